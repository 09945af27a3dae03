"""Reconstructed watermarks (SPEC section 3): L, P, U and M checked by hand on tiny streams."""
from __future__ import annotations

import hashlib

import pytest
from pyspark.sql import functions as F

from pipelines.segments import annotate_segments, summarize_segments
from pipelines.watermarks import partition_watermarks, reconstruct_watermarks
from schemas.validation import validation_errors
from schemas.watermarks import PartitionWatermarks, ReconstructedWatermarks
from tests.reference_leapfrog import delete, heartbeat, put, sop, stream
from tests.rows import raw_frame

A = "dc-a"
B = "dc-b"
C = "dc-c"
D = "dc-d"

ROWS = (
    # Starts at the topic's beginning: P = {}.
    stream(
        A,
        "t",
        [
            sop(),                                           # 0
            put("k", "x", A, 0),                             # 1  L {}
            put("j", "y", B, 0),                             # 2  L {a:0}
            heartbeat(A, 1, {A: 1, B: 0}, origin_ms=100),    # 3  L {a:0,b:0}
            put("k", "z", B, 1),                             # 4  L {a:1,b:0}
            delete("k", A, 2),                               # 5  L {a:1,b:1}
            heartbeat(B, 2, {A: 2, B: 2}, origin_ms=90),     # 6  L {a:2,b:1}; L(end) {a:2,b:2}
        ],
    )
    # Mid-stream: P is the first heartbeat *with* a vector (offset 12), not offset 11's.
    + stream(
        B,
        "t",
        [
            put("k", "x", A, 5),                             # 10
            heartbeat(A, 6, None),                           # 11
            heartbeat(B, 3, {A: 6, B: 3}),                   # 12
            put("k", "z", B, 4),                             # 13
        ],
        first_offset=10,
    )
    # Mid-stream without any heartbeat vector: P unknown.
    + stream(C, "t", [put("k", "x", A, 0), heartbeat(A, 1, None)], first_offset=7)
    # Mid-stream, opened by a heartbeat (no segment 0): P is that heartbeat's vector.
    + stream(D, "t", [heartbeat(B, 8, {A: 7, B: 8}, origin_ms=50), put("k", "x", A, 9)], first_offset=20)
)


@pytest.fixture(scope="module")
def annotated(spark):
    return annotate_segments(raw_frame(spark, ROWS)).localCheckpoint()


@pytest.fixture(scope="module")
def rows(annotated):
    return {(r["replica"], r["offset"]): r.asDict() for r in reconstruct_watermarks(annotated).collect()}


@pytest.fixture(scope="module")
def partitions(annotated):
    return {r["replica"]: r.asDict() for r in partition_watermarks(summarize_segments(annotated)).collect()}


def test_one_row_per_data_row_with_its_content_token(rows):
    assert sorted(rows) == [(A, 1), (A, 2), (A, 4), (A, 5), (B, 10), (B, 13), (C, 7), (D, 21)]
    assert rows[(A, 1)]["value_hash"] == hashlib.sha256(b"x").hexdigest()
    assert rows[(A, 5)]["value_hash"] == "TOMBSTONE"
    # The values stay in raw_topic_snapshots: no stage after the ingestion carries them.
    assert "value" not in rows[(A, 1)]


def test_applied_lower_bound_per_data_row(rows):
    assert [rows[(A, o)]["applied_lower_bound"] for o in (1, 2, 4, 5)] == [{}, {A: 0}, {A: 1, B: 0}, {A: 1, B: 1}]


def test_touch_bound_is_the_running_max_of_the_keys_sources(rows):
    # k: a:0, then b:1, then a:2; j only b:0. Other keys' rows never enter U.
    assert rows[(A, 1)]["touch_bound"] == {A: 0}
    assert rows[(A, 4)]["touch_bound"] == {A: 0, B: 1}
    assert rows[(A, 5)]["touch_bound"] == {A: 2, B: 1}
    assert rows[(A, 2)]["touch_bound"] == {B: 0}


def test_reach_is_L_at_the_keys_next_row_or_at_the_end(rows):
    assert rows[(A, 1)]["reach"] == {A: 1, B: 0}  # L at offset 4
    assert rows[(A, 4)]["reach"] == {A: 1, B: 1}  # L at offset 5
    assert rows[(A, 5)]["reach"] == {A: 2, B: 2}  # L(end)
    assert rows[(A, 2)]["reach"] == {A: 2, B: 2}


def test_mid_stream_pre_history_comes_from_the_first_heartbeat_with_a_vector(rows, partitions):
    assert partitions[B]["pre_history_bound"] == {A: 6, B: 3}
    assert partitions[B]["starts_with_sop"] is False and partitions[B]["pre_history_known"] is True
    # Even the row before that heartbeat is bounded by P (the pre-history reaches at least that far).
    assert rows[(B, 10)]["touch_bound"] == {A: 6, B: 3}
    assert rows[(B, 13)]["touch_bound"] == {A: 6, B: 4}
    assert rows[(B, 10)]["reach"] == {A: 6, B: 3}
    assert rows[(B, 13)]["reach"] == {A: 6, B: 4}


def test_unknown_pre_history_leaves_touch_bound_null(rows, partitions):
    assert partitions[C]["pre_history_bound"] is None and partitions[C]["pre_history_known"] is False
    assert rows[(C, 7)]["touch_bound"] is None
    assert rows[(C, 7)]["reach"] == {A: 1}


def test_partition_watermarks_by_hand(partitions):
    a = partitions[A]
    assert (a["first_offset"], a["last_offset"], a["starts_with_sop"]) == (0, 6, True)
    assert a["pre_history_bound"] == {} and a["pre_history_known"] is True
    assert a["end_lower_bound"] == {A: 2, B: 2}
    # After the last heartbeat: min(latest from a: 100, latest from b: 90). It went down from 100 after the first
    # heartbeat, so the highest over the dump would be wrong.
    assert a["resolved_ts_ms"] == 90
    assert (a["rows"], a["puts"], a["deletes"], a["heartbeats"]) == (7, 3, 1, 2)
    assert partitions[B]["resolved_ts_ms"] == 1_000
    assert partitions[C]["first_offset"] == 7
    d = partitions[D]
    assert (d["first_offset"], d["last_offset"], d["starts_with_sop"]) == (20, 21, False)
    assert d["pre_history_bound"] == {A: 7, B: 8} and d["end_lower_bound"] == {A: 9, B: 8}
    assert (d["rows"], d["puts"], d["deletes"], d["heartbeats"], d["resolved_ts_ms"]) == (2, 1, 0, 1, 50)


def test_reconstructed_watermarks_schema_accepts_the_output_and_rejects_a_bad_row(annotated):
    table = reconstruct_watermarks(annotated)
    assert validation_errors(ReconstructedWatermarks, table) == []
    bad = table.withColumn("kind", F.lit("HEARTBEAT"))
    assert any(e.column == "kind" for e in validation_errors(ReconstructedWatermarks, bad))


def test_partition_watermarks_schema_accepts_the_output_and_rejects_a_bad_row(annotated):
    table = partition_watermarks(summarize_segments(annotated))
    assert validation_errors(PartitionWatermarks, table) == []
    bad = table.withColumn("end_lower_bound", F.lit(None).cast("map<string,bigint>"))
    assert any(e.column == "end_lower_bound" for e in validation_errors(PartitionWatermarks, bad))
