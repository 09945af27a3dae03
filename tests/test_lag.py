"""Replication lag (SPEC 6): per-heartbeat bounds and the per (replica, origin) summary."""
from __future__ import annotations

import pytest

from pipelines.lag import heartbeat_lag, lag_summary
from schemas.operations import HeartbeatLag, ReplicationLag
from schemas.validation import validation_errors
from tests.rows import raw_frame


def frame(spark, rows):
    return raw_frame(spark, [{"source_file": "x", **r} for r in rows])


def hb(replica, partition, offset, origin_region, origin, applied):
    return {
        "replica": replica, "topic": "t", "partition": partition, "offset": offset, "kind": "HEARTBEAT",
        "source_region": origin_region, "source_offset": offset, "hb_vector": None,
        "origin_ts_min_ms": origin[0], "origin_ts_max_ms": origin[1],
        "applied_ts_min_ms": applied[0], "applied_ts_max_ms": applied[1], "leader_epoch": 1,
    }


def with_upper(replica, partition, offset, origin_region, origin_min, upper):
    """A heartbeat with origin interval [m, m+5] and applied interval [m+upper-5, m+upper]: upper lag ``upper``."""
    return hb(replica, partition, offset, origin_region, (origin_min, origin_min + 5),
              (origin_min + upper - 5, origin_min + upper))


def test_heartbeat_lag_bounds_by_hand(spark):
    rows = [
        # lower = 1100 - 1010 = 90, upper = 1110 - 1000 = 110
        hb("dc-a", 0, 3, "dc-b", (1000, 1010), (1100, 1110)),
        # applied min 2020 is before origin max 2050: lower clamps to 0; upper = 2030 - 2000 = 30
        hb("dc-a", 0, 7, "dc-b", (2000, 2050), (2020, 2030)),
        {"replica": "dc-a", "topic": "t", "partition": 0, "offset": 8, "kind": "PUT", "key": "k", "value": "v",
         "source_region": "dc-b", "source_offset": 9},
    ]
    df = heartbeat_lag(frame(spark, rows))
    got = sorted((r["offset"], r["origin_region"], r["lag_lower_ms"], r["lag_upper_ms"]) for r in df.collect())
    assert got == [(3, "dc-b", 90, 110), (7, "dc-b", 0, 30)]
    assert validation_errors(HeartbeatLag, df) == []


# Replica dc-a applies eleven heartbeats from dc-b over two partitions, with upper lags
# 10, 20, ..., 100 and 1000, and one from dc-c that it applies last (at 7200).
# Replica dc-b applies one heartbeat from dc-a, later than anything in dc-a: it must not
# leak into dc-a's "latest applied time".
SUMMARY_ROWS = (
    [with_upper("dc-a", 0, i, "dc-b", 1000 * i, 10 * i) for i in range(1, 7)]
    + [with_upper("dc-a", 1, i, "dc-b", 1000 * i + 500, 10 * (i + 6)) for i in range(1, 5)]
    + [with_upper("dc-a", 1, 5, "dc-b", 5500, 1000)]
    + [with_upper("dc-a", 0, 7, "dc-c", 7000, 200)]
    + [with_upper("dc-b", 0, 1, "dc-a", 9000, 50)]
)


@pytest.fixture(scope="module")
def summary(spark):
    df = lag_summary(heartbeat_lag(frame(spark, SUMMARY_ROWS)))
    return df, {(r["replica"], r["origin_region"]): r for r in df.collect()}


def test_summary_counts_and_exact_percentiles(summary):
    _, rows = summary
    a_from_b = rows[("dc-a", "dc-b")]
    assert (a_from_b["heartbeats"], a_from_b["partitions"]) == (11, 2)
    # Sorted upper lags 10..100, 1000: the median is the 6th (60); p99 sits at rank
    # 0.99 * 10 = 9.9, between 100 and 1000: 100 + 0.9 * 900 = 910.
    assert a_from_b["p50_upper_ms"] == pytest.approx(60.0)
    assert a_from_b["p99_upper_ms"] == pytest.approx(910.0)
    assert a_from_b["max_upper_ms"] == 1000
    a_from_c = rows[("dc-a", "dc-c")]
    assert (a_from_c["heartbeats"], a_from_c["p50_upper_ms"], a_from_c["p99_upper_ms"], a_from_c["max_upper_ms"]) == (
        1, 200.0, 200.0, 200,
    )
    assert set(rows) == {("dc-a", "dc-b"), ("dc-a", "dc-c"), ("dc-b", "dc-a")}


def test_summary_staleness_against_the_replicas_latest_applied_time(summary):
    _, rows = summary
    a_from_b = rows[("dc-a", "dc-b")]
    # dc-a last applied anything at 7200 (dc-c's heartbeat); the newest heartbeat from dc-b
    # it applied originated at 6000 (partition 0): staleness 1200.
    assert (a_from_b["latest_applied_ts_ms"], a_from_b["latest_origin_ts_min_ms"], a_from_b["staleness_ms"]) == (
        7200, 6000, 1200,
    )
    # Partition 1's newest heartbeat from dc-b originated at 5500: the stalest, 1700 ms.
    assert (a_from_b["stalest_topic"], a_from_b["stalest_partition"], a_from_b["stalest_partition_staleness_ms"]) == (
        "t", 1, 1700,
    )
    assert rows[("dc-a", "dc-c")]["staleness_ms"] == 200
    b_from_a = rows[("dc-b", "dc-a")]
    assert (b_from_a["latest_applied_ts_ms"], b_from_a["staleness_ms"]) == (9050, 50)


def test_replication_lag_model_passes_and_fails(spark, summary):
    df, _ = summary
    assert validation_errors(ReplicationLag, df) == []
    bad = df.withColumn("heartbeats", df["heartbeats"] * 0)
    assert any(e.column == "heartbeats" for e in validation_errors(ReplicationLag, bad))


def test_heartbeat_lag_model_fails_on_negative_lower_bound(spark):
    df = heartbeat_lag(frame(spark, [hb("dc-a", 0, 1, "dc-b", (1000, 1010), (1100, 1110))]))
    assert validation_errors(HeartbeatLag, df) == []
    bad = df.withColumn("lag_lower_ms", df["lag_lower_ms"] - 1000)
    assert any(e.column == "lag_lower_ms" for e in validation_errors(HeartbeatLag, bad))
