"""The region universe of ``partition_watermarks`` (what the carried state's bounds are laid out over).

The audit's stream pass needs no universe at all: each stream's vectors are laid out over the regions that
stream names (``pipelines/stream_pass.py``).
"""
from __future__ import annotations

from pipelines.vectors import PARTITION_VECTORS, partition_regions, universe


def test_the_universe_of_the_partition_vectors_holds_the_keys_of_l_end_and_p_once(spark):
    """Catches: what the write observes (and ``partition_regions`` collects) leaving P's keys out, failing
    on a null vector, or naming a region twice or unsorted."""
    frame = spark.createDataFrame(
        [({"dc-b": 3, "dc-a": 1}, None), ({"dc-a": 2}, {"dc-z": 1}), ({}, {}), (None, {"dc-a": 0})],
        "end_lower_bound map<string,bigint>, pre_history_bound map<string,bigint>",
    )
    observed = frame.agg(universe(vector_columns=PARTITION_VECTORS).alias("regions")).first()["regions"]
    assert observed == partition_regions(frame) == ["dc-a", "dc-b", "dc-z"]
