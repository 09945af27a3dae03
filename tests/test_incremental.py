"""Incremental audits: state carried from one snapshot of a stream to the next (pipelines/state/carry.py).

Continuing snapshots are made by cutting streams by offset: S1 holds each replica
partition's rows below its cut (with START_OF_PUSH), S2 the rest, as a later mid-stream
dump would. Every scenario is its own topic, and all of them go through the divergence
stage once (module fixture ``audits``): S1, then S2 with S1's state, S2 alone (no state)
and S3, the whole streams as one snapshot. Overlapping dumps re-read S1's last offsets
(``rereading``) and are compared with the same dumps trimmed by hand; a chain of them, each
re-reading the one before, is tests/test_state_bounded.py's. The Dagster tests
audit S2 through ``run_audit`` on a warehouse holding S1's state, re-materialize it, tamper
with the state, and audit an S2 that re-reads S1's last offsets.
"""
from __future__ import annotations

import re

import json
import shutil
import tempfile
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from deltalake import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from assets.partitions import SNAPSHOTS
from explain.carried import Stream, continue_stream
from explain.document import ReplicaInput, explain, witness_versions
from explain.reading import explain_key, input_of
from explain.text import render_text
from pipelines.leapfrog import compare, compare_replicas, comparison_layout, state_files
from pipelines.segments import annotate_segments, summarize_segments
from pipelines.state.carry import (
    CONTEXT,
    VERSION,
    PriorState,
    StateRefused,
    carry_over,
    context_problems,
    next_state,
    predecessors,
    no_prior_state,
    prior_state,
    contexts_from_sums,
)
from pipelines.state.check import found_sums_of_arrow
from pipelines.watermarks import partition_watermarks, reconstruct_watermarks
from replica_lens.audit import run_audit
from replica_lens.jobs import AUDIT_JOB
from replica_lens.simulator import SimulationConfig, simulate
from resources.delta_store import DeltaStore
from schemas.registry import model_for, struct_for
from schemas.state import ReplicaState
from schemas.validation import TableValidation, validation_errors
from schemas.watermarks import PartitionWatermarks, ReconstructedWatermarks
from tests.reference_leapfrog import compare_key, dumps_of, heartbeat, put, reference_verdicts, sop, stream
from tests.rows import raw_frame, value_hash


def token(value: str) -> str:
    return value_hash({"kind": "PUT", "value": value})

A, B = "dc-a", "dc-b"
TOPIC = "orders"
PROVEN = ("DIVERGENT", "MISSING")
SETTINGS = {"spark_master": "local[2]", "delta_jars_dir": None, "shuffle_partitions": 4}
# The audits of this file look at the divergence step and its state only: no lag or exporter tables (scope
# "divergence", replica_lens/scopes.py; those tables carry nothing between snapshots).
AUDIT = {**SETTINGS, "scope": "divergence"}
DIVERGENCE_STAGE = ("divergence_reports", "divergence_summary", "replica_state")


# --------------------------------------------------------------------------- scenarios


def position(row: dict) -> tuple:
    return row["replica"], row["topic"], row["partition"]


def split(rows: list[dict], cut: dict[tuple, int]) -> tuple[list[dict], list[dict]]:
    """S1: each replica partition's rows below its cut; S2: the rest. Exporter reports go to S2."""
    first = [r for r in rows if r.get("offset") is not None and r["offset"] < cut[position(r)]]
    second = [r for r in rows if r.get("offset") is None or r["offset"] >= cut[position(r)]]
    return first, second


def exporter(replica: str, exported: int, at: int) -> dict:
    return {"replica": replica, "topic": TOPIC, "partition": 0, "kind": "EXPORTER_POSITION",
            "exporter": "cdc", "exported_offset": exported, "reported_at_ms": at}


# "orders": dc-b loses k2 (a:1) and corrupts k4 (a:2); both are last written before the cut,
# after which come k3 and a heartbeat. k1 is written before the cut only.
ORDERS = stream(A, TOPIC, [
    sop(), put("k1", "x", A, 0), put("k2", "y", A, 1), put("k4", "v", A, 2), heartbeat(A, 3, {A: 3}),
    put("k3", "z", A, 4), heartbeat(A, 5, {A: 5}),
]) + stream(B, TOPIC, [
    sop(), put("k1", "x", A, 0), put("k4", "CORRUPT", A, 2), heartbeat(A, 3, {A: 3}),
    put("k3", "z", A, 4), heartbeat(A, 5, {A: 5}),
]) + [exporter(A, 3, 1_000), exporter(B, 4, 2_000)]
ORDERS_CUT = {(A, TOPIC, 0): 5, (B, TOPIC, 0): 4}

# "late_p": a mid-stream dump without any heartbeat vector before the cut (P unknown in S1).
LATE_P = stream(A, "late_p", [put("k", "x", A, 7), put("j", "y", B, 3), heartbeat(A, 9, {A: 9, B: 4}),
                              put("k", "w", A, 10)], first_offset=100)
LATE_P_CUT = {(A, "late_p", 0): 102}


def simulated(tmp: Path, topic: str, seed: int, keys: int, **faults) -> tuple[list[dict], dict[tuple, int]]:
    """A small simulated snapshot renamed to ``topic``, with cuts at 3/5 of every replica partition."""
    config = SimulationConfig(seed=seed, regions=3, partitions=1, keys=keys, writes=240, heartbeat_every=10,
                              exporters=1, **faults)
    simulate(str(tmp), topic, config)
    rows = [{**json.loads(line), "topic": topic} for path in sorted((tmp / topic).glob("*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]
    last: dict[tuple, int] = {}
    for r in rows:
        if r.get("offset") is not None:
            last[position(r)] = max(last.get(position(r), 0), r["offset"])
    return rows, {p: (3 * n) // 5 for p, n in last.items()}


def stage(spark, rows: list[dict], snapshot_id: str) -> tuple[DataFrame, DataFrame]:
    """(reconstructed_watermarks, partition_watermarks) of a snapshot, as the watermark assets compute them."""
    annotated = annotate_segments(raw_frame(spark, rows, snapshot_id))
    return (reconstruct_watermarks(annotated).localCheckpoint(eager=True),
            partition_watermarks(summarize_segments(annotated)).localCheckpoint(eager=True))


ROW_COLUMNS = ReconstructedWatermarks.to_structtype().names


def no_state(spark) -> DataFrame:
    return spark.createDataFrame([], ReplicaState.to_structtype())


@dataclass
class Compared:
    """The verdicts of one comparison, collected."""

    reports: list[dict]
    summary: list[dict]

    def verdicts(self, topic: str) -> dict[tuple, str]:
        return {(r["replica_a"], r["replica_b"], r["key"]): r["verdict"] for r in self.reports if r["topic"] == topic}

    def compared(self, topic: str) -> int:
        return sum(r["keys_compared"] for r in self.summary if r["topic"] == topic)


@dataclass
class Audit(Compared):
    """The divergence stage of one snapshot, run without Dagster as the asset runs it."""

    row_wm: DataFrame
    part_wm: DataFrame
    prior: PriorState
    rows: DataFrame  # carried reconstructed_watermarks
    carried: DataFrame  # the same with what the state kept of each carried version (carry_over(prior_payload=True))
    parts: DataFrame  # carried partition_watermarks
    state: DataFrame  # replica_state after the snapshot
    raw: DataFrame  # raw_topic_snapshots of the snapshot


def audit(
    spark, rows: list[dict], snapshot_id: str, state: DataFrame | None = None, raw: DataFrame | None = None
) -> Audit:
    """The divergence stage of ``rows``; ``state`` and ``raw`` hold the earlier snapshots' state and raw rows."""
    row_wm, part_wm = stage(spark, rows, snapshot_id)
    own_raw = raw_frame(spark, rows, snapshot_id)
    every_raw = own_raw if raw is None else raw.unionByName(own_raw)
    prior = prior_state(state if state is not None else no_state(spark), part_wm, snapshot_id, every_raw)
    # As the asset runs it: a small cut (its per-key facts broadcast to the carried versions), the carried rows holding
    # what the state kept of them; the comparison's pass writes the state's VERSION rows, the contexts follow from its
    # sums.
    carried, carried_parts = carry_over(row_wm, part_wm, prior.versions, prior.context,
                                        cut_rows=len(rows), prior_payload=True)
    carried = carried.localCheckpoint(eager=True)
    comparison, after = compared_with_state(spark, carried, carried_parts, prior, snapshot_id)
    reports, summary = comparison.reports, comparison.summary
    return Audit(reports=[r.asDict() for r in reports.collect()], summary=[r.asDict() for r in summary.collect()],
                 row_wm=row_wm, part_wm=part_wm, prior=prior, rows=carried.select(*ROW_COLUMNS), carried=carried,
                 parts=carried_parts, state=after, raw=own_raw)


def compared_with_state(spark, rows: DataFrame, parts: DataFrame, prior: PriorState, snapshot_id: str,
                        count: int | None = None):
    """The comparison with the state written by its pass, as the divergence asset runs it: (comparison, state rows).

    ``rows``: ``carry_over(prior_payload=True)``'s. ``count``: the rows' count, to run the pass on the driver (None:
    in Spark's Python workers).
    """
    store = DeltaStore(warehouse_root=tempfile.mkdtemp(prefix="state-"), engine="embedded")
    table = "replica_state"
    stage_ = store.arrow_stage(table, snapshot_id, struct_for(table), TableValidation(model_for(table)).arrow_rules())
    layout = comparison_layout(parts)
    comparison = compare(rows, parts, layout, rows=count, state=state_files(stage_, layout))
    store.write_arrow(stage_, contexts_from_sums(parts, prior.context, comparison.state_sums), name="contexts")
    staged = store.stage_arrow(stage_, struct_for(table))
    assert staged.metrics["rule_counts"] == [0] * len(stage_.rules)
    written = store.read_staged(spark, staged).select(*[f.name for f in ReplicaState.to_structtype().fields])
    return comparison, written.localCheckpoint(eager=True)


@dataclass
class Audits:
    rows: list[dict]  # every scenario's whole streams
    s1_rows: list[dict]
    s2_rows: list[dict]
    s1: Audit
    s2: Audit  # with S1's state
    alone: Compared  # S2 without any state
    s3: Audit  # the whole streams (except late_p) as one snapshot, with S1's state present


@pytest.fixture(scope="module")
def audits(spark, tmp_path_factory) -> Audits:
    tmp = tmp_path_factory.mktemp("simulations")
    clean, clean_cut = simulated(tmp, "clean", seed=11, keys=60, lagging_replica="dc-c", lag_messages=15)
    faulty, faulty_cut = simulated(tmp, "faulty", seed=1, keys=30, lost_writes=3, corrupted_values=3,
                                   duplicate_deliveries=2, conflicting_writes=2)
    rows = ORDERS + LATE_P + clean + faulty
    s1_rows, s2_rows = split(rows, {**ORDERS_CUT, **LATE_P_CUT, **clean_cut, **faulty_cut})
    s1 = audit(spark, s1_rows, "s1")
    s2 = audit(spark, s2_rows, "s2", s1.state)
    alone_reports, alone_summary = compare_replicas(s2.row_wm, s2.part_wm)
    alone = Compared([r.asDict() for r in alone_reports.collect()], [r.asDict() for r in alone_summary.collect()])
    s3 = audit(spark, [r for r in rows if r["topic"] != "late_p"], "s3", s1.state)
    return Audits(rows, s1_rows, s2_rows, s1, s2, alone, s3)


def state_rows(state: DataFrame) -> list[tuple]:
    """State rows as sorted tuples (maps as their sorted entries): equal lists are equal tables, duplicates too."""
    return sorted(
        (tuple(tuple(sorted(v.items())) if isinstance(v, dict) else v for v in row) for row in state.collect()),
        key=repr,
    )


def test_the_state_the_comparisons_pass_writes_is_the_state_spark_aggregates(spark, audits):
    """Every state row (last versions, carried ones included, and contexts with their checksums) is the
    same whether the comparison's pass writes it (as the asset does, on the driver or in Spark's
    Python workers) or Spark aggregates the rows (``next_state`` with ``last_versions_of``).

    Bug caught: the pass taking a key's first row for its last (or the reverse), a payload column
    taken from another row (the rows are sorted in the pass, the payload is not), a region's
    highest source offset lost or put under another region, a lone replica partition (no pair to
    compare) left out of the state, ``L`` of a carried key's first row not being the stored one, a
    carried version matched to another key or replica (its origin, ``key_touch`` or ``missing_before``
    wrong), a task's checksum share differing from Spark's ``xxhash64``, or the tasks' shares summed
    other than modulo 2^64.
    """
    for audited in (audits.s1, audits.s2, audits.s3):
        aggregated = next_state(audited.rows, audited.parts, audited.prior.versions, audited.prior.context)
        assert state_rows(audited.state) == state_rows(aggregated)
        _, on_driver = compared_with_state(spark, audited.carried, audited.parts, audited.prior,
                                           audited.state.first()["snapshot_id"], count=audited.rows.count())
        assert state_rows(on_driver) == state_rows(aggregated)


def topic_rows(df: DataFrame, topic: str) -> list[dict]:
    return [r.asDict() for r in df.where(F.col("topic") == topic).collect()]


def columns(df: DataFrame) -> list[tuple]:
    return [(f.name, f.dataType) for f in df.schema.fields]


def columns_of(model) -> list[tuple]:
    return [(f.name, f.dataType) for f in model.to_structtype().fields]


def canonical(df: DataFrame) -> list[tuple]:
    return sorted(tuple(sorted((k, str(v)) for k, v in r.asDict().items())) for r in df.collect())


# --------------------------------------------------------------------------- pure functions


def test_carry_over_gives_the_same_rows_whether_a_cut_is_broadcast_or_shuffled(audits):
    """A small cut's per-key facts are broadcast to the carried versions' scan (the asset's plan for a live store's
    cuts); a large cut's are shuffled and sort-merged with them. Catches the two plans giving different rows: a carried
    key touch lost by the filter on the cut's keys, a carried version given another key's first row in the snapshot,
    or the carried payload (origin, stream position, touch) differing; and a plan that stops being the one meant."""
    audited = audits.s2  # continues S1's state (S3 starts at START_OF_PUSH: nothing carried)
    prior = audited.prior
    small, _ = carry_over(audited.row_wm, audited.part_wm, prior.versions, prior.context, cut_rows=10,
                          prior_payload=True)
    large, _ = carry_over(audited.row_wm, audited.part_wm, prior.versions, prior.context, prior_payload=True)
    # The joins on a key (the carried versions' with the cut's rows): sort-merged only for the large cut.
    by_key = re.compile(r"(SortMergeJoin|BroadcastHashJoin) \[[^\]]*\bkey#")
    plans = {name: by_key.findall(df._jdf.queryExecution().sparkPlan().toString())
             for name, df in (("small", small), ("large", large))}
    assert plans["small"] and set(plans["small"]) == {"BroadcastHashJoin"}
    assert plans["large"] and set(plans["large"]) == {"SortMergeJoin"}
    assert canonical(small) == canonical(large) == canonical(audited.carried)
    assert small.where(F.col("is_prior")).count() == prior.carried_versions > 0


def test_carry_over_extends_l_u_m_and_adds_each_carried_version_at_its_real_offset(audits):
    s2 = audits.s2
    assert columns(s2.rows) == columns_of(ReconstructedWatermarks)
    assert columns(s2.parts) == columns_of(PartitionWatermarks)
    got = {(r["replica"], r["key"], r["offset"]): r for r in topic_rows(s2.rows, TOPIC)}
    assert set(got) == {(A, "k1", 1), (A, "k2", 2), (A, "k4", 3), (A, "k3", 5),
                        (B, "k1", 1), (B, "k4", 2), (B, "k3", 4)}
    # dc-a's S2 dump alone gives k3 L = {} and M = L(end) = {a: 5}; S1 had applied {a: 3}.
    k3 = got[(A, "k3", 5)]
    assert (k3["applied_lower_bound"], k3["touch_bound"], k3["reach"]) == ({A: 3}, {A: 4}, {A: 5})
    # Carried versions: S2's snapshot id, U from the stream (P = {} after START_OF_PUSH), M = L'(end)
    # since S2 does not write them, and L of the key's first row in the stream (the reach of ⊥).
    k2 = got[(A, "k2", 2)]
    assert (k2["snapshot_id"], k2["value_hash"], k2["touch_bound"], k2["reach"]) == ("s2", token("y"), {A: 1}, {A: 5})
    assert k2["applied_lower_bound"] == {A: 0}
    assert (got[(B, "k4", 2)]["value_hash"], got[(B, "k4", 2)]["reach"]) == (token("CORRUPT"), {A: 5})
    part = {r["replica"]: r for r in topic_rows(s2.parts, TOPIC)}
    # The stream started at START_OF_PUSH in S1; S2's own offsets and counts stay S2's.
    assert part[A]["starts_with_sop"] and part[A]["pre_history_bound"] == {} and part[A]["end_lower_bound"] == {A: 5}
    assert (part[A]["first_offset"], part[A]["puts"]) == (5, 1)
    # The watermark table itself keeps S2's own view.
    assert [r["applied_lower_bound"] for r in topic_rows(audits.s2.row_wm, TOPIC)] == [{}, {}]


def test_carry_over_passes_replica_partitions_without_prior_context_through_unchanged(audits):
    # Nothing precedes S1: every replica partition passes through.
    order = ("topic", "replica", "offset")
    assert [r.asDict() for r in audits.s1.rows.orderBy(*order).collect()] == \
        [r.asDict() for r in audits.s1.row_wm.orderBy(*order).collect()]
    assert [r.asDict() for r in audits.s1.parts.orderBy("topic", "replica").collect()] == \
        [r.asDict() for r in audits.s1.part_wm.orderBy("topic", "replica").collect()]


def test_a_stream_whose_p_was_unknown_takes_the_first_heartbeat_vector_of_the_next_dump(audits):
    # No U in S1. S2's first heartbeat gives the stream its P, and every version (the carried
    # one too) gets a U: all or none per dump, as the Leap Frog's indexing needs.
    assert {r["touch_bound"] is None for r in topic_rows(audits.s1.rows, "late_p")} == {True}
    touch = {(r["key"], r["offset"]): r["touch_bound"] for r in topic_rows(audits.s2.rows, "late_p")}
    assert touch == {("k", 100): {A: 9, B: 4}, ("j", 101): {A: 9, B: 4}, ("k", 103): {A: 10, B: 4}}
    assert topic_rows(audits.s2.parts, "late_p")[0]["pre_history_bound"] == {A: 9, B: 4}
    versions = {r["key"]: r for r in topic_rows(audits.s2.state.where(F.col("row_kind") == VERSION), "late_p")}
    # key_touch stays without P, so that U can be recomputed whatever P the stream gets.
    assert versions["k"]["key_touch"] == {A: 10} and versions["j"]["key_touch"] == {B: 3}


def test_next_state_keeps_the_last_version_per_key_and_one_context_per_replica_partition(audits):
    state = audits.s2.state
    assert columns(state) == columns_of(ReplicaState)
    assert not validation_errors(ReplicaState, state)
    versions = {(r["replica"], r["key"]): r for r in topic_rows(state.where(F.col("row_kind") == VERSION), TOPIC)}
    assert set(versions) == {(A, "k1"), (A, "k2"), (A, "k3"), (A, "k4"), (B, "k1"), (B, "k3"), (B, "k4")}
    assert (versions[(A, "k2")]["offset"], versions[(A, "k2")]["origin_snapshot_id"]) == (2, "s1")
    k3 = versions[(A, "k3")]
    assert (k3["offset"], k3["origin_snapshot_id"]) == (5, "s2")
    assert (k3["first_lower_bound"], k3["key_touch"]) == ({A: 3}, {A: 4})
    contexts = {r["replica"]: r for r in topic_rows(state.where(F.col("row_kind") == CONTEXT), TOPIC)}
    a = contexts[A]
    assert (a["previous_snapshot_id"], a["first_offset"], a["stream_first_offset"], a["last_offset"]) == ("s1", 5, 0, 6)
    assert a["starts_with_sop"] and a["end_lower_bound"] == {A: 5}
    assert (a["state_rows"], contexts[B]["state_rows"]) == (4, 3)
    s1_context = topic_rows(audits.s1.state.where((F.col("row_kind") == CONTEXT) & (F.col("replica") == A)), TOPIC)
    assert (s1_context[0]["previous_snapshot_id"], s1_context[0]["last_offset"]) == (None, 4)


def test_context_problems_finds_missing_changed_and_duplicated_state(audits):
    """Catches a state whose VERSION rows lost a row or changed a column passing its context's check (count or
    checksum), a checksum that depends on the rows' order, a duplicated context passing, and the checksum counted in
    Spark's Python workers differing from the one counted on the driver."""
    state = audits.s1.state.where(F.col("topic") == TOPIC)
    versions = state.where(F.col("row_kind") == VERSION)
    contexts = state.where(F.col("row_kind") == CONTEXT)

    def problems(v: DataFrame, c: DataFrame) -> set[tuple]:
        # Counted in Spark's Python workers (a large state) and on the driver from rows read (a small one, as
        # ``prior_state`` does): the same problems.
        found = [{(r["replica"], r["problem"], r["found"]) for r in context_problems(v, c, found=counts)}
                 for counts in (None, found_sums_of_arrow(v.toArrow()))]
        assert found[0] == found[1]
        return {(replica, problem) for replica, problem, _ in found[0]}

    assert problems(versions, contexts) == set()
    # Row order does not change the checksum.
    assert problems(versions.orderBy(F.col("key").desc()).repartition(3), contexts) == set()
    without_k2 = versions.where(~((F.col("replica") == A) & (F.col("key") == "k2")))
    assert problems(without_k2, contexts) == {(A, "STATE_ROWS"), (A, "STATE_CHECKSUM")}
    changed = versions.withColumn("value_hash", F.when(F.col("key") == "k4", F.lit("w")).otherwise(F.col("value_hash")))
    assert problems(changed, contexts) == {(A, "STATE_CHECKSUM"), (B, "STATE_CHECKSUM")}
    assert problems(versions, contexts.unionByName(contexts.where(F.col("replica") == B))) == {(B, "DUPLICATE_CONTEXT")}


def context_row(spark, snapshot_id: str, first: int, last: int, replica: str = A) -> DataFrame:
    row = {"snapshot_id": snapshot_id, "row_kind": CONTEXT, "replica": replica, "topic": TOPIC, "partition": 0,
           "first_offset": first, "stream_first_offset": 0, "last_offset": last, "starts_with_sop": True,
           "pre_history_bound": {}, "end_lower_bound": {A: last}, "state_rows": 1000 - last, "state_checksum": 0}
    struct = ReplicaState.to_structtype()
    return spark.createDataFrame([tuple(row.get(f.name) for f in struct.fields)], struct)


def partition_row(spark, first: int, last: int, snapshot_id: str = "s9") -> DataFrame:
    row = {"snapshot_id": snapshot_id, "replica": A, "topic": TOPIC, "partition": 0, "first_offset": first,
           "last_offset": last, "starts_with_sop": False, "pre_history_bound": {}, "pre_history_known": True,
           "end_lower_bound": {}, "rows": 1, "puts": 0, "deletes": 0, "heartbeats": 0}
    struct = PartitionWatermarks.to_structtype()
    return spark.createDataFrame([tuple(row.get(f.name) for f in struct.fields)], struct)


def test_the_predecessor_is_the_context_with_the_greatest_last_offset_below_the_dump(spark):
    """Catches a predecessor other than the closest state below the dump (or the one it overlaps and continues), and
    the chosen state's size (``previous_state_rows``, which decides whether it is read onto the driver) taken from
    another context."""
    contexts = (context_row(spark, "s0", 0, 9).unionByName(context_row(spark, "s1", 10, 19))
                .unionByName(context_row(spark, "s2", 20, 29)).unionByName(context_row(spark, "s1", 10, 19, B)))
    link = predecessors(partition_row(spark, 30, 39), contexts).first()
    assert (link["previous_snapshot_id"], link["previous_last_offset"], link["overlapping"]) == ("s2", 29, [])
    assert link["previous_state_rows"] == 971
    # A dump that skips s2's range continues the state right below it.
    skipping = predecessors(partition_row(spark, 25, 26), contexts.where(F.col("snapshot_id") != "s2")).first()
    assert (skipping["previous_snapshot_id"], skipping["previous_state_rows"]) == ("s1", 981)
    fresh = predecessors(partition_row(spark, 0, 5), contexts).first()
    assert (fresh["previous_snapshot_id"], fresh["previous_state_rows"]) == (None, None)
    # A dump starting inside s2's range and going past it continues s2, once the overlap 25..29 is verified.
    inside = predecessors(partition_row(spark, 25, 35), contexts).first()
    assert (inside["previous_snapshot_id"], inside["previous_last_offset"], inside["overlap"]) == ("s2", 29, True)
    assert inside["previous_state_rows"] == 971
    assert [o["snapshot_id"] for o in inside["overlapping"]] == ["s2"]
    assert link["overlap"] is False


def no_raw(spark) -> DataFrame:
    return raw_frame(spark, [], "none")


def test_a_dump_overlapping_a_state_it_cannot_continue_or_two_tied_predecessors_are_refused(spark, audits):
    # dc-a's S1 dump of orders covers 0..4. A dump inside it adds nothing to S1's state.
    with pytest.raises(StateRefused) as refused:
        prior_state(audits.s1.state, partition_row(spark, 2, 4, snapshot_id="s2x"), "s2x", no_raw(spark))
    message = str(refused.value)
    assert "dc-a/orders/0" in message and "snapshot s1 covers offsets 0..4" in message
    assert "adds no offset to that state" in message
    # A dump from S1's first offset on: does it continue S1's state or replace it?
    with pytest.raises(StateRefused, match=r"at offset 0 \(up to 6\), but the state of snapshot s1 covers offsets "
                                           r"0\.\.4, from that offset or later, so whether s2x continues"):
        prior_state(audits.s1.state, partition_row(spark, 0, 6, snapshot_id="s2x"), "s2x", no_raw(spark))
    # A dump overlapping two states.
    two = context_row(spark, "s1", 0, 4).unionByName(context_row(spark, "s1b", 5, 9))
    with pytest.raises(StateRefused, match=r"the states of snapshots s1 \(0\.\.4\), s1b \(5\.\.9\) all cover some "
                                           r"of its offsets, so which state s9 continues is ambiguous"):
        prior_state(two, partition_row(spark, 3, 12), "s9", no_raw(spark))
    tied = context_row(spark, "s1", 0, 19).unionByName(context_row(spark, "s1b", 5, 19))
    with pytest.raises(StateRefused, match=r"dc-a/orders/0: the states of snapshots s1, s1b all end at offset 19"):
        prior_state(tied, partition_row(spark, 20, 30), "s9", no_raw(spark))


# ------------------------------------------------------------- overlapping dumps


def offsets_of(rows: list[dict]) -> dict[tuple, list[int]]:
    found: dict[tuple, set[int]] = {}
    for r in rows:
        if r.get("offset") is not None:
            found.setdefault(position(r), set()).add(r["offset"])
    return {p: sorted(o) for p, o in found.items()}


def dump_between(rows: list[dict], start: dict[tuple, int], stop: dict[tuple, int] | None = None) -> list[dict]:
    """Each replica partition's rows at offsets start..stop (stop excluded; none: to the end, exporter reports too)."""
    if stop is None:
        return [r for r in rows if r.get("offset") is None or r["offset"] >= start[position(r)]]
    return [r for r in rows if r.get("offset") is not None and start[position(r)] <= r["offset"] < stop[position(r)]]


def rereading(s1_rows: list[dict], s2_rows: list[dict], offsets: int = 2) -> list[dict]:
    """S2 as a dump tool would write it: it re-reads S1's last ``offsets`` offsets (never S1's first)."""
    below = offsets_of(s1_rows)
    start = {p: o[max(len(o) - offsets, 1)] for p, o in below.items()}
    return [r for r in s1_rows if r["offset"] >= start[position(r)]] + s2_rows


@pytest.fixture(scope="module")
def overlapping(spark, audits) -> Audit:
    """S2 re-reading the last offsets of S1, audited as s2 with S1's state and raw rows."""
    return audit(spark, rereading(audits.s1_rows, audits.s2_rows), "s2", audits.s1.state, audits.s1.raw)


def without(df: DataFrame, *names: str) -> list[tuple]:
    return canonical(df.drop(*names))


def test_a_dump_overlapping_its_predecessor_gives_the_audit_of_the_dump_trimmed_by_hand(audits, overlapping):
    # audits.s2 is the same S2 trimmed by hand at S1's last offset.
    links = {(r["replica"], r["topic"]): r for r in overlapping.prior.links}
    assert {link["previous_snapshot_id"] for link in links.values()} == {"s1"}
    assert len(links) == len(audits.s2.prior.links)
    a, b = links[(A, TOPIC)], links[(B, TOPIC)]
    assert (a["first_offset"], a["previous_last_offset"], a["state_rows"]) == (3, 4, 3)
    assert a["overlap"] == {"first_offset": 3, "last_offset": 4, "offsets": 2, "rows_verified": 2}
    assert b["overlap"] == {"first_offset": 2, "last_offset": 3, "offsets": 2, "rows_verified": 2}
    assert links[(A, "late_p")]["overlap"]["offsets"] == 1
    # An overlap counted twice would show up in the carried rows, the counts and the verdicts.
    assert canonical(overlapping.rows) == canonical(audits.s2.rows)
    assert sorted(map(str, overlapping.reports)) == sorted(map(str, audits.s2.reports))
    assert sorted(map(str, overlapping.summary)) == sorted(map(str, audits.s2.summary))
    # The state after S2 is the trimmed audit's, but for the offsets of S2's own dump.
    own = ("first_offset", "rows", "puts", "deletes", "heartbeats")
    assert without(overlapping.parts, *own) == without(audits.s2.parts, *own)
    assert without(overlapping.state, "first_offset") == without(audits.s2.state, "first_offset")
    context = topic_rows(overlapping.state.where((F.col("row_kind") == CONTEXT) & (F.col("replica") == A)), TOPIC)
    assert (context[0]["first_offset"], context[0]["stream_first_offset"], context[0]["last_offset"]) == (3, 0, 6)
    # The per-snapshot table keeps S2's own rows, the re-read ones included.
    assert {r["offset"] for r in topic_rows(overlapping.row_wm, TOPIC) if r["replica"] == A} == {3, 5}


ORDERS_S1 = [r for r in ORDERS if r.get("offset") is not None and r["offset"] < ORDERS_CUT[position(r)]]
ORDERS_S2 = [r for r in ORDERS if r.get("offset") is None or r["offset"] >= ORDERS_CUT[position(r)]]


def changed(rows: list[dict], replica: str, offset: int, **fields) -> list[dict]:
    return [{**r, **fields} if (r["replica"], r.get("offset")) == (replica, offset) else r for r in rows]


@pytest.fixture(scope="module")
def rereading_orders(spark) -> tuple[list[dict], DataFrame]:
    """Orders' S2 re-reading dc-a's offsets 2..4 and dc-b's 2..3 of S1, and its partition_watermarks."""
    rows = [r for r in ORDERS_S1 if r["offset"] >= 2] + ORDERS_S2
    return rows, stage(spark, rows, "s2x")[1]


def test_an_overlap_whose_messages_differ_is_refused_at_the_first_offset_where_they_do(spark, audits, rereading_orders):
    rows, part_wm = rereading_orders
    state = audits.s1.state.where(F.col("topic") == TOPIC)
    s1_raw = raw_frame(spark, ORDERS_S1, "s1")

    def refusal(s2x_rows: list[dict], s1_raw: DataFrame = s1_raw) -> str:
        with pytest.raises(StateRefused) as refused:
            prior_state(state, part_wm, "s2x", s1_raw.unionByName(raw_frame(spark, s2x_rows, "s2x")))
        return str(refused.value)

    # k4 (offset 3) and the heartbeat after it differ: the first difference is named, not the second.
    message = refusal(changed(changed(rows, A, 3, value="w"), A, 4, hb_vector={A: 4}))
    assert "dc-a/orders/0: s2x starts at offset 2, inside the state of snapshot s1 (up to 4)" in message
    assert "first at offset 3, where the messages differ in value" in message
    assert "offset 4" not in message and "dc-b/orders/0" not in message
    message = refusal(changed(rows, A, 4, hb_vector={A: 4}))
    assert "first at offset 4, where the messages differ in hb_vector" in message
    # An offset only one of the two dumps holds.
    message = refusal([r for r in rows if (r["replica"], r.get("offset")) != (A, 3)])
    assert "first at offset 3, where only s1 has a message (PUT)" in message
    s1_lacking = raw_frame(spark, [r for r in ORDERS_S1 if (r["replica"], r["offset"]) != (B, 2)], "s1")
    message = refusal(rows, s1_lacking)
    assert "dc-b/orders/0" in message and "first at offset 2, where only s2x has a message (PUT)" in message
    # S1's raw rows are gone: nothing to verify the overlap with.
    message = refusal(rows, raw_frame(spark, [r for r in ORDERS_S1 if r["replica"] == B], "s1"))
    assert "dc-a/orders/0" in message and "no longer holds s1's rows at offsets 2..4" in message


def test_an_overlap_differing_only_in_bookkeeping_columns_or_vector_order_is_verified(spark, audits, rereading_orders):
    rows, part_wm = rereading_orders
    s1_raw = raw_frame(spark, changed(ORDERS_S1, A, 4, hb_vector={A: 3, B: 0}), "s1")
    s2x_raw = raw_frame(spark, [{**r, "source_file": "dump-2.jsonl", "copies": 2} for r in rows], "s2x")
    # The heartbeat at dc-a's offset 4 with the same vector, its entries in the other order.
    heartbeat_4 = (F.col("replica") == A) & (F.col("offset") == 4)
    reordered = F.create_map(F.lit(B), F.lit(0).cast("long"), F.lit(A), F.lit(3).cast("long"))
    s2x_raw = s2x_raw.withColumn("hb_vector", F.when(heartbeat_4, reordered).otherwise(F.col("hb_vector")))
    raw = s1_raw.unionByName(s2x_raw)
    assert raw.where(heartbeat_4).select(F.to_json("hb_vector")).distinct().count() == 2
    prior = prior_state(audits.s1.state.where(F.col("topic") == TOPIC), part_wm, "s2x", raw)
    overlaps = {link["replica"]: link["overlap"] for link in prior.links}
    assert overlaps == {A: {"first_offset": 2, "last_offset": 4, "offsets": 3, "rows_verified": 3},
                        B: {"first_offset": 2, "last_offset": 3, "offsets": 2, "rows_verified": 2}}


def test_the_snapshots_own_state_is_ignored_so_rematerializing_it_uses_the_state_before_it(spark, audits):
    # S2's own contexts cover exactly S2's offsets: were they read, S2 would overlap them.
    again = prior_state(audits.s1.state.unionByName(audits.s2.state), audits.s2.part_wm, "s2", no_raw(spark))
    assert again.previous_snapshot_ids == ["s1"] and again.links == audits.s2.prior.links
    assert canonical(again.context) == canonical(audits.s2.prior.context)


def test_with_no_other_snapshots_state_the_prior_state_is_the_empty_one_the_asset_takes_without_reading(spark, audits):
    # The divergence asset skips reading contexts when the Delta log names no other snapshot's state
    # (no_prior_state). Catches: that shortcut differing from what prior_state finds on the same store (its own
    # state only), e.g. carrying something or refusing.
    alone = prior_state(audits.s1.state, audits.s1.part_wm, "s1", no_raw(spark))
    shortcut = no_prior_state(spark)
    assert alone.links == shortcut.links == []
    assert alone.previous_snapshot_ids == shortcut.previous_snapshot_ids == []
    assert alone.context.count() == shortcut.context.count() == 0
    assert alone.versions.count() == shortcut.versions.count() == 0
    assert [(f.name, f.dataType) for f in shortcut.versions.schema] == [(f.name, f.dataType) for f in audits.s1.state.schema]


def test_a_start_of_push_dump_starts_a_fresh_stream_without_carry_over(audits):
    # S3 is a full dump taken later: it starts at START_OF_PUSH although S1's state is there.
    assert audits.s3.prior.links == [] and audits.s3.prior.previous_snapshot_ids == []
    contexts = audits.s3.state.where(F.col("row_kind") == CONTEXT).collect()
    assert {c["previous_snapshot_id"] for c in contexts} == {None}
    assert {c["stream_first_offset"] for c in contexts} == {0}
    assert audits.s3.verdicts(TOPIC) == {(A, B, "k2"): "MISSING", (A, B, "k4"): "DIVERGENT"}
    assert audits.s3.rows.count() == audits.s3.row_wm.count()


def test_keys_last_written_before_the_cut_are_compared_and_proven_only_with_the_state(audits):
    assert audits.s2.verdicts(TOPIC) == {(A, B, "k2"): "MISSING", (A, B, "k4"): "DIVERGENT"}
    assert {r["missing_in"] for r in audits.s2.reports if r["key"] == "k2" and r["topic"] == TOPIC} == {B}
    assert audits.s2.compared(TOPIC) == 4
    # S2 alone is a fresh mid-stream start: it sees k3 only.
    assert audits.alone.verdicts(TOPIC) == {} and audits.alone.compared(TOPIC) == 1


def test_a_clean_split_audited_incrementally_gives_the_verdicts_of_one_whole_audit(audits):
    # "clean": no faults, but dc-c lags, so keys are IN_FLIGHT at the end.
    assert audits.s2.verdicts("clean") == audits.s3.verdicts("clean")
    assert set(audits.s3.verdicts("clean").values()) == {"IN_FLIGHT"}
    # With the topic partition's keys, each once under its worst verdict (issue 71), counted by the pass with the
    # carried versions as with the whole stream.
    counts = ("replica_a", "replica_b", "keys_compared", "consistent", "divergent", "missing", "in_flight",
              "partition_keys_compared", "partition_keys_consistent", "partition_keys_in_flight")

    def summary(a: Audit) -> list[tuple]:
        return sorted(tuple(r[c] for c in counts) for r in a.summary if r["topic"] == "clean")

    assert summary(audits.s2) == summary(audits.s3)
    written_in_s2 = {r["key"] for r in audits.s2_rows if r["topic"] == "clean" and r["kind"] in ("PUT", "DELETE")}
    written = {r["key"] for r in audits.rows if r["topic"] == "clean" and r["kind"] in ("PUT", "DELETE")}
    assert written - written_in_s2, "some keys should be written before the cut only"
    assert audits.alone.compared("clean") < audits.s2.compared("clean")


# --------------------------------------------------------------------------- explaining a continued key


def explained_streams(audited: Audit) -> tuple[dict[tuple, Stream], dict[tuple, dict]]:
    """Per continued replica partition, the stream's facts, and every (replica, topic, partition, key, offset)'s row,
    as ``explain`` computes them (``explain/carried.py``) from the rows the tables keep: S's own watermarks, the
    predecessor's CONTEXT row and its VERSION rows."""
    contexts = {position(r): r for r in (x.asDict() for x in audited.prior.context.collect()) if r["row_kind"] == CONTEXT}
    carried = {(*position(r), r["key"]): r for r in (x.asDict() for x in audited.prior.versions.collect())
               if r["row_kind"] == VERSION and r["snapshot_id"] == contexts.get(position(r), {}).get("snapshot_id")}
    dumps = {position(r): r for r in (x.asDict() for x in audited.part_wm.collect())}
    own: dict[tuple, list[dict]] = {}
    for r in (x.asDict() for x in audited.row_wm.collect()):
        own.setdefault((*position(r), r["key"]), []).append(r)
    streams, rows = {}, {}
    for part, context in contexts.items():
        keys = {k[3] for k in [*own, *carried] if k[:3] == part}
        for key in keys:
            streams[part], key_rows = continue_stream(dumps[part], context, carried.get((*part, key)),
                                                      own.get((*part, key), []))
            rows.update({(*part, key, r["offset"]): r for r in key_rows})
    return streams, rows


BOUNDS = ("applied_lower_bound", "touch_bound", "reach", "missing_before")


@pytest.mark.parametrize("which", ["s2", "overlapping", "gapped"])
def test_explain_computes_the_carried_rows_and_bounds_the_comparison_used(audits, overlapping, gapped, which):
    """``explain/carried.py`` (plain Python, one key at a time) gives, for every key of every continued replica
    partition, exactly the rows and the L, U, M and gap counts that ``carry_over`` gave the comparison, and the
    stream's P, L(end), START_OF_PUSH, first gap and gap positions; every report's witness is one of those rows,
    with the report's U and M.

    Catches explain showing a continuing snapshot's own bounds (not the verdict's), a carried version left out or
    its reach taken from the wrong rule (a gap in an earlier dump, the gap between the state and S, the key's first
    row in S, S's first gap), an overlap's rows shown although the comparison left them out, and a P left unknown
    where the next dump gives it."""
    audited = {"s2": audits.s2, "overlapping": overlapping, "gapped": gapped}[which]
    streams, rows = explained_streams(audited)
    assert streams, "no continued replica partition: the scenario tests nothing"
    continued = set(streams)
    spark_rows = {(*position(r), r["key"], r["offset"]): r for r in (x.asDict() for x in audited.rows.collect())
                  if position(r) in continued}
    assert set(rows) == set(spark_rows)
    assert {k: tuple(r[c] for c in BOUNDS) for k, r in rows.items()} == {
        k: tuple(r[c] for c in BOUNDS) for k, r in spark_rows.items()}
    for part in (x.asDict() for x in audited.parts.collect()):
        if position(part) in continued:
            stream = streams[position(part)]
            assert (stream.starts_with_sop, stream.pre_history_bound, stream.end_lower_bound,
                    stream.first_gap_lower_bound) == (part["starts_with_sop"], part["pre_history_bound"],
                                                      part["end_lower_bound"], part["first_gap_lower_bound"])
    own_gaps = {position(p): p["gap_positions"] for p in (x.asDict() for x in audited.part_wm.collect())}
    stream_gaps = {position(p): p["gap_positions"] for p in (x.asDict() for x in audited.parts.collect())}
    assert {p: own_gaps[p] + s.earlier_gap_positions for p, s in streams.items()} == {p: stream_gaps[p] for p in streams}

    contexts = {position(r): r for r in (x.asDict() for x in audited.prior.context.collect()) if r["row_kind"] == CONTEXT}
    dumps = {position(r): r for r in (x.asDict() for x in audited.part_wm.collect())}
    proven = [r for r in audited.reports if r["verdict"] in PROVEN and (r["replica_a"], r["topic"], r["partition"]) in continued]
    for report in proven:
        inputs = []
        for replica in (report["replica_a"], report["replica_b"]):
            part = (replica, report["topic"], report["partition"])
            key_rows = [r for k, r in rows.items() if k[:4] == (*part, report["key"])]
            if part in contexts:
                inputs.append(ReplicaInput(replica, dumps[part], key_rows, [], streams[part]))
            else:
                inputs.append(input_of(dumps[part], [r for r in (x.asDict() for x in audited.row_wm.collect())
                                                      if (*position(r), r["key"]) == (*part, report["key"])], []))
        doc = explain(audited.rows.first()["snapshot_id"], report["topic"], report["partition"], report["key"], inputs,
                      [report])
        (pair,) = doc["pairs"]
        v, w = witness_versions(doc, pair)
        for version, side in ((v, "a"), (w, "b")):
            assert version["reach"] == report[f"reach_{side}"], (report["key"], side)
            if version["offset"] is not None:
                assert version["touch_bound"] == report[f"touch_bound_{side}"], (report["key"], side)
    if which == "s2":  # k2 and k4 are proven from versions carried from S1 (the test below)
        assert {r["key"] for r in proven if r["topic"] == TOPIC} == {"k2", "k4"}


def restricted_reference(rows: list[dict], s1_rows: list[dict], topic: str) -> dict[tuple, str]:
    """The plain-Python Leap Frog over the whole streams, keeping of S1 only each key's last version."""
    in_s1 = {(*position(r), r["offset"]) for r in s1_rows if r["topic"] == topic and r.get("offset") is not None}
    dumps = dumps_of(r for r in rows if r["topic"] == topic)
    for place, dump in dumps.items():
        last_in_s1 = {r["key"]: r["offset"] for r in dump.rows
                      if r["kind"] in ("PUT", "DELETE") and (*place, r["offset"]) in in_s1}
        dropped = {r["offset"] for r in dump.rows
                   if r["kind"] in ("PUT", "DELETE") and (*place, r["offset"]) in in_s1
                   and last_in_s1[r["key"]] != r["offset"]}

        def kept(key: str, dump=dump, dropped=dropped, versions=type(dump).versions) -> list[Any]:
            return [v for v in versions(dump, key) if v.offset not in dropped]

        dump.versions = kept
    out = {}
    replicas = sorted({r for (r, _, _) in dumps})
    for name_a, name_b in combinations(replicas, 2):
        a, b = dumps[(name_a, topic, 0)], dumps[(name_b, topic, 0)]
        for key in a.keys() | b.keys():
            out[(name_a, name_b, key)] = compare_key(a, b, key, name_a, name_b).verdict
    return out


def test_only_last_versions_are_carried_which_can_miss_a_proof_but_never_make_one(audits):
    expected = restricted_reference(audits.rows, audits.s1_rows, "faulty")
    got = audits.s2.verdicts("faulty")
    assert got == {k: v for k, v in expected.items() if v != "CONSISTENT"}
    assert audits.s2.compared("faulty") == len(expected)
    proven = {k for k, v in got.items() if v in PROVEN}
    whole = {k for k, v in audits.s3.verdicts("faulty").items() if v in PROVEN}
    faulty_rows = [r for r in audits.rows if r["topic"] == "faulty"]
    assert whole == {k[2:] for k, f in reference_verdicts(faulty_rows).items() if f.verdict in PROVEN}
    assert proven and proven <= whole
    written_in_s2 = {r["key"] for r in audits.s2_rows if r["topic"] == "faulty" and r["kind"] in ("PUT", "DELETE")}
    assert any(key not in written_in_s2 for _, _, key in proven), "a fault last written before the cut is proven"


# --------------------------------------------------------------------------- through Dagster


def write_landing(landing: Path, snapshot_id: str, rows: list[dict]) -> None:
    folder = landing / snapshot_id
    folder.mkdir(parents=True)
    lines = [json.dumps({k: v for k, v in r.items() if v is not None}) for r in rows]
    (folder / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "_SUCCESS").write_text("")


def run_divergence(
    landing: Path, warehouse: Path, snapshot_id: str, run_config: dict | None = None
) -> dg.ExecuteInProcessResult:
    """The audit job of one snapshot, its divergence stage only (its inputs are in the warehouse)."""
    from replica_lens.definitions import build_definitions

    defs = build_definitions(landing_root=str(landing), warehouse_root=str(warehouse), **SETTINGS)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(SNAPSHOTS, [snapshot_id])
    return defs.resolve_job_def(AUDIT_JOB).execute_in_process(
        partition_key=snapshot_id, instance=instance, raise_on_error=False,
        asset_selection=[dg.AssetKey(k) for k in DIVERGENCE_STAGE],
        run_config=run_config or {},
    )


def failure_message(result: dg.ExecuteInProcessResult) -> str:
    failure = next(e for e in result.all_events if e.is_step_failure).step_failure_data
    return failure.user_failure_data.description if failure.user_failure_data else failure.error.message


def table(spark, warehouse: Path, name: str, snapshot_id: str) -> DataFrame:
    return DeltaStore(warehouse_root=str(warehouse)).read_snapshot(spark, name, snapshot_id, struct_for(name))


@pytest.fixture(scope="module")
def seeded(spark, audits, tmp_path_factory) -> tuple[Path, Path]:
    """A warehouse holding S1's state of "orders" (as the divergence asset writes it) and its raw rows (where the
    values of its versions are), and S2 in the landing zone."""
    root = tmp_path_factory.mktemp("incremental")
    landing, warehouse = root / "landing", root / "warehouse"
    write_landing(landing, "s2", [r for r in audits.s2_rows if r["topic"] == TOPIC])
    store = DeltaStore(warehouse_root=str(warehouse))
    orders_state = audits.s1.state.where(F.col("topic") == TOPIC)
    store.write_snapshot(spark, orders_state, "replica_state", "s1", struct_for("replica_state"))
    orders_raw = raw_frame(spark, [r for r in audits.s1_rows if r["topic"] == TOPIC], "s1")
    store.write_snapshot(spark, orders_raw, "raw_topic_snapshots", "s1", struct_for("raw_topic_snapshots"))
    return landing, warehouse


@pytest.fixture(scope="module")
def audited_s2(seeded, tmp_path_factory):
    landing, seeded_warehouse = seeded
    warehouse = tmp_path_factory.mktemp("audited") / "warehouse"
    shutil.copytree(seeded_warehouse, warehouse)
    return landing, warehouse, run_audit("s2", str(landing), str(warehouse), **AUDIT)


@pytest.mark.slow
def test_an_audit_of_s2_through_dagster_proves_faults_last_written_in_s1(spark, audited_s2):
    _, warehouse, result = audited_s2
    assert result.success, result.error
    reports = table(spark, warehouse, "divergence_reports", "s2").collect()
    found = {(r["key"], r["verdict"], r["missing_in"]) for r in reports}
    assert found == {("k2", "MISSING", B), ("k4", "DIVERGENT", None)}
    summary = table(spark, warehouse, "divergence_summary", "s2").collect()
    assert [r["keys_compared"] for r in summary] == [4]
    state = result.metadata["replica_state"]
    assert (state["carried_partitions"], state["carried_versions"], state["previous_snapshot_ids"]) == (2, 5, ["s1"])
    assert result.metadata["divergence_reports"]["keys_missing"] == 1
    assert "replica_state:matches_schema" not in result.failed_checks
    # The per-snapshot tables keep describing S2's own rows: two data rows (k3 in each replica).
    assert table(spark, warehouse, "reconstructed_watermarks", "s2").count() == 2
    # explain reads the carried state from the tables: k4's witnesses are both versions carried from S1 (dc-b's
    # CORRUPT at offset 2). Catches explain failing on a witness the snapshot's own rows do not hold.
    doc = explain_key(str(warehouse), "s2", TOPIC, 0, "k4")
    v, w = witness_versions(doc, doc["pairs"][0])
    assert (v["offset"], v["carried_from"], w["offset"], w["carried_from"], w["value"]) == (3, "s1", 2, "s1", "CORRUPT")
    assert {r["replica"]: r["carried_from"]["previous_last_offset"] for r in doc["replicas"]} == {A: 4, B: 3}
    assert "@2 (carried from s1)" in render_text(doc)


# Where the check of a carried state counts its VERSION rows: on the driver (a small state, these tests' default), or
# from the state's files in Spark's tasks (a large one, ``found_sums_of_files``: REPLICA_LENS_DRIVER_MAX_ROWS=0).
STATE_COUNTED = pytest.mark.parametrize("driver_max_rows", [None, "0"], ids=["counted-on-driver", "counted-from-files"])


def count_state(monkeypatch, driver_max_rows: str | None) -> None:
    from resources.tuning import DRIVER_MAX_ROWS_ENV

    if driver_max_rows is None:
        monkeypatch.delenv(DRIVER_MAX_ROWS_ENV, raising=False)
    else:
        monkeypatch.setenv(DRIVER_MAX_ROWS_ENV, driver_max_rows)


@pytest.mark.slow
@STATE_COUNTED
def test_rematerializing_s2_gives_identical_state_and_reports_from_s1s_state(
    spark, audited_s2, monkeypatch, driver_max_rows
):
    """Catches a re-audit that reads its own state, and a state check that refuses the untouched state it continues
    (counted from the state's files: a column, a type or a file not counted as Spark reads them)."""
    count_state(monkeypatch, driver_max_rows)
    landing, warehouse, _ = audited_s2
    before = {t: canonical(table(spark, warehouse, t, "s2")) for t in DIVERGENCE_STAGE}
    assert before["replica_state"] and before["divergence_reports"]
    assert run_divergence(landing, warehouse, "s2").success
    assert {t: canonical(table(spark, warehouse, t, "s2")) for t in DIVERGENCE_STAGE} == before
    contexts = table(spark, warehouse, "replica_state", "s2").where(F.col("row_kind") == CONTEXT).collect()
    assert {c["previous_snapshot_id"] for c in contexts} == {"s1"}


@pytest.mark.slow
@STATE_COUNTED
def test_a_tampered_state_is_refused_naming_the_replica_partition_and_nothing_of_s2_is_written(
    spark, audits, seeded, tmp_path, monkeypatch, driver_max_rows
):
    """Catches a state that lost a VERSION row outside an audit passing its check, whether its rows are counted on
    the driver or from its files (a file the Delta log removed still counted, the check skipped; S2 is a small cut
    that settles keys, so from its files the read that settles them counts them: a check left undone after it)."""
    count_state(monkeypatch, driver_max_rows)
    landing, seeded_warehouse = seeded
    warehouse = tmp_path / "warehouse"
    shutil.copytree(seeded_warehouse, warehouse)
    store = DeltaStore(warehouse_root=str(warehouse))
    for name, df in (("reconstructed_watermarks", audits.s2.row_wm), ("partition_watermarks", audits.s2.part_wm)):
        store.write_snapshot(spark, df.where(F.col("topic") == TOPIC), name, "s2", struct_for(name))
    DeltaTable(str(warehouse / "replica_state")).delete(
        "snapshot_id = 's1' AND row_kind = 'VERSION' AND replica = 'dc-b' AND key = 'k4'"
    )
    result = run_divergence(landing, warehouse, "s2")
    assert not result.success
    message = failure_message(result)
    assert "dc-b/orders/0" in message and "snapshot s1" in message and "STATE_ROWS" in message
    assert "dc-a/orders/0" not in message
    for name in DIVERGENCE_STAGE:
        assert table(spark, warehouse, name, "s2").count() == 0, name


@pytest.mark.slow
def test_an_audit_of_s2_re_reading_s1s_last_offsets_through_dagster_verifies_the_overlap(spark, audits, tmp_path):
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    write_landing(landing, "s2", rereading(ORDERS_S1, ORDERS_S2))
    store = DeltaStore(warehouse_root=str(warehouse))
    orders_state = audits.s1.state.where(F.col("topic") == TOPIC)
    store.write_snapshot(spark, orders_state, "replica_state", "s1", struct_for("replica_state"))
    s1_raw = raw_frame(spark, ORDERS_S1, "s1")
    store.write_snapshot(spark, s1_raw, "raw_topic_snapshots", "s1", struct_for("raw_topic_snapshots"))
    result = run_audit("s2", str(landing), str(warehouse), **AUDIT)
    assert result.success, result.error
    reports = table(spark, warehouse, "divergence_reports", "s2").collect()
    found = {(r["key"], r["verdict"], r["missing_in"]) for r in reports}
    assert found == {("k2", "MISSING", B), ("k4", "DIVERGENT", None)}
    carried = result.metadata["divergence_reports"]["carried_from"]
    assert {(c["replica"], c["previous_snapshot_id"], c["overlap"]["first_offset"], c["overlap"]["last_offset"],
             c["overlap"]["rows_verified"]) for c in carried} == {(A, "s1", 3, 4, 2), (B, "s1", 2, 3, 2)}
    # The raw rows of S2 came from its landing file (source_file differs from S1's): only messages are compared.
    assert table(spark, warehouse, "raw_topic_snapshots", "s2").where(F.col("source_file") == "test.jsonl").count() == 0


# dc-b has not applied k3's second write yet, and no heartbeat proves it should have: IN_FLIGHT, never proven.
LAGGING = stream(A, "lagging", [sop(), put("k3", "z", A, 0), put("k3", "z2", A, 1), heartbeat(A, 2, {A: 2})]) + stream(
    B, "lagging", [sop(), put("k3", "z", A, 0)])
CAUGHT_UP = stream(A, "lagging", [sop(), put("k3", "z", A, 0), put("k3", "z2", A, 1), heartbeat(A, 2, {A: 2})]) + stream(
    B, "lagging", [sop(), put("k3", "z", A, 0), put("k3", "z2", A, 1), heartbeat(A, 2, {A: 2})])


@pytest.mark.slow
def test_reports_of_only_in_flight_keys_are_written_and_a_healthy_re_audit_empties_them(spark, tmp_path):
    # When every key is CONSISTENT the step commits empty reports without running their plan. Catches: that
    # shortcut taken when a key is only IN_FLIGHT (not proven, yet a report row), or a healthy re-audit of the
    # snapshot leaving the earlier report rows in place.
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    write_landing(landing, "s", LAGGING)
    first = run_audit("s", str(landing), str(warehouse), **AUDIT)
    assert first.success, first.error
    reports = table(spark, warehouse, "divergence_reports", "s").collect()
    assert [(r["key"], r["verdict"]) for r in reports] == [("k3", "IN_FLIGHT")]
    assert first.metadata["divergence_reports"]["keys_in_flight"] == 1

    shutil.rmtree(landing / "s")
    write_landing(landing, "s", CAUGHT_UP)
    again = run_audit("s", str(landing), str(warehouse), **AUDIT)
    assert again.success, again.error
    assert table(spark, warehouse, "divergence_reports", "s").count() == 0
    assert again.metadata["divergence_reports"]["dagster/row_count"] == 0
    assert again.metadata["divergence_reports"]["keys_consistent"] == again.metadata["divergence_reports"][
        "keys_compared"] == 1


# dc-a's S2 starts three positions after S1 ended: in between, dc-a applied b's write k="y"
# (and a heartbeat) that dc-b holds too.
GAPPED = "gapped"
GAPPED_A = stream(A, GAPPED, [
    sop(), put("k", "x", A, 0), heartbeat(A, 1, {A: 1}),
    put("k", "y", B, 0), put("j", "w", B, 1), heartbeat(B, 2, {A: 1, B: 2}),  # offsets 3-5: never dumped
    heartbeat(A, 2, {A: 2, B: 2}), put("j", "v", A, 3), heartbeat(A, 4, {A: 4, B: 2}),
])
GAPPED_B = stream(B, GAPPED, [
    sop(), put("k", "x", A, 0), put("k", "y", B, 0), put("j", "w", B, 1), heartbeat(B, 2, {A: 1, B: 2}),
    heartbeat(A, 2, {A: 2, B: 2}), put("j", "v", A, 3), heartbeat(A, 4, {A: 4, B: 2}),
])


@pytest.fixture(scope="module")
def gapped(spark) -> Audit:
    """The gapped scenario's S2 (dc-a's dump starting three positions past S1's end), audited with S1's state."""
    s1_rows = [r for r in GAPPED_A if r["offset"] <= 2] + [r for r in GAPPED_B if r["offset"] <= 2]
    s2_rows = [r for r in GAPPED_A if r["offset"] >= 6] + [r for r in GAPPED_B if r["offset"] >= 3]
    return audit(spark, s2_rows, "g2", audit(spark, s1_rows, "g1").state)


def test_a_continuing_dump_that_starts_past_the_carried_end_stops_the_carried_reach_at_the_gap(gapped):
    # Catches a carried version whose reach runs over the gap: dc-a's carried k="x" would then seem current while
    # dc-b held "y" with everything that made it applied, a false DIVERGENT. And S2's rows must take S2's own P as
    # their floor.
    topic, a_all, b_all, s2 = GAPPED, GAPPED_A, GAPPED_B, gapped
    assert [link["previous_snapshot_id"] for link in s2.prior.links] == ["g1", "g1"]
    # dc-a's last "x" against dc-b's "y": different, not provable over the gap.
    assert s2.verdicts(topic) == {(A, B, "k"): "IN_FLIGHT"}, s2.reports

    # The carried k="x" of dc-a: reach stopped at the gap, L of S1's end.
    carried = {r["key"]: r for r in s2.rows.where((F.col("replica") == A) & (F.col("offset") < 6)).collect()}
    assert carried["k"]["reach"] == {A: 1}
    # S2's rows of dc-a follow the gap: their floor is S2's own P, its first heartbeat vector.
    (j,) = s2.rows.where((F.col("replica") == A) & (F.col("key") == "j")).collect()
    assert j["touch_bound"] == {A: 3, B: 2}
    # The same dump read as one (with positions 3-5 missing) gives the same bounds and verdicts.
    one = [r for r in a_all if not 3 <= r["offset"] <= 5] + b_all
    dumps = dumps_of(one)
    assert dumps[(A, topic, 0)].reach[1] == {A: 1} and dumps[(A, topic, 0)].touch[7] == {A: 3, B: 2}
    assert {k[2:]: f.verdict for k, f in reference_verdicts(one).items() if f.verdict != "CONSISTENT"} == {
        (A, B, "k"): "IN_FLIGHT"
    }
    # Without the gap (dc-a dumped whole) nothing differs either: "y" reaches dc-a in the gap.
    assert {k: f.verdict for k, f in reference_verdicts(a_all + b_all).items() if f.verdict != "CONSISTENT"} == {}
    # The state after S2 remembers the gap: positions missing in the stream, and where ⊥'s reach stops.
    (context,) = s2.state.where((F.col("row_kind") == CONTEXT) & (F.col("replica") == A)).collect()
    assert context["gap_positions"] == 3 and context["first_gap_lower_bound"] == {A: 1}
    # A version after the gap keeps its own bounds for the next snapshot (its U cannot be recomputed from P);
    # a stream without a gap keeps none, as a state written before gaps were known.
    versions = {(r["replica"], r["key"]): r for r in s2.state.where(F.col("row_kind") == VERSION).collect()}
    j_a = versions[(A, "j")]
    assert (j_a["missing_before"], j_a["touch_bound"], j_a["reach"]) == (3, {A: 3, B: 2}, {A: 4, B: 2})
    assert all(versions[(B, k)][c] is None for k in ("k", "j") for c in ("missing_before", "touch_bound", "reach"))


# --------------------------------------------------------------------------- a replica absent from a broker cut
# SPEC 11: a chain of broker cuts (``replica-lens watch``). In c2 dc-a was not read (its brokers did not answer: s = e),
# dc-b was. dc-b lost k's second write (a:1): it still holds x1 although its heartbeat in c2 says it applied a:3.
# Proving it needs both c2's heartbeat of dc-b and dc-a's x2, which only dc-a's state from c1 holds. n is new in c2
# (dc-b only): dc-a, read up to a:2, cannot be shown to lack it (IN_FLIGHT, never MISSING). In c3 dc-a continues
# from its c1 state (c2 wrote none of it) and dc-b is the one without rows (nothing new: s = e).
ABSENT = "absent_cut"
ABSENT_A = stream(A, ABSENT, [sop(), put("k", "x1", A, 0), put("k", "x2", A, 1), put("j", "y", A, 2),  # c1: 0..3
                              put("n", "z", A, 4), heartbeat(A, 5, {A: 5})])  # c3: 4..5
ABSENT_B = stream(B, ABSENT, [sop(), put("k", "x1", A, 0),  # c1: 0..1
                              put("j", "y", A, 2), heartbeat(A, 3, {A: 3}), put("n", "z", A, 4)])  # c2: 2..4
# Per cut, per replica: (s, e, skipped_reason); c1 is a snapshot of files.
ABSENT_CUTS = {"c2": {A: (4, 4, "brokers did not answer"), B: (2, 5, None)}, "c3": {A: (4, 6, None), B: (5, 5, None)}}


def cut_file(snapshot_id: str, previous: str, cut: dict[str, tuple], topic: str = ABSENT) -> str:
    """A ``_cut.json`` as ``replica-lens watch`` writes it (``pipelines/venice/kafka_cut.py``, ``cut_document``)."""
    partitions = [{"region": region, "topic": topic, "partition": 0, "start": s, "end": e, "log_start": 0,
                   "delivered": e - s, "cleanup_policy": "delete", "not_delivered": 0, "broker_end": e,
                   "skipped": skipped} for region, (s, e, skipped) in sorted(cut.items())]
    return json.dumps({"snapshot_id": snapshot_id, "cut_at": "2026-01-01T00:00:00.000+00:00",
                       "isolation_level": "read_committed", "continues": previous, "regions": {},
                       "max_offsets": None, "skipped_regions": {}, "partitions": partitions})


def in_cut(rows: list[dict], cut: dict[str, tuple]) -> list[dict]:
    return [r for r in rows if r["replica"] in cut and cut[r["replica"]][0] <= r["offset"] < cut[r["replica"]][1]]


@dataclass
class Chain:
    warehouse: Path
    results: dict[str, Any]  # snapshot -> run_audit's result
    tables: dict[str, dict[str, list]]  # snapshot -> divergence table -> canonical rows, after each audit
    rematerialized: dict[str, list]  # c2's divergence tables re-materialized once c3 was audited


@pytest.fixture(scope="module")
def absent_chain(spark, tmp_path_factory) -> Chain:
    """c1 (files), c2 and c3 (broker cuts, each with one replica absent) audited in order, then c2 again."""
    root = tmp_path_factory.mktemp("absent")
    landing, warehouse = root / "landing", root / "warehouse"
    rows = ABSENT_A + ABSENT_B
    write_landing(landing, "c1", [r for r in rows if r["offset"] < {A: 4, B: 2}[r["replica"]]])
    for snapshot_id, previous in (("c2", "c1"), ("c3", "c2")):
        write_landing(landing, snapshot_id, in_cut(rows, ABSENT_CUTS[snapshot_id]))
        (landing / snapshot_id / "_cut.json").write_text(cut_file(snapshot_id, previous, ABSENT_CUTS[snapshot_id]))
    results, tables = {}, {}
    for snapshot_id in ("c1", "c2", "c3"):
        results[snapshot_id] = run_audit(snapshot_id, str(landing), str(warehouse), **AUDIT)
        assert results[snapshot_id].success, (snapshot_id, results[snapshot_id].error)
        tables[snapshot_id] = {t: canonical(table(spark, warehouse, t, snapshot_id)) for t in DIVERGENCE_STAGE}
    assert run_divergence(landing, warehouse, "c2").success
    again = {t: canonical(table(spark, warehouse, t, "c2")) for t in DIVERGENCE_STAGE}
    return Chain(warehouse, results, tables, again)


def chain_verdicts(spark, chain: Chain, snapshot_id: str) -> dict[tuple, str]:
    reports = table(spark, chain.warehouse, "divergence_reports", snapshot_id).collect()
    return {(r["replica_a"], r["replica_b"], r["key"]): r["verdict"] for r in reports}


@pytest.mark.slow
def test_a_replica_absent_from_a_broker_cut_is_judged_on_its_carried_state(spark, absent_chain):
    """Catches an absent replica partition left out of the comparison (k stays IN_FLIGHT in c2, as a chain that
    ended there did on live brokers), a false proof from it (n MISSING in dc-a, which was only read up to a:2), and
    a verdict other than the whole history's for the pair."""
    got = chain_verdicts(spark, absent_chain, "c2")
    assert got == {(A, B, "k"): "DIVERGENT", (A, B, "n"): "IN_FLIGHT"}
    # One audit of every row read by c2 (dc-a's of c1, dc-b's of c1 and c2) as one snapshot: the same verdicts.
    read = [r for r in ABSENT_A if r["offset"] < 4] + [r for r in ABSENT_B if r["offset"] < 5]
    assert got == {k[2:]: f.verdict for k, f in reference_verdicts(read).items() if f.verdict != "CONSISTENT"}
    summary = table(spark, absent_chain.warehouse, "divergence_summary", "c2").collect()
    assert [(r["replica_a"], r["replica_b"], r["keys_compared"]) for r in summary] == [(A, B, 3)]
    metadata = absent_chain.results["c2"].metadata["divergence_reports"]
    assert (metadata["carried_partitions"], metadata["absent_partitions"]) == (2, 1)
    assert sorted((c["replica"], c["previous_snapshot_id"], c["first_offset"], c["absent"])
                  for c in metadata["carried_from"]) == [(A, "c1", 4, True), (B, "c1", 2, False)]
    assert absent_chain.results["c2"].metadata["replica_state"]["absent_partitions"] == 1
    # The per-snapshot tables keep describing c2's own rows: dc-b's only.
    assert {r["replica"] for r in table(spark, absent_chain.warehouse, "partition_watermarks", "c2").collect()} == {B}


@pytest.mark.slow
def test_an_absent_replicas_state_is_not_written_again_so_the_next_cut_continues_the_older_one(spark, absent_chain):
    """Catches c2 writing a state of dc-a (the next cut of dc-a would then be refused: two contexts end at offset 3),
    and c3 judging anything but the whole history's verdicts."""
    state = table(spark, absent_chain.warehouse, "replica_state", "c2").collect()
    assert {r["replica"] for r in state} == {B}
    carried = absent_chain.results["c3"].metadata["divergence_reports"]["carried_from"]
    assert sorted((c["replica"], c["previous_snapshot_id"], c["previous_last_offset"], c["absent"])
                  for c in carried) == [(A, "c1", 3, False), (B, "c2", 4, True)]
    got = chain_verdicts(spark, absent_chain, "c3")
    assert got == {(A, B, "k"): "DIVERGENT"}
    whole = {k[2:]: f.verdict for k, f in reference_verdicts(ABSENT_A + ABSENT_B).items() if f.verdict != "CONSISTENT"}
    assert got == whole


@pytest.mark.slow
def test_rematerializing_a_cut_with_an_absent_replica_after_later_cuts_gives_the_same_tables(absent_chain):
    """Catches the absent replica's predecessor chosen among later states (c3's dc-a state starts at its s)."""
    assert absent_chain.tables["c2"]["divergence_reports"]
    assert absent_chain.rematerialized == absent_chain.tables["c2"]


@pytest.mark.slow
def test_explain_of_a_key_proven_with_an_absent_replicas_carried_state_agrees_with_the_report(spark, absent_chain):
    """Catches explain leaving the absent replica out (no witness for the reported pair) or showing other bounds than
    the verdict compared."""
    doc = explain_key(str(absent_chain.warehouse), "c2", ABSENT, 0, "k")
    (report,) = [r.asDict() for r in table(spark, absent_chain.warehouse, "divergence_reports", "c2").collect()
                 if r["key"] == "k"]
    (pair,) = doc["pairs"]
    assert pair["verdict"] == report["verdict"] == "DIVERGENT"
    v, w = witness_versions(doc, pair)
    for version, side in ((v, "a"), (w, "b")):
        assert version["offset"] == report[f"witness_offset_{side}"]
        assert version["reach"] == report[f"reach_{side}"] and version["touch_bound"] == report[f"touch_bound_{side}"]
    assert (v["offset"], v["carried_from"], v["value"]) == (2, "c1", "x2")
    (absent,) = [r for r in doc["replicas"] if r.get("absent")]
    assert absent["replica"] == A and absent["carried_from"]["previous_snapshot_id"] == "c1"
    assert "no rows in this snapshot" in render_text(doc)


# dc-a's keys m1..m7 are in its state only (dc-b holds m0 alone); in the second cut dc-a is absent and dc-b's heartbeat
# says it applied a:8: dc-b lost m1..m7, proven MISSING from dc-a's carried state. Run in Spark's Python workers
# without coalescing, some task holds only keys of the absent dc-a, whose state is not written again.
ONLY_A = "absent_keys"
ONLY_A_C1 = stream(A, ONLY_A, [sop(), *[put(f"m{i}", f"v{i}", A, i) for i in range(8)]]) + stream(
    B, ONLY_A, [sop(), put("m0", "v0", A, 0)])
ONLY_A_C2 = stream(B, ONLY_A, [heartbeat(A, 8, {A: 8})], first_offset=2)


def test_the_pass_in_spark_workers_writes_no_state_of_an_absent_replica_partition(spark):
    """Catches the pass writing the absent replica's versions into the state (or counting them in a context), a
    task holding only its keys failing on an empty state, and the state the pass writes differing from Spark's."""
    from pipelines.state.absent import absent_dumps, absent_watermarks
    from pipelines.venice.kafka_cut import cut_rows

    c1 = audit(spark, ONLY_A_C1, "k1")
    row_wm, part_wm = stage(spark, ONLY_A_C2, "k2")
    cut = cut_rows(cut_file("k2", "k1", {A: (9, 9, "brokers did not answer"), B: (2, 3, None)}, ONLY_A), "k2")
    absent = absent_dumps(spark.createDataFrame(cut, struct_for("broker_cuts")), part_wm)
    raw = raw_frame(spark, ONLY_A_C1, "k1").unionByName(raw_frame(spark, ONLY_A_C2, "k2"))
    prior = prior_state(c1.state, part_wm, "k2", raw, absent=absent)
    assert [(link["replica"], link["absent"]) for link in prior.links] == [(A, True), (B, False)]
    parts = part_wm.unionByName(absent_watermarks(absent, prior.context))
    rows, parts = carry_over(row_wm, parts, prior.versions, prior.context, prior_payload=True)
    coalescing = spark.conf.get("spark.sql.adaptive.coalescePartitions.enabled")
    spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")
    try:
        comparison, state = compared_with_state(spark, rows.localCheckpoint(eager=True), parts, prior, "k2")
        reports = [r.asDict() for r in comparison.reports.collect()]
    finally:
        spark.conf.set("spark.sql.adaptive.coalescePartitions.enabled", coalescing)
    assert {r["replica"] for r in state.collect()} == {B}
    assert state_rows(state) == state_rows(next_state(rows, parts, prior.versions, prior.context))
    got = {(r["replica_a"], r["replica_b"], r["key"]): r["verdict"] for r in reports}
    assert got == {(A, B, f"m{i}"): "MISSING" for i in range(1, 8)}
    whole = ONLY_A_C1 + ONLY_A_C2
    assert got == {k[2:]: f.verdict for k, f in reference_verdicts(whole).items() if f.verdict != "CONSISTENT"}


# --------------------------------------------------------------------------- settled keys


@pytest.mark.slow
def test_settled_keys_leave_the_comparison_and_the_tables_are_those_of_comparing_them(spark, audits, tmp_path,
                                                                                      monkeypatch):
    """S2 of "faulty" and "clean" through the asset, in two warehouses: one settles the carried keys S2 does not
    write and whose verdict cannot change (``pipelines/state/settled.py``), the other compares every carried key.
    Catches: a settled key that a comparison would report (a divergence or IN_FLIGHT key settled), a settled key not
    counted CONSISTENT in every pair, a settled key's state row differing from the one the pass writes, or its
    checksum share lost (the next context would not match its rows), and a topic partition that settles nothing
    losing its carried versions."""
    import assets.divergence as divergence

    # "late_p" has one replica: no key of it settles, and its carried versions come from Spark's scan of the state
    # beside the ones the settling read hands over (Settled.carried).
    topics = ("faulty", "clean", "late_p")
    s1_rows = [r for r in audits.s1_rows if r["topic"] in topics]
    s2_rows = [r for r in audits.s2_rows if r["topic"] in topics]
    landing = tmp_path / "landing"
    write_landing(landing, "s1", s1_rows)
    write_landing(landing, "s2", s2_rows)
    first = run_audit("s1", str(landing), str(tmp_path / "settling"), **AUDIT)
    assert first.success, first.error
    shutil.copytree(tmp_path / "settling", tmp_path / "comparing")
    results, tables = {}, {}
    for mode in ("settling", "comparing"):
        if mode == "comparing":
            monkeypatch.setattr(divergence, "settle_carried", lambda *args, **kwargs: None)
        results[mode] = run_audit("s2", str(landing), str(tmp_path / mode), **AUDIT)
        assert results[mode].success, results[mode].error
        tables[mode] = {name: canonical(table(spark, tmp_path / mode, name, "s2")) for name in DIVERGENCE_STAGE}
    settled = results["settling"].metadata["divergence_reports"]["settled_keys"]
    assert settled > 0 and results["comparing"].metadata["divergence_reports"].get("settled_keys", 0) == 0
    for name in DIVERGENCE_STAGE:
        assert tables["settling"][name] == tables["comparing"][name], name
    # dc-c lags in "clean": its keys are IN_FLIGHT and stay compared; so do "faulty"'s proven keys.
    assert results["settling"].metadata["divergence_reports"]["keys_in_flight"] > 0
