"""Schema of the state carried from one snapshot's audit to the next (incremental audits)."""
from __future__ import annotations

import pandera.pyspark as pa
from pyspark.sql import types as T

from schemas.raw import DATA_KINDS, VECTOR

ROW_KINDS = ("VERSION", "CONTEXT")


class ReplicaState(pa.DataFrameModel):
    """The state after auditing a snapshot: each key's last version and one commit context per replica partition.

    Both row kinds share one table so that a snapshot's state and its commit contexts are
    written in one Delta commit. VERSION rows fill the version columns, CONTEXT rows the
    context columns; the other kind's columns are null.
    """

    snapshot_id: T.StringType() = pa.Field(nullable=False, description="The audited snapshot this state follows")
    row_kind: T.StringType() = pa.Field(nullable=False, isin=list(ROW_KINDS))
    replica: T.StringType() = pa.Field(nullable=False)
    topic: T.StringType() = pa.Field(nullable=False)
    partition: T.IntegerType() = pa.Field(nullable=False, ge=0)
    # VERSION rows: the key's last data row in the stream so far.
    key: T.StringType() = pa.Field(nullable=True)
    offset: T.LongType() = pa.Field(nullable=True, ge=0, description="VERSION: offset of the key's last data row")
    kind: T.StringType() = pa.Field(nullable=True, isin=list(DATA_KINDS))
    value: T.StringType() = pa.Field(
        nullable=True,
        description="VERSION: null (the value is in raw_topic_snapshots of origin_snapshot_id, at offset); kept for "
        "the states written while the state held values, whose checksums cover it",
    )
    value_hash: T.StringType() = pa.Field(nullable=True, description="VERSION: sha256 of the value, or TOMBSTONE")
    source_region: T.StringType() = pa.Field(nullable=True)
    source_offset: T.LongType() = pa.Field(nullable=True, ge=0)
    write_ts: T.LongType() = pa.Field(nullable=True)
    key_touch: VECTOR = pa.Field(
        nullable=True,
        description="VERSION: max of {source_region: source_offset} over the key's rows so far; U = max(P, key_touch)",
    )
    first_lower_bound: VECTOR = pa.Field(
        nullable=True,
        description="VERSION: the reach of the key's ⊥: L of its first data row in the stream, or L at the first gap",
    )
    origin_snapshot_id: T.StringType() = pa.Field(nullable=True, description="VERSION: snapshot the row was read from")
    # CONTEXT rows: what the state covers, and the invariant checked before it is used.
    previous_snapshot_id: T.StringType() = pa.Field(
        nullable=True, description="CONTEXT: snapshot whose state this one continued; null for a fresh start"
    )
    first_offset: T.LongType() = pa.Field(nullable=True, ge=0, description="CONTEXT: this snapshot's first offset")
    stream_first_offset: T.LongType() = pa.Field(
        nullable=True, ge=0, description="CONTEXT: first offset of the stream's first dump"
    )
    last_offset: T.LongType() = pa.Field(nullable=True, ge=0, description="CONTEXT: highest offset covered")
    starts_with_sop: T.BooleanType() = pa.Field(
        nullable=True, description="CONTEXT: the stream's first dump starts with START_OF_PUSH"
    )
    pre_history_bound: VECTOR = pa.Field(nullable=True, description="CONTEXT: P of the stream (null when unknown)")
    end_lower_bound: VECTOR = pa.Field(nullable=True, description="CONTEXT: L(end) of the stream so far")
    state_rows: T.LongType() = pa.Field(
        nullable=True, ge=0, description="CONTEXT: VERSION rows of the replica partition"
    )
    state_checksum: T.LongType() = pa.Field(
        nullable=True,
        description="CONTEXT: sum of xxhash64 of every VERSION column, modulo 2^64 (order-independent)",
    )
    # Gaps (SPEC 3a). Null in states written before gaps were known: read as no gap.
    # Kept only where a stream of the snapshot has a gap; without one, U and M follow from the columns above.
    touch_bound: VECTOR = pa.Field(
        nullable=True, description="VERSION: U of the version in the stream (null when unknown or not kept)"
    )
    reach: VECTOR = pa.Field(nullable=True, description="VERSION: M of the version in the stream so far (or null)")
    missing_before: T.LongType() = pa.Field(
        nullable=True, ge=1, description="VERSION: positions missing in the stream before the version (null: none)"
    )
    gap_positions: T.LongType() = pa.Field(
        nullable=True, ge=0, description="CONTEXT: positions missing in the stream so far (gaps, SPEC 3a)"
    )
    first_gap_lower_bound: VECTOR = pa.Field(
        nullable=True, description="CONTEXT: L of the first row after the stream's first gap (null: no gap)"
    )

    class Config:
        name = "replica_state"
        strict = True
