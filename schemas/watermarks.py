"""Schemas of the reconstructed-watermark stage (SPEC section 3)."""
from __future__ import annotations

import pandera.pyspark as pa
from pyspark.sql import types as T

from schemas.raw import DATA_KINDS, VECTOR


class ReconstructedWatermarks(pa.DataFrameModel):
    """One row per data row (PUT or DELETE) with its applied lower bound L, touch bound U and reach M."""

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    replica: T.StringType() = pa.Field(nullable=False)
    topic: T.StringType() = pa.Field(nullable=False)
    partition: T.IntegerType() = pa.Field(nullable=False, ge=0)
    offset: T.LongType() = pa.Field(nullable=False, ge=0)
    key: T.StringType() = pa.Field(nullable=False)
    kind: T.StringType() = pa.Field(nullable=False, isin=list(DATA_KINDS))
    value_hash: T.StringType() = pa.Field(
        nullable=False,
        description="Content token: sha256 hex of the value for PUT, 'TOMBSTONE' for DELETE (the value itself is in "
        "raw_topic_snapshots, at the row's position)",
    )
    source_region: T.StringType() = pa.Field(nullable=False)
    source_offset: T.LongType() = pa.Field(nullable=False, ge=0)
    write_ts: T.LongType() = pa.Field(nullable=True)
    applied_lower_bound: VECTOR = pa.Field(nullable=False, description="L(p): applied before this row was written")
    touch_bound: VECTOR = pa.Field(
        nullable=True, description="U(r): bounds the upstream messages this state holds; null when P is unknown"
    )
    reach: VECTOR = pa.Field(nullable=False, description="M(r): applied while this row was the key's state")
    missing_before: T.LongType() = pa.Field(
        nullable=False, ge=0,
        description="Positions missing before this row in its dump: a gap lies between two rows iff theirs differ",
    )

    class Config:
        name = "reconstructed_watermarks"
        strict = True


class PartitionWatermarks(pa.DataFrameModel):
    """One row per (replica, topic, partition) dump: its bounds at both ends."""

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    replica: T.StringType() = pa.Field(nullable=False)
    topic: T.StringType() = pa.Field(nullable=False)
    partition: T.IntegerType() = pa.Field(nullable=False, ge=0)
    first_offset: T.LongType() = pa.Field(nullable=False, ge=0)
    last_offset: T.LongType() = pa.Field(nullable=False, ge=0)
    starts_with_sop: T.BooleanType() = pa.Field(
        nullable=False, description="START_OF_PUSH at the lowest offset: the dump starts at the topic's beginning"
    )
    pre_history_bound: VECTOR = pa.Field(
        nullable=True,
        description="P: {} after START_OF_PUSH, else the first heartbeat's hb_vector; null when unknown",
    )
    pre_history_known: T.BooleanType() = pa.Field(nullable=False)
    end_lower_bound: VECTOR = pa.Field(nullable=False, description="L(end): applied by the end of the dump")
    resolved_ts_ms: T.LongType() = pa.Field(nullable=True, description="Resolved timestamp after the last heartbeat")
    rows: T.LongType() = pa.Field(nullable=False, ge=1)
    puts: T.LongType() = pa.Field(nullable=False, ge=0)
    deletes: T.LongType() = pa.Field(nullable=False, ge=0)
    heartbeats: T.LongType() = pa.Field(nullable=False, ge=0)
    gaps: T.LongType() = pa.Field(nullable=False, ge=0, description="Gaps (SPEC 3a) right before a row of this dump")
    gap_positions: T.LongType() = pa.Field(nullable=False, ge=0, description="Positions missing in those gaps")
    first_gap_offset: T.LongType() = pa.Field(nullable=True, ge=0, description="First position missing (null: no gap)")
    last_gap_offset: T.LongType() = pa.Field(nullable=True, ge=0, description="Last position missing (null: no gap)")
    first_gap_lower_bound: VECTOR = pa.Field(
        nullable=True, description="L of the first row after the first gap, where reach stops (null: no gap)"
    )

    class Config:
        name = "partition_watermarks"
        strict = True
