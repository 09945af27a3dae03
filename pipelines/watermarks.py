"""Reconstructed watermarks (SPEC section 3): ``L``, ``P``, ``U`` and ``M`` from the annotated segments.

- ``L(p)`` comes with every row from ``annotate_segments``; ``L(end)`` is the max of
  every contribution of the dump (``L`` of the last row joined with its contribution).
- ``P``, the pre-history bound of a dump: ``{}`` when it starts with START_OF_PUSH,
  else the ``hb_vector`` of its first heartbeat that has one, else unknown (null).
- ``U(r)``: ``max(P, {source_region: source_offset} of every data row of the key up to
  and including r)``, a running max per key (null when ``P`` is unknown).
- ``M(r)``: ``L`` of the key's next data row, or ``L(end)`` for the key's last row.

``P`` and ``L(end)`` (``partition_watermarks``) are read off the segment summary, a few
rows per replica partition, rather than aggregated over every row again: at 2M rows that
aggregation was a 3.7 s job on the audit's longest chain of steps.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.segments import PARTITION_KEYS, summarize_segments
from pipelines.vectors import empty_vector, partition_regions, running_max_single
from schemas.conform import conform
from schemas.raw import DATA_KINDS
from schemas.watermarks import PartitionWatermarks, ReconstructedWatermarks

TOMBSTONE = "TOMBSTONE"


def value_token() -> Column:
    """The content a version holds, comparable by equality: sha256 of a PUT's value, TOMBSTONE for a DELETE."""
    return F.when(F.col("kind") == "DELETE", F.lit(TOMBSTONE)).otherwise(F.sha2(F.col("value"), 256))


def partition_watermarks(summary: DataFrame) -> DataFrame:
    """One row per replica partition: first/last offset, ``P``, ``L(end)``, final resolved timestamp, counts.

    Read off ``summary`` (``summarize_segments``: one row per heartbeat segment), not off
    every row: the partition's first row is the first row of its lowest segment, ``P`` the
    baseline of its lowest segment whose opening heartbeat has a vector, ``L(end)`` the
    closing watermark of its last segment, and its resolved timestamp the last segment's.
    """
    def sum_of(column: str) -> Column:
        return F.sum(column).cast(T.LongType())

    bounds = summary.groupBy(*PARTITION_KEYS).agg(
        F.min("first_offset").alias("first_offset"),
        F.max("last_offset").alias("last_offset"),
        (F.min_by("first_kind", "segment") == F.lit("START_OF_PUSH")).alias("starts_with_sop"),
        # min_by skips rows whose ordering value is null: only segments opened by a vector compete.
        F.min_by("baseline_vector", F.when(F.col("opening_has_vector"), F.col("segment"))).alias("first_hb_vector"),
        F.max_by("closing_watermark", "segment").alias("end_lower_bound"),
        F.max_by("resolved_ts_ms", "segment").alias("resolved_ts_ms"),
        sum_of("rows").alias("rows"),
        sum_of("puts").alias("puts"),
        sum_of("deletes").alias("deletes"),
        sum_of("heartbeats").alias("heartbeats"),
    )
    pre_history = F.when(F.col("starts_with_sop"), empty_vector()).otherwise(F.col("first_hb_vector"))
    bounds = bounds.withColumn("pre_history_bound", pre_history).withColumn(
        "pre_history_known", F.col("pre_history_bound").isNotNull()
    )
    return conform(bounds, PartitionWatermarks.to_structtype())


def reconstruct_watermarks(
    annotated: DataFrame, partitions: DataFrame | None = None, regions: list[str] | None = None
) -> DataFrame:
    """One row per PUT/DELETE with its content token, ``L``, ``U`` (null when ``P`` is unknown) and ``M``.

    ``partitions`` is ``partition_watermarks`` of the segments' summary when the caller has
    it (the asset passes the table it just wrote); ``P`` and ``L(end)`` come from its few rows.
    ``regions``: ``partition_regions(partitions)`` when the caller has it (the asset observes it
    on the write of ``partitions``: no query of its own), else collected here.
    """
    data = annotated.where(F.col("kind").isin(*DATA_KINDS))
    partitions = partitions if partitions is not None else partition_watermarks(summarize_segments(annotated))
    regions = partition_regions(partitions) if regions is None else regions
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
