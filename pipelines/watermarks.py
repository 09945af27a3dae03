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

``U`` and ``M`` come from the fused pass per stream (``pipelines/stream_pass.py``), with
``L`` and the segments. ``P``, ``L(end)`` and the gaps of a dump (``partition_watermarks``) are read off the segment
summary, a few rows per replica partition, rather than aggregated over every row again
(docs/performance.md).
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.segments import PARTITION_KEYS, summary_gap_aggregates
from pipelines.stream_pass import watermarks_of_segments
from pipelines.vectors import empty_vector
from schemas.conform import conform
from schemas.watermarks import PartitionWatermarks


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


def reconstruct_watermarks(annotated: DataFrame) -> DataFrame:
    """One row per PUT/DELETE of ``annotated`` (``heartbeat_segments`` rows) with its content token, ``L``, ``U`` and ``M``.

    The watermark part of the fused pass (``pipelines/stream_pass.py``) over segments computed
    earlier; the audit itself writes both tables from one pass (``stream_pass``).
    """
    return watermarks_of_segments(annotated)
