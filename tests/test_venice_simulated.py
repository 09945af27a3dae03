"""One simulated history written twice, as SPEC rows and as raw Venice records (``replica-lens simulate
--format venice-kafka``), audits to the same verdicts, watermarks, lag, anomalies and exporter tables
(issue 18 item 4).

Both snapshots use one-component heartbeats (``heartbeat_vector own``), as Venice's do, so the two inputs
hold the same information. What differs only by spelling is mapped before comparing: the audit of Venice
records names a key by the base64 of its bytes and a PUT value as ``schemaId:base64(bytes)``
(``venice_key``, ``venice_value``); hashes of values differ with their spelling and are left out. A
Venice write time is whole milliseconds (the RMD's value-level timestamp, ``ms << 18``), so a SPEC
``write_ts`` loses its 18 logical bits on the way, also where a WRITE_TS_REGRESSION anomaly shows it.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from pipelines.ingest import VeniceSettings, judge_rows, read_snapshot_lines
from replica_lens.audit import run_audit
from replica_lens.simulator import SimulationConfig, simulate, venice_key, venice_value
from resources.delta_store import DeltaStore
from resources.filesystem import Location
from tests.explained import assert_explanations_equal_the_reference
from tests.rows import plain
from resources.landing import parse_cluster_regions
from schemas.registry import struct_for

SETTINGS = {"spark_master": "local[2]", "delta_jars_dir": None, "shuffle_partitions": 4}
# Every fault and stream anomaly a one-component, time-point heartbeat can carry.
HISTORY = dict(
    seed=23, regions=3, partitions=2, keys=120, writes=1500, heartbeat_every=20, heartbeat_vector="own",
    lost_writes=3, corrupted_values=3, duplicate_deliveries=2, conflicting_writes=2, lagging_replica="dc-c",
    lag_messages=30, failover_clock_behind=1, rewind=1, stalled_heartbeat=1, exporter_regression=1,
)
COMPARED = (
    "divergence_reports", "divergence_summary", "reconstructed_watermarks", "partition_watermarks",
    "heartbeat_segment_summary", "heartbeat_segments", "stream_anomalies", "heartbeat_lag", "replication_lag",
    "exporter_positions", "exporter_regressions", "compaction_bounds",
)
KEY_COLUMNS = {"key"}
WRITE_TS_COLUMNS = {"write_ts"}
VALUE_COLUMNS = {"value", "witness_value_a", "witness_value_b"}
# Not information of the history: where a row was read from, and hashes and sizes of the values' spelling.
IGNORED = {"snapshot_id", "source_file", "value_hash", "value_bytes", "witness_hash_a", "witness_hash_b", "last_hash_a", "last_hash_b"}


# The same history as a production store writes it (issue 43): values compressed with a trained zstd
# dictionary, a quarter of them large enough to be chunked (then chunk-cleanup DELETEs when replaced), and
# the control messages of a push. Its chunks and control messages take offsets of their own, so positions
# differ from the SPEC snapshot's; everything else must not.
CHUNK_ABOVE = 48
PRODUCTION = dict(file_format="venice-kafka", compression="zstd-dict", chunk_above=CHUNK_ABOVE, push_control_messages=True)


def _simulate_both(landing: Path, production: bool = False) -> dict:
    spec = simulate(str(landing), "spec", SimulationConfig(**HISTORY, file_format="jsonl"))
    venice = simulate(str(landing), "venice", SimulationConfig(**HISTORY, file_format="venice-kafka"))
    assert spec["rows"] == venice["rows"], "the same seed and knobs must simulate the same history"
    if production:
        made = simulate(str(landing), "production", SimulationConfig(**HISTORY, **PRODUCTION))
        rows = {r: {k: n for k, n in kinds.items() if k != "EXPORTER_POSITION"} for r, kinds in made["rows"].items()}
        assert rows == {r: {k: n for k, n in kinds.items() if k != "EXPORTER_POSITION"} for r, kinds in spec["rows"].items()}
    return json.loads((landing / "venice.ground_truth.json").read_text())["venice"]


@pytest.fixture(scope="module")
def landing(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("landing")


# The audits of the ``audited`` fixture, by snapshot id (what the command line and the UI show of them).
AUDITS: dict = {}


@pytest.fixture(scope="module")
def audited(tmp_path_factory, landing):
    warehouse = tmp_path_factory.mktemp("warehouse")
    venice = _simulate_both(landing, production=True)
    decode = {"cluster_regions": venice["cluster_regions"], "venice_clock_uncertainty_ms": venice["clock_uncertainty_ms"]}
    for sid, extra in (("spec", {}), ("venice", decode), ("production", decode)):
        audit = run_audit(sid, str(landing), str(warehouse), **SETTINGS, **extra)
        assert audit.success, audit.error
        AUDITS[sid] = audit
    return DeltaStore(warehouse_root=str(warehouse))


def _ms(hlc: int | None) -> int | None:
    """A write_ts as it comes back from Venice's millisecond RMD timestamp: its logical bits cleared."""
    return None if hlc is None else hlc >> 18 << 18


def _as_venice(cells: dict, chunk_above: int | None = None) -> dict:
    """A SPEC snapshot's row as the audit of the same history in Venice records has it: keys and values
    spelled as Venice bytes, write_ts in whole milliseconds, and a START_OF_PUSH without a leader epoch (a
    Venice START_OF_PUSH carries no leader footer)."""
    for c in WRITE_TS_COLUMNS & cells.keys():
        cells[c] = _ms(cells[c])
    if cells.get("anomaly") == "WRITE_TS_REGRESSION":
        cells["observed"], cells["expected"] = _ms(cells["observed"]), _ms(cells["expected"])
        cells["detail"] = re.sub(
            r"write_ts (\d+) (\(physical \d+ ms\)) is below (\d+)",
            lambda m: f"write_ts {_ms(int(m[1]))} {m[2]} is below {_ms(int(m[3]))}", cells["detail"])
    for c in KEY_COLUMNS & cells.keys():
        cells[c] = None if cells[c] is None else venice_key(cells[c])
    for c in VALUE_COLUMNS & cells.keys():
        cells[c] = None if cells[c] is None else venice_value(cells[c], chunk_above)
    if cells.get("kind") == "START_OF_PUSH" and "leader_epoch" in cells:
        cells["leader_epoch"] = None
    return cells


def _rows(spark, store: DeltaStore, table: str, snapshot_id: str, chunk_above: int | None = None,
          position_map: dict | None = None) -> Counter:
    """A table's rows of one snapshot as a multiset; the SPEC snapshot's spelled as Venice records
    (``_as_venice``), another's positions mapped to the SPEC snapshot's (``position_map``, when given)."""
    frame = store.read_snapshot(spark, table, snapshot_id, struct_for(table))
    columns = [c for c in frame.columns if c not in IGNORED]
    rows = Counter()
    for row in frame.select(*columns).collect():
        cells = row.asDict(recursive=True)
        if snapshot_id == "spec":
            _as_venice(cells, chunk_above)
        elif position_map is not None:
            for column, replica in POSITIONS.items():
                if cells.get(column) is not None:
                    cells[column] = position_map[(cells[replica], cells["topic"], cells["partition"])][cells[column]]
        rows[tuple(sorted((k, plain(v)) for k, v in cells.items()))] += 1
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("table", COMPARED)
def test_the_same_history_audits_the_same_through_venice_records(spark, audited, table):
    """Catches any loss or change between the simulator's Venice encoding, the decoder and ingestion:
    a heartbeat time, source position, epoch, write_ts, key or value that does not survive the round trip
    changes a verdict, bound, lag or anomaly here."""
    spec, venice = _rows(spark, audited, table, "spec"), _rows(spark, audited, table, "venice")
    assert spec, f"{table} is empty: the comparison would prove nothing"
    assert venice == spec, f"{table}: only in SPEC {list((spec - venice).items())[:3]}, only in Venice {list((venice - spec).items())[:3]}"


@pytest.mark.slow
def test_the_history_proves_divergence_and_lag_through_venice_records(spark, audited):
    """Catches a comparison that passes because nothing was found: the Venice audit must prove keys
    DIVERGENT or MISSING and measure the lagging replica's lag."""
    reports = audited.read_snapshot(spark, "divergence_reports", "venice", struct_for("divergence_reports"))
    verdicts = Counter(r["verdict"] for r in reports.collect())
    assert verdicts["DIVERGENT"] + verdicts["MISSING"] > 0, verdicts
    lag = audited.read_snapshot(spark, "heartbeat_lag", "venice", struct_for("heartbeat_lag"))
    assert lag.filter("replica = 'dc-c'").count() > 0


def test_venice_records_decode_to_the_spec_rows_of_the_same_history(spark, tmp_path):
    """Row for row, without the pipeline: catches an encoding or decoding mistake with the row it is in
    (only the differences ``_as_venice`` names are allowed)."""
    venice = _simulate_both(tmp_path)
    settings = VeniceSettings(parse_cluster_regions(venice["cluster_regions"]), venice["clock_uncertainty_ms"])

    def accepted(sid: str) -> list[dict]:
        judged = judge_rows(read_snapshot_lines(spark, str(tmp_path / sid), settings), sid)
        assert judged.quarantined.count() == 0
        columns = [c for c in judged.accepted.columns if c not in IGNORED | {"extra_fields", "copies"}]
        return [r.asDict(recursive=True) for r in judged.accepted.select(*columns).collect()]

    def position(row: dict) -> tuple:
        return (row["replica"], row["topic"], row["partition"], row["offset"] if row["offset"] is not None else -1,
                row["exporter"] or "", row["reported_at_ms"] or 0, row["exported_offset"] or 0)

    expected = [_as_venice(row) for row in accepted("spec")]
    got = sorted(accepted("venice"), key=position)
    expected.sort(key=position)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g == e
    kinds = Counter(r["kind"] for r in got)
    assert kinds["HEARTBEAT"] and kinds["PUT"] and kinds["DELETE"] and kinds["START_OF_PUSH"] and kinds["EXPORTER_POSITION"]


# --- production-shaped records (issue 43) ------------------------------------------------------

PRODUCTION_COMPARED = (
    "divergence_reports", "divergence_summary", "reconstructed_watermarks", "partition_watermarks",
    "heartbeat_segment_summary", "heartbeat_segments", "heartbeat_lag", "replication_lag",
)
# Version-topic positions, each of the replica a row names (the others are upstream positions).
POSITIONS = {"offset": "replica", "opening_offset": "replica", "first_offset": "replica", "last_offset": "replica",
             "first_gap_offset": "replica", "last_gap_offset": "replica", "witness_offset_a": "replica_a",
             "last_offset_a": "replica_a", "witness_offset_b": "replica_b", "last_offset_b": "replica_b"}


def _positions(spark, store: DeltaStore, snapshot_id: str) -> dict:
    frame = store.read_snapshot(spark, "raw_topic_snapshots", snapshot_id, struct_for("raw_topic_snapshots"))
    out: dict = {}
    for r in frame.where("offset IS NOT NULL").select("replica", "topic", "partition", "offset").collect():
        out.setdefault((r["replica"], r["topic"], r["partition"]), []).append(r["offset"])
    return {where: sorted(offsets) for where, offsets in out.items()}


@pytest.fixture(scope="module")
def position_map(spark, audited) -> dict:
    """Production offset -> SPEC offset of the same row, per replica partition: the n-th row is the n-th row."""
    spec, production = _positions(spark, audited, "spec"), _positions(spark, audited, "production")
    assert spec.keys() == production.keys()
    mapping = {}
    for where, offsets in production.items():
        assert len(offsets) == len(spec[where]), where
        mapping[where] = dict(zip(offsets, spec[where]))
    # The chunks and control messages did move positions (else the mapping would test nothing).
    assert any(a != b for m in mapping.values() for a, b in m.items())
    return mapping


@pytest.mark.slow
@pytest.mark.parametrize("table", PRODUCTION_COMPARED)
def test_compressed_chunked_records_audit_like_the_spec_rows(spark, audited, position_map, table):
    """The same history through zstd-dictionary values, chunked values with their cleanups and a push's
    control messages: the same verdicts, witnesses (logical values), segments, watermarks and lag, at the
    same rows. Catches values left compressed or not reassembled (witness and watermark values differ),
    chunk-cleanup DELETEs taken for user deletes (false MISSING verdicts: the chunk keys hold each region's
    producer GUID), chunking suffixes left on keys, and chunk or control-message positions taken for gaps
    (gap columns and bounds differ)."""
    spec = _rows(spark, audited, table, "spec", CHUNK_ABOVE)
    production = _rows(spark, audited, table, "production", position_map=position_map)
    assert spec, f"{table} is empty: the comparison would prove nothing"
    assert production == spec, (f"{table}: only in SPEC {list((spec - production).items())[:2]}, "
                                f"only in production {list((production - spec).items())[:2]}")


@pytest.mark.slow
def test_compressed_chunked_records_are_all_accounted_for(spark, audited, landing):
    """Every record the simulator wrote without a row (chunks, cleanups, control messages) is skipped by rule
    under its kind, per replica: catches a chunk quarantined or a control message counted under the wrong kind."""
    truth = json.loads((landing / "production.ground_truth.json").read_text())["venice"]
    assert truth["push_settings"] == "ZSTD_WITH_DICT, chunked"
    skipped = audited.read_snapshot(spark, "raw_topic_skipped", "production", struct_for("raw_topic_skipped"))
    counted: dict = {}
    for r in skipped.groupBy("replica", F.coalesce("control_message", "reason").alias("kind")).count().collect():
        counted.setdefault(r["replica"], {})[r["kind"]] = r["count"]
    assert counted == truth["records_without_rows"]
    assert all(kinds["VALUE_CHUNK"] and kinds["CHUNK_CLEANUP"] and kinds["DOL_STAMP"] for kinds in counted.values())
    assert audited.read_snapshot(spark, "raw_topic_quarantine", "production", struct_for("raw_topic_quarantine")).count() == 0


# ------------------------------------------------------------------ explaining a key (SPEC 10)
@pytest.mark.slow
@pytest.mark.parametrize("snapshot_id", ["spec", "venice", "production"])
def test_explanations_equal_the_plain_reference(audited, snapshot_id):
    """``replica-lens explain``'s documents against the plain reference of the SPEC rules (``tests/explained.py``),
    on SPEC rows, Venice records and compressed, chunked Venice records (a chunk's or control message's position
    taken for a gap would move reach rows and gap marks). The dump with gaps: tests/test_audit_e2e.py."""
    odd: list = []
    compared = assert_explanations_equal_the_reference(audited.warehouse_root, snapshot_id, odd)
    assert compared >= 30
    # Three regions and corrupted copies: some write's odd replica out is named (else the check above tests little).
    assert odd, "no odd_one_out among the explained keys"


@pytest.mark.slow
@pytest.mark.parametrize("snapshot_id", ["spec", "production"])
def test_every_summary_counts_keys_once_under_their_worst_verdict_and_names_key_pairs(audited, snapshot_id):
    """Issue 71, item 1: with three replicas the summary said ``keys compared 6000`` for 2,000 keys, ``DIVERGENT 10``
    for 5 keys (10 pair rows): key pairs counted as keys, in the command line, the metadata, the check and the page.
    Against the plain reference's verdicts: ``keys_*`` count each (topic, partition, key) once under its worst
    verdict, ``key_pairs_*`` count one per replica pair, everywhere an operator reads them."""
    from replica_lens.audit import audit_document, summary_lines
    from tests.explained import reference_of

    _, findings = reference_of(audited.warehouse_root, snapshot_id)
    rank = {"DIVERGENT": 0, "MISSING": 1, "IN_FLIGHT": 2, "CONSISTENT": 3}
    worst: dict = {}
    for (topic, partition, _, _, key), finding in findings.items():
        worst[(topic, partition, key)] = min(worst.get((topic, partition, key), "CONSISTENT"), finding.verdict,
                                             key=rank.__getitem__)
    keys = {v: sum(w == v for w in worst.values()) for v in rank} | {"COMPARED": len(worst)}
    pairs = {v: sum(f.verdict == v for f in findings.values()) for v in rank} | {"COMPARED": len(findings)}
    assert keys["DIVERGENT"] < pairs["DIVERGENT"], "three replicas: a divergent key shows in several pairs"
    audit = AUDITS[snapshot_id]
    metadata = audit.metadata["divergence_reports"]
    for name in ("COMPARED", "DIVERGENT", "MISSING", "IN_FLIGHT", "CONSISTENT"):
        assert metadata[f"keys_{name.lower()}"] == keys[name], name
        assert metadata[f"key_pairs_{name.lower()}"] == pairs[name], name
    # Keys first, then key pairs under their own name.
    names = [n for n in metadata if n.startswith(("keys_", "key_pairs_")) and not n.startswith(("keys_explained",
                                                                                                 "keys_pictured"))]
    assert names.index("keys_compared") < names.index("key_pairs_compared")
    lines = "\n".join(summary_lines(audit))
    assert (f"keys compared {keys['COMPARED']}: DIVERGENT {keys['DIVERGENT']}, MISSING {keys['MISSING']}, "
            f"IN_FLIGHT {keys['IN_FLIGHT']}, consistent {keys['CONSISTENT']}") in lines
    assert f"key pairs compared {pairs['COMPARED']}: DIVERGENT {pairs['DIVERGENT']}," in lines
    assert lines.index("keys compared") < lines.index("key pairs compared")
    document = audit_document(audit)
    assert document["verdicts"] == {n.lower(): keys[n] for n in keys}
    assert document["key_pair_verdicts"] == {n.lower(): pairs[n] for n in pairs}
    proven = keys["DIVERGENT"] + keys["MISSING"]
    assert audit.check_descriptions["divergence_reports:no_proven_divergence"].startswith(
        f"{proven} key(s) proven divergent or missing ({keys['DIVERGENT']} DIVERGENT, {keys['MISSING']} MISSING), "
        f"in {pairs['DIVERGENT'] + pairs['MISSING']} key pair(s)")
    page = Location.of(metadata["report_page"]).read_text()
    assert f'<span class="verdict-count" data-verdict="DIVERGENT">DIVERGENT keys: {keys["DIVERGENT"]}</span>' in page
    assert f"<th>key pairs compared</th><td>{pairs['COMPARED']}</td>" in page


def _proven_key(store: DeltaStore, snapshot_id: str) -> dict:
    from resources.delta_reader import TableReader

    reports = TableReader(store.warehouse_root).read("divergence_reports", snapshot_id).to_pylist()
    proven = sorted((r for r in reports if r["verdict"] == "DIVERGENT"), key=lambda r: (r["topic"], r["partition"], r["key"]))
    assert proven, f"{snapshot_id} proves nothing: the explanation tests would test little"
    return proven[0]


def _explain_args(store: DeltaStore, snapshot_id: str, report: dict, *more: str) -> list[str]:
    return ["explain", "--warehouse", store.warehouse_root, "--snapshot-id", snapshot_id, "--topic", report["topic"],
            "--partition", str(report["partition"]), *more]


def test_explain_prints_text_and_writes_json_and_html_of_the_same_facts(audited, tmp_path, capsys):
    """The command as an operator runs it: text on stdout, the JSON document and the page, all naming the witness
    offsets and the verdict. Catches an option not wired (a file not written, text printed with ``--json -``)
    and the text or page leaving out the witness. The key is the Venice snapshot's, given as text (``--key-text``)."""
    from replica_lens.cli import main
    import base64

    report = _proven_key(audited, "venice")
    key_text = base64.b64decode(report["key"]).decode("utf-8")
    json_path, html_path = tmp_path / "k.json", tmp_path / "k.html"
    args = _explain_args(audited, "venice", report, "--key-text", key_text)
    assert main([*args, "--json", str(json_path), "--html", str(html_path)]) == 0
    text = capsys.readouterr().out
    doc = json.loads(json_path.read_text())
    page = html_path.read_text()
    assert doc["key"] == report["key"] and doc["venice"]
    pair = next(p for p in doc["pairs"] if (p["replica_a"], p["replica_b"]) == (report["replica_a"], report["replica_b"]))
    assert pair["verdict"] == "DIVERGENT"
    assert (pair["witness"]["offset_a"], pair["witness"]["offset_b"]) == (report["witness_offset_a"], report["witness_offset_b"])
    for shown in (text, page):
        assert "DIVERGENT" in shown and report["key"] in shown
        assert str(report["witness_offset_a"]) in shown and str(report["witness_offset_b"]) in shown
        assert "--dump-kafka-topic" in shown and "--starting_offset" in shown
    assert main([*args, "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out) == doc


def test_explain_refuses_a_key_or_partition_the_snapshot_does_not_hold(audited, capsys):
    """Exit 2 with a message naming what exists: catches a traceback (exit 70) or an empty explanation of a typo."""
    from replica_lens.cli import main

    report = _proven_key(audited, "spec")
    assert main(_explain_args(audited, "spec", report, "--key", "no-such-key")) == 2
    error = capsys.readouterr().err
    assert "no key 'no-such-key'" in error and "keys it holds there include" in error
    assert main([*_explain_args(audited, "spec", {**report, "partition": 99}), "--key", report["key"]]) == 2
    error = capsys.readouterr().err
    assert "no topic" in error and f"{report['topic']} partition 0" in error


def test_redaction_keeps_value_text_out_of_every_output(audited, tmp_path, capsys):
    """With ``--redact-values`` (and in the job and the report page, by the same setting) no value's text appears
    anywhere: the text, the JSON, the page with its picture, the job's metadata. Catches a renderer or metadata
    entry that reads the value past the redaction (the witness values of this history are known strings)."""
    from replica_lens.cli import main
    from explain.report import build_report
    from replica_lens.jobs import explain_key_job
    from resources.reports import ReportSettings

    report = _proven_key(audited, "spec")
    secrets = {report["witness_value_a"], report["witness_value_b"]} - {None}
    assert secrets, report
    json_path, html_path = tmp_path / "k.json", tmp_path / "k.html"
    args = _explain_args(audited, "spec", report, "--key", report["key"], "--redact-values")
    assert main([*args, "--json", str(json_path), "--html", str(html_path)]) == 0
    outputs = {"text": capsys.readouterr().out, "json": json_path.read_text(), "html": html_path.read_text()}
    assert "redacted" in outputs["text"] and report["witness_hash_a"][:12] in outputs["text"]
    page = build_report(audited.warehouse_root, "spec", {"DIVERGENT": 1}, pictures=2, redacting=True)
    outputs["report page"] = Location.of(page.uri).read_text()
    outputs["UI markdown"] = page.ui_markdown(2)
    result = explain_key_job.execute_in_process(
        run_config={"ops": {"explain_key_op": {"config": {
            "snapshot_id": "spec", "topic": report["topic"], "partition": report["partition"], "key": report["key"]}}}},
        resources={"store": audited, "reports": ReportSettings(redact_values=True)},
    )
    assert result.success
    output = next(e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT")
    metadata = output.event_specific_data.metadata
    outputs["job metadata"] = json.dumps({k: str(getattr(v, "value", v)) for k, v in metadata.items()})
    for where, shown in outputs.items():
        for secret in secrets:
            assert secret not in shown, f"the value {secret!r} shows in the {where}"
    assert main([*args[:-1], "--no-redact-values", "--json", str(json_path)]) == 0
    capsys.readouterr()
    assert any(secret in json_path.read_text() for secret in secrets), "without redaction the value must show"


def test_the_explain_key_launchpad_shows_every_field_explains_a_real_key_by_default_and_fails_in_one_line(audited):
    """Issue 71, item 5: the Launchpad opened with an error and "Scaffold missing config" gave no ``key``; launching
    that failed after a full Python stack trace. Catches a config field the Launchpad does not show (the job's default
    config names every field), a default that explains nothing (left null it explains the newest audited snapshot's
    most important key), and a bad config failing otherwise than with ``dg.Failure``'s one-line description (no
    chained traceback of ours)."""
    from explain.reading import first_reported_key
    from replica_lens.jobs import EXPLAIN_DEFAULT_CONFIG, ExplainKeyConfig, explain_key_job
    from resources.reports import ReportSettings

    fields = EXPLAIN_DEFAULT_CONFIG["ops"]["explain_key_op"]["config"]
    assert set(fields) == set(ExplainKeyConfig.model_fields) >= {"snapshot_id", "topic", "partition", "key", "key_text"}
    assert all(ExplainKeyConfig.model_fields[f].description for f in fields)
    assert explain_key_job.run_config_schema.config_type.fields["ops"].is_required is False  # launchable as it opens
    resources = {"store": audited, "reports": ReportSettings(redact_values=True)}
    result = explain_key_job.execute_in_process(resources=resources)  # the Launchpad's default, unchanged
    assert result.success
    output = next(e for e in result.all_node_events if e.event_type_value == "STEP_OUTPUT")
    metadata = {k: getattr(v, "value", v) for k, v in output.event_specific_data.metadata.items()}
    newest = "production"  # audited last by the fixture (no instance registered the snapshots: the commit order)
    topic, partition, key = first_reported_key(audited.warehouse_root, newest)
    assert (metadata["snapshot_id"], metadata["topic"], metadata["partition"], metadata["key"]) == (
        newest, topic, partition, key)
    assert metadata["verdict"] in ("DIVERGENT", "MISSING", "IN_FLIGHT")

    def failure_of(config: dict):
        run = explain_key_job.execute_in_process(
            run_config={"ops": {"explain_key_op": {"config": config}}}, resources=resources, raise_on_error=False)
        assert not run.success
        failed = next(e for e in run.all_node_events if e.is_step_failure).step_failure_data
        return failed

    for config, words in (
        ({"topic": topic, "partition": partition, "key": key, "key_text": "x"}, "either key or key_text, not both"),
        ({"key": key}, "give the topic and partition of the key"),
        ({"snapshot_id": "spec", "topic": topic, "partition": partition, "key": "no-such-key"}, "holds no key"),
    ):
        failed = failure_of(config)
        description = failed.user_failure_data.description
        assert words in description and "\n" not in description, description
        assert failed.error.cause is None, failed.error.cause  # no chained traceback of ours beneath the Failure


def test_the_trend_follows_audits_run_from_the_shell(audited, landing):
    """Issue 71, item 8: ``audit_trend`` stayed "Never materialized" after audits from the shell (the run status
    sensor only set its cursor: it sees runs of the daemon's instance, after it started). ``trend_catch_up`` asks for
    ``refresh_trend`` once the warehouse holds an audit newer than the trend, and nothing once the trend is newer.
    Catches a sensor that waits for runs it will never see, a trend that counts key pairs, and a second request for
    the same audit."""
    import dagster as dg

    from replica_lens.definitions import build_definitions
    from replica_lens.jobs import trend_catch_up

    with dg.instance_for_test() as instance:
        first = trend_catch_up(dg.build_sensor_context(instance=instance, resources={"store": audited}))
        (request,) = first.run_requests
        assert request.run_key.startswith("trend-for-audit-")
        defs = build_definitions(landing_root=str(landing), warehouse_root=audited.warehouse_root, **SETTINGS)
        assert defs.resolve_job_def("refresh_trend").execute_in_process(instance=instance).success
        again = trend_catch_up(dg.build_sensor_context(instance=instance, resources={"store": audited}))
        assert not again.run_requests and "newer" in again.skip_reason.skip_message
    trend = {r["snapshot_id"]: r for r in _whole_table(audited.warehouse_root, "audit_trend")}
    for sid, audit in AUDITS.items():
        metadata = audit.metadata["divergence_reports"]
        assert (trend[sid]["keys_compared"], trend[sid]["divergent"], trend[sid]["missing"], trend[sid]["in_flight"]) \
            == (metadata["keys_compared"], metadata["keys_divergent"], metadata["keys_missing"],
                metadata["keys_in_flight"]), sid


def _whole_table(warehouse: str, table: str) -> list[dict]:
    from deltalake import DeltaTable

    from resources.delta_reader import table_uri

    return DeltaTable(table_uri(warehouse, table)).to_pyarrow_table().to_pylist()
