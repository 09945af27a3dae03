"""Reconstructed watermarks (SPEC section 3): ``L``, ``P``, ``U`` and ``M`` from the annotated segments.

- ``L(p)`` comes with every row from ``annotate_segments``; ``L(end)`` is the max of
  every contribution of the dump (``L`` of the last row joined with its contribution).
- ``P``, the pre-history bound of a dump: ``{}`` when it starts with START_OF_PUSH,
  else the ``hb_vector`` of its first heartbeat that has one, else unknown (null).
- ``U(r)``: ``max(P, {source_region: source_offset} of every data row of the key up to
  and including r)``, a running max per key (null when ``P`` is unknown).
- ``M(r)``: ``L`` of the key's next data row, or ``L(end)`` for the key's last row.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.segments import PARTITION_KEYS, end_bounds, rows_at
from pipelines.vectors import conform, empty_vector, partition_regions, running_max_single
from schemas.raw import DATA_KINDS
from schemas.watermarks import PartitionWatermarks, ReconstructedWatermarks

TOMBSTONE = "TOMBSTONE"


def value_token() -> Column:
    """The content a version holds, comparable by equality: sha256 of a PUT's value, TOMBSTONE for a DELETE."""
    return F.when(F.col("kind") == "DELETE", F.lit(TOMBSTONE)).otherwise(F.sha2(F.col("value"), 256))


def _partition_bounds(annotated: DataFrame) -> DataFrame:
    """Per replica partition: offsets and counts by a hash aggregation, vectors from the rows that hold them.

    The first heartbeat with a vector and the last row are found by their offsets and read
    back by a broadcast join (``rows_at``): no aggregate carries maps through a sort.
    """
    kind = F.col("kind")
    is_heartbeat_with_vector = (kind == "HEARTBEAT") & F.col("hb_vector").isNotNull()

    def count_of(condition: Column) -> Column:
        return F.sum(condition.cast(T.LongType()))

    counts = annotated.groupBy(*PARTITION_KEYS).agg(
        F.min("offset").alias("first_offset"),
        F.max("offset").alias("last_offset"),
        F.min(F.when(kind == "START_OF_PUSH", F.col("offset"))).alias("first_sop_offset"),
        F.min(F.when(is_heartbeat_with_vector, F.col("offset"))).alias("first_hb_offset"),
        F.count(F.lit(1)).alias("rows"),
        count_of(kind == "PUT").alias("puts"),
        count_of(kind == "DELETE").alias("deletes"),
        count_of(kind == "HEARTBEAT").alias("heartbeats"),
    )
    first_hb = rows_at(
        annotated.select(*PARTITION_KEYS, "offset", "hb_vector"),
        counts.where(F.col("first_hb_offset").isNotNull()).select(*PARTITION_KEYS, F.col("first_hb_offset").alias("offset")),
    ).select(*PARTITION_KEYS, F.col("hb_vector").alias("first_hb_vector"))
    ends = end_bounds(annotated, counts.select(*PARTITION_KEYS, F.col("last_offset").alias("offset")))
    bounds = (
        counts.join(F.broadcast(first_hb), on=list(PARTITION_KEYS), how="left")
        .join(F.broadcast(ends), on=list(PARTITION_KEYS), how="left")
        .withColumn("starts_with_sop", F.coalesce(F.col("first_sop_offset") == F.col("first_offset"), F.lit(False)))
    )
    pre_history = F.when(F.col("starts_with_sop"), empty_vector()).otherwise(F.col("first_hb_vector"))
    return bounds.withColumn("pre_history_bound", pre_history).withColumn(
        "pre_history_known", F.col("pre_history_bound").isNotNull()
    )


def partition_watermarks(annotated: DataFrame) -> DataFrame:
    """One row per replica partition: first/last offset, ``P``, ``L(end)``, final resolved timestamp, counts."""
    return conform(_partition_bounds(annotated), PartitionWatermarks.to_structtype())


def reconstruct_watermarks(annotated: DataFrame, partitions: DataFrame | None = None) -> DataFrame:
    """One row per PUT/DELETE with its content token, ``L``, ``U`` (null when ``P`` is unknown) and ``M``.

    ``partitions`` is ``partition_watermarks(annotated)`` when the caller already has it
    (the asset passes the table it just wrote): ``P`` and ``L(end)`` then come from its
    few rows instead of another aggregation over every row.
    """
    data = annotated.where(F.col("kind").isin(*DATA_KINDS))
    partitions = partitions if partitions is not None else _partition_bounds(annotated)
    regions = partition_regions(partitions)
    bounds = partitions.select(*PARTITION_KEYS, "pre_history_bound", "end_lower_bound")
    by_key = Window.partitionBy(*PARTITION_KEYS, "key").orderBy("offset")
    # U = max(P, the key's {source_region: source_offset} so far): P's regions are in ``regions``.
    touched = running_max_single(
        F.col("source_region"),
        F.col("source_offset"),
        regions,
        by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow),
        floor=F.col("pre_history_bound"),
    )
    next_lower_bound = F.lead("applied_lower_bound", 1).over(by_key.rowsBetween(1, 1))
    rows = data.join(F.broadcast(bounds), on=list(PARTITION_KEYS), how="inner").select(
        "*",
        value_token().alias("value_hash"),
        F.when(F.col("pre_history_bound").isNotNull(), touched).alias("touch_bound"),
        F.coalesce(next_lower_bound, F.col("end_lower_bound")).alias("reach"),
    )
    return conform(rows, ReconstructedWatermarks.to_structtype())
