"""Schema of the cross-snapshot trend table."""
from __future__ import annotations

import pandera.pyspark as pa
from pyspark.sql import types as T


class AuditTrend(pa.DataFrameModel):
    """One row per audited snapshot: is replication getting better or worse?

    The verdict counts are keys (each (topic, partition, key) once, under its worst verdict over its replica pairs;
    SPEC 10), null for a snapshot audited before its key counts were written (materialize it again).
    """

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    keys_compared: T.LongType() = pa.Field(nullable=True, ge=0, description="Keys compared (each once)")
    divergent: T.LongType() = pa.Field(nullable=True, ge=0, description="Keys whose worst verdict is DIVERGENT")
    missing: T.LongType() = pa.Field(nullable=True, ge=0, description="Keys whose worst verdict is MISSING")
    in_flight: T.LongType() = pa.Field(nullable=True, ge=0, description="Keys whose worst verdict is IN_FLIGHT")
    rows_quarantined: T.LongType() = pa.Field(nullable=False, ge=0)
    stream_anomalies: T.LongType() = pa.Field(nullable=False, ge=0)
    worst_lag_p99_ms: T.LongType() = pa.Field(nullable=True)
    worst_staleness_ms: T.LongType() = pa.Field(nullable=True)

    class Config:
        name = "audit_trend"
        strict = True
