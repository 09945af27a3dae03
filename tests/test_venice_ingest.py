"""Ingestion of raw Venice records (issue 18, items 1 and 2): a snapshot folder of Parquet files with
the columns of Spark's Kafka source plus ``region`` is recognized by its footer, decoded on the
executors and judged like any other rows; skipped records are counted, quarantined ones keep the
decoder's reason; an upstream cluster id without a region name fails the run before any table is
written."""
from __future__ import annotations

import base64
import datetime as dt
import io
from pathlib import Path

import fastavro
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.ingest import VeniceSettings, accounting_from_tables, judge_rows, read_snapshot_lines
from pipelines.venice.decoder import encode_record, envelope_schema
from resources.errors import InvalidSetting
from resources.landing import parse_cluster_regions

U = 5
CLUSTERS = {0: "dc-a", 1: "dc-b"}
REGIONS = {v: k for k, v in CLUSTERS.items()}
TOPIC = "store_v1"
NS = "com.linkedin.venice.kafka.protocol."
PRODUCER_KEY = b"\x02" + b"\x01" * 16 + bytes(8)

KAFKA_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("timestamp", pa.timestamp("ms", tz="UTC")), ("timestampType", pa.int32()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))), ("region", pa.string()),
])


def spec_rows(replica: str) -> list[dict]:
    """A START_OF_PUSH, two PUTs, a DELETE and a heartbeat of one replica's version topic. Write times
    are whole milliseconds (``ms << 18``): Venice's replication metadata carries no logical counter."""
    base = {"replica": replica, "topic": TOPIC, "partition": 0}
    other = "dc-b" if replica == "dc-a" else "dc-a"
    return [
        {**base, "offset": 0, "kind": "START_OF_PUSH"},
        {**base, "offset": 1, "kind": "PUT", "key": "azE=", "value": "3:dmFsdWUtMQ==", "source_region": "dc-a",
         "source_offset": 10, "write_ts": 1_000 << 18, "leader_epoch": 2},
        {**base, "offset": 2, "kind": "PUT", "key": "azI=", "value": "3:dmFsdWUtMg==", "source_region": other,
         "source_offset": 20, "write_ts": None, "leader_epoch": None},
        {**base, "offset": 3, "kind": "DELETE", "key": "azE=", "source_region": "dc-b", "source_offset": 21,
         "write_ts": 1_500 << 18, "leader_epoch": 2},
        {**base, "offset": 4, "kind": "HEARTBEAT", "source_region": "dc-a", "source_offset": 30, "leader_epoch": None,
         "origin_ts_min_ms": 2_000 - U, "origin_ts_max_ms": 2_000 + U,
         "applied_ts_min_ms": 2_100 - U, "applied_ts_max_ms": 2_100 + U},
    ]


def envelope(message_type: int, payload: tuple, footer_cluster: int | None = 0) -> bytes:
    """A v14 value written with fastavro directly (records encode_record cannot make)."""
    env = {
        "messageType": message_type,
        "producerMetadata": {"producerGUID": b"\x01" * 16, "segmentNumber": 0, "messageSequenceNumber": 1,
                             "messageTimestamp": 1, "logicalTimestamp": -1},
        "payloadUnion": payload,
        "leaderMetadataFooter": None if footer_cluster is None else (
            NS + "LeaderMetadata", {"hostName": "h", "upstreamOffset": 5, "upstreamKafkaClusterId": footer_cluster,
                                    "upstreamPubSubPosition": b"", "termId": -1, "upstreamMessageTimestamp": -1}),
    }
    out = io.BytesIO(bytes([23, 14]))
    out.seek(2)
    fastavro.schemaless_writer(out, envelope_schema(14), env)
    return out.getvalue()


def control(cm_type: int, branch: str, body: dict) -> bytes:
    return envelope(2, (NS + "ControlMessage", {"controlMessageType": cm_type, "debugInfo": {},
                                                "controlMessageUnion": (NS + branch, body)}), None)


def write_snapshot(folder: Path, records: dict[str, list[tuple[bytes, bytes, int, int]]]) -> None:
    """One Parquet file per region, Kafka source columns + region, then _SUCCESS."""
    folder.mkdir(parents=True)
    for region, recs in records.items():
        table = pa.table({
            "key": [k for k, _, _, _ in recs], "value": [v for _, v, _, _ in recs], "topic": [TOPIC] * len(recs),
            "partition": [0] * len(recs), "offset": [o for _, _, o, _ in recs],
            "timestamp": [dt.datetime.fromtimestamp(t / 1000, dt.timezone.utc) for _, _, _, t in recs],
            "timestampType": [0] * len(recs), "headers": [[] for _ in recs], "region": [region] * len(recs),
        }, schema=KAFKA_SCHEMA)
        pq.write_table(table, folder / f"{region}.parquet")
    (folder / "_SUCCESS").write_text("")


def encoded(rows: list[dict], clusters: dict[str, int] = REGIONS) -> list[tuple[bytes, bytes, int, int]]:
    out = []
    for row in rows:
        rec = encode_record(row, region_clusters=clusters, clock_uncertainty_ms=U)
        out.append((rec.key, rec.value, row["offset"], rec.timestamp_ms))
    return out


def venice_snapshot(folder: Path) -> None:
    update = envelope(3, (NS + "Update", {"schemaId": 3, "updateSchemaId": 1, "updateValue": b"\x00"}))
    end_of_push = control(1, "EndOfPush", {})
    segment_start = control(2, "StartOfSegment", {"checksumType": 0, "upcomingAggregates": []})
    write_snapshot(folder, {
        "dc-a": encoded(spec_rows("dc-a")) + [
            (b"\x04azM=", update, 5, 0),             # UPDATE: quarantined UPDATE_NOT_APPLIED
            (PRODUCER_KEY, end_of_push, 6, 0),       # END_OF_PUSH: skipped CONTROL_MESSAGE
        ],
        "dc-b": encoded(spec_rows("dc-b")) + [
            (b"\x00azQ=", b"\x17\x0e\x00", 5, 0),    # truncated envelope: quarantined MALFORMED_RECORD
            (PRODUCER_KEY, segment_start, 6, 0),     # START_OF_SEGMENT under a producer key: skipped
        ],
    })


def test_raw_venice_records_are_decoded_judged_and_accounted(spark, tmp_path):
    # Catches: Kafka-source Parquet read as SPEC Parquet (every row BAD_TYPE/MISSING_FIELD),
    # skipped records vanishing from the accounting (read != accepted + quarantined + skipped),
    # decoder reasons lost in the quarantine, and decoded fields mangled on the way (source
    # region by cluster id, offsets, heartbeat intervals, value as schema id and base64).
    folder = tmp_path / "landing" / "venice-snap"
    venice_snapshot(folder)
    judgement = judge_rows(read_snapshot_lines(spark, str(folder), VeniceSettings(CLUSTERS, U)), "venice-snap")
    accepted = judgement.accepted.collect()
    quarantined = judgement.quarantine().collect()
    skipped = judgement.skipped_by_reason()
    counts = accounting_from_tables(judgement.accepted, judgement.quarantined, skipped)

    assert (counts["rows_read"], counts["rows_accepted"], counts["rows_quarantined"], counts["rows_skipped"]) == (
        14, 10, 2, 2)
    assert skipped == {"CONTROL_MESSAGE": 2}
    assert counts["by_reason"] == {"MALFORMED_RECORD": 1, "UPDATE_NOT_APPLIED": 1}
    assert {(r["replica"], r["reason"]) for r in quarantined} == {("dc-a", "UPDATE_NOT_APPLIED"),
                                                                  ("dc-b", "MALFORMED_RECORD")}
    assert all(r["source_file"] in ("dc-a.parquet", "dc-b.parquet") and '"offset":5' in r["raw"] for r in quarantined)

    fields = [f for f in spec_rows("dc-a")[1]] + ["origin_ts_min_ms", "origin_ts_max_ms", "applied_ts_min_ms",
                                                  "applied_ts_max_ms"]
    got = sorted(({k: r[k] for k in fields if r[k] is not None} for r in accepted),
                 key=lambda d: (d["replica"], d["offset"]))
    want = sorted(({k: v for k, v in row.items() if v is not None} for rep in ("dc-a", "dc-b") for row in spec_rows(rep)),
                  key=lambda d: (d["replica"], d["offset"]))
    assert got == want
    assert all(r["copies"] == 1 and r["source_file"] == f"{r['replica']}.parquet" for r in accepted)


def test_unknown_cluster_id_fails_the_run_before_any_table_is_written(spark, tmp_path, monkeypatch):
    # Catches a record from an unnamed cluster being quarantined, dropped or given a made-up
    # region (its rows would then be compared under the wrong source) instead of failing the run,
    # the REPLICA_LENS_CLUSTER_REGIONS setting not reaching the ingestion, and an error that names
    # only one of several unknown ids.
    from replica_lens.audit import run_audit
    from resources.delta_store import DeltaStore

    landing = tmp_path / "landing"
    write_snapshot(landing / "snap", {"dc-a": encoded(spec_rows("dc-a"), {"dc-a": 0, "dc-b": 7}),
                                      "dc-b": encoded(spec_rows("dc-b"), {"dc-a": 9, "dc-b": 1})})
    monkeypatch.setenv("REPLICA_LENS_CLUSTER_REGIONS", "0=dc-a,1=dc-b")
    warehouse = tmp_path / "warehouse"
    audit = run_audit("snap", str(landing), str(warehouse), spark_master="local[2]", delta_jars_dir=None,
                      shuffle_partitions=4)
    assert not audit.success
    assert "raw_topic_snapshots" in (audit.error or "")
    # Every unknown id is named, not only the first one a task met (the operator fixes the map once).
    assert ("upstreamKafkaClusterIds [7, 9] are not in the cluster -> region map (known ids: [0, 1]; "
            "ids in the snapshot: [0, 1, 7, 9])") in audit.error
    store = DeltaStore(warehouse_root=str(warehouse))
    assert not store.exists("raw_topic_snapshots") and not store.exists("raw_topic_quarantine")


def test_cluster_regions_setting_is_parsed_strictly():
    # Catches a typo in the map ("0:dc-a", a missing name, an id named twice) being read as
    # fewer clusters, which would only show later as an unknown-id failure or a wrong region.
    assert parse_cluster_regions(" 0=dc-a, 1=dc-b ,") == {0: "dc-a", 1: "dc-b"}
    assert parse_cluster_regions(None) == {} and parse_cluster_regions("") == {}
    for bad in ("0:dc-a", "0=", "x=dc-a", "0=dc-a,0=dc-b"):
        with pytest.raises(InvalidSetting):
            parse_cluster_regions(bad)


def test_clock_uncertainty_setting_is_parsed_strictly_and_falls_back_to_the_environment(monkeypatch, capsys):
    # Catches a negative or non-numeric uncertainty read as some number (it would narrow or shift every
    # heartbeat interval), and a resource that ignores REPLICA_LENS_VENICE_CLOCK_UNCERTAINTY_MS from .env.
    from replica_lens.cli import EXIT_USAGE, main
    from resources.landing import CLOCK_UNCERTAINTY_ENV, LandingZone, parse_clock_uncertainty

    assert parse_clock_uncertainty(" 7 ") == 7 and parse_clock_uncertainty(None) == 0 and parse_clock_uncertainty("") == 0
    for bad in ("-1", "3ms", "1.5"):
        with pytest.raises(InvalidSetting):
            parse_clock_uncertainty(bad)
    monkeypatch.setenv(CLOCK_UNCERTAINTY_ENV, "9")
    assert LandingZone(root="landing").clock_uncertainty_ms() == 9
    assert LandingZone(root="landing", venice_clock_uncertainty_ms=2).clock_uncertainty_ms() == 2
    args = ["audit", "--landing", "l", "--warehouse", "w", "--venice-clock-uncertainty-ms", "-3"]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == EXIT_USAGE
    assert "not a whole number of milliseconds" in capsys.readouterr().err


def test_a_mid_stream_chunked_dump_needs_push_settings_and_names_missing_chunks(spark, tmp_path):
    """A dump that starts mid-stream holds no START_OF_PUSH. Catches: its values read as if uncompressed (without
    a settings file every record of the topic is kept in the quarantine, UNKNOWN_PUSH_SETTINGS with its position,
    nothing of it accepted), and a manifest whose chunks lie before the dump's first offset stored as a value,
    dropped, or quarantined without saying which chunks are missing."""
    import json

    from replica_lens.simulator import SimulationConfig, simulate
    from pipelines.venice.push_settings import parse_push_settings

    # The cut at 146 falls inside a chunked value in both replicas (its chunks before, its manifest after).
    config = SimulationConfig(seed=5, regions=2, partitions=1, keys=30, writes=600, file_format="venice-kafka",
                              compression="gzip", chunk_above=40, mid_stream_from=146)
    summary = simulate(tmp_path, "mid", config)
    truth = json.loads(Path(summary["ground_truth"]).read_text())["venice"]
    settings = VeniceSettings(parse_cluster_regions(truth["cluster_regions"]), truth["clock_uncertainty_ms"])
    unknown = judge_rows(read_snapshot_lines(spark, summary["snapshot_dir"], settings), "mid")
    version_topic = [r for r in unknown.accepted.collect() if r["kind"] != "EXPORTER_POSITION"]  # first, as below
    kept = unknown.quarantine().collect()
    assert not version_topic and not unknown.skipped_by_reason()
    assert kept and {(r["reason"], r["topic"]) for r in kept} == {("UNKNOWN_PUSH_SETTINGS", "store_v1")}
    assert all(None not in (r["replica"], r["partition"], r["offset"]) and "value_base64" in r["raw"] for r in kept)
    assert "--venice-push-settings" in summary["audit_with"]
    settings = VeniceSettings(settings.cluster_regions, settings.clock_uncertainty_ms,
                              parse_push_settings(str(tmp_path / truth["push_settings_file"])))
    judgement = judge_rows(read_snapshot_lines(spark, summary["snapshot_dir"], settings), "mid")
    accepted = judgement.accepted.collect()  # first: the quarantine is read from its pass's observations
    quarantined = judgement.quarantine().collect()
    skipped = judgement.skipped_by_reason()
    counts = accounting_from_tables(judgement.accepted, judgement.quarantined, skipped)
    assert quarantined and {r["reason"] for r in quarantined} == {"MISSING_CHUNKS"}
    for r in quarantined:
        missing = json.loads(r["raw"])["missing"]
        assert r["offset"] >= 146 and "not in the dump: value chunk 0" in missing, missing
    # Every other record: accepted (values decompressed, keys without suffix) or skipped by rule.
    assert counts["rows_read"] == sum(pq.read_metadata(p).num_rows for p in Path(summary["snapshot_dir"]).glob("*.kafka.parquet")) + sum(
        pq.read_metadata(p).num_rows for p in Path(summary["snapshot_dir"]).glob("*.exporters.*.parquet"))
    assert set(skipped) == {"VALUE_CHUNK", "CHUNK_CLEANUP"}
    values = [r["value"] for r in accepted if r["kind"] == "PUT"]
    assert values and all(base64.b64decode(v.split(":", 1)[1]).startswith(b"v") for v in values)


def test_push_settings_file_is_parsed_strictly(tmp_path):
    """Catches a typo in the settings file (an unknown strategy, a missing dictionary, an unknown field) read as
    some default, which would store compressed bytes as values."""
    from pipelines.venice.values import GZIP, ZSTD_WITH_DICT, PushSettings
    from pipelines.venice.push_settings import parse_push_settings

    (tmp_path / "v7.dict").write_bytes(b"DICT")
    good = tmp_path / "good.json"
    good.write_text('{"a_v1": {"compression": "gzip", "chunked": true},'
                    ' "b_v7": {"compression": "ZSTD_WITH_DICT", "dictionary_file": "v7.dict"},'
                    ' "c_v2": {"compression": "ZSTD_WITH_DICT", "dictionary_base64": "RElDVA=="}}')
    assert parse_push_settings(str(good)) == {"a_v1": PushSettings(True, GZIP),
                                              "b_v7": PushSettings(False, ZSTD_WITH_DICT, b"DICT"),
                                              "c_v2": PushSettings(False, ZSTD_WITH_DICT, b"DICT")}
    assert parse_push_settings(None) == {}
    for bad in ('{"a": {"compression": "LZ4"}}', '{"a": {"compression": "ZSTD_WITH_DICT"}}',
                '{"a": {"compresion": "GZIP"}}', '{"a": {"chunked": "yes"}}', '["a"]', "{",
                '{"a": {"compression": "ZSTD_WITH_DICT", "dictionary_file": "nope.dict"}}'):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(InvalidSetting, match="Venice push settings"):
            parse_push_settings(str(tmp_path / "bad.json"))


def test_push_settings_reach_the_landing_resource_from_its_field_or_the_environment(tmp_path, monkeypatch):
    """Catches REPLICA_LENS_VENICE_PUSH_SETTINGS (or the resource's field, which wins) not reaching the ingestion."""
    from pipelines.venice.values import GZIP, NO_OP, PushSettings
    from resources.landing import LandingZone
    from pipelines.venice.push_settings import parse_push_settings
    from resources.landing import PUSH_SETTINGS_ENV

    (tmp_path / "env.json").write_text('{"a_v1": {"compression": "GZIP"}}')
    (tmp_path / "field.json").write_text('{"a_v1": {"compression": "NO_OP", "chunked": true}}')
    assert LandingZone(root="landing").push_settings_file() is None
    monkeypatch.setenv(PUSH_SETTINGS_ENV, str(tmp_path / "env.json"))
    assert parse_push_settings(LandingZone(root="landing").push_settings_file()) == {"a_v1": PushSettings(False, GZIP)}
    field = LandingZone(root="landing", venice_push_settings=str(tmp_path / "field.json"))
    assert parse_push_settings(field.push_settings_file()) == {"a_v1": PushSettings(True, NO_OP)}


def test_limits_reach_the_landing_resource_from_its_fields_or_the_environment(tmp_path, monkeypatch):
    """Catches a limit setting that is ignored, a field that loses to the environment, and a bad value accepted
    (a zero limit would quarantine every value)."""
    from resources.landing import MAX_CHUNKS_ENV, MAX_VALUE_BYTES_ENV, LandingZone

    monkeypatch.delenv(MAX_VALUE_BYTES_ENV, raising=False)
    monkeypatch.delenv(MAX_CHUNKS_ENV, raising=False)
    assert LandingZone(root=str(tmp_path)).limit_settings() == {}
    monkeypatch.setenv(MAX_CHUNKS_ENV, "7")
    assert LandingZone(root=str(tmp_path), max_value_bytes=5).limit_settings() == {"max_value_bytes": 5, "max_chunks": 7}
    assert LandingZone(root=str(tmp_path), max_chunks=3).limit_settings() == {"max_chunks": 3}
    monkeypatch.setenv(MAX_VALUE_BYTES_ENV, "0")
    with pytest.raises(InvalidSetting, match=MAX_VALUE_BYTES_ENV):
        LandingZone(root=str(tmp_path)).limit_settings()


def test_values_over_the_limits_are_quarantined_with_their_positions_and_every_record_is_counted(spark, tmp_path):
    """A gzip, chunked store read with low limits: whole values above ``max_value_bytes`` once decompressed and
    manifests naming more chunks than ``max_chunks`` are quarantined VALUE_TOO_LARGE, each with its Kafka position
    (a gap of one position), and read = accepted + quarantined + skipped. Catches a refused record without its
    position (an invisible gap), one that vanishes from the accounting, and a limit applied to the compressed size."""
    import json

    from pipelines.venice.values import Limits
    from replica_lens.simulator import SimulationConfig, simulate

    config = SimulationConfig(seed=5, regions=2, partitions=1, keys=30, writes=300, file_format="venice-kafka",
                              compression="gzip", chunk_above=40)
    summary = simulate(tmp_path, "limits", config)
    truth = json.loads(Path(summary["ground_truth"]).read_text())["venice"]
    clusters, u = parse_cluster_regions(truth["cluster_regions"]), truth["clock_uncertainty_ms"]
    limit = 4  # the simulated whole values are 3 to 5 bytes (the chunked ones 80 and more): some are above it
    judgement = judge_rows(read_snapshot_lines(spark, summary["snapshot_dir"], VeniceSettings(
        clusters, u, limits=Limits(max_value_bytes=limit, max_chunks=1))), "limits")
    accepted = judgement.accepted.collect()
    quarantined = judgement.quarantine().collect()
    skipped = judgement.skipped_by_reason()
    counts = accounting_from_tables(judgement.accepted, judgement.quarantined, skipped)
    assert {r["reason"] for r in quarantined} == {"VALUE_TOO_LARGE"}
    assert all(None not in (r["replica"], r["topic"], r["partition"], r["offset"]) for r in quarantined)
    assert counts["rows_read"] == sum(pq.read_metadata(p).num_rows for p in Path(summary["snapshot_dir"]).glob("*.parquet"))
    assert counts["rows_read"] == counts["rows_accepted"] + counts["rows_quarantined"] + counts["rows_skipped"]
    kept = [len(base64.b64decode(r["value"].split(":", 1)[1])) for r in accepted if r["kind"] == "PUT"]
    assert kept and max(kept) <= limit
    # Both limits refused something: whole values (schema id >= 0) above max_value_bytes, manifests (-20) naming
    # more than one chunk. The quarantine keeps the Kafka record, so its envelope is read back here.
    def schema_id(raw: str) -> int:
        value = base64.b64decode(json.loads(raw)["value_base64"])
        return fastavro.schemaless_reader(io.BytesIO(value[2:]), envelope_schema(value[1]), None)["payloadUnion"]["schemaId"]

    refused = {schema_id(r["raw"]) >= 0 for r in quarantined}
    assert refused == {True, False}, refused


def test_a_row_group_holding_a_page_over_the_line_limit_is_quarantined_and_the_rest_decodes_as_before(spark, tmp_path):
    """One replica's file rewritten in row groups of 16 records, a middle one holding a record whose Kafka value is
    larger than the line limit: that row group's records are PAGE_TOO_LARGE at their Kafka positions (never given to
    a Parquet reader, never decoded), and every other record has the outcome it has in the file as written. Catches
    a large page read whole (Spark's reader, or the skipped positions' second pass over the files), a row group's
    records lost from the accounting, and the other row groups of a guarded file decoded differently or twice."""
    import json
    import shutil

    from pipelines.ingest.reading import read_skipped_positions
    from replica_lens.simulator import SimulationConfig, simulate

    config = SimulationConfig(seed=8, regions=2, partitions=1, keys=20, writes=120, file_format="venice-kafka",
                              push_control_messages=True)
    summary = simulate(tmp_path / "as-written", "s", config)
    truth = json.loads(Path(summary["ground_truth"]).read_text())["venice"]
    settings = VeniceSettings(parse_cluster_regions(truth["cluster_regions"]), truth["clock_uncertainty_ms"])
    limit, rows_per_group = 16384, 16  # above the pages of many small values (a writer cuts a page per 1024 rows)
    written = Path(summary["snapshot_dir"])
    guarded = tmp_path / "guarded" / "s"
    shutil.copytree(written, guarded)
    (path,) = [p for p in sorted(guarded.glob("*.parquet")) if p.name.startswith("dc-a")][:1]
    table = pq.read_table(path)
    big = 2 * rows_per_group + 3  # a record of the third row group
    values = table.column("value").to_pylist()
    values[big] = values[big] + b"\x00" * (2 * limit)
    table = table.set_column(table.schema.get_field_index("value"), "value", pa.array(values, pa.binary()))
    pq.write_table(table, path, row_group_size=rows_per_group)
    held = {(table.column("region")[i].as_py(), table.column("offset")[i].as_py())
            for i in range(2 * rows_per_group, 3 * rows_per_group)}

    def outcomes(folder):
        judgement = judge_rows(read_snapshot_lines(spark, str(folder), settings, limit), "s")
        rows = [("accepted", r["replica"], r["offset"], r["kind"]) for r in judgement.accepted.collect()]
        rows += [(r["reason"], r["replica"], r["offset"], None) for r in judgement.quarantine().collect()]
        skipped = [("skipped", r["replica"], r["offset"], r["reason"])
                   for r in read_skipped_positions(spark, str(folder), "s", settings, limit).collect()]
        return sorted(rows + skipped, key=str), judgement

    before, _ = outcomes(written)
    after, judgement = outcomes(guarded)
    assert sorted((r[1], r[2]) for r in after if r[0] == "PAGE_TOO_LARGE") == sorted(held)
    assert [r for r in after if (r[1], r[2]) not in held] == [r for r in before if (r[1], r[2]) not in held]
    counts = accounting_from_tables(judgement.accepted, judgement.quarantined, judgement.skipped_by_reason())
    assert counts["rows_read"] == sum(pq.read_metadata(p).num_rows for p in guarded.glob("*.parquet"))
    (detail,) = {r["detail"] for r in judgement.quarantine().collect() if r["reason"] == "PAGE_TOO_LARGE"}
    assert detail.startswith(f"PAGE_TOO_LARGE: row group 2 of {path.name} ({rows_per_group} rows) has a page of ")


def test_a_topic_without_push_settings_is_kept_and_named_and_the_others_are_audited(spark, tmp_path):
    """Three version topics dumped mid-stream (snapshot "two"): the settings file names one, an earlier snapshot
    ("one", audited first) holds another's START_OF_PUSH, the third has neither. The audit succeeds, takes the second
    topic's settings from the earlier snapshot (and continues its state), keeps every record of the third in the
    quarantine (UNKNOWN_PUSH_SETTINGS) and names it in the summary, in --json and in the failed ingestion check.
    Catches one unknown topic stopping the whole snapshot (no table written, as before), its records lost from the
    accounting, a topic left out silently, and a continuing dump that needs its settings given by hand although the
    snapshot it continues declared them."""
    import dataclasses
    import json

    from replica_lens.audit import audit_document, run_audit, summary_lines
    from replica_lens.simulator import SimulationConfig, simulate

    start = 40  # the offset the dumps of snapshot "two" start at
    config = SimulationConfig(seed=7, regions=2, topics=3, partitions=1, keys=20, writes=240,
                              file_format="venice-kafka", compression="gzip", mid_stream_from=start)
    summary = simulate(tmp_path / "landing", "two", config)
    truth = json.loads(Path(summary["ground_truth"]).read_text())["venice"]
    named = json.loads((tmp_path / "landing" / truth["push_settings_file"]).read_text())
    kept_topic, carried_topic, audited_topic = sorted(named)
    # "one": the carried topic's records before offset start, START_OF_PUSH first (the whole stream simulated again).
    whole = simulate(tmp_path / "whole", "whole", dataclasses.replace(config, mid_stream_from=None))
    one = tmp_path / "landing" / "one"
    one.mkdir()
    for path in sorted(Path(whole["snapshot_dir"]).glob(f"*.{carried_topic}.*.kafka.parquet")):
        table = pq.read_table(path)
        pq.write_table(table.filter(pa.compute.less(table.column("offset"), start)), one / path.name)
    (one / "_SUCCESS").write_text("")
    settings_file = tmp_path / "one-topic.json"
    settings_file.write_text(json.dumps({audited_topic: named[audited_topic]}))
    settings = dict(spark_master="local[2]", delta_jars_dir=None, shuffle_partitions=4,
                    cluster_regions=truth["cluster_regions"], venice_clock_uncertainty_ms=truth["clock_uncertainty_ms"],
                    venice_push_settings=str(settings_file), scope="divergence")  # the ingest's outcome only
    assert run_audit("one", str(tmp_path / "landing"), str(tmp_path / "warehouse"), **settings).success
    audit = run_audit("two", str(tmp_path / "landing"), str(tmp_path / "warehouse"), **settings)
    assert audit.success, audit.error
    document = audit_document(audit)
    assert list(document["topics_not_audited"]) == [kept_topic] and document["topics_not_audited"][kept_topic] > 0
    assert document["push_settings_from"] == {audited_topic: "settings file", carried_topic: "carried from one"}
    assert document["push_settings_disagreements"] == {}
    assert "no push settings file names it" in document["why_not_audited"][kept_topic]
    assert any(line.strip().startswith(f"{kept_topic}: it holds data records") for line in summary_lines(audit))
    assert document["quarantined_by_reason"] == {"UNKNOWN_PUSH_SETTINGS": document["topics_not_audited"][kept_topic]}
    rows = document["rows"]
    assert rows["read"] == rows["accepted"] + rows["quarantined"] + rows["skipped"]
    assert "raw_topic_snapshots:every_topic_decoded" in audit.failed_checks
    assert any(f"not audited, their push settings unknown: {kept_topic}" in line for line in summary_lines(audit))
    compared = audit.metadata["divergence_reports"]["keys_compared"]
    assert compared > 0, "the topics with settings must be audited"
    # The carried topic continued the state of "one": its keys last written before offset start are compared too.
    carried_from = audit.metadata["divergence_reports"]["carried_from"]
    assert {(c["topic"], c["previous_snapshot_id"]) for c in carried_from} == {(carried_topic, "one")}


def test_push_settings_come_from_the_snapshot_then_the_file_then_earlier_snapshots_and_disagreements_are_named(
    spark, tmp_path
):
    """Catches the file or an earlier snapshot overriding the snapshot's own START_OF_PUSH, a disagreement between
    them passing unreported, and earlier snapshots that disagree among themselves taken at random."""
    from pipelines.venice.frame import resolve_push_settings
    from pipelines.venice.values import GZIP, NO_OP, ZSTD, PushSettings

    gzip_push = PushSettings(False, GZIP)
    rows = spec_rows("dc-a")  # START_OF_PUSH (GZIP) and data of TOPIC; data only of "t2", "t3" and "t4"
    rows += [{**rows[1], "topic": topic, "offset": 10 + n} for n, topic in enumerate(("t2", "t3", "t4"))]
    encoded_rows = [encode_record(row, region_clusters=REGIONS, clock_uncertainty_ms=U, push=gzip_push) for row in rows]
    frame = spark.createDataFrame(
        [(bytes(r.key), bytes(r.value), row["topic"], 0, row["offset"]) for row, r in zip(rows, encoded_rows)],
        "key binary, value binary, topic string, partition int, offset long")
    earlier = {TOPIC: {PushSettings(False, NO_OP): ["s0"]}, "t2": {PushSettings(True, ZSTD): ["s0"]},
               "t3": {gzip_push: ["s0"], PushSettings(False, NO_OP): ["s1"]}}
    resolved = resolve_push_settings(frame, {"t2": gzip_push}, lambda topics: {t: earlier[t] for t in topics
                                                                              if t in earlier})
    assert resolved.settings == {TOPIC: gzip_push, "t2": gzip_push}
    assert resolved.sources == {TOPIC: "START_OF_PUSH", "t2": "settings file"}
    assert set(resolved.refused) == {"t3", "t4"}
    assert "earlier snapshots' START_OF_PUSH records declare different settings" in resolved.refused["t3"]
    assert "no push settings file names it" in resolved.refused["t4"]
    assert "earlier snapshots' START_OF_PUSH declared NO_OP (snapshot s0)" in resolved.disagreements[TOPIC]
    assert resolved.disagreements["t2"].startswith("used GZIP (settings file)")


@pytest.mark.slow
def test_a_value_at_the_default_limit_passes_whole_through_spark_and_one_byte_more_is_refused(spark, tmp_path):
    """A GZIP PUT whose value is exactly the default limit (16 MiB) once decompressed is accepted whole through the
    decoder, the JSON judging and its Variant; one a byte larger is quarantined VALUE_TOO_LARGE with its position;
    a limit above what a record can carry whole is refused as a setting. Catches a hidden ceiling on the way
    (Jackson's 20-million-character strings quarantined a 16 MiB value as MALFORMED_JSON, without its position)."""
    import hashlib

    from pipelines.venice.values import DEFAULT_MAX_VALUE_BYTES, GZIP, MAX_SUPPORTED_VALUE_BYTES, Limits, PushSettings

    push = PushSettings(False, GZIP)
    base = {"replica": "dc-a", "topic": TOPIC, "partition": 0}
    largest = (b"0123456789abcdef" * (DEFAULT_MAX_VALUE_BYTES // 16 + 1))[:DEFAULT_MAX_VALUE_BYTES]
    rows = [{**base, "offset": 0, "kind": "START_OF_PUSH"}]
    for offset, key, value in ((1, "azE=", largest), (2, "azI=", largest + b"!")):
        rows.append({**base, "offset": offset, "kind": "PUT", "key": key, "source_region": "dc-a",
                     "source_offset": offset, "write_ts": 1_000 << 18, "leader_epoch": 2,
                     "value": "1:" + base64.b64encode(value).decode("ascii")})
    records = []
    for row in rows:
        rec = encode_record(row, region_clusters=REGIONS, clock_uncertainty_ms=U, push=push)
        records.append((rec.key, rec.value, row["offset"], rec.timestamp_ms))
    del rows
    folder = tmp_path / "large"
    write_snapshot(folder, {"dc-a": records})
    judgement = judge_rows(read_snapshot_lines(spark, str(folder), VeniceSettings(CLUSTERS, U)), "large")
    from pyspark.sql import functions as F

    accepted = judgement.accepted.select("offset", F.sha2("value", 256).alias("digest")).collect()
    quarantined = judgement.quarantine().select("offset", "reason").collect()
    assert [(r["offset"], r["digest"]) for r in accepted] == [
        (0, None), (1, hashlib.sha256(("1:" + base64.b64encode(largest).decode("ascii")).encode()).hexdigest())]
    assert [(r["offset"], r["reason"]) for r in quarantined] == [(2, "VALUE_TOO_LARGE")]
    assert Limits.checked() == Limits()
    with pytest.raises(InvalidSetting, match="at most"):
        Limits.checked(max_value_bytes=MAX_SUPPORTED_VALUE_BYTES + 1)
