"""The watermarks step takes its region universe from the write of ``partition_watermarks``, not from a query."""
from __future__ import annotations

import shutil

import pytest

import pipelines.watermarks
from pipelines.vectors import PARTITION_VECTORS, partition_regions, universe
from replica_lens.audit import run_audit
from tests.rows import EXAMPLES

SETTINGS = {"spark_master": "local[2]", "delta_jars_dir": None, "shuffle_partitions": 4}
SNAPSHOT = "two-regions"


def test_the_universe_of_the_partition_vectors_holds_the_keys_of_l_end_and_p_once(spark):
    """Catches: what the write observes (and ``partition_regions`` collects) leaving P's keys out, failing
    on a null vector, or naming a region twice or unsorted."""
    frame = spark.createDataFrame(
        [({"dc-b": 3, "dc-a": 1}, None), ({"dc-a": 2}, {"dc-z": 1}), ({}, {}), (None, {"dc-a": 0})],
        "end_lower_bound map<string,bigint>, pre_history_bound map<string,bigint>",
    )
    observed = frame.agg(universe(vector_columns=PARTITION_VECTORS).alias("regions")).first()["regions"]
    assert observed == partition_regions(frame) == ["dc-a", "dc-b", "dc-z"]


@pytest.mark.slow
def test_the_watermarks_step_collects_no_region_universe_of_its_own(spark, tmp_path, monkeypatch):
    """Catches: the step collecting ``partition_regions`` (a Spark query on the audit's longest chain)
    although the write of ``partition_watermarks`` observed the same regions."""

    def no_query(*_args, **_kwargs):
        raise AssertionError("partition_regions was queried")

    monkeypatch.setattr(pipelines.watermarks, "partition_regions", no_query)
    shutil.copytree(EXAMPLES / SNAPSHOT, tmp_path / "landing" / SNAPSHOT)
    audit = run_audit(SNAPSHOT, str(tmp_path / "landing"), str(tmp_path / "warehouse"), **SETTINGS)
    assert audit.success, audit.error
    assert audit.metadata["reconstructed_watermarks"]["dagster/row_count"] > 0
