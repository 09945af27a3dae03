"""Schemas of the heartbeat-segment stage (SPEC section 2)."""
from __future__ import annotations

import pandera.pyspark as pa
from pyspark.sql import types as T

from schemas.raw import VECTOR

# Every kind that lives in a version topic; EXPORTER_POSITION rows are reports about it, not in it.
VERSION_TOPIC_KINDS = ("START_OF_PUSH", "PUT", "DELETE", "HEARTBEAT")


class HeartbeatSegments(pa.DataFrameModel):
    """Every version-topic row, annotated with its heartbeat segment and the applied lower bound before it.

    Heartbeat number ``n`` (1-based, by offset) opens segment ``n``: it is that segment's
    first row, and the rows after it up to the next heartbeat follow. Segment 0 holds the
    rows before the first heartbeat and has no opening heartbeat (its opening columns are null).
    """

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    replica: T.StringType() = pa.Field(nullable=False)
    topic: T.StringType() = pa.Field(nullable=False)
    partition: T.IntegerType() = pa.Field(nullable=False, ge=0)
    offset: T.LongType() = pa.Field(nullable=False, ge=0)
    kind: T.StringType() = pa.Field(nullable=False, isin=list(VERSION_TOPIC_KINDS))
    key: T.StringType() = pa.Field(nullable=True)
    value_hash: T.StringType() = pa.Field(
        nullable=True, description="sha256 hex of the value, TOMBSTONE for a DELETE (the value: raw_topic_snapshots)"
    )
    source_region: T.StringType() = pa.Field(nullable=True)
    source_offset: T.LongType() = pa.Field(nullable=True, ge=0)
    hb_vector: VECTOR = pa.Field(nullable=True)
    origin_ts_min_ms: T.LongType() = pa.Field(nullable=True)
    origin_ts_max_ms: T.LongType() = pa.Field(nullable=True)
    applied_ts_min_ms: T.LongType() = pa.Field(nullable=True)
    applied_ts_max_ms: T.LongType() = pa.Field(nullable=True)
    write_ts: T.LongType() = pa.Field(nullable=True)
    leader_epoch: T.LongType() = pa.Field(nullable=True)
    segment: T.LongType() = pa.Field(nullable=False, ge=0, description="Heartbeats at or before this row")
    opening_offset: T.LongType() = pa.Field(nullable=True, ge=0, description="Offset of the opening heartbeat")
    baseline_vector: VECTOR = pa.Field(
        nullable=True, description="Opening heartbeat's hb_vector, or its {source_region: source_offset}"
    )
    opening_applied_ts_min_ms: T.LongType() = pa.Field(nullable=True)
    opening_applied_ts_max_ms: T.LongType() = pa.Field(nullable=True)
    contribution: VECTOR = pa.Field(
        nullable=False, description="What this row adds to the applied lower bound of the rows after it"
    )
    applied_lower_bound: VECTOR = pa.Field(
        nullable=False, description="L(p): max of the contributions of the rows strictly before this one"
    )
    resolved_ts_ms: T.LongType() = pa.Field(
        nullable=True, description="Resolved timestamp after the opening heartbeat (null before any)"
    )
    gap_before: T.LongType() = pa.Field(
        nullable=False, ge=0,
        description="Positions missing since the row before (a gap: SPEC 3a; read positions between are not); 0 when none",
    )
    gap_start: T.LongType() = pa.Field(nullable=True, ge=0, description="First position missing since the row before")
    gap_end: T.LongType() = pa.Field(nullable=True, ge=0, description="Last position missing since the row before")
    missing_before: T.LongType() = pa.Field(
        nullable=False, ge=0,
        description="Positions missing before this row in the whole dump; a gap lies between two rows iff theirs differ",
    )

    class Config:
        name = "heartbeat_segments"
        strict = True


class HeartbeatSegmentSummary(pa.DataFrameModel):
    """One row per heartbeat segment of a replica's topic partition."""

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    replica: T.StringType() = pa.Field(nullable=False)
    topic: T.StringType() = pa.Field(nullable=False)
    partition: T.IntegerType() = pa.Field(nullable=False, ge=0)
    segment: T.LongType() = pa.Field(nullable=False, ge=0)
    opening_offset: T.LongType() = pa.Field(nullable=True, ge=0)
    first_offset: T.LongType() = pa.Field(nullable=False, ge=0)
    last_offset: T.LongType() = pa.Field(nullable=False, ge=0)
    rows: T.LongType() = pa.Field(nullable=False, ge=1)
    puts: T.LongType() = pa.Field(nullable=False, ge=0)
    deletes: T.LongType() = pa.Field(nullable=False, ge=0)
    heartbeats: T.LongType() = pa.Field(nullable=False, ge=0, le=1)
    other_rows: T.LongType() = pa.Field(nullable=False, ge=0, description="START_OF_PUSH rows")
    first_kind: T.StringType() = pa.Field(
        nullable=False, isin=list(VERSION_TOPIC_KINDS), description="Kind of the segment's first row"
    )
    baseline_vector: VECTOR = pa.Field(nullable=True)
    opening_has_vector: T.BooleanType() = pa.Field(
        nullable=False, description="The opening heartbeat carries an hb_vector (the baseline is that vector)"
    )
    closing_watermark: VECTOR = pa.Field(
        nullable=False, description="Applied lower bound after the segment's last row"
    )
    opening_applied_ts_min_ms: T.LongType() = pa.Field(nullable=True)
    opening_applied_ts_max_ms: T.LongType() = pa.Field(nullable=True)
    resolved_ts_ms: T.LongType() = pa.Field(nullable=True)
    gaps: T.LongType() = pa.Field(nullable=False, ge=0, description="Gaps (SPEC 3a) right before a row of this segment")
    gap_positions: T.LongType() = pa.Field(nullable=False, ge=0, description="Positions missing in those gaps")
    first_gap_offset: T.LongType() = pa.Field(nullable=True, ge=0, description="First position missing (null: no gap)")
    last_gap_offset: T.LongType() = pa.Field(nullable=True, ge=0, description="Last position missing (null: no gap)")
    first_gap_lower_bound: VECTOR = pa.Field(
        nullable=True, description="L of the first row after the first gap, where reach stops (null: no gap)"
    )

    class Config:
        name = "heartbeat_segment_summary"
        strict = True
