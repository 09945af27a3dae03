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

Gaps (SPEC 3a) are found by the same ordering: the offsets of a version topic are
contiguous, so positions between two consecutive positions read that hold nothing are a
gap (compaction, a quarantined or lost record). Every row carries ``gap_before``, the
positions missing since the row before it (``gap_start`` the first of them, ``gap_end`` the
last), and ``missing_before``, the positions missing before it in the whole dump.
``missing_before`` only grows, and it grows exactly at a gap: a gap lies
between two rows exactly when their ``missing_before`` differ, which is all the later
stages ask. Positions read that hold no row (raw Venice records skipped by rule) are not
gaps: ``annotate_segments`` takes them as ``read_positions`` and orders them with the rows.
A gap that ends at such a position (a quarantined record followed by skipped chunks) is a gap
of the next row: ``gap_before`` counts every position missing since the row before.
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


def _with_read_positions(rows: DataFrame, read_positions: DataFrame | None) -> DataFrame:
    """``rows`` and, as rows of kind null, the positions read that hold no row (ordered with them, then dropped).

    Each position once: a record read twice (a file delivered twice) is one position, and counting it twice
    would take one from ``missing_before`` of every later row.
    """
    if read_positions is None:
        return rows
    markers = read_positions.select(*PARTITION_KEYS, "offset").distinct().select(
        *PARTITION_KEYS, "offset", *[F.lit(None).cast(f.dataType).alias(f.name) for f in rows.schema.fields
                                     if f.name not in (*PARTITION_KEYS, "offset")]
    )
    return rows.unionByName(markers.select(*rows.columns))


def annotate_segments(raw: DataFrame, read_positions: DataFrame | None = None) -> DataFrame:
    """Every version-topic row with its segment, opening heartbeat, baseline, contribution, ``L(p)`` and gaps.

    ``read_positions``: (``snapshot_id``, ``replica``, ``topic``, ``partition``, ``offset``) of
    positions read that hold no row of the dump (records skipped by rule): they close gaps
    and are not rows.
    """
    rows = raw.where(F.col("kind") != "EXPORTER_POSITION").withColumn("contribution", contribution())
    # Every region a contribution can name: each row's source region and each heartbeat vector's keys.
    regions = region_universe(rows, region_columns=["source_region"], vector_columns=["hb_vector"])
    upto = _by_offset().rowsBetween(Window.unboundedPreceding, Window.currentRow)
    before = _by_offset().rowsBetween(Window.unboundedPreceding, -1)
    # Positions between the dump's first position and this row that were not read; all in the window's one sort.
    first_position = F.min("offset").over(upto)
    missing_before = F.col("offset") - first_position - (F.row_number().over(_by_offset()) - 1)
    previous = F.lag("offset", 1).over(_by_offset())
    annotated = _with_read_positions(rows, read_positions).select(
        "*",
        F.sum((F.col("kind") == "HEARTBEAT").cast(T.LongType())).over(upto).alias("segment"),
        _last_at_heartbeat(F.col("offset"), upto).alias("opening_offset"),
        _last_at_heartbeat(F.col("contribution"), upto).alias("baseline_vector"),
        _last_at_heartbeat(F.col("applied_ts_min_ms"), upto).alias("opening_applied_ts_min_ms"),
        _last_at_heartbeat(F.col("applied_ts_max_ms"), upto).alias("opening_applied_ts_max_ms"),
        running_max(F.col("contribution"), regions, before).alias("applied_lower_bound"),
        _resolved_ts(regions, upto).alias("resolved_ts_ms"),
        F.coalesce(F.col("offset") - previous - 1, F.lit(0)).cast(T.LongType()).alias("gap_before"),
        missing_before.cast(T.LongType()).alias("missing_before"),
        previous.alias("_previous"),
    )
    at_gap = F.col("gap_before") > 0
    # Without read positions every position is a row, and the gaps since the row before are the ones right before
    # it (what ``_gaps_between_rows`` would find, without its two extra windows).
    if read_positions is None:
        annotated = annotated.select(
            "*",
            F.when(at_gap, F.col("offset") - F.col("gap_before")).alias("gap_start"),
            F.when(at_gap, F.col("offset") - 1).alias("gap_end"),
        )
    else:
        annotated = _gaps_between_rows(annotated, before, upto)
    return conform(annotated, HeartbeatSegments.to_structtype())


def _gaps_between_rows(positions: DataFrame, before: Window, upto: Window) -> DataFrame:
    """The rows of ``positions`` (rows and read positions, with each position's own ``gap_before``), each with the
    gaps since the row before it: a gap can end at a read position (a quarantined record, then skipped ones), and
    it is a gap of the rows all the same (SPEC 3a).

    ``gap_before`` becomes the positions missing since the previous row (``missing_before`` minus the previous
    row's), ``gap_start`` the first of them and ``gap_end`` the last. Same ordering as the rows' other windows: no
    sort of its own.
    """
    row = F.col("kind").isNotNull()
    here = F.col("gap_before")  # positions missing right before this position, row or read
    with_previous_row = positions.select(
        "*", F.last(F.when(row, F.col("missing_before")), ignorenulls=True).over(before).alias("_row_missing")
    )
    since_row = F.coalesce(F.col("_row_missing"), F.lit(0))
    # The first gap after the previous row: the one whose positions missing before it are the previous row's.
    first_after_row = (here > 0) & (F.col("missing_before") - here == since_row)
    gaps = with_previous_row.select(
        "*",
        F.last(F.when(first_after_row, F.col("_previous") + 1), ignorenulls=True).over(upto).alias("_first_start"),
        F.last(F.when(here > 0, F.col("offset") - 1), ignorenulls=True).over(upto).alias("_last_end"),
    ).where(row)
    gap_before = (F.col("missing_before") - since_row).cast(T.LongType())
    return gaps.withColumn("gap_before", gap_before).select(
        "*",
        F.when(F.col("gap_before") > 0, F.col("_first_start")).alias("gap_start"),
        F.when(F.col("gap_before") > 0, F.col("_last_end")).alias("gap_end"),
    )


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
        *gap_aggregates(F.col("gap_before"), F.col("offset"), F.col("applied_lower_bound"), F.col("gap_start"),
                        F.col("gap_end")),
    )
    return conform(summary, HeartbeatSegmentSummary.to_structtype())


def gap_aggregates(
    gap_before: Column, offset: Column, lower_bound: Column, gap_start: Column, gap_end: Column
) -> list[Column]:
    """Aggregates over rows: their gaps (how many, positions missing, first and last position missing) and ``L(g)``.

    ``L(g)`` of the first row after the first gap (``first_gap_lower_bound``) is where the
    reach of a version before that gap stops (SPEC 3a). Over segment rows or over segment
    summaries alike: a summary's columns have these meanings per segment, and the partition's
    are their sums, least and greatest (``summary_gap_aggregates``).
    """
    at_gap = gap_before > 0
    return [
        F.count_if(at_gap).cast(T.LongType()).alias("gaps"),
        F.sum(gap_before).cast(T.LongType()).alias("gap_positions"),
        F.min(F.when(at_gap, gap_start)).alias("first_gap_offset"),
        F.max(F.when(at_gap, gap_end)).alias("last_gap_offset"),
        # min_by skips rows whose ordering value is null: only the rows after a gap compete.
        F.min_by(lower_bound, F.when(at_gap, offset)).alias("first_gap_lower_bound"),
    ]


def summary_gap_aggregates() -> list[Column]:
    """``gap_aggregates`` of a replica partition, over its segments' summaries."""
    return [
        F.sum("gaps").cast(T.LongType()).alias("gaps"),
        F.sum("gap_positions").cast(T.LongType()).alias("gap_positions"),
        F.min("first_gap_offset").alias("first_gap_offset"),
        F.max("last_gap_offset").alias("last_gap_offset"),
        F.min_by("first_gap_lower_bound", "first_gap_offset").alias("first_gap_lower_bound"),
    ]
