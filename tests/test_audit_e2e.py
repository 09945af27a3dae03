"""The whole pipeline through Dagster, as `replica-lens audit` runs it."""
from __future__ import annotations

import json
import re
import shutil
import threading
import time
from pathlib import Path

import dagster as dg
import pytest

from replica_lens.audit import audit_document, audit_instance, run_audit, summary_lines
from replica_lens.reference import find_gaps
from replica_lens.cli import main
from replica_lens.simulator import SimulationConfig, simulate
from resources.delta_store import DeltaStore
from schemas.registry import struct_for
from tests.explained import assert_explanations_equal_the_reference
from tests.rows import EXAMPLES, OPERATIONS_TABLES, PER_SNAPSHOT_TABLES

EXAMPLE = EXAMPLES
SETTINGS = {"spark_master": "local[2]", "delta_jars_dir": None, "shuffle_partitions": 4}


def _reports(spark, warehouse: Path, snapshot_id: str) -> set[tuple]:
    store = DeltaStore(warehouse_root=str(warehouse))
    rows = store.read_snapshot(spark, "divergence_reports", snapshot_id, struct_for("divergence_reports")).collect()
    return {(r["topic"], r["partition"], r["replica_a"], r["replica_b"], r["key"], r["verdict"]) for r in rows}


def _table_counts(spark, warehouse: Path, snapshot_id: str) -> dict[str, int]:
    store = DeltaStore(warehouse_root=str(warehouse))
    return {t: store.read_snapshot(spark, t, snapshot_id, struct_for(t)).count() for t in PER_SNAPSHOT_TABLES}


class _Recorder:
    """A pipe-like stream that records when each line was written."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []

    def write(self, text: str) -> None:
        self.lines.extend((time.time(), line) for line in text.splitlines() if line.strip())

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


# The units a figure's name may say (rows, keys, files, positions ... milliseconds, hours, bytes).
UNIT = re.compile(r"(^|[_/ ])(rows?|keys?|key_pairs|files?|positions?|gaps|dumps|versions|partitions|states|bytes|"
                  r"ms|seconds|hours|violations|rules|tables|row_count|version|records|offsets|regions)(_|$| )")


@pytest.fixture()
def instance_lives(monkeypatch) -> dict[str, list]:
    """Dagster instances while the test runs: the ephemeral ones made ("made": instance, thread) and
    every disposal ("disposed": instance, thread)."""
    lives: dict[str, list] = {"made": [], "disposed": []}
    make, dispose = dg.DagsterInstance.ephemeral, dg.DagsterInstance.dispose

    def ephemeral(*args, **kwargs):
        instance = make(*args, **kwargs)
        lives["made"].append((instance, threading.get_ident()))
        return instance

    def recorded_dispose(self):
        lives["disposed"].append((self, threading.get_ident()))
        dispose(self)

    monkeypatch.setattr(dg.DagsterInstance, "ephemeral", staticmethod(ephemeral))
    monkeypatch.setattr(dg.DagsterInstance, "dispose", recorded_dispose)
    return lives


def test_only_the_cli_records_its_audits_in_dagster_home_and_every_instance_made_is_disposed_of(
    tmp_path, monkeypatch, instance_lives
):
    # Catches: run_audit or the benchmark's in-process audits filling the operator's DAGSTER_HOME
    # instance; the CLI ignoring DAGSTER_HOME (its runs would not show in the UI); an instance
    # made here left to the garbage collector; an instance handed in disposed of under its owner.
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))

    def disposed():
        return [instance for instance, _ in instance_lives["disposed"]]

    with audit_instance(from_dagster_home=True) as home:
        assert home.is_persistent and home.root_directory == str(tmp_path)
    with audit_instance() as own:
        assert not own.is_persistent
    assert disposed() == [home, own]
    with dg.DagsterInstance.ephemeral() as given:
        with audit_instance(given, from_dagster_home=True) as used:
            assert used is given
        assert disposed() == [home, own]
    assert disposed() == [home, own, given]


@pytest.fixture()
def example_landing(tmp_path) -> Path:
    landing = tmp_path / "landing"
    shutil.copytree(EXAMPLE / "two-regions", landing / "two-regions")
    return landing


@pytest.mark.slow
def test_the_shared_example_gives_exactly_the_expected_reports(spark, example_audit):
    # The audit is the session's (tests/conftest.py, example_audit): run_audit with its own instance and a
    # StepPrinter, into a warehouse of its own; tests/test_blocking_checks.py starts from a copy of its warehouse.
    warehouse, instance, printed, audit = (example_audit.warehouse, example_audit.instance, example_audit.printed,
                                           example_audit.audit)

    assert audit.success, audit.error
    # Step lines come as each step ends, not after the run (catches lines printed only once
    # the run is over, a step printed twice or never): the ingestion's line is out before
    # the divergence step starts.
    stats = {s.step_key: s for s in instance.get_run_step_stats(audit.run_id)}
    lines = {text.split()[1]: (at, text) for at, text in printed.lines}
    assert set(lines) == set(stats) and len(printed.lines) == len(stats)
    at, text = lines["raw_topic_snapshots"]
    assert "success" in text and "in 102" in text and "raw_topic_snapshots 102" in text, text
    assert "[quarantined 0]" in text, text
    assert at < stats["divergence_reports"].start_time
    # Rows in are the upstream table's rows out; the step's outcome is on its line.
    watermarks = audit.metadata["reconstructed_watermarks"]["dagster/row_count"]
    divergence = lines["divergence_reports"][1]
    assert f"in {watermarks}" in divergence and "[DIVERGENT 3, MISSING 0, IN_FLIGHT 0]" in divergence, divergence
    assert "[anomalies: DUPLICATE_OR_REWIND 5]" in lines["stream_pass"][1]
    assert "[worst p99 <= 382 ms (dc-a from dc-a)]" in lines["replication_lag"][1]
    assert audit.failed_checks == ["divergence_reports:no_proven_divergence"]
    expected = json.loads((EXAMPLE / "two-regions.expected.json").read_text())["expected_reports"]
    expected_keys = {(e["topic"], e["partition"], e["replica_a"], e["replica_b"], e["key"], e["verdict"]) for e in expected}
    proven = {r for r in _reports(spark, warehouse, "two-regions") if r[-1] in ("DIVERGENT", "MISSING")}
    assert proven == expected_keys
    # The failed check counts every proven key and lists them in order (catches counts taken over
    # the listed examples only, or examples out of order).
    checks = {
        (e.asset_key.to_user_string(), e.check_name): e
        for e in (r.dagster_event.event_specific_data
                  for r in instance.all_logs(audit.run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION))
    }
    failed = checks[("divergence_reports", "no_proven_divergence")]
    assert not failed.passed
    assert failed.metadata["keys_divergent"].value == len(expected_keys) and failed.metadata["keys_missing"].value == 0
    assert failed.metadata["key_pairs_divergent"].value == len(expected_keys)  # two replicas: a key pair per key
    fields = ("topic", "partition", "replica_a", "replica_b", "key", "verdict")
    assert [tuple(k[f] for f in fields) for k in failed.metadata["example_keys"].value] == sorted(expected_keys)
    for asset, name in (("replication_lag", "lag_within_bounds"), ("exporter_positions", "exporters_within_bounds")):
        assert checks[(asset, name)].passed and checks[(asset, name)].metadata["over_bound"].value == 0
    raw = audit.metadata["raw_topic_snapshots"]
    assert raw["rows_read"] == 102 and raw["rows_quarantined"] == 0 and raw["rows_accepted"] == 102
    # What Dagster's Plots tab draws across runs must be numbers (catches a count or lag stored as text or JSON).
    materialized = {
        e.asset_key.to_user_string(): e.metadata
        for e in (r.dagster_event.event_specific_data.materialization
                  for r in instance.all_logs(audit.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION))
    }
    lag = [name for name in materialized["replication_lag"] if name.startswith(("lag_p50_ms ", "lag_p99_ms "))]
    assert sorted(lag) == sorted(f"lag_{s}_ms {r}<-{o}" for s in ("p50", "p99") for r in ("dc-a", "dc-b")
                                 for o in ("dc-a", "dc-b")), lag
    assert all(isinstance(materialized["replication_lag"][name], dg.FloatMetadataValue) for name in lag)
    for asset, names in (("divergence_reports", ("keys_divergent", "keys_missing", "keys_in_flight")),
                         ("partition_watermarks", ("gaps", "gap_positions", "dumps_with_gaps"))):
        assert all(isinstance(materialized[asset][n], dg.IntMetadataValue) for n in names), materialized[asset]
    # Issue 71, item 6: every figure the Plots tab draws says its unit in its name, and a count is a whole number
    # (an int: a float count draws a 8.5-9.5 axis); only durations in milliseconds may be fractional.
    unitless = [(asset, name) for asset, values in materialized.items() for name, value in values.items()
                if isinstance(value, (dg.IntMetadataValue, dg.FloatMetadataValue)) and not UNIT.search(name)]
    fractional = [(asset, name) for asset, values in materialized.items() for name, value in values.items()
                  if isinstance(value, dg.FloatMetadataValue) and not name.split(" ")[0].endswith(("_ms", "_seconds"))]
    assert (unitless, fractional) == ([], []), "figures without their unit, or counts that are not whole numbers"
    # The report page beside the tables explains every proven key (catches a page that drops keys past a bound).
    page = Path(materialized["divergence_reports"]["report_page"].value)
    assert page.parent.parent == warehouse.resolve() / "_reports" and page.is_file()
    folded = set(re.findall(r'<details class="key" data-verdict="(\w+)" data-key="([^"]*)"', page.read_text()))
    assert folded == {("DIVERGENT", key[4]) for key in expected_keys}, folded
    # Every table of the run was written, each with its snapshot's rows only.
    assert set(PER_SNAPSHOT_TABLES) <= set(audit.metadata)


def test_a_divergence_scope_audit_writes_the_tables_of_a_whole_one_except_lag_and_exporters(
    example_audit, tmp_path, capsys
):
    """``scope="divergence"`` (``replica-lens audit --scope divergence``, a watched store's ``audit_scope``) against
    the shared example's whole audit. Catches a scope that drops a table the divergence step reads or writes (a
    multi-asset step cut in two: the stream pass or the ingest without some of its tables), rows that differ from
    the whole audit's, lag or exporter tables still computed, a run that does not record its selection (the UI would
    show the unselected assets as planned and never materialized), and an unknown scope accepted."""
    from deltalake import DeltaTable

    from replica_lens.cli import build_parser
    from resources.errors import UsageError

    warehouse = tmp_path / "warehouse"
    with dg.DagsterInstance.ephemeral() as instance:
        audit = run_audit("two-regions", str(example_audit.landing), str(warehouse), instance=instance,
                          scope="divergence", **SETTINGS)
        run = instance.get_run_by_id(audit.run_id)
    assert audit.success, audit.error
    whole = example_audit.audit
    assert set(whole.metadata) - set(audit.metadata) == OPERATIONS_TABLES
    assert {k.to_user_string() for k in run.asset_selection} == set(audit.metadata)
    assert audit_document(audit)["scope"] == "divergence" and audit_document(whole)["scope"] == "all"
    assert summary_lines(audit)[0].endswith("succeeded (scope divergence: no lag or exporter tables)")
    assert summary_lines(whole)[0].endswith("succeeded")
    assert audit.failed_checks == whole.failed_checks  # the same checks fail: none of lag or exporters ran
    for table in set(audit.metadata):
        def rows(root: Path) -> list[str]:
            return sorted(json.dumps(r, sort_keys=True, default=str)
                          for r in DeltaTable(str(root / table)).to_pyarrow_table().to_pylist())

        assert rows(warehouse) == rows(example_audit.warehouse), table
    assert not any((warehouse / table).exists() for table in OPERATIONS_TABLES)
    with pytest.raises(UsageError, match="unknown audit scope 'lag'"):
        run_audit("two-regions", str(example_audit.landing), str(warehouse), scope="lag", **SETTINGS)
    args = ["audit", "--landing", "l", "--warehouse", "w"]
    assert build_parser().parse_args(args + ["--scope", "divergence"]).scope == "divergence"
    assert build_parser().parse_args(args).scope == "all"
    with pytest.raises(SystemExit):
        build_parser().parse_args(args + ["--scope", "lag"])
    assert "invalid choice: 'lag'" in capsys.readouterr().err


@pytest.mark.slow
def test_a_complete_snapshot_without_data_files_is_audited_with_no_rows(spark, tmp_path):
    """A snapshot folder holding only ``_SUCCESS`` (a replica that had nothing to dump) is audited, not failed.

    Bug caught: Spark knows such a snapshot's lines are none before it runs anything and drops the
    ingestion's observations from its plan, whose reading then failed with a bare assertion error
    (every run of such a snapshot failed in ``raw_topic_snapshots``).
    """
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    (landing / "empty").mkdir(parents=True)
    (landing / "empty" / "_SUCCESS").write_text("")
    audit = run_audit("empty", str(landing), str(warehouse), **SETTINGS)
    assert audit.success, audit.error
    raw = audit.metadata["raw_topic_snapshots"]
    assert (raw["rows_read"], raw["rows_accepted"], raw["rows_quarantined"]) == (0, 0, 0)
    assert _table_counts(spark, warehouse, "empty") == dict.fromkeys(PER_SNAPSHOT_TABLES, 0)


@pytest.mark.slow
def test_a_simulated_snapshot_with_faults_reports_every_fault_and_nothing_else(spark, tmp_path):
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    config = SimulationConfig(
        seed=5, regions=3, partitions=2, keys=400, writes=1200, lost_writes=3, corrupted_values=3,
        duplicate_deliveries=3, conflicting_writes=3,
    )
    simulate(str(landing), "sim", config)
    truth = json.loads((landing / "sim.ground_truth.json").read_text())
    audit = run_audit("sim", str(landing), str(warehouse), **SETTINGS)
    assert audit.success, audit.error

    proven_keys = {(r[0], r[1], r[4]) for r in _reports(spark, warehouse, "sim") if r[-1] in ("DIVERGENT", "MISSING")}
    expected_keys = {(d["topic"], d["partition"], d["key"]) for d in truth["keys_differing_at_end"]}
    faulty_keys = {
        (f["topic"], f["partition"], f["key"])
        for f in truth["injected_faults"]
        if f["fault"] in ("lost_write", "corrupted_value")
    }
    assert expected_keys, "the simulation should have injected divergence that shows in the final states"
    # Live: every fault visible in the final states is proven. Safe: nothing is proven
    # without a fault (a fault later overwritten may still be proven, correctly).
    assert expected_keys <= proven_keys <= faulty_keys


@pytest.mark.slow
def test_the_cli_refuses_an_incomplete_or_unsafe_snapshot_id_with_exit_status_2(example_landing, tmp_path, capsys):
    # Catches an audit started on a half-written snapshot (no _SUCCESS) or on a path outside the landing folder.
    # (The summary and exit status of an audit that runs: the verbosity test below.)
    warehouse = tmp_path / "warehouse"
    (example_landing / "half-written").mkdir()  # no _SUCCESS: skipped, not read
    assert main(["audit", "--landing", str(example_landing), "--warehouse", str(warehouse),
                 "--snapshot-id", "half-written"]) == 2
    assert "incomplete" in capsys.readouterr().err
    assert main(["audit", "--landing", str(example_landing), "--warehouse", str(warehouse),
                 "--snapshot-id", "../etc"]) == 2
    assert not warehouse.exists() or not any(warehouse.iterdir())


@pytest.mark.slow
def test_the_cli_output_at_each_verbosity_and_its_json_document(
    spark, example_landing, tmp_path, capsys, instance_lives, monkeypatch
):
    # Catches: Dagster's event log (hundreds of DEBUG lines) back at default verbosity, --quiet
    # still printing step lines, --verbose losing the event log, anything but JSON on stdout
    # with --json -, and a JSON document missing or misreporting what the summary says; a
    # re-materialization that appends a second copy of a table's rows (or writes none); an exit code
    # that ignores --fail-on-divergence.
    # And the command's Dagster instance left to the garbage collector: when a step thread of a
    # later audit collected it, SQLAlchemy printed a traceback in that audit's output ("SQLite
    # objects created in a thread can only be used in that same thread").
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    warehouse = tmp_path / "warehouse"
    (example_landing / "half-written").mkdir()
    audit = ["audit", "--landing", str(example_landing), "--warehouse", str(warehouse), "--spark-master", "local[2]"]

    assert main([*audit, "--json", "-"]) == 0
    out = capsys.readouterr()
    document = json.loads(out.out)  # stdout holds the JSON document and nothing else
    assert "STEP_START" not in out.err and "DEBUG" not in out.err
    steps = [line for line in out.err.splitlines() if line.strip().startswith("step ")]
    assert any("raw_topic_snapshots" in line and "raw_topic_snapshots 102" in line for line in steps), steps
    assert any("divergence_reports" in line and "success" in line for line in steps), steps
    assert "rows read 102" in out.err and "DIVERGENT 3" in out.err
    assert "look at: divergence_reports: 3 key(s) proven" in out.err
    assert len(out.err.splitlines()) <= 40, out.err

    assert document["exit_code"] == 0
    assert "half-written" in out.err  # named as skipped in the summary too
    assert document["skipped"] == [{"snapshot_id": "half-written", "reason": "no _SUCCESS yet"}]
    (snapshot,) = document["snapshots"]
    assert snapshot["snapshot_id"] == "two-regions" and snapshot["success"] is True and snapshot["run_id"]
    assert snapshot["rows"] == {"read": 102, "accepted": 102, "quarantined": 0, "skipped": 0, "duplicates_collapsed": 0}
    assert snapshot["verdicts"]["divergent"] == 3 and snapshot["verdicts"]["compared"] >= 3
    assert snapshot["failed_checks"] == ["divergence_reports:no_proven_divergence"]
    assert set(snapshot["tables"]) == set(PER_SNAPSHOT_TABLES)
    assert all(isinstance(t["delta_version"], int) and t["rows"] >= 0 for t in snapshot["tables"].values())
    assert snapshot["tables"]["raw_topic_snapshots"]["rows"] == 102
    # One copy: every table holds the rows the run says it wrote (a write that appended, or wrote
    # nothing, fails here), the raw table the example's 102 distinct lines.
    counts = _table_counts(spark, warehouse, "two-regions")
    assert {t: snapshot["tables"][t]["rows"] for t in PER_SNAPSHOT_TABLES} == counts
    # The worst lag is the replication_lag row with the largest p99 (then staleness).
    store = DeltaStore(warehouse_root=str(warehouse))
    lag = store.read_snapshot(spark, "replication_lag", "two-regions", struct_for("replication_lag")).collect()
    top = max(lag, key=lambda r: (r["p99_upper_ms"], r["staleness_ms"]))
    assert snapshot["worst_lag"] == {
        k: top[k] for k in ("replica", "origin_region", "p99_upper_ms", "max_upper_ms", "staleness_ms")
    }

    report = tmp_path / "audit.json"
    assert main([*audit, "--snapshot-id", "two-regions", "--quiet", "--json", str(report)]) == 0
    out = capsys.readouterr()
    assert "rows read 102" in out.out and "step " not in out.out and "STEP_START" not in out.out + out.err
    again = json.loads(report.read_text())["snapshots"][0]
    # Re-materialized: every table's Delta version moved on, and still holds one copy of its rows.
    assert all(again["tables"][t]["delta_version"] > snapshot["tables"][t]["delta_version"] for t in again["tables"])
    assert _table_counts(spark, warehouse, "two-regions") == counts
    assert {t: again["tables"][t]["rows"] for t in PER_SNAPSHOT_TABLES} == counts

    # --fail-on-divergence: the same audit exits 3 when a divergence is proven.
    assert main([*audit, "--snapshot-id", "two-regions", "--verbose", "--fail-on-divergence"]) == 3
    out = capsys.readouterr()
    assert "STEP_START" in out.out + out.err
    # Without --json the summary goes to stdout.
    assert "snapshot two-regions" in out.out and "rows read 102" in out.out and "DIVERGENT 3" in out.out
    # One instance per command, disposed of before it returned, by the thread that made it.
    made, disposals = instance_lives["made"], instance_lives["disposed"]
    assert len(made) == 3, made
    assert sorted((id(i), thread) for i, thread in made) == sorted((id(i), thread) for i, thread in disposals), (
        instance_lives
    )


def test_a_compacted_lossy_snapshot_shows_its_gaps_and_proves_only_what_the_complete_topic_proves(spark, tmp_path):
    # Catches: gaps not detected (or miscounted) in partition_watermarks, the materialization, the
    # summary or --json; and a proof on the damaged dump that the complete topic does not make
    # (today's rules across gaps prove dozens of such keys on this snapshot).
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    config = SimulationConfig(
        seed=11, regions=3, partitions=2, keys=300, writes=1500, lost_writes=3, corrupted_values=2,
        conflicting_writes=3, compact_below=0.6, lose_records=0.03,
    )
    simulate(str(landing), "damaged", config)
    truth = json.loads((landing / "damaged.ground_truth.json").read_text())
    audit = run_audit("damaged", str(landing), str(warehouse), **SETTINGS)
    assert audit.success, audit.error

    store = DeltaStore(warehouse_root=str(warehouse))
    raw = store.read_snapshot(spark, "raw_topic_snapshots", "damaged", struct_for("raw_topic_snapshots")).collect()
    offsets: dict[tuple, list[int]] = {}
    for r in raw:
        if r["offset"] is not None:
            offsets.setdefault((r["replica"], r["topic"], r["partition"]), []).append(r["offset"])
    expected = {place: find_gaps(found) for place, found in offsets.items()}
    parts = store.read_snapshot(spark, "partition_watermarks", "damaged", struct_for("partition_watermarks")).collect()
    assert {(p["replica"], p["topic"], p["partition"]): (p["gaps"], p["gap_positions"], p["first_gap_offset"],
                                                          p["last_gap_offset"]) for p in parts} == {
        place: (len(gaps), sum(b - a + 1 for a, b in gaps), gaps[0][0] if gaps else None, gaps[-1][1] if gaps else None)
        for place, gaps in expected.items()
    }
    gapped = sorted(place for place, gaps in expected.items() if gaps)
    assert gapped, "compaction below 60% must leave gaps"
    metadata = audit.metadata["partition_watermarks"]
    assert metadata["dumps_with_gaps"] == len(gapped)
    assert metadata["gap_positions"] == sum(p["gap_positions"] for p in parts)
    assert [d["dump"] for d in metadata["dumps_with_gaps_listed"]] == sorted(f"{r}/{t}/{p}" for r, t, p in gapped)
    summary = "\n".join(summary_lines(audit))
    assert f"gaps: {len(gapped)} dump(s) miss {metadata['gap_positions']} position(s)" in summary
    assert "proofs are limited" in summary
    document = audit_document(audit)
    assert document["gaps"]["proofs_limited"] is True and document["gaps"]["dumps_with_gaps"] == len(gapped)

    # `replica-lens explain` on the dump with gaps: reach rows cut at gaps, U after a gap, ⊥ over the first gap.
    assert assert_explanations_equal_the_reference(str(warehouse), "damaged") >= 30

    on_topic = {(p["topic"], p["partition"], p["replica_a"], p["replica_b"], p["key"])
                for p in truth["damage"]["complete_topic_proofs"]}
    proven = {r[:5] for r in _reports(spark, warehouse, "damaged") if r[-1] in ("DIVERGENT", "MISSING")}
    assert proven <= on_topic, proven - on_topic
