"""Replication lag from the heartbeats' clock intervals (SPEC section 6, after Vitess).

A heartbeat from origin X written by replica R carries X's clock interval when it was
emitted and R's when it was applied. With clocks only known to within an interval, the
lag is only known to within ``[max(0, applied min - origin max), applied max - origin min]``.

The summary is per (snapshot, R, X) across every topic partition, as SPEC 6 asks. Its
"latest applied time in the snapshot" is the highest ``applied_ts_max_ms`` of any of R's
heartbeats (any origin, any partition): the latest moment R is known to have been
writing. Staleness against X compares it with the newest ``origin_ts_min_ms`` of a
heartbeat from X that R applied. Taken across partitions that hides a single stuck
partition behind healthy ones, so the summary also names the stalest partition (the
one whose newest heartbeat from X is oldest) and its staleness.

Percentiles are exact (``percentile``, linear interpolation between the closest ranks,
as numpy's default): one aggregate over the heartbeats, which are few next to the rows.
"""
from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from schemas.conform import conform
from schemas.operations import HeartbeatLag, ReplicationLag


def heartbeat_lag(raw: DataFrame) -> DataFrame:
    """One row per HEARTBEAT of ``raw``: its origin and lower/upper lag bounds in ms."""
    heartbeats = raw.where((F.col("kind") == "HEARTBEAT") & F.col("offset").isNotNull())
    columns = {
        "origin_region": F.col("source_region"),
        "lag_lower_ms": F.greatest(F.lit(0), F.col("applied_ts_min_ms") - F.col("origin_ts_max_ms")),
        "lag_upper_ms": F.col("applied_ts_max_ms") - F.col("origin_ts_min_ms"),
    }
    return conform(heartbeats, HeartbeatLag.to_structtype(), columns)


def lag_summary(heartbeat_lag_df: DataFrame) -> DataFrame:
    """Per (snapshot, replica, origin region): count, exact p50/p99/max of the upper bound, staleness."""
    lag = heartbeat_lag_df
    per_origin = lag.groupBy("snapshot_id", "replica", "origin_region").agg(
        F.count(F.lit(1)).alias("heartbeats"),
        F.percentile(F.col("lag_upper_ms"), 0.5).alias("p50_upper_ms"),
        F.percentile(F.col("lag_upper_ms"), 0.99).alias("p99_upper_ms"),
        F.max("lag_upper_ms").alias("max_upper_ms"),
        F.max("origin_ts_min_ms").alias("latest_origin_ts_min_ms"),
    )
    latest_applied = lag.groupBy("snapshot_id", "replica").agg(
        F.max("applied_ts_max_ms").alias("latest_applied_ts_ms")
    )
    per_partition = lag.groupBy("snapshot_id", "replica", "origin_region", "topic", "partition").agg(
        F.max("origin_ts_min_ms").alias("partition_origin_ts_min_ms")
    )
    # The partition whose newest heartbeat from X is oldest; ties go to the first topic/partition.
    stalest = per_partition.groupBy("snapshot_id", "replica", "origin_region").agg(
        F.count(F.lit(1)).alias("partitions"),
        F.min(
            F.struct(
                F.col("partition_origin_ts_min_ms").alias("origin_ts"),
                F.col("topic").alias("topic"),
                F.col("partition").alias("partition"),
            )
        ).alias("stalest"),
    )
    joined = per_origin.join(stalest, on=["snapshot_id", "replica", "origin_region"], how="inner").join(
        latest_applied, on=["snapshot_id", "replica"], how="inner"
    )
    columns = {
        "staleness_ms": F.col("latest_applied_ts_ms") - F.col("latest_origin_ts_min_ms"),
        "stalest_topic": F.col("stalest.topic"),
        "stalest_partition": F.col("stalest.partition"),
        "stalest_partition_staleness_ms": F.col("latest_applied_ts_ms") - F.col("stalest.origin_ts"),
    }
    return conform(joined, ReplicationLag.to_structtype(), columns)
