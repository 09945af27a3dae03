"""Schema of ``broker_cuts``: the cut of every broker snapshot (SPEC 11), one row per partition read."""
from __future__ import annotations

import pandera.pyspark as pa
from pyspark.sql import types as T


class BrokerCuts(pa.DataFrameModel):
    """Per (region, topic, partition) of a snapshot ``replica-lens dump-kafka`` read from the brokers: the offsets
    ``[start_offset, end_offset)`` it read, the log start offset the broker reported, the records delivered and
    the offsets that delivered none (gaps: compacted, transaction markers, aborted, or before the log start), the
    topic's ``cleanup.policy``, the isolation level, the time of the cut (``<snapshot>/_cut.json``), the offsets left
    for a later cut (``backlog_offsets``) and, for a region the cut could not read, why. Empty for snapshots of
    files."""

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    region: T.StringType() = pa.Field(nullable=False)
    topic: T.StringType() = pa.Field(nullable=False)
    partition: T.IntegerType() = pa.Field(nullable=False, ge=0)
    start_offset: T.LongType() = pa.Field(nullable=False, ge=0)
    end_offset: T.LongType() = pa.Field(nullable=False, ge=0)
    log_start_offset: T.LongType() = pa.Field(nullable=False, ge=0)
    records_delivered: T.LongType() = pa.Field(nullable=False, ge=0)
    offsets_not_delivered: T.LongType() = pa.Field(nullable=False, ge=0)
    # Offsets the broker held past end_offset at the cut: a cut bounded per partition leaves them to the next one.
    backlog_offsets: T.LongType() = pa.Field(nullable=False, ge=0)
    cleanup_policy: T.StringType() = pa.Field(nullable=False)
    isolation_level: T.StringType() = pa.Field(nullable=False, isin=["read_committed", "read_uncommitted"])
    cut_at_ms: T.LongType() = pa.Field(nullable=False, ge=0)  # when the end offsets were asked, ms since the epoch
    continues: T.StringType() = pa.Field(nullable=True)
    # Why the partition's region was not read in this cut (``replica-lens watch``: its brokers did not answer); then
    # start_offset = end_offset = its last published end, and nothing was delivered. Null when it was read.
    skipped_reason: T.StringType() = pa.Field(nullable=True)

    class Config:
        name = "broker_cuts"
        strict = True
