"""Heartbeat-annotated segments (SPEC section 2) and the applied lower bound ``L`` (SPEC section 3).

Within one (snapshot, replica, topic, partition) the rows are ordered by offset and the
heartbeats cut them into segments. Heartbeat number ``n`` (1-based) opens segment ``n``:
it is the segment's first row, followed by the rows after it up to the next heartbeat.
Segment 0 holds the rows before the first heartbeat and has no opening heartbeat.

Each row also carries its *contribution* to what the replica is known to have applied
(a heartbeat's ``hb_vector``, or its ``{source_region: source_offset}`` when it has
none; a data row's ``{source_region: source_offset}``; nothing for START_OF_PUSH) and
``L(p)``, the componentwise max of the contributions strictly before it, so that the
later stages reuse both instead of sorting the stream again.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.vectors import empty_vector, region_universe, running_max, single, vector_max
from schemas.conform import conform
from schemas.raw import DATA_KINDS
from schemas.segments import HeartbeatSegments, HeartbeatSegmentSummary

PARTITION_KEYS = ("snapshot_id", "replica", "topic", "partition")


def _by_offset() -> Window:
    return Window.partitionBy(*PARTITION_KEYS).orderBy("offset")


def contribution() -> Column:
    """What a row adds to the applied lower bound of every later row of its partition."""
    is_data = F.col("kind").isin(*DATA_KINDS)
    return (
        F.when(F.col("kind") == "HEARTBEAT", F.coalesce(F.col("hb_vector"), single("source_region", "source_offset")))
        .when(is_data, single("source_region", "source_offset"))
        .otherwise(empty_vector())
    )


def _last_at_heartbeat(column: Column, upto: Window) -> Column:
    return F.last(F.when(F.col("kind") == "HEARTBEAT", column), ignorenulls=True).over(upto)


def _resolved_ts(regions: list[str], upto: Window) -> Column:
    # Per origin region, the origin_ts_min_ms of the last heartbeat from it so far; the
    # resolved timestamp is the least of them. Regions not seen yet are null, which
    # least() skips, so they do not hold the watermark back before they first appear.
    latest = [
        F.last(
            F.when((F.col("kind") == "HEARTBEAT") & (F.col("source_region") == F.lit(r)), F.col("origin_ts_min_ms")),
            ignorenulls=True,
        ).over(upto)
        for r in regions
    ]
    if not latest:
        return F.lit(None).cast(T.LongType())
    return latest[0] if len(latest) == 1 else F.least(*latest)


def annotate_segments(raw: DataFrame) -> DataFrame:
    """Every version-topic row with its segment, opening heartbeat, baseline, contribution and ``L(p)``."""
    rows = raw.where(F.col("kind") != "EXPORTER_POSITION").withColumn("contribution", contribution())
    # Every region a contribution can name: each row's source region and each heartbeat vector's keys.
    regions = region_universe(rows, region_columns=["source_region"], vector_columns=["hb_vector"])
    upto = _by_offset().rowsBetween(Window.unboundedPreceding, Window.currentRow)
    before = _by_offset().rowsBetween(Window.unboundedPreceding, -1)
    annotated = rows.select(
        "*",
        F.sum((F.col("kind") == "HEARTBEAT").cast(T.LongType())).over(upto).alias("segment"),
        _last_at_heartbeat(F.col("offset"), upto).alias("opening_offset"),
        _last_at_heartbeat(F.col("contribution"), upto).alias("baseline_vector"),
        _last_at_heartbeat(F.col("applied_ts_min_ms"), upto).alias("opening_applied_ts_min_ms"),
        _last_at_heartbeat(F.col("applied_ts_max_ms"), upto).alias("opening_applied_ts_max_ms"),
        running_max(F.col("contribution"), regions, before).alias("applied_lower_bound"),
        _resolved_ts(regions, upto).alias("resolved_ts_ms"),
    )
    return conform(annotated, HeartbeatSegments.to_structtype())


def bound_after_last_row() -> Column:
    """Aggregate: ``L`` just after a group's last row (its ``L`` joined with its contribution).

    The last row's two vectors are picked first and joined once per group, not once per row.
    """
    last = F.max_by(F.struct("applied_lower_bound", "contribution"), "offset")
    return vector_max(last["applied_lower_bound"], last["contribution"])


def summarize_segments(annotated: DataFrame) -> DataFrame:
    """One row per segment: offsets, rows per kind, first kind, baseline, closing watermark, resolved timestamp.

    It holds what ``pipelines.watermarks.partition_watermarks`` needs, so that the bounds of
    each replica partition come from its few segments instead of from every row again: the
    first row's kind (a dump starts with START_OF_PUSH only in segment 0), whether the
    opening heartbeat carries a vector (the first one that does is ``P``), the closing
    watermark (the last segment's is ``L(end)``) and the resolved timestamp, which only a
    heartbeat changes and so is the same on every row of a segment.
    """
    kind = F.col("kind")

    def count_of(condition: Column) -> Column:
        return F.sum(condition.cast(T.LongType()))

    # The opening columns are constant within a segment; max/max_by just pick that value.
    summary = annotated.groupBy(*PARTITION_KEYS, "segment").agg(
        F.max("opening_offset").alias("opening_offset"),
        F.min("offset").alias("first_offset"),
        F.max("offset").alias("last_offset"),
        F.count(F.lit(1)).alias("rows"),
        count_of(kind == "PUT").alias("puts"),
        count_of(kind == "DELETE").alias("deletes"),
        count_of(kind == "HEARTBEAT").alias("heartbeats"),
        count_of(~kind.isin("PUT", "DELETE", "HEARTBEAT")).alias("other_rows"),
        F.min_by("kind", "offset").alias("first_kind"),
        F.max_by("baseline_vector", "offset").alias("baseline_vector"),
        # A segment holds at most one heartbeat, its opening one.
        F.bool_or((kind == "HEARTBEAT") & F.col("hb_vector").isNotNull()).alias("opening_has_vector"),
        bound_after_last_row().alias("closing_watermark"),
        F.max("opening_applied_ts_min_ms").alias("opening_applied_ts_min_ms"),
        F.max("opening_applied_ts_max_ms").alias("opening_applied_ts_max_ms"),
        F.max("resolved_ts_ms").alias("resolved_ts_ms"),
    )
    return conform(summary, HeartbeatSegmentSummary.to_structtype())
