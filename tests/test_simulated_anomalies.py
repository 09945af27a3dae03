"""Each anomaly the simulator injects is found at exactly its row, and a clean simulation has none."""
from __future__ import annotations

import json

import pytest

from pipelines.anomalies import AnomalyBounds, find_stream_anomalies
from pipelines.exporters import exporter_inputs, exporter_regressions
from pipelines.ingest import read_snapshot_lines, validate_rows
from replica_lens.simulator import SimulationConfig, simulate

BASE = dict(seed=9, regions=3, partitions=2, keys=60, writes=900)
INJECTED = dict(
    failover_clock_behind=1,
    heartbeat_under_report=1,
    rewind=1,
    stalled_heartbeat=1,
    wide_clock_interval=1,
    exporter_regression=1,
)


def _audit_streams(spark, tmp_path, **knobs):
    simulate(str(tmp_path), "sim", SimulationConfig(**BASE, **knobs))
    truth = json.loads((tmp_path / "sim.ground_truth.json").read_text())
    accepted, quarantined = validate_rows(read_snapshot_lines(spark, str(tmp_path / "sim")), "sim")
    assert quarantined.count() == 0
    # Bounds just above what the healthy simulation produces: only injected rows break them.
    bounds = AnomalyBounds(
        heartbeat_gap_ms=truth["bounds"]["natural_max_heartbeat_gap_ms"],
        clock_uncertainty_ms=truth["bounds"]["natural_clock_interval_width_ms"],
    )
    found = {
        (r["anomaly"], r["replica"], r["topic"], r["partition"], r["offset"])
        for r in find_stream_anomalies(accepted, bounds).collect()
    }
    regressions = {
        (r["exporter"], r["replica"], r["topic"], r["partition"], r["exported_offset"])
        for r in exporter_regressions(exporter_inputs(accepted)).collect()
    }
    return truth, found, regressions


def _expected(truth: dict) -> tuple[set, set]:
    """The injected anomalies as (anomaly, replica, topic, partition, offset), and the exporter regressions."""
    expected, expected_regressions = set(), set()
    for a in truth["anomalies"]:
        if a["anomaly"] == "EXPORTER_REGRESSION":
            expected_regressions.add((a["exporter"], a["replica"], a["topic"], a["partition"], a["exported_offset"]))
            continue
        for offset in a.get("offsets") or [a["offset"]]:
            expected.add((a["anomaly"], a["replica"], a["topic"], a["partition"], offset))
    return expected, expected_regressions


@pytest.mark.slow
def test_a_clean_simulation_has_no_anomaly(spark, tmp_path):
    _, found, regressions = _audit_streams(spark, tmp_path)
    assert found == set() and regressions == set()


@pytest.mark.slow
def test_every_injected_anomaly_is_found_at_its_row_and_nowhere_else(spark, tmp_path):
    truth, found, regressions = _audit_streams(spark, tmp_path, **INJECTED)
    expected, expected_regressions = _expected(truth)
    causes = {a["cause"] for a in truth["anomalies"]}
    assert causes == set(INJECTED), f"the simulator could not place every anomaly: {truth['warnings']}"
    assert found == expected
    assert regressions == expected_regressions


@pytest.mark.slow
def test_the_audit_writes_every_injected_anomaly_to_its_table(spark, tmp_path):
    """The same anomalies through the assets, as `replica-lens audit` runs them. DATA_BEYOND_HEARTBEAT reads the
    snapshot's heartbeat segments and their summary: catches the stream_anomalies asset not depending on them (run
    beside the segments step, it would read no segments and miss every DATA_BEYOND_HEARTBEAT) or reading another
    snapshot's."""
    import dagster as dg

    from replica_lens.audit import run_audit
    from replica_lens.definitions import build_definitions
    from resources.delta_store import DeltaStore
    from schemas.registry import struct_for

    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    # Declared upstream, so that no executor runs the step before the segments are committed.
    graph = build_definitions(landing_root=str(landing), warehouse_root=str(warehouse)).resolve_asset_graph()
    parents = {key.to_user_string() for key in graph.get(dg.AssetKey("stream_anomalies")).parent_keys}
    assert parents >= {"raw_topic_snapshots", "heartbeat_segments", "heartbeat_segment_summary"}
    simulate(str(landing), "sim", SimulationConfig(**BASE, **INJECTED))
    truth = json.loads((landing / "sim.ground_truth.json").read_text())
    audit = run_audit("sim", str(landing), str(warehouse), spark_master="local[2]", delta_jars_dir=None,
                      shuffle_partitions=4, scope="divergence")  # the stream pass's anomalies; no lag or exporters
    assert audit.success, audit.error
    rows = DeltaStore(warehouse_root=str(warehouse)).read_snapshot(
        spark, "stream_anomalies", "sim", struct_for("stream_anomalies")
    ).collect()
    # The audit runs with the default time bounds, not the simulation's own: the anomalies of positions only.
    timed = {"HEARTBEAT_GAP", "CLOCK_UNCERTAINTY"}
    expected = {row for row in _expected(truth)[0] if row[0] not in timed}
    assert {a for a, *_ in expected} >= {"DATA_BEYOND_HEARTBEAT", "DUPLICATE_OR_REWIND", "HEARTBEAT_REGRESSION"}
    found = {(r["anomaly"], r["replica"], r["topic"], r["partition"], r["offset"]) for r in rows}
    assert {row for row in found if row[0] not in timed} == expected
