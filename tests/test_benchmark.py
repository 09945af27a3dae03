"""The benchmark command keeps working: a tiny run reports every step, both floors and valid JSON.

Timings are not asserted (they belong in the benchmark itself, never in tests); only that
the figures are there, consistent with each other, and that the audit succeeded.
"""
from __future__ import annotations

import json

import pytest

from replica_lens.benchmark import STEP_INPUTS, benchmark


@pytest.mark.slow
def test_a_small_benchmark_reports_every_step_and_both_floors(spark, tmp_path):
    out = tmp_path / "bench.json"
    report = benchmark(rows=3_000, variants=("uniform", "hot"), out=str(out), workdir=str(tmp_path / "work"))

    assert json.loads(out.read_text()) == json.loads(json.dumps(report))
    assert [v["variant"] for v in report["variants"]] == ["uniform", "hot"]
    assert report["hot_to_uniform"] > 0
    for variant in report["variants"]:
        assert variant["success"]
        assert variant["version_topic_rows"] > 2_000
        assert variant["floor_seconds"] > 0 and variant["parse_floor_seconds"] > 0
        assert variant["ratio_to_floor"] == pytest.approx(variant["audit_seconds"] / variant["floor_seconds"], rel=0.1)  # floors are rounded to 10 ms
        steps = {s["step"]: s for s in variant["steps"]}
        assert set(STEP_INPUTS) <= set(steps)
        assert steps["raw_topic_snapshots"]["rows_in"] == variant["version_topic_rows"]
        assert steps["raw_topic_snapshots"]["rows_out"]["raw_topic_snapshots"] > 0
        assert steps["divergence_reports"]["rows_out"]["divergence_summary"] > 0
        assert all(s["seconds"] >= 0 and s["peak_jvm_mib"] > 0 for s in steps.values())
