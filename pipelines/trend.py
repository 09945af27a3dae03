"""Divergence, lag and quarantine counts per snapshot, across every snapshot audited."""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from schemas.conform import conform
from schemas.trend import AuditTrend


def audit_trend(
    divergence_summary: DataFrame, quarantine: DataFrame, replication_lag: DataFrame, anomalies: DataFrame
) -> DataFrame:
    """One row per snapshot present in any input; counts are 0 and lags null where a stage has no rows."""
    verdicts = divergence_summary.groupBy("snapshot_id").agg(
        F.sum("keys_compared").alias("keys_compared"),
        F.sum("divergent").alias("divergent"),
        F.sum("missing").alias("missing"),
        F.sum("in_flight").alias("in_flight"),
    )
    quarantined = quarantine.groupBy("snapshot_id").agg(F.count(F.lit(1)).alias("rows_quarantined"))
    lag = replication_lag.groupBy("snapshot_id").agg(
        F.ceil(F.max("p99_upper_ms")).alias("worst_lag_p99_ms"),
        F.max("staleness_ms").alias("worst_staleness_ms"),
    )
    anomaly_counts = anomalies.groupBy("snapshot_id").agg(F.count(F.lit(1)).alias("stream_anomalies"))
    snapshots = (
        verdicts.select("snapshot_id")
        .unionByName(quarantined.select("snapshot_id"))
        .unionByName(lag.select("snapshot_id"))
        .unionByName(anomaly_counts.select("snapshot_id"))
        .distinct()
    )
    joined = (
        snapshots.join(verdicts, on="snapshot_id", how="left")
        .join(quarantined, on="snapshot_id", how="left")
        .join(lag, on="snapshot_id", how="left")
        .join(anomaly_counts, on="snapshot_id", how="left")
    )
    counts = ("keys_compared", "divergent", "missing", "in_flight", "rows_quarantined", "stream_anomalies")
    struct = AuditTrend.to_structtype()
    return conform(joined, struct, {name: F.coalesce(F.col(name), F.lit(0)) for name in counts}).orderBy("snapshot_id")
