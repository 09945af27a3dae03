"""Reconstructed watermarks (SPEC section 3): ``L``, ``P``, ``U`` and ``M`` from the annotated segments.

- ``L(p)`` comes with every row from ``annotate_segments``; ``L(end)`` is the max of
  every contribution of the dump (``L`` of the last row joined with its contribution).
- ``P``, the pre-history bound of a dump: ``{}`` when it starts with START_OF_PUSH,
  else the ``hb_vector`` of its first heartbeat that has one, else unknown (null).
- ``U(r)``: ``max(P, {source_region: source_offset} of every data row of the key up to
  and including r)``, a running max per key (null when ``P`` is unknown).
- ``M(r)``: ``L`` of the key's next data row, or ``L(end)`` for the key's last row.

Gaps (SPEC 3a: compaction, quarantined or lost records) make two bounds more cautious, so
that a dump never proves more than the complete topic would: the reach of a version stops
at ``L`` of the first row after the first gap after it, and a version with a gap before it
takes as floor, instead of ``P``, the vector of the first vector heartbeat after the last
gap before it (unknown when there is none). ``L`` is unchanged.

``P``, ``L(end)`` and the gaps of a dump (``partition_watermarks``) are read off the segment
summary, a few rows per replica partition, rather than aggregated over every row again
(docs/performance.md).
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.segments import PARTITION_KEYS, summarize_segments, summary_gap_aggregates
from pipelines.vectors import empty_vector, partition_regions, running_max_single
from schemas.conform import conform
from schemas.raw import DATA_KINDS, VECTOR
from schemas.watermarks import PartitionWatermarks, ReconstructedWatermarks


def bottom_reach() -> Column:
    """The reach ⊥ would have if this row were its key's first: its ``L``, or ``L`` at the dump's first gap when one
    lies before the row (SPEC 3a). Over a data row with its dump's ``first_gap_lower_bound`` beside it."""
    return F.when(
        (F.col("missing_before") == 0) | F.col("first_gap_lower_bound").isNull(), F.col("applied_lower_bound")
    ).otherwise(F.col("first_gap_lower_bound"))


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
        *summary_gap_aggregates(),
    )
    pre_history = F.when(F.col("starts_with_sop"), empty_vector()).otherwise(F.col("first_hb_vector"))
    bounds = bounds.withColumn("pre_history_bound", pre_history).withColumn(
        "pre_history_known", F.col("pre_history_bound").isNotNull()
    )
    return conform(bounds, PartitionWatermarks.to_structtype())


def gap_runs(annotated: DataFrame) -> DataFrame:
    """Per replica partition and *run* (the rows between two gaps, named by their ``missing_before``): its bounds.

    - ``run_floor``: ``P`` of the rows after the gap that opens the run (SPEC 3a): the
      ``hb_vector`` of the first heartbeat with a vector at or after the run's first row,
      wherever it lies; null when none follows (their ``U`` is unknown).
    - ``run_stop``: ``L`` of the first row after the gap that closes the run, where the
      reach of every version in the run stops; null for the last run.

    Read off the rows after a gap and the heartbeats with a vector only, ordered once.
    """
    at_gap = F.col("gap_before") > 0
    vector_heartbeat = (F.col("kind") == "HEARTBEAT") & F.col("hb_vector").isNotNull()
    # Descending offsets: the frame up to the current row holds the rows at or after it.
    after = Window.partitionBy(*PARTITION_KEYS).orderBy(F.desc("offset")).rowsBetween(
        Window.unboundedPreceding, Window.currentRow
    )
    gaps = annotated.where(at_gap | vector_heartbeat).select(
        *PARTITION_KEYS, "offset", "gap_before", "missing_before", "applied_lower_bound",
        F.last(F.when(vector_heartbeat, F.col("hb_vector")), ignorenulls=True).over(after).alias("next_vector"),
    ).where(at_gap)
    no_vector = F.lit(None).cast(VECTOR)
    opening = gaps.select(*PARTITION_KEYS, F.col("missing_before").alias("run"),
                          F.col("next_vector").alias("run_floor"), no_vector.alias("run_stop"))
    closing = gaps.select(*PARTITION_KEYS, (F.col("missing_before") - F.col("gap_before")).alias("run"),
                          no_vector.alias("run_floor"), F.col("applied_lower_bound").alias("run_stop"))
    return opening.unionByName(closing).groupBy(*PARTITION_KEYS, "run").agg(
        F.first("run_floor", ignorenulls=True).alias("run_floor"),
        F.first("run_stop", ignorenulls=True).alias("run_stop"),
    )


def reconstruct_watermarks(
    annotated: DataFrame, partitions: DataFrame | None = None, regions: list[str] | None = None,
    gaps: bool | None = None,
) -> DataFrame:
    """One row per PUT/DELETE with its content token, ``L``, ``U`` (null when unknown) and ``M``.

    ``partitions`` is ``partition_watermarks`` of the segments' summary when the caller has
    it (the asset passes the table it just wrote); ``P`` and ``L(end)`` come from its few rows.
    ``regions``: ``partition_regions(partitions)`` when the caller has it (the asset observes it
    on the write of ``partitions``: no query of its own), else collected here. ``gaps``: whether
    any dump has a gap (the asset observes it on the same write), else read off ``partitions``.
    Without gaps the bounds are SPEC 3's; with gaps SPEC 3a's (``gap_runs``): the reach of a
    version stops at the first gap after it, and a version after a gap takes its run's floor.
    """
    data = annotated.where(F.col("kind").isin(*DATA_KINDS))
    partitions = partitions if partitions is not None else partition_watermarks(summarize_segments(annotated))
    regions = partition_regions(partitions) if regions is None else regions
    if gaps is None:
        gaps = bool(partitions.agg(F.sum("gaps")).first()[0] or 0)
    bounds = partitions.select(*PARTITION_KEYS, "pre_history_bound", "end_lower_bound")
    by_key = Window.partitionBy(*PARTITION_KEYS, "key").orderBy("offset")
    next_lower_bound = F.lead("applied_lower_bound", 1).over(by_key.rowsBetween(1, 1))
    rows = data.join(F.broadcast(bounds), on=list(PARTITION_KEYS), how="inner")
    if gaps:
        runs = gap_runs(annotated).withColumnRenamed("run", "missing_before")
        rows = rows.join(runs, on=[*PARTITION_KEYS, "missing_before"], how="left")
        # Rows after a gap: P of their run; before any gap: P of the dump.
        floor = F.when(F.col("missing_before") > 0, F.col("run_floor")).otherwise(F.col("pre_history_bound"))
        same_run = F.lead("missing_before", 1).over(by_key.rowsBetween(1, 1)) == F.col("missing_before")
        reach = (
            F.when(next_lower_bound.isNotNull() & same_run, next_lower_bound)
            .when(F.col("run_stop").isNotNull(), F.col("run_stop"))
            .otherwise(F.coalesce(next_lower_bound, F.col("end_lower_bound")))
        )
    else:
        floor = F.col("pre_history_bound")
        reach = F.coalesce(next_lower_bound, F.col("end_lower_bound"))
    # U = max(floor, the key's {source_region: source_offset} so far): the floor's regions are in ``regions``.
    touched = running_max_single(
        F.col("source_region"),
        F.col("source_offset"),
        regions,
        by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow),
        floor=floor,
    )
    rows = rows.select(
        "*",
        F.when(floor.isNotNull(), touched).alias("touch_bound"),
        reach.alias("reach"),
    )
    return conform(rows, ReconstructedWatermarks.to_structtype())
