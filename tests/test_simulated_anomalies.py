"""Each anomaly the simulator injects is found at exactly its row, and a clean simulation has none."""
from __future__ import annotations

import json

import pytest

from pipelines.anomalies import AnomalyBounds, find_stream_anomalies
from pipelines.exporters import exporter_regressions
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
        for r in exporter_regressions(accepted).collect()
    }
    return truth, found, regressions


@pytest.mark.slow
def test_a_clean_simulation_has_no_anomaly(spark, tmp_path):
    _, found, regressions = _audit_streams(spark, tmp_path)
    assert found == set() and regressions == set()


@pytest.mark.slow
def test_every_injected_anomaly_is_found_at_its_row_and_nowhere_else(spark, tmp_path):
    truth, found, regressions = _audit_streams(spark, tmp_path, **INJECTED)
    expected = set()
    expected_regressions = set()
    for a in truth["anomalies"]:
        if a["anomaly"] == "EXPORTER_REGRESSION":
            expected_regressions.add((a["exporter"], a["replica"], a["topic"], a["partition"], a["exported_offset"]))
            continue
        for offset in a.get("offsets") or [a["offset"]]:
            expected.add((a["anomaly"], a["replica"], a["topic"], a["partition"], offset))
    causes = {a["cause"] for a in truth["anomalies"]}
    assert causes == set(INJECTED), f"the simulator could not place every anomaly: {truth['warnings']}"
    assert found == expected
    assert regressions == expected_regressions
