"""Heartbeat segments (SPEC section 2): segment numbers, baselines, L, resolved timestamps, summaries."""
from __future__ import annotations

import random

import pytest
from pyspark.sql import functions as F

from pipelines.segments import annotate_segments, summarize_segments
from pipelines.vectors import region_universe, vector_max
from pipelines.watermarks import reconstruct_watermarks
from schemas.segments import HeartbeatSegments, HeartbeatSegmentSummary
from schemas.validation import validation_errors
from tests.reference_leapfrog import delete, heartbeat, put, sop, stream
from tests.rows import raw_frame

A = "dc-a"
B = "dc-b"

# dc-a's dump, by offset:
#   0 START_OF_PUSH            segment 0
#   1 PUT k1 (a:0)             segment 0
#   2 HEARTBEAT a:1 {a:1,b:0}  opens segment 1, origin 100
#   3 PUT k2 (b:1)
#   4 DELETE k1 (a:2)
#   5 HEARTBEAT b:2 no vector  opens segment 2, origin 50
#   6 PUT k1 (b:3)
#   7 HEARTBEAT a:3 {a:3,b:3}  opens segment 3, origin 200
#   8 HEARTBEAT b:4 {a:3,b:4}  opens segment 4, origin 300
ROWS = stream(
    A,
    "t",
    [
        sop(),
        put("k1", "v1", A, 0),
        heartbeat(A, 1, {A: 1, B: 0}, origin_ms=100, applied_ms=110),
        put("k2", "v2", B, 1),
        delete("k1", A, 2),
        heartbeat(B, 2, None, origin_ms=50, applied_ms=120),
        put("k1", "v3", B, 3),
        heartbeat(A, 3, {A: 3, B: 3}, origin_ms=200, applied_ms=130),
        heartbeat(B, 4, {A: 3, B: 4}, origin_ms=300, applied_ms=140),
    ],
) + stream(B, "t", [put("k1", "v1", A, 0), heartbeat(B, 1, {A: 0, B: 1}, origin_ms=10, applied_ms=20)]) + [
    {"replica": A, "topic": "t", "partition": 0, "offset": None, "kind": "EXPORTER_POSITION",
     "exporter": "cdc", "exported_offset": 4, "reported_at_ms": 500},
]


@pytest.fixture(scope="module")
def annotated(spark):
    return annotate_segments(raw_frame(spark, ROWS)).localCheckpoint()


@pytest.fixture(scope="module")
def by_offset(annotated):
    return {(r["replica"], r["offset"]): r.asDict() for r in annotated.collect()}


def test_exporter_positions_are_not_version_topic_rows(by_offset):
    assert len(by_offset) == 11
    assert all(offset is not None for _, offset in by_offset)


def test_each_heartbeat_opens_its_own_segment(by_offset):
    segments = [by_offset[(A, o)]["segment"] for o in range(9)]
    assert segments == [0, 0, 1, 1, 1, 2, 2, 3, 4]
    openings = [by_offset[(A, o)]["opening_offset"] for o in range(9)]
    assert openings == [None, None, 2, 2, 2, 5, 5, 7, 8]
    # Partitions are numbered independently: dc-b's first heartbeat is its segment 1.
    assert [by_offset[(B, o)]["segment"] for o in range(2)] == [0, 1]


def test_baseline_is_the_opening_vector_or_its_single_component(by_offset):
    assert by_offset[(A, 1)]["baseline_vector"] is None
    assert by_offset[(A, 4)]["baseline_vector"] == {A: 1, B: 0}
    assert by_offset[(A, 6)]["baseline_vector"] == {B: 2}  # heartbeat without hb_vector
    assert by_offset[(A, 6)]["opening_applied_ts_min_ms"] == 120
    assert by_offset[(A, 6)]["opening_applied_ts_max_ms"] == 125


def test_applied_lower_bound_covers_strictly_earlier_rows(by_offset):
    expected = [{}, {}, {A: 0}, {A: 1, B: 0}, {A: 1, B: 1}, {A: 2, B: 1}, {A: 2, B: 2}, {A: 2, B: 3}, {A: 3, B: 3}]
    assert [by_offset[(A, o)]["applied_lower_bound"] for o in range(9)] == expected
    assert by_offset[(A, 0)]["contribution"] == {}  # START_OF_PUSH adds nothing
    assert by_offset[(A, 5)]["contribution"] == {B: 2}


def test_resolved_timestamp_is_the_least_latest_origin_time(by_offset):
    # After heartbeats from a (100), b (50), a (200), b (300): 100, 50, 50, 200.
    assert [by_offset[(A, o)]["resolved_ts_ms"] for o in range(9)] == [None, None, 100, 100, 100, 50, 50, 50, 200]


def test_summary_counts_rows_per_kind_and_closes_each_segment(annotated):
    rows = {r["segment"]: r.asDict() for r in summarize_segments(annotated).where(F.col("replica") == A).collect()}
    assert sorted(rows) == [0, 1, 2, 3, 4]
    zero, one, two = rows[0], rows[1], rows[2]
    assert (zero["first_offset"], zero["last_offset"], zero["rows"], zero["puts"], zero["other_rows"]) == (0, 1, 2, 1, 1)
    assert zero["opening_offset"] is None and zero["baseline_vector"] is None
    assert zero["closing_watermark"] == {A: 0}
    assert (one["opening_offset"], one["rows"], one["puts"], one["deletes"], one["heartbeats"]) == (2, 3, 1, 1, 1)
    assert one["baseline_vector"] == {A: 1, B: 0}
    assert one["closing_watermark"] == {A: 2, B: 1}
    assert (one["opening_applied_ts_min_ms"], one["opening_applied_ts_max_ms"], one["resolved_ts_ms"]) == (110, 115, 100)
    assert two["closing_watermark"] == {A: 2, B: 3}
    assert two["resolved_ts_ms"] == 50
    assert rows[4]["closing_watermark"] == {A: 3, B: 4}
    assert rows[4]["resolved_ts_ms"] == 200


def test_summary_tells_each_segments_first_kind_and_whether_a_vector_opened_it(annotated):
    # What the partition watermarks are read from: the dump's first row (segment 0 starts with START_OF_PUSH) and the
    # first heartbeat carrying a vector (segment 2's opening heartbeat has none).
    rows = {r["segment"]: r.asDict() for r in summarize_segments(annotated).where(F.col("replica") == A).collect()}
    assert [rows[s]["first_kind"] for s in range(5)] == ["START_OF_PUSH", "HEARTBEAT", "HEARTBEAT", "HEARTBEAT", "HEARTBEAT"]
    assert [rows[s]["opening_has_vector"] for s in range(5)] == [False, True, False, True, True]


def test_heartbeat_segments_schema_accepts_the_output_and_rejects_a_bad_row(annotated):
    assert [f.name for f in annotated.schema.fields] == [f.name for f in HeartbeatSegments.to_structtype().fields]
    assert validation_errors(HeartbeatSegments, annotated) == []
    bad = annotated.withColumn("segment", F.lit(-1).cast("long"))
    assert any(e.column == "segment" for e in validation_errors(HeartbeatSegments, bad))


def test_segment_summary_schema_accepts_the_output_and_rejects_a_bad_row(annotated):
    summary = summarize_segments(annotated)
    assert validation_errors(HeartbeatSegmentSummary, summary) == []
    bad = summary.withColumn("heartbeats", F.lit(2).cast("long"))
    assert any(e.column == "heartbeats" for e in validation_errors(HeartbeatSegmentSummary, bad))


def test_the_region_universe_holds_every_source_region_and_every_vector_key_once(spark):
    # What annotate_segments builds one running-max column per: a region named only as a heartbeat vector's key
    # (dc-z) must be in it, nulls (no region, no vector) must not, and each name once, sorted.
    frame = spark.createDataFrame(
        [("dc-b", {"dc-z": 3, "dc-a": 1}), (None, None), ("dc-a", {}), ("dc-b", {"dc-a": 2, "dc-z": 4})],
        "source_region string, hb_vector map<string,bigint>",
    )
    assert region_universe(frame, region_columns=["source_region"], vector_columns=["hb_vector"]) == ["dc-a", "dc-b", "dc-z"]
    assert region_universe(frame, vector_columns=["hb_vector"]) == ["dc-a", "dc-z"]
    assert region_universe(frame) == []


@pytest.mark.parametrize("evaluation", ["interpreted", "compiled"])
def test_vector_max_is_componentwise_and_a_null_side_counts_as_empty(spark, request, evaluation):
    # Bug caught: a null side answered null instead of the other side (or of {} when both are null), a key of one
    # side lost, the smaller of two components kept, or the two evaluation modes disagreeing on the shortcut that
    # skips the merge when a side is null.
    session = spark if evaluation == "interpreted" else request.getfixturevalue("compiled_by_default")
    rng = random.Random(7)

    def vector():
        return None if rng.random() < 0.2 else {r: rng.randrange(5) for r in ("dc-a", "dc-b", "dc-c") if rng.random() < 0.6}

    pairs = [({"dc-a": 1, "dc-b": 5}, {"dc-b": 2, "dc-c": 0}), (None, {"dc-a": 3}), ({"dc-a": 3}, None), (None, None),
             ({}, {}), ({}, None), *[(vector(), vector()) for _ in range(200)]]
    frame = session.createDataFrame(list(enumerate(pairs)), "i int, pair struct<a: map<string,bigint>, b: map<string,bigint>>")
    got = {r["i"]: r["m"] for r in frame.select("i", vector_max(F.col("pair.a"), F.col("pair.b")).alias("m")).collect()}
    for i, (a, b) in enumerate(pairs):
        a, b = a or {}, b or {}
        assert got[i] == {r: max(a.get(r, -1), b.get(r, -1)) for r in {*a, *b}}, (i, a, b)


def test_no_stage_after_the_ingestion_reads_a_value(spark, tmp_path):
    # Bug caught: a value carried past raw_topic_snapshots again (a column kept by "*", a token computed from the
    # value instead of read): every sort, window and batch of the stages would then hold each value, which is what
    # exhausted the heap with many values of megabytes (docs/venice-input.md, "Memory").
    path = str(tmp_path / "raw")
    raw_frame(spark, ROWS).write.parquet(path)
    raw = spark.read.parquet(path)
    annotated = annotate_segments(raw)
    rows = reconstruct_watermarks(annotated)
    for frame in (annotated, rows):
        leaves = frame._jdf.queryExecution().sparkPlan().collectLeaves()  # before adaptive execution wraps it
        scanned = [list(leaves.apply(i).requiredSchema().fieldNames()) for i in range(leaves.size())
                   if leaves.apply(i).nodeName().startswith("Scan parquet")]
        assert scanned and all("value" not in s for s in scanned) and any("value_hash" in s for s in scanned), scanned
        assert "value" not in frame.columns and "value_hash" in frame.columns
