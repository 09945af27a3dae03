"""Schemas of the operations stage: stream anomalies, replication lag, exporter positions (SPEC 5, 6, 7)."""
from __future__ import annotations

import pandera.pyspark as pa
from pyspark.sql import types as T

ANOMALIES = (
    "HEARTBEAT_REGRESSION",
    "DATA_BEYOND_HEARTBEAT",
    "DUPLICATE_OR_REWIND",
    "WRITE_TS_REGRESSION",
    "HEARTBEAT_GAP",
    "CLOCK_UNCERTAINTY",
)

BOUND_REASONS = ("EXPORTERS", "PROCESSED", "NO_EXPORTER", "NOT_PROCESSED")


class StreamAnomalies(pa.DataFrameModel):
    """One row per version-topic row and anomaly found at it (one per regressed component for
    HEARTBEAT_REGRESSION); ``observed`` is the offending value, ``expected`` the bound it broke."""

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    replica: T.StringType() = pa.Field(nullable=False)
    topic: T.StringType() = pa.Field(nullable=False)
    partition: T.IntegerType() = pa.Field(nullable=False, ge=0)
    offset: T.LongType() = pa.Field(nullable=False, ge=0, description="Position of the offending row")
    anomaly: T.StringType() = pa.Field(nullable=False, isin=list(ANOMALIES))
    key: T.StringType() = pa.Field(nullable=True, description="Record key, for anomalies of data rows")
    source_region: T.StringType() = pa.Field(
        nullable=True,
        description="Upstream region that observed/expected refer to (the regressed component for "
        "HEARTBEAT_REGRESSION, the heartbeat's origin for HEARTBEAT_GAP and CLOCK_UNCERTAINTY)",
    )
    observed: T.LongType() = pa.Field(nullable=False)
    expected: T.LongType() = pa.Field(
        nullable=True, description="Bound broken; null only when the judging heartbeat lacks the component"
    )
    reference_offset: T.LongType() = pa.Field(
        nullable=True, ge=0, description="Offset of the row that set the expected bound (null for config bounds)"
    )
    leader_epoch: T.LongType() = pa.Field(nullable=True)
    previous_leader_epoch: T.LongType() = pa.Field(
        nullable=True, description="For WRITE_TS_REGRESSION: leader_epoch of the key's previous write"
    )
    detail: T.StringType() = pa.Field(nullable=False)

    class Config:
        name = "stream_anomalies"
        strict = True


class HeartbeatLag(pa.DataFrameModel):
    """One row per heartbeat: lower and upper replication lag bounds from its clock intervals (SPEC 6)."""

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    replica: T.StringType() = pa.Field(nullable=False)
    topic: T.StringType() = pa.Field(nullable=False)
    partition: T.IntegerType() = pa.Field(nullable=False, ge=0)
    offset: T.LongType() = pa.Field(nullable=False, ge=0)
    origin_region: T.StringType() = pa.Field(nullable=False)
    origin_ts_min_ms: T.LongType() = pa.Field(nullable=False)
    origin_ts_max_ms: T.LongType() = pa.Field(nullable=False)
    applied_ts_min_ms: T.LongType() = pa.Field(nullable=False)
    applied_ts_max_ms: T.LongType() = pa.Field(nullable=False)
    lag_lower_ms: T.LongType() = pa.Field(nullable=False, ge=0, description="max(0, applied min - origin max)")
    lag_upper_ms: T.LongType() = pa.Field(nullable=False, description="applied max - origin min")

    class Config:
        name = "heartbeat_lag"
        strict = True


class ReplicationLag(pa.DataFrameModel):
    """Per (snapshot, replica R, origin region X), over every topic partition of R: upper-bound lag
    percentiles and staleness at the end of the snapshot (SPEC 6)."""

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    replica: T.StringType() = pa.Field(nullable=False)
    origin_region: T.StringType() = pa.Field(nullable=False)
    heartbeats: T.LongType() = pa.Field(nullable=False, ge=1)
    partitions: T.LongType() = pa.Field(nullable=False, ge=1, description="Topic partitions with heartbeats from X")
    p50_upper_ms: T.DoubleType() = pa.Field(nullable=False, description="Exact median of lag_upper_ms")
    p99_upper_ms: T.DoubleType() = pa.Field(nullable=False, description="Exact 99th percentile (interpolated)")
    max_upper_ms: T.LongType() = pa.Field(nullable=False)
    latest_applied_ts_ms: T.LongType() = pa.Field(
        nullable=False, description="Latest applied time in the snapshot: max applied_ts_max_ms of R's heartbeats"
    )
    latest_origin_ts_min_ms: T.LongType() = pa.Field(
        nullable=False, description="Latest origin_ts_min_ms of a heartbeat from X applied by R"
    )
    staleness_ms: T.LongType() = pa.Field(
        nullable=False, description="latest_applied_ts_ms - latest_origin_ts_min_ms"
    )
    stalest_topic: T.StringType() = pa.Field(nullable=False)
    stalest_partition: T.IntegerType() = pa.Field(nullable=False, ge=0)
    stalest_partition_staleness_ms: T.LongType() = pa.Field(
        nullable=False, description="Staleness of the partition whose latest heartbeat from X is oldest"
    )

    class Config:
        name = "replication_lag"
        strict = True


class ExporterPositions(pa.DataFrameModel):
    """Latest report per (snapshot, replica, topic, partition, exporter), with its lag (SPEC 7)."""

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    replica: T.StringType() = pa.Field(nullable=False)
    topic: T.StringType() = pa.Field(nullable=False)
    partition: T.IntegerType() = pa.Field(nullable=False, ge=0)
    exporter: T.StringType() = pa.Field(nullable=False)
    exported_offset: T.LongType() = pa.Field(nullable=False, ge=0, description="Position of the latest report")
    reported_at_ms: T.LongType() = pa.Field(nullable=False)
    reports: T.LongType() = pa.Field(nullable=False, ge=1)
    max_exported_offset_seen: T.LongType() = pa.Field(nullable=False, ge=0)
    regressions: T.LongType() = pa.Field(
        nullable=False, ge=0, description="Reports below an earlier report of the same exporter"
    )
    last_offset: T.LongType() = pa.Field(nullable=True, ge=0, description="Highest offset of the partition read")
    lag_positions: T.LongType() = pa.Field(
        nullable=True, description="last_offset - exported_offset (negative when the report is ahead of the dump)"
    )
    first_heartbeat_offset: T.LongType() = pa.Field(
        nullable=True, ge=0, description="First heartbeat at or after exported_offset; null: none, lag_ms unknown"
    )
    last_heartbeat_offset: T.LongType() = pa.Field(nullable=True, ge=0)
    lag_ms: T.LongType() = pa.Field(
        nullable=True, description="Applied time (max) of the last heartbeat minus that of first_heartbeat_offset"
    )

    class Config:
        name = "exporter_positions"
        strict = True


class ExporterRegressions(pa.DataFrameModel):
    """One row per exporter report whose position is below an earlier report of the same exporter."""

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    replica: T.StringType() = pa.Field(nullable=False)
    topic: T.StringType() = pa.Field(nullable=False)
    partition: T.IntegerType() = pa.Field(nullable=False, ge=0)
    exporter: T.StringType() = pa.Field(nullable=False)
    reported_at_ms: T.LongType() = pa.Field(nullable=False)
    exported_offset: T.LongType() = pa.Field(nullable=False, ge=0)
    previous_exported_offset: T.LongType() = pa.Field(
        nullable=False, ge=0, description="Position of the report just before this one"
    )
    previous_reported_at_ms: T.LongType() = pa.Field(nullable=False)
    max_earlier_exported_offset: T.LongType() = pa.Field(
        nullable=False, ge=0, description="Highest position of any earlier report"
    )

    class Config:
        name = "exporter_regressions"
        strict = True


class CompactionBounds(pa.DataFrameModel):
    """Per replica topic partition: where compaction is safe and the re-export exposure (SPEC 7).

    Every version-topic partition of the snapshot is listed, and every partition that only
    exporter reports name. Offsets strictly below ``compaction_bound`` have been exported by
    every exporter and read by the audit (Zeebe: compact only below the lowest exported and
    processed position)."""

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    replica: T.StringType() = pa.Field(nullable=False)
    topic: T.StringType() = pa.Field(nullable=False)
    partition: T.IntegerType() = pa.Field(nullable=False, ge=0)
    exporters: T.LongType() = pa.Field(nullable=False, ge=0)
    min_exported_offset: T.LongType() = pa.Field(nullable=True, ge=0)
    max_exported_offset: T.LongType() = pa.Field(nullable=True, ge=0)
    holding_back_exporter: T.StringType() = pa.Field(
        nullable=True, description="Exporter at min_exported_offset (first by name on a tie)"
    )
    processed_offset: T.LongType() = pa.Field(
        nullable=True, ge=0, description="Highest offset of the partition the audit read"
    )
    compaction_bound: T.LongType() = pa.Field(
        nullable=True, ge=0, description="least(min_exported_offset, processed_offset); null without either"
    )
    bound_reason: T.StringType() = pa.Field(
        nullable=False,
        isin=list(BOUND_REASONS),
        description="EXPORTERS / PROCESSED: which side set the bound; NO_EXPORTER / NOT_PROCESSED: why it is null",
    )
    reexport_exposure_rows: T.LongType() = pa.Field(
        nullable=True,
        ge=0,
        description="Rows read with min_exported_offset < offset <= max_exported_offset (null when none read)",
    )
    reexport_exposure_data_rows: T.LongType() = pa.Field(
        nullable=True, ge=0, description="The PUT and DELETE rows among reexport_exposure_rows"
    )

    class Config:
        name = "compaction_bounds"
        strict = True
