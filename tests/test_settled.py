"""Settled keys (pipelines/state/settled.py): which carried keys a snapshot may leave out of its comparison.

Kernel tests without Spark: the rule decided on a state file's rows, and the topic partitions where it may apply.
The audits that settle keys and write the same tables as a full comparison are in tests/test_incremental.py.
"""
from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_schema

from pipelines.state.settled import SettledPart, settled_in, settled_parts
from schemas.state import ReplicaState

A, B, C = "dc-a", "dc-b", "dc-c"
SCHEMA = to_arrow_schema(ReplicaState.to_structtype())


def version(replica, key, content="v", touch=None, first=None, **extra) -> dict:
    return {"snapshot_id": "p0", "row_kind": "VERSION", "replica": replica, "topic": "t", "partition": 0,
            "key": key, "offset": 1, "kind": "PUT", "value_hash": content, "source_region": A, "source_offset": 1,
            "key_touch": list((touch or {A: 1}).items()), "first_lower_bound": list((first or {}).items()),
            "origin_snapshot_id": "p0", **extra}


def rows(*versions: dict) -> pa.Table:
    return pa.Table.from_pylist(list(versions), schema=SCHEMA)


def part(sop=(False, False, False), pre_history=({A: 0}, {A: 0}, {A: 0})) -> SettledPart:
    return SettledPart(topic="t", partition=0, previous="p0", replicas=(A, B, C), sop=tuple(sop),
                       pre_history=tuple(tuple(sorted(p.items())) for p in pre_history))


def test_a_key_every_replica_holds_alike_is_settled_and_any_difference_keeps_it_compared():
    # Catches: a key settled with a value differing in one replica (a divergence never looked at again), with a
    # replica lacking it (IN_FLIGHT or MISSING turned CONSISTENT), with a kind differing (a DELETE against a PUT of
    # the same hash), or a key the snapshot writes settled on its old versions.
    table = rows(
        *[version(r, "same") for r in (A, B, C)],
        version(A, "differs"), version(B, "differs", content="w"), version(C, "differs"),
        version(A, "lacking"), version(B, "lacking"),
        version(A, "kind"), version(B, "kind", kind="DELETE"), version(C, "kind"),
        *[version(r, "written") for r in (A, B, C)],
    )
    mask = settled_in(table, part(), touched=pa.array(["written"]))
    assert sorted({k for k, m in zip(table["key"].to_pylist(), mask) if m}) == ["same"]
    assert mask.sum() == 3  # each of its rows, one per replica


def test_a_pre_dump_version_that_can_still_prove_keeps_the_key_compared():
    # dc-a's stream starts at START_OF_PUSH: its ⊥ (ABSENT) reaches {dc-a: 5}. dc-b's and dc-c's last version is
    # made by {dc-a: 3}, which dc-a had applied while it still held ⊥: a proof (MISSING in dc-a's history), so the
    # key must be compared. Made by {dc-a: 7}, beyond ⊥'s reach: nothing to prove, settled.
    # Catches: the ⊥ rule left out, taken the wrong way round (U of ⊥ against M of w), or P of the stream ignored.
    reach = {A: 5}
    proven = [version(r, "proven", touch={A: 3}, first=reach if r == A else {}) for r in (A, B, C)]
    beyond = [version(r, "beyond", touch={A: 7}, first=reach if r == A else {}) for r in (A, B, C)]
    table = rows(*proven, *beyond)
    sop = part(sop=(True, False, False))
    assert {k for k, m in zip(table["key"].to_pylist(), settled_in(table, sop, None)) if m} == {"beyond"}
    # The stream's P raises U: with dc-b's P at {dc-a: 6}, "proven" is beyond ⊥'s reach too.
    raised = part(sop=(True, False, False), pre_history=({A: 0}, {A: 6}, {A: 6}))
    assert settled_in(table, raised, None).all()
    # Without START_OF_PUSH no replica has ⊥: both settle.
    assert settled_in(table, part(), None).all()


def test_a_version_holding_what_a_gap_keeps_or_a_value_is_never_copied():
    # Catches: rows with their own bounds (a gapped stream: SPEC 3a) or an old state's value copied unchanged,
    # where the pass would write them otherwise.
    table = rows(
        version(A, "gapped", missing_before=2), version(B, "gapped"), version(C, "gapped"),
        version(A, "valued", value="x"), version(B, "valued"), version(C, "valued"),
    )
    assert not settled_in(table, part(), None).any()


PARTITIONS = [{"replica": r, "topic": "t", "partition": 0, "first_gap_lower_bound": None} for r in (A, B, C)]


def link(replica, previous="p0", absent=False, first_offset=11) -> dict:
    return {"replica": replica, "topic": "t", "partition": 0, "previous_snapshot_id": previous, "absent": absent,
            "previous_last_offset": 10, "first_offset": first_offset}


def context(replica, previous="p0", pre_history=None, gap=None, gap_positions=None, sop=True) -> dict:
    return {"snapshot_id": previous, "replica": replica, "topic": "t", "partition": 0,
            "pre_history_bound": {A: 1} if pre_history is None else pre_history, "first_gap_lower_bound": gap,
            "gap_positions": gap_positions, "starts_with_sop": sop}


def test_only_a_topic_partition_continuing_one_gapless_state_everywhere_may_settle():
    # Catches: settling where replicas continue different snapshots (their rows of a key are not in one state),
    # where one is absent (compared on its carried state, not written) or not continued, where a stream has a gap
    # (in an earlier dump, between the state and S, or in S), or where the stream's P is not known yet (U unknown:
    # a proof may appear once it is).
    links = [link(r) for r in (A, B, C)]
    contexts = [context(r) for r in (A, B, C)]
    (found,) = settled_parts(PARTITIONS, links, contexts)
    assert (found.previous, found.replicas, found.sop) == ("p0", (A, B, C), (True, True, True))
    assert settled_parts(PARTITIONS, links[:2] + [link(C, "p1")], contexts + [context(C, "p1")]) == []
    assert settled_parts(PARTITIONS, links[:2] + [link(C, absent=True)], contexts) == []
    assert settled_parts(PARTITIONS, links[:2], contexts) == []  # dc-c starts afresh
    assert settled_parts(PARTITIONS[:2] + [{**PARTITIONS[2], "first_gap_lower_bound": {A: 4}}], links, contexts) == []
    assert settled_parts(PARTITIONS, links[:2] + [link(C, first_offset=12)], contexts) == []  # a gap before S
    assert settled_parts(PARTITIONS, links[:2] + [link(C, first_offset=8)], contexts) != []  # an overlap: none
    assert settled_parts(PARTITIONS, links, contexts[:2] + [context(C, gap_positions=3)]) == []
    assert settled_parts(PARTITIONS, links, contexts[:2] + [context(C, gap={A: 2})]) == []
    assert settled_parts(PARTITIONS, links, contexts[:2] + [context(C, pre_history={})]) != []  # P known, empty
    assert settled_parts(PARTITIONS, links, contexts[:2] + [{**context(C), "pre_history_bound": None}]) == []
    assert settled_parts(PARTITIONS[:1], links[:1], contexts[:1]) == []  # a lone replica: no pair


def test_one_read_of_the_state_counts_every_row_once_copies_the_settled_and_hands_over_the_rest(tmp_path):
    # settle_files on two state files of p0 (a context, t/0 where keys settle, t/1 where none may), run as one task.
    # Catches: a row counted twice or not at all for the check (an untouched state refused, a changed one passed),
    # an unsettled row of t/0 lost from the comparison or a settled one both copied and compared, rows of t/1 (which
    # the carry reads from the state itself) handed over twice, and CONTEXT rows counted as versions.
    import pyarrow.compute as pc
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq

    from pipelines.state.arrow_checksum import state_sums
    from pipelines.state.rows import VERSION_COLUMNS
    from pipelines.state.settled import FOUND, SETTLED, settle_files
    from resources.staged_files import ArrowStage

    other = {"topic": "t", "partition": 1}
    files_rows = [
        rows(*[version(r, "same") for r in (A, B, C)], version(A, "differs"), version(B, "differs", content="w"),
             version(C, "differs"), *[version(r, "x", **other) for r in (A, B, C)],
             {**version(A, None), "row_kind": "CONTEXT", "key": None, "state_rows": 3, "state_checksum": 1}),
        rows(*[version(r, "again") for r in (A, B, C)], *[version(r, "written") for r in (A, B, C)],
             version(B, "y", **other)),
    ]
    listed = []
    for number, table in enumerate(files_rows):
        path = tmp_path / "state" / f"f{number}.parquet"
        path.parent.mkdir(exist_ok=True)
        pq.write_table(table.drop_columns(["snapshot_id"]), path)
        listed.append(("p0", pafs.LocalFileSystem(), str(path)))
    out_dir = tmp_path / "staged"
    out_dir.mkdir()
    stage = ArrowStage(table="replica_state", uri=str(out_dir), relative_dir="w", snapshot_id="s",
                       schema=pa.schema([f for f in SCHEMA if f.name != "snapshot_id"]), fs=pafs.LocalFileSystem(),
                       path=str(out_dir), dictionary_columns=())
    ids = [pa.RecordBatch.from_pydict({"id": pa.array([0, 1], pa.int64())})]
    got = pa.Table.from_batches(list(settle_files(iter(ids), tuple(listed), (part(),), {("t", 0): pa.array(["written"])},
                                                  SCHEMA, stage)), schema=SCHEMA)

    def keys(table, kind="VERSION"):
        chosen = table.filter(pc.equal(table["row_kind"], kind))
        return sorted(zip(chosen["replica"].to_pylist(), chosen["topic"].to_pylist(),
                          chosen["partition"].to_pylist(), chosen["key"].to_pylist()))

    assert keys(got) == sorted([(r, "t", 0, k) for r in (A, B, C) for k in ("differs", "written")])
    copied = pq.read_table(out_dir / "settled-00000.parquet")
    assert sorted(zip(copied["replica"].to_pylist(), copied["key"].to_pylist())) == sorted(
        (r, k) for r in (A, B, C) for k in ("same", "again"))
    # FOUND and SETTLED shares add up to what the check would count over every VERSION row of the two files.
    counted: dict[tuple, list[int]] = {}
    for row in got.filter(pc.is_in(got["row_kind"], pa.array([FOUND, SETTLED]))).to_pylist():
        total = counted.setdefault((row["snapshot_id"], row["replica"], row["topic"], row["partition"]), [0, 0])
        total[0] += row["state_rows"]
        total[1] = (total[1] + row["state_checksum"]) % 2**64
    versions = [t.filter(pc.equal(t["row_kind"], "VERSION")) for t in files_rows]
    expected = {(r["snapshot_id"], r["replica"], r["topic"], r["partition"]): [r["found_rows"], r["found_checksum"] % 2**64]
                for batch in state_sums((b for t in versions for b in t.to_batches()), VERSION_COLUMNS)
                for r in batch.to_pylist()}
    assert counted == expected and expected[("p0", B, "t", 1)][0] == 2
