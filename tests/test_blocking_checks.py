"""A failing blocking schema check stops the stages downstream of it, and says why."""
from __future__ import annotations

import shutil

import pytest
from pyspark.sql import functions as F

import assets.watermarks
from replica_lens.audit import run_audit
from tests.rows import EXAMPLES

SETTINGS = {"spark_master": "local[2]", "delta_jars_dir": None, "shuffle_partitions": 4}


@pytest.mark.slow
def test_a_table_that_breaks_its_schema_blocks_the_divergence_stage(spark, tmp_path, monkeypatch):
    landing = tmp_path / "landing"
    shutil.copytree(EXAMPLES / "two-regions", landing / "two-regions")
    real = assets.watermarks.reconstruct_watermarks

    def broken(*args):  # a regression that writes negative offsets
        return real(*args).withColumn("offset", F.lit(-1).cast("bigint"))

    monkeypatch.setattr(assets.watermarks, "reconstruct_watermarks", broken)
    audit = run_audit("two-regions", str(landing), str(tmp_path / "warehouse"), **SETTINGS)

    assert not audit.success
    assert "reconstructed_watermarks:matches_schema" in audit.failed_checks
    assert "divergence_reports" not in audit.metadata  # never materialized from the bad table
    assert "heartbeat_segments" in audit.metadata and "stream_anomalies" in audit.metadata
    assert audit.error and "matches_schema" in audit.error
