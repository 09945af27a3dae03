"""Heartbeat-annotated segments (SPEC section 2) and the applied lower bound ``L`` (SPEC section 3).

Within one (snapshot, replica, topic, partition) the rows are ordered by offset and the
heartbeats cut them into segments. Heartbeat number ``n`` (1-based) opens segment ``n``:
it is the segment's first row, followed by the rows after it up to the next heartbeat.
Segment 0 holds the rows before the first heartbeat and has no opening heartbeat.

Each row also carries its *contribution* to what the replica is known to have applied
(a heartbeat's ``hb_vector``, or its ``{source_region: source_offset}`` when it has
none; a data row's ``{source_region: source_offset}``; nothing for START_OF_PUSH) and
``L(p)``, the componentwise max of the contributions strictly before it, so that the
later stages reuse both instead of sorting the stream again. They are computed by the
fused pass per stream (``pipelines/stream_pass.py``), with one summary row per segment.

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

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.stream_pass import PARTITION_KEYS, segment_rows, stream_pass
from pipelines.vectors import vector_max
from schemas.conform import conform
from schemas.segments import HeartbeatSegmentSummary


def annotate_segments(raw: DataFrame, read_positions: DataFrame | None = None, rows: int | None = None) -> DataFrame:
    """Every version-topic row with its segment, opening heartbeat, baseline, contribution, ``L(p)`` and gaps.

    The segment columns of the fused pass (``pipelines/stream_pass.py``). ``read_positions``:
    (``snapshot_id``, ``replica``, ``topic``, ``partition``, ``offset``) of positions read that
    hold no row of the dump (records skipped by rule): they close gaps and are not rows.
    ``rows``: how many rows ``raw`` has, when known (a few run on the driver).
    """
    return segment_rows(stream_pass(raw, read_positions, rows))



def bound_after_last_row() -> Column:
    """Aggregate: ``L`` just after a group's last row (its ``L`` joined with its contribution).

    The last row's two vectors are picked first and joined once per group, not once per row.
    """
    last = F.max_by(F.struct("applied_lower_bound", "contribution"), "offset")
    return vector_max(last["applied_lower_bound"], last["contribution"])


def summarize_segments(annotated: DataFrame) -> DataFrame:
    """One row per segment: offsets, rows per kind, first kind, baseline, closing watermark, resolved timestamp.

    The summary of segment rows computed earlier (a table read back), as Spark aggregates; the
    audit writes the same rows from the fused pass (``pipelines.stream_pass.summary_rows``), and
    ``tests/test_stream_pass.py`` holds the two equal.

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
