"""Schema of the cross-snapshot trend table."""
from __future__ import annotations

import pandera.pyspark as pa
from pyspark.sql import types as T


class AuditTrend(pa.DataFrameModel):
    """One row per audited snapshot: is replication getting better or worse?"""

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    keys_compared: T.LongType() = pa.Field(nullable=False, ge=0)
    divergent: T.LongType() = pa.Field(nullable=False, ge=0)
    missing: T.LongType() = pa.Field(nullable=False, ge=0)
    in_flight: T.LongType() = pa.Field(nullable=False, ge=0)
    rows_quarantined: T.LongType() = pa.Field(nullable=False, ge=0)
    stream_anomalies: T.LongType() = pa.Field(nullable=False, ge=0)
    worst_lag_p99_ms: T.LongType() = pa.Field(nullable=True)
    worst_staleness_ms: T.LongType() = pa.Field(nullable=True)

    class Config:
        name = "audit_trend"
        strict = True
