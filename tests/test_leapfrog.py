"""Leap Frog divergence reports (SPEC section 4) on hand-written scenarios.

Every scenario is its own topic; all of them run through the pipeline once (module
fixture), as the assets would: annotate, reconstruct watermarks, compare. Each test
reads its topic's verdicts, and one test checks every key against the plain-Python
reference in ``tests/reference_leapfrog.py``.
"""
from __future__ import annotations

import hashlib
import json
import re

import pytest
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipelines.leapfrog import _compared, _replica_partition_ids, compare, compare_replicas, \
    comparison_layout
from pipelines.segments import annotate_segments, summarize_segments
from pipelines.vectors import vector_leq
from pipelines.watermarks import partition_watermarks, reconstruct_watermarks
from resources.tuning import DRIVER_MAX_ROWS
from schemas.divergence import DivergenceReports, DivergenceSummary
from schemas.validation import validation_errors
from tests.reference_leapfrog import (
    build_dump,
    delete,
    heartbeat,
    leq,
    put,
    reference_verdicts,
    sop,
    stream,
    vmax,
)
from tests.rows import EXAMPLES, raw_frame
from tests.spark_work import measure_work

A, B, C = "dc-a", "dc-b", "dc-c"


def sha(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def example_rows() -> list[dict]:
    with open(EXAMPLES / "two-regions" / "part-0.jsonl") as lines:
        return [json.loads(line) for line in lines]


SCENARIOS: dict[str, list[dict]] = {
    # TLA+ "symmetric" writes: the same writes reach both replicas, in different orders.
    "symmetric": stream(A, "symmetric", [
        sop(), put("k", "x", A, 0), put("j", "y", B, 0),
        heartbeat(A, 1, {A: 1, B: 0}), heartbeat(B, 1, {A: 1, B: 1}),
    ]) + stream(B, "symmetric", [
        sop(), put("j", "y", B, 0), put("k", "x", A, 0),
        heartbeat(B, 1, {A: 0, B: 1}), heartbeat(A, 1, {A: 1, B: 1}),
    ]),
    # TLA+ "asymmetric" writes: a:1 and a:2 reach dc-a only; dc-b's heartbeat covers them.
    "asymmetric": stream(A, "asymmetric", [
        sop(), put("k1", "v1", A, 0), put("k1", "v2", A, 1), put("k2", "n", A, 2), heartbeat(A, 3, {A: 3}),
    ]) + stream(B, "asymmetric", [sop(), put("k1", "v1", A, 0), heartbeat(A, 3, {A: 3})]),
    # The same loss before dc-b wrote a heartbeat covering it: not provable yet.
    "asymmetric_uncovered": stream(A, "asymmetric_uncovered", [
        sop(), put("k1", "v1", A, 0), put("k1", "v2", A, 1), put("k2", "n", A, 2), heartbeat(A, 3, {A: 3}),
    ]) + stream(B, "asymmetric_uncovered", [sop(), put("k1", "v1", A, 0), heartbeat(B, 0, {A: 0, B: 0})]),
    # TLA+ "eventually consistent" writes: concurrent x (ts 10) and y (ts 20). dc-a shows x
    # for a while; at dc-b, x arrives after y and loses, so it never shows.
    "eventually_consistent": stream(A, "eventually_consistent", [
        sop(), put("k", "x", A, 0, 10), put("k", "y", B, 0, 20),
        heartbeat(A, 1, {A: 1, B: 0}), heartbeat(B, 1, {A: 1, B: 1}),
    ]) + stream(B, "eventually_consistent", [
        sop(), put("k", "y", B, 0, 20), heartbeat(B, 1, {A: 0, B: 1}), heartbeat(A, 1, {A: 1, B: 1}),
    ]),
    # Duplicate delivery of a:0 (twice in a row, and again later while still current).
    "duplicates": stream(A, "duplicates", [
        sop(), put("k", "x", A, 0), put("k", "x", A, 0), put("j", "z", A, 1), put("k", "x", A, 0),
        heartbeat(A, 2, {A: 2}),
    ]) + stream(B, "duplicates", [sop(), put("k", "x", A, 0), put("j", "z", A, 1), heartbeat(A, 2, {A: 2})]),
    # dc-b lags: it stopped after a:1.
    "lagging": stream(A, "lagging", [
        sop(), put("k", "v1", A, 0), heartbeat(A, 1, {A: 1}), put("k", "v2", A, 2), put("j", "w", A, 3),
        heartbeat(A, 4, {A: 4}),
    ]) + stream(B, "lagging", [sop(), put("k", "v1", A, 0), heartbeat(A, 1, {A: 1})]),
    # A key written from b earlier in the same segment, then merged with a's update (a
    # partial update: the record holds both). Bounding U(v) by the last heartbeat and
    # the record's own source would "prove" a divergence here; the per-key max does not.
    "same_segment": stream(A, "same_segment", [
        sop(), heartbeat(A, 0, {A: 0, B: 0}), put("k", "f1=Y", B, 1), put("k", "f1=Y,f2=X", A, 1),
        heartbeat(A, 2, {A: 2, B: 1}),
    ]) + stream(B, "same_segment", [
        sop(), heartbeat(A, 0, {A: 0, B: 0}), put("k", "f2=X", A, 1), put("k", "f1=Y,f2=X", B, 1),
        heartbeat(A, 2, {A: 2, B: 1}),
    ]),
    # Venice's heartbeats today: no hb_vector, only their own (source_region, source_offset).
    "no_vectors": stream(A, "no_vectors", [
        sop(), put("k", "v", A, 0), put("k", "x", A, 1), heartbeat(A, 2, None),
    ]) + stream(B, "no_vectors", [sop(), put("k", "v", A, 0), heartbeat(A, 2, None)]),
    # Three replicas: dc-c applied a:0 with a corrupted value.
    "three": stream(A, "three", [
        sop(), put("k", "x", A, 0), put("j", "y", B, 0), heartbeat(C, 0, {A: 0, B: 0, C: 0}),
    ]) + stream(B, "three", [
        sop(), put("j", "y", B, 0), put("k", "x", A, 0), heartbeat(C, 0, {A: 0, B: 0, C: 0}),
    ]) + stream(C, "three", [
        sop(), put("k", "x-corrupt", A, 0), put("j", "y", B, 0), heartbeat(C, 0, {A: 0, B: 0, C: 0}),
    ]),
    # One topic, three partitions: same key names; only partition 1 lost a write; only dc-a holds 2.
    "multi": stream(A, "multi", [sop(), put("k", "x", A, 0), heartbeat(A, 1, {A: 1})], partition=0)
    + stream(B, "multi", [sop(), put("k", "x", A, 0), heartbeat(A, 1, {A: 1})], partition=0)
    + stream(A, "multi", [sop(), put("k", "x", A, 0), put("k", "z", A, 1), heartbeat(A, 2, {A: 2})], partition=1)
    + stream(B, "multi", [sop(), put("k", "x", A, 0), heartbeat(A, 2, {A: 2})], partition=1)
    + stream(A, "multi", [sop(), put("k", "x", A, 0)], partition=2),
    # dc-b's dump starts mid-stream at a heartbeat with a vector: P known, proofs possible.
    "midstream_known": stream(A, "midstream_known", [
        sop(), put("k", "p", A, 0), heartbeat(A, 1, {A: 1}), put("k", "q", A, 6), heartbeat(A, 7, {A: 7}),
    ]) + stream(B, "midstream_known", [
        heartbeat(A, 1, {A: 1}), put("k", "q-corrupt", A, 6), heartbeat(A, 7, {A: 7}),
    ], first_offset=40),
    # The same, but dc-b's heartbeats carry no vector: P unknown, nothing provable.
    "midstream_unknown": stream(A, "midstream_unknown", [
        sop(), put("k", "p", A, 0), heartbeat(A, 1, {A: 1}), put("k", "q", A, 6), heartbeat(A, 7, {A: 7}),
    ]) + stream(B, "midstream_unknown", [
        heartbeat(A, 1, None), put("k", "q-corrupt", A, 6), heartbeat(A, 7, None),
    ], first_offset=40),
    # A mid-stream dump that never saw k: IN_FLIGHT; j it holds the same.
    "midstream_never_saw": stream(A, "midstream_never_saw", [
        sop(), put("k", "x", A, 0), put("j", "y", A, 1), heartbeat(A, 2, {A: 2}),
    ]) + stream(B, "midstream_never_saw", [put("j", "y", A, 1), heartbeat(A, 2, {A: 2})], first_offset=50),
    # dc-a (replica_a) lost the only write of k: MISSING in dc-a.
    "missing_in_a": stream(A, "missing_in_a", [sop(), put("j", "y", A, 0), heartbeat(A, 2, {A: 2})])
    + stream(B, "missing_in_a", [sop(), put("j", "y", A, 0), put("k", "n", A, 1), heartbeat(A, 2, {A: 2})]),
    # The VIP-2 proposal's heartbeats over three regions; k from dc-c, corrupted in dc-b.
    "vip2": stream(A, "vip2", [
        sop(), heartbeat(C, 4500, {A: 3, B: 199, C: 4500}), put("k", "red", C, 4600), put("same", "s", C, 4601),
        heartbeat(A, 4, {A: 4, B: 199, C: 4900}),
    ]) + stream(B, "vip2", [
        sop(), heartbeat(C, 4500, {A: 3, B: 199, C: 4500}), put("k", "blue", C, 4600), put("same", "s", C, 4601),
        heartbeat(A, 4, {A: 4, B: 199, C: 4900}),
    ]),
    # Both replicas hold the partition but no data rows: a pair with nothing to compare.
    "no_data": stream(A, "no_data", [sop(), heartbeat(A, 0, {A: 0})]) + stream(B, "no_data", [sop()]),
    # A delete lost in one replica: the other still holds the value; proven once covered.
    "lost_delete": stream(A, "lost_delete", [
        sop(), put("k", "x", A, 0), delete("k", B, 0), heartbeat(B, 1, {A: 0, B: 1}),
    ]) + stream(B, "lost_delete", [sop(), put("k", "x", A, 0), heartbeat(B, 1, {A: 0, B: 1})]),
}

ALL_ROWS = [row for rows in SCENARIOS.values() for row in rows] + example_rows()


@pytest.fixture(scope="module")
def stages(spark):
    raw = raw_frame(spark, ALL_ROWS).localCheckpoint()
    annotated = annotate_segments(raw).localCheckpoint()
    row_watermarks = reconstruct_watermarks(annotated).localCheckpoint()
    partition_wm = partition_watermarks(summarize_segments(annotated)).localCheckpoint()
    # The witnesses' values are looked up in the raw rows by position: the watermarks carry tokens only.
    reports, summary = compare_replicas(row_watermarks, partition_wm, values=raw)
    return {
        "watermarks": row_watermarks,
        "partitions": partition_wm,
        "reports": reports.localCheckpoint(),
        "summary": summary.localCheckpoint(),
    }


@pytest.fixture(scope="module")
def reports(stages):
    return {
        (r["topic"], r["partition"], r["replica_a"], r["replica_b"], r["key"]): r.asDict()
        for r in stages["reports"].collect()
    }


@pytest.fixture(scope="module")
def summary(stages):
    return {
        (r["topic"], r["partition"], r["replica_a"], r["replica_b"]): r.asDict() for r in stages["summary"].collect()
    }


def verdicts(reports: dict, topic: str) -> dict:
    return {(k[1], k[2], k[3], k[4]): r["verdict"] for k, r in reports.items() if k[0] == topic}


def test_shared_two_region_example_reports_exactly_the_expected_keys(reports, summary):
    expected = json.loads((EXAMPLES / "two-regions.expected.json").read_text())["expected_reports"]
    want = {(e["topic"], e["partition"], e["replica_a"], e["replica_b"], e["key"]): e["verdict"] for e in expected}
    got = {k: r["verdict"] for k, r in reports.items() if k[0] == "store_v1"}
    assert got == want
    # Every other key is CONSISTENT: counted, not reported.
    counts = summary[("store_v1", 0, A, B)]
    assert counts["keys_compared"] == 8
    assert (counts["consistent"], counts["divergent"], counts["missing"], counts["in_flight"]) == (5, 3, 0, 0)


def test_every_verdict_and_witness_matches_the_reference(reports, summary):
    expected = reference_verdicts([{**r, "snapshot_id": "t"} for r in ALL_ROWS])
    flagged = {k: f for k, f in expected.items() if f.verdict != "CONSISTENT"}
    assert {k: r["verdict"] for k, r in reports.items()} == {k: f.verdict for k, f in flagged.items()}
    for k, finding in flagged.items():
        got = reports[k]
        assert got["missing_in"] == finding.missing_in, k
        if finding.witness_a is not None:
            assert (got["witness_offset_a"], got["witness_offset_b"]) == (
                finding.witness_a.offset,
                finding.witness_b.offset,
            ), k
    compared: dict = {}
    for (topic, partition, a, b, _), _finding in expected.items():
        compared[(topic, partition, a, b)] = compared.get((topic, partition, a, b), 0) + 1
    assert {k: v["keys_compared"] for k, v in summary.items() if v["keys_compared"]} == compared


def test_each_topic_partition_counts_its_keys_once_under_their_worst_verdict(summary):
    """``partition_keys_*`` against the reference's verdicts: each (topic, partition, key) once, under its worst
    verdict over its pairs (SPEC 10, "a key"). Catches key pairs counted as keys (issue 71: a key divergent in two of
    three pairs counted twice), a key of several pairs counted under a better verdict than its worst, a key only one
    replica holds left out, and a partition's count differing between its pair rows."""
    expected = reference_verdicts([{**r, "snapshot_id": "t"} for r in ALL_ROWS])
    rank = {"DIVERGENT": 0, "MISSING": 1, "IN_FLIGHT": 2, "CONSISTENT": 3}
    worst: dict = {}
    for (topic, partition, _, _, key), finding in expected.items():
        place = (topic, partition, key)
        worst[place] = min(worst.get(place, "CONSISTENT"), finding.verdict, key=rank.__getitem__)
    want: dict = {}
    for (topic, partition, _), verdict in worst.items():
        counts = want.setdefault((topic, partition), dict.fromkeys(["compared", *(v.lower() for v in rank)], 0))
        counts["compared"] += 1
        counts[verdict.lower()] += 1
    names = ("compared", "consistent", "divergent", "missing", "in_flight")
    got: dict = {}
    for (topic, partition, _, _), row in summary.items():
        counts = {n: row[f"partition_keys_{n}"] for n in names}
        assert got.setdefault((topic, partition), counts) == counts, (topic, partition)  # the same on every pair row
    assert {k: v for k, v in got.items() if v["compared"]} == want
    # "three": one key DIVERGENT in two of its three pairs is one DIVERGENT key (two key pairs), beside a CONSISTENT one.
    assert got[("three", 0)] == {"compared": 2, "consistent": 1, "divergent": 1, "missing": 0, "in_flight": 0}
    assert sum(summary[("three", 0, *pair)]["divergent"] for pair in ((A, B), (A, C), (B, C))) == 2


def test_a_pair_without_data_rows_gets_a_zero_summary_row(reports, summary):
    assert verdicts(reports, "no_data") == {}
    counts = summary[("no_data", 0, A, B)]
    assert [counts[c] for c in ("keys_compared", "consistent", "divergent", "missing", "in_flight")] == [0] * 5


def test_every_proof_names_a_witness_that_satisfies_the_definition(stages):
    proven = stages["reports"].where(F.col("verdict").isin("DIVERGENT", "MISSING"))
    checked = proven.select(
        (F.col("witness_hash_a") != F.col("witness_hash_b")).alias("contents_differ"),
        vector_leq(F.col("touch_bound_b"), F.col("reach_a")).alias("a_had_applied_w"),
        vector_leq(F.col("touch_bound_a"), F.col("reach_b")).alias("b_had_applied_v"),
    ).collect()
    assert len(checked) >= 10
    assert all(all(row) for row in checked)


def test_symmetric_writes_are_never_flagged(reports, summary):
    assert verdicts(reports, "symmetric") == {}
    assert summary[("symmetric", 0, A, B)]["consistent"] == 2


def test_asymmetric_write_is_proven_once_covered_by_heartbeats_in_both(reports):
    assert verdicts(reports, "asymmetric") == {(0, A, B, "k1"): "DIVERGENT", (0, A, B, "k2"): "MISSING"}
    k1 = reports[("asymmetric", 0, A, B, "k1")]
    # v = dc-a's v2 (offset 2), w = dc-b's v1 (offset 1).
    assert (k1["witness_offset_a"], k1["witness_offset_b"]) == (2, 1)
    assert (k1["witness_value_a"], k1["witness_value_b"]) == ("v2", "v1")
    assert (k1["witness_hash_a"], k1["witness_hash_b"]) == (sha("v2"), sha("v1"))
    assert (k1["touch_bound_a"], k1["reach_a"]) == ({A: 1}, {A: 3})
    assert (k1["touch_bound_b"], k1["reach_b"]) == ({A: 0}, {A: 3})
    assert leq(k1["touch_bound_b"], k1["reach_a"]) and leq(k1["touch_bound_a"], k1["reach_b"])
    assert k1["missing_in"] is None
    k2 = reports[("asymmetric", 0, A, B, "k2")]
    assert k2["missing_in"] == B
    # w is dc-b's pre-dump version: no offset, ABSENT.
    assert (k2["witness_offset_a"], k2["witness_offset_b"]) == (3, None)
    assert (k2["witness_hash_b"], k2["witness_value_b"]) == ("ABSENT", None)
    assert (k2["touch_bound_b"], k2["reach_b"]) == ({}, {A: 3})
    assert (k2["versions_a"], k2["versions_b"]) == (2, 1)


def test_asymmetric_write_before_the_covering_heartbeat_is_in_flight(reports):
    assert verdicts(reports, "asymmetric_uncovered") == {(0, A, B, "k1"): "IN_FLIGHT", (0, A, B, "k2"): "IN_FLIGHT"}
    k1 = reports[("asymmetric_uncovered", 0, A, B, "k1")]
    assert k1["witness_offset_a"] is None and k1["witness_hash_a"] is None
    assert (k1["last_offset_a"], k1["last_offset_b"]) == (2, 1)
    assert (k1["last_hash_a"], k1["last_hash_b"]) == (sha("v2"), sha("v1"))


def test_eventually_consistent_writes_with_a_temporary_value_are_not_flagged(reports, summary):
    assert verdicts(reports, "eventually_consistent") == {}
    assert summary[("eventually_consistent", 0, A, B)]["consistent"] == 1


def test_duplicate_deliveries_are_not_flagged(reports):
    assert verdicts(reports, "duplicates") == {}


def test_a_lagging_replica_is_in_flight_never_divergent(reports):
    assert verdicts(reports, "lagging") == {(0, A, B, "k"): "IN_FLIGHT", (0, A, B, "j"): "IN_FLIGHT"}
    j = reports[("lagging", 0, A, B, "j")]
    assert (j["last_offset_b"], j["last_hash_b"], j["versions_b"]) == (None, "ABSENT", 1)
    assert (j["last_offset_a"], j["last_hash_a"], j["versions_a"]) == (4, sha("w"), 2)


def test_earlier_write_from_another_region_in_the_same_segment_is_not_flagged(reports):
    assert verdicts(reports, "same_segment") == {}
    # The scenario matters: with U bounded by the last heartbeat and the row's own source
    # (dc-a's merged row: {a:1, b:0}), dc-a's "f1=Y,f2=X" and dc-b's "f2=X" would pass.
    a = build_dump(SCENARIOS["same_segment"][:5])
    b = build_dump(SCENARIOS["same_segment"][5:])
    last_heartbeat_bound = vmax({A: 0, B: 0}, {A: 1})
    assert leq(last_heartbeat_bound, b.reach[2]) and leq(b.touch[2], a.reach[3])
    assert not leq(a.touch[3], b.reach[2])


def test_heartbeats_without_vectors_still_prove_a_lost_write(reports):
    assert verdicts(reports, "no_vectors") == {(0, A, B, "k"): "DIVERGENT"}
    k = reports[("no_vectors", 0, A, B, "k")]
    assert (k["touch_bound_a"], k["reach_a"], k["touch_bound_b"], k["reach_b"]) == ({A: 1}, {A: 2}, {A: 0}, {A: 2})


def test_three_replicas_are_compared_pairwise(reports, summary):
    assert verdicts(reports, "three") == {(0, A, C, "k"): "DIVERGENT", (0, B, C, "k"): "DIVERGENT"}
    assert sorted(k for k in summary if k[0] == "three") == [("three", 0, A, B), ("three", 0, A, C), ("three", 0, B, C)]
    assert summary[("three", 0, A, B)]["consistent"] == 2


def test_topics_and_partitions_are_compared_separately(reports, summary):
    assert verdicts(reports, "multi") == {(1, A, B, "k"): "DIVERGENT"}
    # Partition 2 is held by one replica only: there is no pair to compare.
    assert sorted(k[1] for k in summary if k[0] == "multi") == [0, 1]


def test_mid_stream_dump_with_a_known_pre_history_can_be_proven(reports):
    assert verdicts(reports, "midstream_known") == {(0, A, B, "k"): "DIVERGENT"}
    k = reports[("midstream_known", 0, A, B, "k")]
    assert (k["witness_offset_a"], k["witness_offset_b"]) == (3, 41)
    assert k["versions_b"] == 1  # no pre-dump version without START_OF_PUSH


def test_mid_stream_dump_with_unknown_pre_history_is_never_divergent(reports):
    assert verdicts(reports, "midstream_unknown") == {(0, A, B, "k"): "IN_FLIGHT"}


def test_a_key_a_mid_stream_dump_never_saw_is_in_flight(reports):
    assert verdicts(reports, "midstream_never_saw") == {(0, A, B, "k"): "IN_FLIGHT"}
    k = reports[("midstream_never_saw", 0, A, B, "k")]
    assert (k["versions_b"], k["last_hash_b"]) == (0, None)


def test_missing_names_the_replica_that_lacks_the_key(reports):
    assert verdicts(reports, "missing_in_a") == {(0, A, B, "k"): "MISSING"}
    assert reports[("missing_in_a", 0, A, B, "k")]["missing_in"] == A


def test_vip2_heartbeats_bound_a_write_from_a_third_region(reports, stages):
    assert verdicts(reports, "vip2") == {(0, A, B, "k"): "DIVERGENT"}
    marks = {
        r["offset"]: r.asDict()
        for r in stages["watermarks"].where((F.col("topic") == "vip2") & (F.col("replica") == A)).collect()
    }
    # Row 2 (k from dc-c:4600) sits after the heartbeat {3, 199, 4500}.
    assert marks[2]["applied_lower_bound"] == {A: 3, B: 199, C: 4500}
    # VIP-2 would bound U by that heartbeat: {3, 199, 4600}. The key's own sources are tighter.
    assert marks[2]["touch_bound"] == {C: 4600}
    # k stays current to the end: M is L(end), the heartbeat {4, 199, 4900}.
    assert marks[2]["reach"] == {A: 4, B: 199, C: 4900}
    assert marks[3]["applied_lower_bound"] == {A: 3, B: 199, C: 4600}
    assert marks[3]["touch_bound"] == {C: 4601}
    k = reports[("vip2", 0, A, B, "k")]
    assert (k["witness_value_a"], k["witness_value_b"]) == ("red", "blue")
    assert k["reach_b"] == {A: 4, B: 199, C: 4900}


def test_a_lost_delete_is_proven_against_the_surviving_value(reports):
    assert verdicts(reports, "lost_delete") == {(0, A, B, "k"): "DIVERGENT"}
    k = reports[("lost_delete", 0, A, B, "k")]
    assert (k["witness_hash_a"], k["witness_value_a"], k["witness_hash_b"]) == ("TOMBSTONE", None, sha("x"))


def _sorted_rows(df: DataFrame) -> list[tuple]:
    return sorted((tuple(r) for r in df.collect()), key=repr)


def _runs_python(df: DataFrame) -> bool:
    return "MapInArrow" in df._jdf.queryExecution().analyzed().toString()


def test_the_comparison_on_the_driver_gives_the_same_tables_without_python_workers(stages):
    # Bugs caught: the driver's pass seeing only part of a key's rows or another order (other
    # verdicts, witnesses or last versions than the executors' pass), its output typed
    # otherwise, or a small comparison still sent to Python workers (mapInArrow).
    rows, partitions = stages["watermarks"], stages["partitions"]
    assert rows.count() <= DRIVER_MAX_ROWS
    layout = comparison_layout(partitions)
    ids = _replica_partition_ids(rows.sparkSession, layout)
    assert _runs_python(_compared(rows, layout, ids, driver=False))
    assert not _runs_python(_compared(rows, layout, ids, driver=True))
    on_executors = compare(rows, partitions, layout)
    on_driver = compare(rows, partitions, layout, rows=rows.count())
    for name in ("reports", "summary", "last_versions"):
        want, got = getattr(on_executors, name), getattr(on_driver, name)
        assert not _runs_python(got), name
        assert got.schema == want.schema, name
        assert _sorted_rows(got) == _sorted_rows(want), name
    assert any(r["verdict"] == "DIVERGENT" for r in on_driver.reports.collect())


def test_a_pass_of_a_few_hundred_thousand_rows_runs_in_a_task_per_core_with_the_same_tables(stages):
    # Bugs caught: a mid-sized pass merged by adaptive execution into one Python task (one core busy, the other idle:
    # the exchange must name its partitions), a split that sends a key's rows to two tasks (other verdicts or last
    # versions than the unsplit pass), and the split applied where it does not belong (a driver-sized pass, an
    # unknown size, inputs large enough for adaptive execution's own partitions, a single core), and a pass split
    # into more tasks than its rows fill (a cluster's every core starting a Python worker for a few hundred rows).
    from resources.tuning import SPLIT_PASS_MAX_ROWS, pass_tasks

    assert pass_tasks(None, 2) is None and pass_tasks(DRIVER_MAX_ROWS, 2) is None
    assert pass_tasks(DRIVER_MAX_ROWS + 1, 2) == 2 and pass_tasks(SPLIT_PASS_MAX_ROWS, 8) == 8
    assert pass_tasks(SPLIT_PASS_MAX_ROWS + 1, 2) is None and pass_tasks(DRIVER_MAX_ROWS + 1, 1) is None
    assert pass_tasks(3 * DRIVER_MAX_ROWS, 64) == 3  # many cores: tasks of at least DRIVER_MAX_ROWS rows
    rows, partitions = stages["watermarks"], stages["partitions"]
    layout = comparison_layout(partitions)
    ids = _replica_partition_ids(rows.sparkSession, layout)
    plan = _compared(rows, layout, ids, driver=False, tasks=3)._jdf.queryExecution().executedPlan().toString()
    assert re.search(r"Exchange hashpartitioning\(part_id#\d+, key#\d+, 3\)", plan), plan
    unsplit = compare(rows, partitions, layout)
    split = compare(rows, partitions, layout, rows=DRIVER_MAX_ROWS + 1)  # the pass counts no rows: a bound it trusts
    assert rows.sparkSession.sparkContext.defaultParallelism >= 2
    for name in ("reports", "summary", "last_versions"):
        assert _sorted_rows(getattr(split, name)) == _sorted_rows(getattr(unsplit, name)), name


def test_divergence_reports_schema_accepts_the_output_and_rejects_a_bad_row(stages):
    table = stages["reports"]
    assert validation_errors(DivergenceReports, table) == []
    bad = table.withColumn("verdict", F.lit("CONSISTENT"))
    assert any(e.column == "verdict" for e in validation_errors(DivergenceReports, bad))


def test_divergence_summary_schema_accepts_the_output_and_rejects_a_bad_row(stages):
    table = stages["summary"]
    assert validation_errors(DivergenceSummary, table) == []
    bad = table.withColumn("divergent", F.lit(None).cast("long"))
    assert any(e.column == "divergent" for e in validation_errors(DivergenceSummary, bad))


# A hot key: one key written N times (from dc-a, offsets 0..N-1) in both replicas, at two
# sizes (N and 2N, a topic each). Its first half is tight: a heartbeat every 100 writes bounds
# every version closely, and dc-b's version N/4 is corrupted: the earliest proof. Its second
# half arrives after a heartbeat that already covers every write: there every version of one
# replica overlaps every version of the other, and any two with different contents prove a
# divergence (N^2/6 proving pairs): the worst case for a comparison that pairs versions, even
# one that keeps only the pairs that prove something.
HOT_VERSIONS = 10_000
# The deliberately quadratic control pairs every 10th version only (N^2 / 100 pairs), to stay cheap.
PAIRED_SAMPLE = 10
# work(2N) / work(N): linear work doubles (fixed costs make it a little less), pairing quadruples.
# Adaptive execution may plan the same comparison a little differently from run to run (seen:
# +-10% rows at one size), which the margin absorbs.
LINEAR_GROWTH_LIMIT = 3.0


def hot_key_messages(versions: int, corrupt_at: int | None = None) -> list[dict]:
    def write(i: int) -> dict:
        return put("hot", f"v{i % 3}" + ("-corrupt" if i == corrupt_at else ""), A, i)

    tight = []
    for i in range(versions // 2):
        tight.append(write(i))
        if i % 100 == 99:
            tight.append(heartbeat(A, i, {A: i}))
    covered = [write(i) for i in range(versions // 2, versions)]
    return [sop(), *tight, heartbeat(A, versions, {A: versions}), *covered]


def hot_key_rows(topic: str, versions: int) -> list[dict]:
    return stream(A, topic, hot_key_messages(versions)) + stream(
        B, topic, hot_key_messages(versions, corrupt_at=versions // 4)
    )


def expected_hot_report(rows: list[dict], versions: int) -> tuple:
    """(verdict, witness offsets a and b, witness values a and b), as tests/reference_leapfrog.py finds them."""
    corrupted = next(r for r in rows if (r.get("value") or "").endswith("-corrupt"))["offset"]
    value = f"v{versions // 4 % 3}"
    # Both dumps have the same layout: dc-a holds the same write at the same offset.
    return ("DIVERGENT", corrupted, corrupted, value, f"{value}-corrupt")


def pair_every_version(row_watermarks: DataFrame) -> DataFrame:
    """Deliberately quadratic: the SPEC's definition as one join.

    Every version of dc-a is paired with every version of dc-b of the same key, the proof
    test is the join's condition, and an aggregate keeps the earliest proof per key: the
    obvious Spark reading of SPEC section 4, and the bug the hot-key test exists to catch.
    The hot key's vectors have one region, so one component of U and M decides.
    """

    def side(replica: str, s: str) -> DataFrame:
        return row_watermarks.where(F.col("replica") == replica).select(
            "topic", "partition", "key",
            F.col("offset").alias(f"offset_{s}"), F.col("value_hash").alias(f"token_{s}"),
            F.col("touch_bound")[A].alias(f"u_{s}"), F.col("reach")[A].alias(f"m_{s}"),
        )

    proves = (F.col("token_a") != F.col("token_b")) & (F.col("u_b") <= F.col("m_a")) & (F.col("u_a") <= F.col("m_b"))
    return (
        side(A, "a").join(side(B, "b"), on=["topic", "partition", "key"]).where(proves)
        .groupBy("topic", "partition", "key").agg(F.min(F.struct("offset_b", "offset_a")).alias("first"))
    )


def next_offset_by_scanning_ahead(row_watermarks: DataFrame) -> DataFrame:
    """Deliberately quadratic in CPU, linear in rows: a min over "1 following to unbounded following".

    Spark aggregates such a frame anew for every row; b886d1b replaced exactly this (the
    next run start) with a lead that skips nulls.
    """
    ahead = Window.partitionBy("topic", "partition", "replica", "key").orderBy("offset")
    return row_watermarks.select(F.min("offset").over(ahead.rowsBetween(1, Window.unboundedFollowing)))


def test_a_hot_key_is_compared_with_work_linear_in_its_versions(spark):
    """Twice the versions of a hot key make Spark process about twice the rows, and the verdict is right.

    The bug it catches: a compare_replicas that pairs the versions of a key, e.g. a join of
    dc-a's and dc-b's versions on the key with the proof test as the join's condition (as
    ``pair_every_version`` does), a cross join, or one row per version in every overlap
    range. On the hot key's second half any of these makes ~N^2 rows, so the work grows
    about four-fold when N doubles, however small the result. Also an aggregate over a
    window frame running to the partition's end (quadratic CPU with linear rows, which no
    row count shows): such frames in any executed plan are reported. And a wrong answer:
    the key is DIVERGENT with the reference's witness, dc-b's corrupted version.

    The work is what Spark's own metrics say every job did while compare_replicas ran and
    its outputs were collected, checkpoints included (``tests/spark_work.py``): the plan of
    its result only reads the last checkpoint. Only compare_replicas' signature and outputs
    are relied on, so any near-linear implementation passes. Both controls run under the
    same measurement and are flagged by it, or the measurement would prove nothing.
    The comparison itself runs in Spark's Python workers (``compare_keys``), where Spark's
    metrics see its input and output rows only: the proof search's own work on a hot key
    (``earliest_proofs``) is checked in ``tests/test_leapfrog_kernel.py``.
    """
    # The expected witness is the reference's (which pairs versions: checked on a small instance).
    small = hot_key_rows("small", 400)
    finding = reference_verdicts([{**r, "snapshot_id": "t"} for r in small])[("small", 0, A, B, "hot")]
    witness_a, witness_b = finding.witness_a, finding.witness_b
    assert (finding.verdict, witness_a.offset, witness_b.offset, witness_a.value, witness_b.value) == (
        expected_hot_report(small, 400)
    )

    sizes = (HOT_VERSIONS, 2 * HOT_VERSIONS)
    topic = {n: f"hot_{n}" for n in sizes}
    rows = {n: hot_key_rows(topic[n], n) for n in sizes}
    raw = raw_frame(spark, [r for n in sizes for r in rows[n]]).localCheckpoint()
    annotated = annotate_segments(raw).localCheckpoint()
    partition_wm = partition_watermarks(summarize_segments(annotated)).localCheckpoint()
    row_wm = reconstruct_watermarks(annotated).localCheckpoint()

    compared, paired = {}, {}
    for n in sizes:
        # Each size's inputs saved on their own, so that reading them counts for that size only.
        versions, partitions = (f.where(F.col("topic") == topic[n]).localCheckpoint() for f in (row_wm, partition_wm))
        with measure_work(spark) as work:
            reports, summary = compare_replicas(versions, partitions, values=raw.where(F.col("topic") == topic[n]))
            found = reports.collect()
            counts = summary.collect()
        compared[n] = work
        expected = expected_hot_report(rows[n], n)
        witness = ("verdict", "witness_offset_a", "witness_offset_b", "witness_value_a", "witness_value_b")
        assert [(r["key"], *(r[c] for c in witness)) for r in found] == [("hot", *expected)]
        assert [(c["keys_compared"], c["divergent"]) for c in counts] == [(1, 1)]
        sample = versions.where(F.col("touch_bound")[A] % PAIRED_SAMPLE == 0).localCheckpoint()
        with measure_work(spark) as work:
            proofs = pair_every_version(sample).collect()
        paired[n] = work
        # The control compares for real: its earliest proof (among every 10th version) is the same.
        assert [(p["first"]["offset_a"], p["first"]["offset_b"]) for p in proofs] == [expected[1:3]]

    def growth(work: dict) -> float:
        return work[sizes[1]].rows / work[sizes[0]].rows

    numbers = "\n".join(
        f"{name} at {n:,} versions: {work[n]}"
        for name, work in (("compare_replicas", compared), ("pairing control", paired))
        for n in sizes
    )
    assert growth(compared) < LINEAR_GROWTH_LIMIT, numbers
    assert growth(paired) > LINEAR_GROWTH_LIMIT, numbers
    assert [frame for n in sizes for frame in compared[n].window_frames] == []

    with measure_work(spark) as scanning:
        next_offset_by_scanning_ahead(row_wm.where(F.col("touch_bound")[A] < 500)).collect()
    assert scanning.window_frames == ["specifiedwindowframe(RowFrame, 1, unboundedfollowing$())"]
