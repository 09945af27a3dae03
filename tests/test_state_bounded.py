"""Bounded state: a divergence step reads only the predecessor state it continues, and retention drops the rest.

A chain of three dumps of the same streams (S1 from START_OF_PUSH, S2 and S3 mid-stream) is
audited in sequence from a Delta warehouse, as the divergence asset reads it
(``assets.divergence``), with ``state_retention = 2``. S2 and S3 each re-read the last two
offsets of the dump before it, as a dump tool does, so every step also verifies an overlap, and
S3's overlap lies inside S2's state only. The reference is the same chain trimmed by hand at
each predecessor's last offset, every step given every earlier snapshot's state (the path
before the state was bounded). Retention drops a state only after the next step has read, so
at S3 two states are there to choose from (S1's and S2's): the pruned read is tested on the same
chain, and so is re-auditing S3 once S1's state is gone.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import dagster as dg
import pytest
from pyspark.sql import functions as F

from assets.divergence import (
    MIN_STATE_RETENTION,
    STATE,
    check_state_retention,
    load_prior_state,
    retention_plan,
    state_contexts,
)
from assets.tables import read_stage
from pipelines.leapfrog import compare_replicas
from pipelines.state.carry import CONTEXT, PriorState, carry_over, next_state, prior_state, retained_states
from replica_lens.cli import build_parser
from resources.delta_store import DeltaStore
from resources.errors import InvalidSetting
from schemas.registry import struct_for
from tests.rows import raw_frame
from tests.test_incremental import (
    ORDERS,
    audit,
    canonical,
    dump_between,
    offsets_of,
    rereading,
    run_divergence,
    simulated,
    stage,
    state_rows,
    write_landing,
)

CHAIN = ("s1", "s2", "s3")
RETAIN_TWO = {"ops": {"divergence_reports": {"config": {"state_retention": 2}}}}


@dataclass
class Dumps:
    trimmed: list[list[dict]]  # thirds of every replica partition's offsets
    overlapping: list[list[dict]]  # S2 and S3 re-reading the last two offsets of the third before


def chain_dumps(rows: list[dict]) -> Dumps:
    offsets = offsets_of(rows)
    start = [{p: o[(len(o) * i) // 3] for p, o in offsets.items()} for i in range(3)]
    trimmed = [dump_between(rows, start[i], start[i + 1]) for i in range(2)] + [dump_between(rows, start[2])]
    return Dumps(trimmed, trimmed[:1] + [rereading(before, dump) for before, dump in zip(trimmed, trimmed[1:])])


@pytest.fixture(scope="module")
def dumps(tmp_path_factory) -> Dumps:
    tmp = tmp_path_factory.mktemp("chain")
    faulty, _ = simulated(tmp, "faulty", seed=1, keys=30, lost_writes=3, corrupted_values=3,
                          duplicate_deliveries=2, conflicting_writes=2)
    clean, _ = simulated(tmp, "clean", seed=11, keys=60, lagging_replica="dc-c", lag_messages=15)
    return chain_dumps(faulty + clean)


@dataclass
class Step:
    reports: list[str]
    summary: list[str]
    prior: PriorState
    versions_files: list[str]  # the files of replica_state the step read (its carried VERSION rows come from them)
    read_snapshots: list[tuple[str, str]]  # (table, snapshot_id) of every one-snapshot read of the step
    retention: dict = field(default_factory=dict)  # the metadata retention_plan reports (empty: no retention)
    dropped: list[str] = field(default_factory=list)  # the snapshots whose states were dropped


def audit_from_store(spark, store: DeltaStore, rows: list[dict], snapshot_id: str, keep: int | None, spy,
                     state_files: list[str]) -> Step:
    """One divergence step as the asset runs it: contexts, the predecessors' partitions, retention after the commit."""
    row_wm, part_wm = stage(spark, rows, snapshot_id)
    store.write_snapshot(spark, raw_frame(spark, rows, snapshot_id), "raw_topic_snapshots", snapshot_id,
                         struct_for("raw_topic_snapshots"))
    spy.clear()
    state_files.clear()
    contexts = state_contexts(spark, store)
    prior = load_prior_state(spark, store, part_wm, snapshot_id, contexts)
    carried_rows, carried_parts = carry_over(row_wm, part_wm, prior.versions, prior.context)
    carried_rows = carried_rows.localCheckpoint(eager=True)
    reports, summary = compare_replicas(carried_rows, carried_parts)
    state = next_state(carried_rows, carried_parts, prior.versions, prior.context)
    # The files of the state read whole (the carried versions, when few, are then kept in a local copy: the plan of
    # prior.versions no longer names them).
    files, reads = list(state_files), list(spy)
    store.write_snapshot(spark, state, STATE, snapshot_id, struct_for(STATE))
    dropped, plan = [], {}
    if keep is not None:
        dropped, plan = retention_plan(contexts, read_stage(spark, store, STATE, snapshot_id), snapshot_id, keep)
    store.delete_snapshots(spark, STATE, dropped)
    return Step(sorted(map(str, (r.asDict() for r in reports.collect()))),
                sorted(map(str, (r.asDict() for r in summary.collect()))), prior, files, reads, plan, dropped)


@dataclass
class Chains:
    bounded: dict[str, Step]  # state_retention = 2
    bounded_store: DeltaStore
    reaudited: Step  # S3 audited again after the chain


@pytest.fixture(scope="module")
def chains(spark, dumps, tmp_path_factory) -> Chains:
    """The chain audited from a warehouse with retention 2; every ``DeltaStore.read_snapshot`` is spied."""
    calls: list[tuple[str, str]] = []
    state_files: list[str] = []
    original = DeltaStore.read_snapshot

    def spied(self, spark, table, snapshot_id, struct, required=()):
        calls.append((table, snapshot_id))
        frame = original(self, spark, table, snapshot_id, struct, required)
        if table == STATE:
            state_files.extend(frame.inputFiles())
        return frame

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(DeltaStore, "read_snapshot", spied)
        store = DeltaStore(warehouse_root=str(tmp_path_factory.mktemp("warehouse")))
        steps = {sid: audit_from_store(spark, store, rows, sid, 2, calls, state_files)
                 for sid, rows in zip(CHAIN, dumps.overlapping)}
        reaudited = audit_from_store(spark, store, dumps.overlapping[2], "s3", 2, calls, state_files)
    return Chains(steps, store, reaudited)


@dataclass
class Reference:
    verdicts: dict[str, tuple[list[str], list[str]]]  # (reports, summary) per step
    states: dict[str, list[tuple]]  # replica_state after each step, but for first_offset (the dump's own)


@pytest.fixture(scope="module")
def trimmed(spark, dumps) -> Reference:
    """The dumps trimmed by hand, each step given every earlier snapshot's state (the path before pruning)."""
    verdicts, after, states = {}, {}, None
    for sid, rows in zip(CHAIN, dumps.trimmed):
        step = audit(spark, rows, sid, states)
        verdicts[sid] = (sorted(map(str, step.reports)), sorted(map(str, step.summary)))
        after[sid] = state_rows(step.state.drop("first_offset"))  # first_offset: an overlapping dump's own
        states = step.state if states is None else states.unionByName(step.state)
    return Reference(verdicts, after)


def snapshot_of(path: str) -> str:
    return path.split("snapshot_id=", 1)[1].split("/", 1)[0]


def test_a_step_reads_only_the_state_partition_of_the_predecessor_it_continues(spark, dumps, chains):
    """Catches: the divergence step reading every snapshot's VERSION rows (one union branch per snapshot, joined
    with the chosen predecessors afterwards), so that its cost grows with the number of snapshots audited."""
    store, steps = chains.bounded_store, chains.bounded
    for previous, sid in zip(CHAIN, CHAIN[1:]):
        step = steps[sid]
        assert step.prior.previous_snapshot_ids == [previous], sid
        # The carried VERSION rows come from the files of the predecessor's partition alone...
        assert step.versions_files and {snapshot_of(f) for f in step.versions_files} == {previous}, sid
        # ...and replica_state is read whole for that one snapshot only (its contexts aside).
        assert [s for t, s in step.read_snapshots if t == STATE] == [previous], sid
    assert steps["s1"].prior.links == [] and steps["s1"].versions_files == []
    assert [s for t, s in steps["s1"].read_snapshots if t == STATE] == []
    # The same rows as the full-union read of every state kept (S2's, and S3's own, which is ignored).
    unpruned = prior_state(read_stage(spark, store, STATE, None), stage(spark, dumps.overlapping[2], "s3")[1], "s3",
                           read_stage(spark, store, "raw_topic_snapshots", None))
    assert unpruned.links == steps["s3"].prior.links
    assert canonical(unpruned.versions) == canonical(steps["s3"].prior.versions)
    assert canonical(unpruned.context) == canonical(steps["s3"].prior.context)


def test_pruned_reads_of_overlapping_dumps_and_retention_give_the_audits_of_the_dumps_trimmed_by_hand(
    spark, chains, trimmed
):
    """Catches: a pruned read that picks another predecessor than the predecessor rule over every snapshot's
    state, or loses carried versions or contexts; an overlap counted twice or verified against another
    snapshot's rows; retention that drops the newest state or the one just written (S3 or its re-audit would
    start fresh): the reports or the state of S2 and S3 would differ. Also retention that keeps every state
    (replica_state grows with every snapshot), or misreports what it did."""
    store, steps = chains.bounded_store, chains.bounded
    for sid in CHAIN:
        assert (steps[sid].reports, steps[sid].summary) == trimmed.verdicts[sid], sid
    for sid in ("s2", "s3"):  # the states retention kept
        assert state_rows(read_stage(spark, store, STATE, sid).drop("first_offset")) == trimmed.states[sid], sid
    for sid, previous in zip(CHAIN[1:], CHAIN):
        # Each dump overlaps the state of the one before only (S3 re-reads S2's offsets, none of S1's).
        assert {(link["previous_snapshot_id"], link["overlap"]["offsets"]) for link in steps[sid].prior.links} == {
            (previous, 2)}, sid
    contexts = read_stage(spark, store, STATE, "s3").where(F.col("row_kind") == CONTEXT).collect()
    assert {(c["previous_snapshot_id"], c["stream_first_offset"]) for c in contexts} == {("s2", 0)}
    assert any("'verdict': 'DIVERGENT'" in r or "'verdict': 'MISSING'" in r for r in steps["s3"].reports)
    assert [steps[sid].retention["states_dropped"] for sid in CHAIN] == [0, 0, 1]
    assert [steps[sid].retention["states_kept"] for sid in CHAIN] == [1, 2, 2]
    assert steps["s2"].dropped == [] and steps["s3"].dropped == ["s1"]
    assert steps["s3"].prior.previous_snapshot_ids == ["s2"]
    assert store.snapshot_ids(STATE) == ["s2", "s3"]
    # Re-auditing the newest snapshot starts from the same state: its predecessor was kept.
    assert (chains.reaudited.reports, chains.reaudited.summary) == trimmed.verdicts["s3"]
    assert chains.reaudited.prior.previous_snapshot_ids == ["s2"]
    assert chains.reaudited.retention["states_dropped"] == 0


def test_retained_states_keeps_the_n_furthest_contexts_per_replica_partition_and_ties():
    """Catches: ranking states by snapshot id or ascending offsets, dropping one of two tied states (which would
    turn the ambiguity refusal into a silent choice), or dropping a snapshot still newest in another partition."""
    def ctx(sid, replica, last):
        return {"snapshot_id": sid, "replica": replica, "topic": "t", "partition": 0, "last_offset": last}

    rows = [ctx("z1", "a", 9), ctx("a2", "a", 19), ctx("m3", "a", 29), ctx("z1", "b", 50), ctx("a2", "b", 40)]
    assert retained_states(rows, None) == (["a2", "m3", "z1"], [])
    assert retained_states(rows, 2) == (["a2", "m3", "z1"], [])  # z1 is b's newest
    assert retained_states(rows[:3], 2) == (["a2", "m3"], ["z1"])
    tied = rows[:3] + [ctx("t3", "a", 29)]
    assert retained_states(tied, 2) == (["m3", "t3"], ["a2", "z1"])
    assert retained_states(tied + [ctx("u", "a", 19)], 3) == (["a2", "m3", "t3", "u"], ["z1"])


def test_a_state_retention_below_two_is_refused_by_the_config_and_the_cli(capsys):
    """Catches: a retention of 1 or 0, which would drop the state the newest snapshot continued (re-auditing it,
    as the hourly schedule does, would then start fresh) or every state."""
    assert check_state_retention(None) is None and check_state_retention(MIN_STATE_RETENTION) == 2
    with pytest.raises(InvalidSetting, match="at least 2"):
        check_state_retention(1)
    args = ["audit", "--landing", "l", "--warehouse", "w"]
    assert build_parser().parse_args(args + ["--state-retention", "3"]).state_retention == 3
    assert build_parser().parse_args(args).state_retention is None
    for bad in ("1", "0", "x"):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args(args + ["--state-retention", bad])
        assert exited.value.code == 2
    assert "--state-retention: must be a whole number of at least 2" in capsys.readouterr().err


# --------------------------------------------------------------------------- through Dagster


def comparable(reports) -> list[tuple]:
    return sorted(tuple(sorted((k, str(v)) for k, v in r.items() if k != "snapshot_id")) for r in reports)


@pytest.mark.slow
def test_the_divergence_asset_applies_state_retention_from_run_config_and_reports_it(spark, tmp_path):
    """Catches: the asset ignoring its state_retention config, deleting before its own state is committed, or
    not reporting the states kept and dropped on the replica_state materialization.

    S1's and S2's states are in the warehouse (written as the divergence step writes them), so the asset's
    run of S3 is the one where retention 2 has a state to drop."""
    landing, warehouse = tmp_path / "landing", tmp_path / "warehouse"
    offsets = offsets_of(ORDERS)
    start = [{p: o[min(i * 2, len(o) - 1)] for p, o in offsets.items()} for i in range(3)]
    dumps = [dump_between(ORDERS, start[0], start[1]), dump_between(ORDERS, start[1], start[2]),
             dump_between(ORDERS, start[2])]
    store = DeltaStore(warehouse_root=str(warehouse))
    states = None
    for sid, rows in zip(("s1", "s2"), dumps):
        before = audit(spark, rows, sid, states)
        store.write_snapshot(spark, before.state, STATE, sid, struct_for(STATE))
        states = before.state if states is None else states.unionByName(before.state)
    write_landing(landing, "s3", dumps[2])
    row_wm, part_wm = stage(spark, dumps[2], "s3")
    store.write_snapshot(spark, row_wm, "reconstructed_watermarks", "s3", struct_for("reconstructed_watermarks"))
    store.write_snapshot(spark, part_wm, "partition_watermarks", "s3", struct_for("partition_watermarks"))
    expected = comparable(audit(spark, dumps[2], "s3", states).reports)
    assert expected, "k2 and k4, last written in S2 or before, are reported in S3"

    result = run_divergence(landing, warehouse, "s3", RETAIN_TWO)
    assert result.success
    written = read_stage(spark, store, "divergence_reports", "s3")
    assert comparable(r.asDict() for r in written.collect()) == expected
    metadata = result.get_asset_materialization_events()
    state = next(e.materialization.metadata for e in metadata if e.asset_key == dg.AssetKey(STATE))
    assert (state["state_retention"].value, state["states_kept"].value, state["states_dropped"].value) == (2, 2, 1)
    assert state["dropped_snapshot_ids"].value == ["s1"]
    assert store.snapshot_ids(STATE) == ["s2", "s3"]
    contexts = read_stage(spark, store, STATE, "s3").where(F.col("row_kind") == CONTEXT).collect()
    assert {c["previous_snapshot_id"] for c in contexts} == {"s2"}
