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

from pipelines.segments import PARTITION_KEYS, bound_after_last_row
from pipelines.vectors import conform, empty_vector, partition_regions, running_max_single
from schemas.raw import DATA_KINDS
from schemas.watermarks import PartitionWatermarks, ReconstructedWatermarks

TOMBSTONE = "TOMBSTONE"


def value_token() -> Column:
    """The content a version holds, comparable by equality: sha256 of a PUT's value, TOMBSTONE for a DELETE."""
    return F.when(F.col("kind") == "DELETE", F.lit(TOMBSTONE)).otherwise(F.sha2(F.col("value"), 256))


def _partition_bounds(annotated: DataFrame) -> DataFrame:
    kind = F.col("kind")
    is_heartbeat_with_vector = (kind == "HEARTBEAT") & F.col("hb_vector").isNotNull()

    def count_of(condition: Column) -> Column:
        return F.sum(condition.cast(T.LongType()))

    bounds = annotated.groupBy(*PARTITION_KEYS).agg(
        F.min("offset").alias("first_offset"),
        F.max("offset").alias("last_offset"),
        (F.min_by("kind", "offset") == F.lit("START_OF_PUSH")).alias("starts_with_sop"),
        # min_by skips rows whose ordering value is null: only heartbeats with a vector compete.
        F.min_by("hb_vector", F.when(is_heartbeat_with_vector, F.col("offset"))).alias("first_hb_vector"),
        bound_after_last_row().alias("end_lower_bound"),
        F.max_by("resolved_ts_ms", "offset").alias("resolved_ts_ms"),
        F.count(F.lit(1)).alias("rows"),
        count_of(kind == "PUT").alias("puts"),
        count_of(kind == "DELETE").alias("deletes"),
        count_of(kind == "HEARTBEAT").alias("heartbeats"),
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
