"""The Leap Frog comparison's kernel: numpy and Arrow over one task's rows, run in Spark's Python workers
(or on the driver for small snapshots). No Spark here: ``pipelines/leapfrog.py`` plans the exchange that feeds
``compare_keys`` and turns its rows into the tables; the proof search itself is ``earliest_proofs`` below.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Iterator, Sequence

from pyspark import cloudpickle
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T

from pipelines.state.arrow_checksum import row_hashes
from pipelines.state.rows import LAST_VERSION_COLUMNS, VERSION, VERSION_COLUMNS
from pipelines.arrow_vectors import map_vectors
from pipelines.stream_pass import task_number
from pipelines.vectors import MISSING
from resources.staged_files import ArrowStage
from schemas.state import ReplicaState

ABSENT = "ABSENT"
PART = ("snapshot_id", "topic", "partition")
PAIR = (*PART, "replica_a", "replica_b")
REPLICA_PARTITION = ("snapshot_id", "replica", "topic", "partition")
SIDES = ("a", "b")
# The verdicts, worst first: a key counts once, under the worst verdict of its pairs (SPEC 10, "a key").
KEY_VERDICTS = ("DIVERGENT", "MISSING", "IN_FLIGHT", "CONSISTENT")


# --------------------------------------------------------------- the search (numpy)
def earliest_proofs(
    group: np.ndarray, is_b: np.ndarray, idx: np.ndarray, token: np.ndarray, run_end: np.ndarray,
    u: Sequence[np.ndarray], m: Sequence[np.ndarray],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps 2-4 for many groups at once: per proven group, its earliest proving w of B and v of A.

    One row per version with a known ``U``: its ``group`` (a key of one pair), side, index
    ``idx`` among its replica's versions of the key (A's indices in a group are 0..n-1),
    content ``token`` (an integer code), ``run_end`` (A's rows: the index where its run of
    equal content ends) and one array per region of ``U`` and ``M`` (dense, ``-1`` missing).
    Returns ``(groups, w_idx, v_idx)`` for the proven groups, in group order.

    All groups are solved together with sorts and binary searches, never one at a time: a
    per-region value becomes ``group * span + value`` (``_comparable``) so that one sorted array
    answers every group's rank queries. Memory stays linear in the rows, whatever one
    group's size (``tests/test_leapfrog_kernel.py``).
    """
    none = (np.empty(0, np.int64),) * 3
    # Sorted by group, then A's versions before B's, each in index order.
    order = np.lexsort((idx, is_b, group))
    group, is_b, idx = group[order], is_b[order], idx[order]
    a_rows, b_rows = np.flatnonzero(~is_b), np.flatnonzero(is_b)
    if len(a_rows) == 0 or len(b_rows) == 0:
        return none
    group_a, group_b = group[a_rows], group[b_rows]
    first_a = np.searchsorted(group_a, group_b, side="left")  # where w's group starts among A's rows
    groups = int(group[-1]) + 1
    upper = np.full(len(b_rows), np.iinfo(np.int64).max)  # a(w) = min_r a_r(w)
    lower = np.zeros(len(b_rows), dtype=np.int64)  # s(w) = max_r s_r(w)
    for u_r, m_r in zip(u, m):
        u_rank, m_rank, span = _comparable(u_r[order], m_r[order], groups)
        a_u = np.sort(group_a * span + u_rank[a_rows])
        a_m = np.sort(group_a * span + m_rank[a_rows])
        # a_r(w) = #{v of A : U_r(v) <= M_r(w)}; s_r(w) = #{v of A : M_r(v) < U_r(w)}
        upper = np.minimum(upper, np.searchsorted(a_u, group_b * span + m_rank[b_rows], side="right") - first_a)
        lower = np.maximum(lower, np.searchsorted(a_m, group_b * span + u_rank[b_rows], side="left") - first_a)
    in_range = lower < upper
    at_s = a_rows[np.minimum(first_a + lower, len(a_rows) - 1)]  # A's version at index s
    token, run_end = token[order], run_end[order]
    differs = token[at_s] != token[b_rows]
    proving = in_range & (differs | (run_end[at_s] < upper))
    if not proving.any():
        return none
    # The earliest proving w of each group (B's rows are in index order within a group).
    proven = np.flatnonzero(proving)
    _, first = np.unique(group_b[proven], return_index=True)
    chosen = proven[first]
    v_idx = np.where(differs[chosen], idx[at_s[chosen]], run_end[at_s[chosen]])
    return group_b[chosen], idx[b_rows[chosen]], v_idx.astype(np.int64)


def _comparable(u: np.ndarray, m: np.ndarray, groups: int) -> tuple[np.ndarray, np.ndarray, int]:
    """``u`` and ``m`` as non-negative integers in the same order, equal where they are, and a ``span`` above them all,
    so that ``group * span + value`` (``group`` below ``groups``) orders by group, then value, within an int64.

    The values shifted to start at 0 when that fits (no sort); else (offsets near 2**63) their ranks among the
    distinct values of both.
    """
    low, high = min(int(u.min()), int(m.min())), max(int(u.max()), int(m.max()))
    if (high - low + 1) * groups < 2**62:
        return u - low, m - low, high - low + 1
    _, rank = np.unique(np.concatenate([u, m]), return_inverse=True)
    return rank[:len(u)], rank[len(u):], len(u) + len(m) + 1


# ------------------------------------------------------------ the pass (Arrow in, Arrow out)
@dataclass(frozen=True)
class PairPlan:
    """One replica pair of a topic partition, as the pass needs it: ids and what each dump knows."""

    pair_id: int
    part_id: int
    replica_ids: tuple[int, int]  # (A, B)
    sop: tuple[bool, bool]  # the dump starts with START_OF_PUSH: ⊥ is a version
    # The reach of ⊥ for a key never written, dense: L(end), or L at the first gap when the dump has gaps (SPEC 3a).
    end: tuple[tuple[int, ...], tuple[int, ...]]


# The columns of a key's last version in one replica that the replica state keeps, typed as its schema types them.
_STATE_FIELDS = ReplicaState.to_structtype()
LAST_VERSION = tuple((name, _STATE_FIELDS[name].dataType) for name in LAST_VERSION_COLUMNS)
_PAYLOAD = tuple(name for name, _ in LAST_VERSION if name not in ("offset", "value_hash"))  # read from the rows as they are


def compare_columns(regions: int) -> T.StructType:
    """What ``compare_keys`` returns: rows of three kinds, told apart by a null ``pair_id`` and ``replica_id``.

    Per (pair, key), ``pair_id`` set: counts, last rows, and the witness when proven. Per
    topic partition, ``pair_id`` and ``replica_id`` null: its keys this task holds counted once each, under their
    worst verdict over the partition's pairs (``part_keys_*``; a key's rows are all in one task, so the tasks' counts
    add up). Per (topic partition, key, replica), ``pair_id`` null: the key's last version there
    (``last_*``; ``last_touch_{r}``, ``last_reach_{r}``: its ``U`` and ``M``, ``U`` known when
    ``last_known``; ``last_missing``: positions missing before it), the reach of ⊥
    (``first_lower_{r}``: ``L`` of its first row, or ``L`` at the first gap before that row) and
    its highest source offset per region (``touched_{r}``), dense, ``-1`` missing: what the
    replica state keeps per key.
    """
    longs = ["rows_a", "rows_b", "last_offset_a", "last_offset_b", "witness_offset_a", "witness_offset_b"]
    strings = ["key", "last_hash_a", "last_hash_b", "witness_hash_a", "witness_hash_b"]
    vectors = [f"{v}_{s}_{r}" for s in SIDES for v in ("touch", "reach") for r in range(regions)]
    per_replica = [T.StructField("part_id", T.LongType()), T.StructField("replica_id", T.LongType())] + [
        T.StructField(f"last_{name}", data_type) for name, data_type in LAST_VERSION
    ] + [T.StructField("last_known", T.BooleanType()), T.StructField("last_missing", T.LongType()),
         T.StructField("state_rows", T.LongType()), T.StructField("state_checksum", T.LongType())] + [
        T.StructField(f"{v}_{r}", T.LongType())
        for v in ("first_lower", "touched", "last_touch", "last_reach") for r in range(regions)
    ]
    per_part = [T.StructField(f"part_keys_{v.lower()}", T.LongType()) for v in KEY_VERDICTS]
    return T.StructType(
        [T.StructField("pair_id", T.LongType()), T.StructField("proven", T.BooleanType())]
        + [T.StructField(c, T.StringType()) for c in strings]
        + [T.StructField(c, T.LongType()) for c in longs + vectors]
        + per_replica + per_part
    )


class _Rows:
    """One Spark partition's rows sorted by (part, key, replica, offset), with per-(part, key, replica) groups."""

    def __init__(self, table: pa.Table, regions: int):
        part = table["part_id"].to_numpy()
        replica = table["replica_id"].to_numpy()
        self.key_names = pc.dictionary_encode(table["key"]).combine_chunks()
        key = self.key_names.indices.to_numpy()
        offset = table["offset"].to_numpy()
        tokens = pc.dictionary_encode(table["token"]).combine_chunks()
        order = np.lexsort((offset, replica, key, part))
        self.table = table
        self.order = order
        self.part, self.replica, self.key, self.offset = part[order], replica[order], key[order], offset[order]
        self.token = tokens.indices.to_numpy()[order]
        self.token_names = tokens.dictionary
        self.known = table["known"].to_numpy(zero_copy_only=False)[order]
        self.missing = table["missing"].to_numpy()[order]
        self.u = [table[f"u_{r}"].to_numpy()[order] for r in range(regions)]
        self.m = [table[f"m_{r}"].to_numpy()[order] for r in range(regions)]
        self.l = [table[f"l_{r}"].to_numpy()[order] for r in range(regions)]
        n = len(order)
        starts = np.ones(n, dtype=bool)
        starts[1:] = (self.part[1:] != self.part[:-1]) | (self.key[1:] != self.key[:-1]) | (
            self.replica[1:] != self.replica[:-1]
        )
        self.group = np.cumsum(starts) - 1
        self.first = np.flatnonzero(starts)  # per group: its first row
        self.end = np.append(self.first[1:], n)  # per group: one past its last row
        self.pos = np.arange(n) - self.first[self.group]
        # Where the run of equal content each row is in ends: the next run start (a group starts a run).
        run_starts = starts.copy()
        run_starts[1:] |= self.token[1:] != self.token[:-1]
        at = np.flatnonzero(run_starts)
        self.run_end = np.append(at, n)[np.searchsorted(at, np.arange(n), side="right")] - self.first[self.group]


def _last_versions(rows: _Rows, region_names: Sequence[str], gaps: bool) -> tuple[dict[str, pa.Array], int]:
    """Per (topic partition, key, replica) group: its last row, ``L`` of its first row, its highest source offsets.

    The replica state's per-key facts (``pipelines/state/carry.py``, ``next_state``), taken from the
    rows this pass holds anyway, where Spark would exchange and aggregate every row again. The
    columns (``compare_columns``' per-replica ones) and how many rows they hold.
    """
    first, last = rows.first, rows.end - 1
    in_table = pa.array(rows.order[last])  # the last rows' places in the table as received
    columns: dict[str, pa.Array] = {
        "part_id": pa.array(rows.part[first].astype(np.int64)),
        "replica_id": pa.array(rows.replica[first].astype(np.int64)),
        "key": rows.key_names.dictionary.take(pa.array(rows.key[first])),
        "last_offset": pa.array(rows.offset[last]),
        "last_value_hash": rows.token_names.take(pa.array(rows.token[last])),
        **{f"last_{name}": rows.table[name].take(in_table).combine_chunks() for name in _PAYLOAD},
    }
    for r, l_r in enumerate(rows.l):
        columns[f"first_lower_{r}"] = pa.array(l_r[first])
    if gaps:  # what a later snapshot needs to keep the bounds of SPEC 3a over the gaps of this stream
        columns["last_known"] = pa.array(rows.known[last])
        columns["last_missing"] = pa.array(rows.missing[last])
        for r in range(len(region_names)):
            columns[f"last_touch_{r}"] = pa.array(rows.u[r][last])
            columns[f"last_reach_{r}"] = pa.array(rows.m[r][last])
    # The highest source offset per region: each row's offset under its region's column, -1 elsewhere.
    regions = pc.dictionary_encode(rows.table["source_region"]).combine_chunks()
    index_of = {name: r for r, name in enumerate(region_names)}
    region_ids = np.array([index_of.get(name, -1) for name in regions.dictionary.to_pylist()] + [-1], dtype=np.int64)
    region = region_ids[regions.indices.fill_null(len(regions.dictionary)).to_numpy()[rows.order]]
    source_offset = rows.table["source_offset"].fill_null(MISSING).to_numpy()[rows.order]
    for r in range(len(region_names)):
        columns[f"touched_{r}"] = pa.array(np.maximum.reduceat(np.where(region == r, source_offset, MISSING), first))
    return columns, len(first)


# ------------------------------------------------------- the replica state, written by the pass
@dataclass(frozen=True)
class StateFiles:
    """Where the pass writes the replica state's VERSION rows itself (``replica_state``'s staged write).

    ``streams``: per replica partition, ``(part_id, replica_id, replica, topic, partition, gapped)``,
    ``gapped`` when its stream has a gap (SPEC 3a: its last versions keep their own bounds).
    ``absent``: ``(part_id, replica_id)`` of the replica partitions compared on their carried state
    only (``pipelines/state/absent.py``): their rows are not written, so the older state stays the
    one the next snapshot continues.
    """

    stage: ArrowStage
    streams: tuple[tuple[int, int, str, str, int, bool], ...]
    absent: frozenset = frozenset()

    def written(self, columns: dict[str, pa.Array]) -> np.ndarray | None:
        """Which of the pass's last versions (``_last_versions``' columns) are written; None: all of them."""
        if not self.absent:
            return None
        # One integer per (part_id, replica_id), both small non-negative ids: a vectorized membership test.
        ids = (columns["part_id"].to_numpy().astype(np.int64) << 32) | columns["replica_id"].to_numpy().astype(np.int64)
        absent = np.array([(part << 32) | replica for part, replica in self.absent], dtype=np.int64)
        return ~np.isin(ids, absent)

    @property
    def snapshot_id(self) -> str:
        return self.stage.snapshot_id


def _prior_of(rows: _Rows, prior: pa.Table | None, regions: int) -> dict[str, np.ndarray] | None:
    """Per group of ``rows``, the carried version it continues (``carried_versions``' columns), or None without any.

    ``prior``: the rows of this partition that are carried versions (``is_prior``), one per (replica partition,
    key), with what the state kept of them (``prior_origin``, ``prior_missing``, ``prior_touch_r``).
    """
    if prior is None or prior.num_rows == 0:
        return None
    groups = len(rows.first)
    keys = len(rows.key_names.dictionary)
    width = int(max(rows.replica.max(initial=0), pc.max(prior["replica_id"]).as_py() or 0)) + 1
    # Groups are sorted by (part, key, replica): one code orders them the same way.
    code = (rows.part[rows.first].astype(np.int64) * keys + rows.key[rows.first]) * width + rows.replica[rows.first]
    key = pc.index_in(prior["key"], value_set=rows.key_names.dictionary)
    known = key.is_valid().to_numpy(zero_copy_only=False)
    wanted = (prior["part_id"].to_numpy().astype(np.int64) * keys + key.fill_null(0).to_numpy()) * width \
        + prior["replica_id"].to_numpy()
    at = np.minimum(np.searchsorted(code, wanted), groups - 1)
    found = known & (code[at] == wanted)
    group, source = at[found], np.flatnonzero(found)
    out = {
        "offset": np.full(groups, MISSING, np.int64),
        "missing": np.full(groups, MISSING, np.int64),
        "origin": np.full(groups, -1, np.int64),
        "touch": np.full((groups, regions), MISSING, np.int64),
    }
    out["offset"][group] = prior["offset"].to_numpy()[source]
    out["missing"][group] = prior["prior_missing"].fill_null(MISSING).to_numpy()[source]
    out["origin"][group] = source
    for r in range(regions):
        out["touch"][group, r] = prior[f"prior_touch_{r}"].to_numpy()[source]
    out["origin_names"] = prior["prior_origin"]
    return out


def _state_versions(
    columns: dict[str, pa.Array], count: int, prior: dict[str, np.ndarray] | None, region_names: Sequence[str],
    state: StateFiles, gaps: bool,
) -> pa.Table:
    """The replica state's VERSION rows of these groups (``next_state``'s, from the pass's last versions)."""
    regions = pa.array(list(region_names), pa.string())
    width = int(max((s[1] for s in state.streams), default=0)) + 1
    stream_of = np.full((max((s[0] for s in state.streams), default=0) + 1) * width, -1, np.int64)
    for i, stream in enumerate(state.streams):
        stream_of[stream[0] * width + stream[1]] = i
    stream = stream_of[columns["part_id"].to_numpy() * width + columns["replica_id"].to_numpy()]
    names = {c: pa.array([s[k] for s in state.streams], t).take(pa.array(stream))
             for c, k, t in (("replica", 2, pa.string()), ("topic", 3, pa.string()), ("partition", 4, pa.int32()))}
    gapped = np.array([s[5] for s in state.streams], dtype=bool)[stream] if gaps else np.zeros(count, bool)
    offset = columns["last_offset"].to_numpy()
    touched = np.stack([columns[f"touched_{r}"].to_numpy() for r in range(len(region_names))], axis=1) \
        if region_names else np.empty((count, 0), np.int64)
    carried = np.zeros(count, bool)
    origin = pa.array(np.full(count, state.snapshot_id, dtype=object), pa.string())
    missing = np.where(gapped, columns["last_missing"].to_numpy(), MISSING) if gaps else np.full(count, MISSING)
    if prior is not None:
        touched = np.maximum(touched, prior["touch"])  # key_touch: the carried version's, and this snapshot's
        carried = offset == prior["offset"]
        origin = pc.if_else(pa.array(carried), prior["origin_names"].take(pa.array(np.maximum(prior["origin"], 0))),
                            origin)
        missing = np.where(carried, prior["missing"], missing)

    def dense(prefix: str) -> np.ndarray:
        return np.stack([columns[f"{prefix}_{r}"].to_numpy() for r in range(len(region_names))], axis=1) \
            if region_names else np.empty((count, 0), np.int64)

    out = {
        **names,
        "row_kind": pa.array(np.full(count, VERSION, dtype=object), pa.string()),
        "key": columns["key"],
        "offset": columns["last_offset"],
        "kind": columns["last_kind"],
        "value_hash": columns["last_value_hash"],
        "source_region": columns["last_source_region"],
        "source_offset": columns["last_source_offset"],
        "write_ts": columns["last_write_ts"],
        "key_touch": map_vectors(touched, None, regions),
        "first_lower_bound": map_vectors(dense("first_lower"), None, regions),
        "origin_snapshot_id": origin,
        # A last version keeps its own bounds only where its stream has a gap (``kept_where_gapped``).
        "touch_bound": map_vectors(dense("last_touch"), gapped & columns["last_known"].to_numpy(zero_copy_only=False),
                                   regions) if gaps else None,
        "reach": map_vectors(dense("last_reach"), gapped, regions) if gaps else None,
        "missing_before": pa.array(missing, pa.int64(), mask=~(missing > 0)),
    }
    schema = state.stage.schema
    return pa.table([out[f.name].cast(f.type) if out.get(f.name) is not None else pa.nulls(count, f.type)
                     for f in schema], schema=schema)


def _state_sums(versions: pa.Table, columns: dict[str, pa.Array], schema: pa.Schema) -> pa.RecordBatch:
    """Per replica partition among ``versions``: its rows and its share of the checksum (summed on the driver).

    None written (a task holding only keys of absent replica partitions, whose state is not written): no row."""
    if not versions.num_rows:
        return _batch({}, 0, schema)
    hashes = row_hashes(versions, VERSION_COLUMNS)
    part, replica = columns["part_id"].to_numpy(), columns["replica_id"].to_numpy()
    order = np.lexsort((replica, part))
    part, replica, hashes = part[order], replica[order], hashes[order]
    starts = np.flatnonzero(np.r_[True, (part[1:] != part[:-1]) | (replica[1:] != replica[:-1])])
    sums = np.add.reduceat(hashes, starts, dtype=np.uint64).view(np.int64)
    return _batch({
        "part_id": pa.array(part[starts]), "replica_id": pa.array(replica[starts]),
        "state_rows": pa.array(np.diff(np.append(starts, len(part))).astype(np.int64)),
        "state_checksum": pa.array(sums),
    }, len(starts), schema)


def _batch(columns: dict[str, pa.Array], count: int, schema: pa.Schema) -> pa.RecordBatch:
    """``columns`` as a batch of ``schema``; the other row kind's columns are null."""
    return pa.RecordBatch.from_arrays(
        [columns[f.name].cast(f.type) if f.name in columns else pa.nulls(count, f.type) for f in schema], schema=schema
    )


def _witness_columns(rows: _Rows, row: np.ndarray, bottom: np.ndarray, bottom_reach: list[np.ndarray], side: str):
    """A witness version per proven key: a data row, or ⊥ where ``bottom`` (no row, content ABSENT, U = {})."""
    at = np.where(bottom, 0, row)
    token = rows.token_names.take(pa.array(rows.token[at]))
    columns = {
        f"witness_offset_{side}": pa.array(rows.offset[at], mask=bottom),
        f"witness_hash_{side}": pc.if_else(pa.array(bottom), pa.scalar(ABSENT), token),
    }
    for r in range(len(rows.u)):
        columns[f"touch_{side}_{r}"] = pa.array(np.where(bottom, MISSING, rows.u[r][at]))
        columns[f"reach_{side}_{r}"] = pa.array(np.where(bottom, bottom_reach[r], rows.m[r][at]))
    return columns


def _versions(rows: _Rows, side: dict, keys: np.ndarray) -> dict[str, np.ndarray]:
    """One side's versions with a known ``U`` as ``earliest_proofs`` takes them: data rows, then ⊥ per key if any."""
    data = side["rows_in"][rows.known[side["rows_in"]]]
    sop = side["sop"]
    columns = {
        "group": np.searchsorted(keys, rows.key[data]),
        "idx": (rows.pos[data] + sop).astype(np.int64),
        "token": rows.token[data].astype(np.int64),
        "run_end": (rows.run_end[data] + sop).astype(np.int64),
        **{f"u_{r}": u_r[data] for r, u_r in enumerate(rows.u)},
        **{f"m_{r}": m_r[data] for r, m_r in enumerate(rows.m)},
    }
    if not sop:
        return columns
    count = len(keys)
    bottom = {
        "group": np.arange(count),
        "idx": np.zeros(count, np.int64),
        "token": np.full(count, -1, np.int64),  # ABSENT: no data token has code -1
        "run_end": np.ones(count, np.int64),
        **{f"u_{r}": np.full(count, MISSING, np.int64) for r in range(len(rows.u))},
        **{f"m_{r}": reach for r, reach in enumerate(side["bottom_reach"])},
    }
    return {c: np.concatenate([columns[c], bottom[c]]) for c in columns}


def _compare_pair(
    rows: _Rows, plan: PairPlan, schema: pa.Schema
) -> tuple[pa.RecordBatch, np.ndarray, np.ndarray] | None:
    """Every key of one pair in this partition: counts, last versions, and the first proof if any.

    With the batch, the keys (codes of ``rows.key_names``) and each one's verdict as its index in ``KEY_VERDICTS``,
    decided as ``_verdicts`` decides it in Spark (the per-key counts of the topic partition).
    """
    # The rows are sorted by topic partition first: this pair's are one slice.
    lo, hi = np.searchsorted(rows.part, plan.part_id, side="left"), np.searchsorted(rows.part, plan.part_id, side="right")
    members = [lo + np.flatnonzero(rows.replica[lo:hi] == replica) for replica in plan.replica_ids]
    groups = [np.unique(rows.group[member]) for member in members]
    keys = np.union1d(rows.key[rows.first[groups[0]]], rows.key[rows.first[groups[1]]])
    if len(keys) == 0:
        return None
    count = len(keys)
    sides = []
    for side, member, side_groups, sop, end in zip(SIDES, members, groups, plan.sop, plan.end):
        at = np.searchsorted(keys, rows.key[rows.first[side_groups]])
        data_rows = np.zeros(count, dtype=np.int64)
        data_rows[at] = rows.end[side_groups] - rows.first[side_groups]
        first_row = np.full(count, -1)
        first_row[at] = rows.first[side_groups]
        # ⊥'s reach: ``l`` of the key's first row (its L, or L at the first gap when one lies before it), or the
        # plan's ``end`` when the replica never writes the key.
        bottom_reach = [np.where(first_row >= 0, l_r[np.maximum(first_row, 0)], end[r]) for r, l_r in enumerate(rows.l)]
        sides.append({"side": side, "rows_in": member, "rows": data_rows, "first": first_row,
                      "sop": int(sop), "bottom_reach": bottom_reach})

    # The versions with a known U of both sides, ⊥ first where the dump starts with START_OF_PUSH.
    versions = [_versions(rows, side, keys) for side in sides]
    is_b = np.concatenate([np.full(len(v["idx"]), bool(b)) for b, v in enumerate(versions)])
    arrays = {c: np.concatenate([v[c] for v in versions]) for c in versions[0]}
    regions = range(len(rows.u))
    proven_groups, w_idx, v_idx = earliest_proofs(
        arrays["group"], is_b, arrays["idx"], arrays["token"], arrays["run_end"],
        [arrays[f"u_{r}"] for r in regions], [arrays[f"m_{r}"] for r in regions],
    )
    proven = np.zeros(count, dtype=bool)
    proven[proven_groups] = True

    columns: dict[str, pa.Array] = {
        "pair_id": pa.array(np.full(count, plan.pair_id, dtype=np.int64)),
        "proven": pa.array(proven),
        "key": rows.key_names.dictionary.take(pa.array(keys)),
    }
    for side in sides:
        s = side["side"]
        has = side["rows"] > 0
        last = np.where(has, side["first"] + side["rows"] - 1, 0)
        columns[f"rows_{s}"] = pa.array(side["rows"])
        columns[f"last_offset_{s}"] = pa.array(rows.offset[last], mask=~has)
        columns[f"last_hash_{s}"] = rows.token_names.take(pa.array(rows.token[last], mask=~has))
        # The witness of a proven key (the rest is overwritten with nulls below).
        version = np.zeros(count, dtype=np.int64)
        version[proven_groups] = w_idx if s == "b" else v_idx
        bottom = (version < side["sop"]) & proven
        row = np.where(bottom | ~proven, 0, side["first"] + version - side["sop"])
        for name, values in _witness_columns(rows, row, bottom | ~proven, side["bottom_reach"], s).items():
            columns[name] = pc.if_else(pa.array(proven), values, pa.nulls(count, values.type))
    return _batch(columns, count, schema), keys, _verdict_codes(rows, sides, proven)


def _verdict_codes(rows: _Rows, sides: list[dict], proven: np.ndarray) -> np.ndarray:
    """Each key's verdict in one pair as its index in ``KEY_VERDICTS``: ``_verdicts``' rule over the same facts."""
    last_tokens = []
    for side in sides:
        has = side["rows"] > 0
        last = np.where(has, side["first"] + side["rows"] - 1, 0)
        # A side without rows holds ⊥ (ABSENT, -1, no data token has it) when its dump starts with START_OF_PUSH.
        last_tokens.append(np.where(has, rows.token[last], -1 if side["sop"] else -2))
    rows_a, rows_b = sides[0]["rows"], sides[1]["rows"]
    unseen = (rows_a + sides[0]["sop"] == 0) | (rows_b + sides[1]["sop"] == 0)
    in_flight = unseen | (last_tokens[0] != last_tokens[1])
    return np.where(proven & ((rows_a == 0) | (rows_b == 0)), 1,
                    np.where(proven, 0, np.where(in_flight, 2, 3))).astype(np.int64)


def _key_counts(found: dict[int, list[tuple[np.ndarray, np.ndarray]]], schema: pa.Schema) -> pa.RecordBatch | None:
    """Per topic partition: its keys here counted once each, under their worst verdict over its pairs."""
    if not found:
        return None
    parts, counts = [], []
    for part_id, per_pair in sorted(found.items()):
        keys = np.concatenate([k for k, _ in per_pair])
        codes = np.concatenate([c for _, c in per_pair])
        order = np.lexsort((codes, keys))  # each key's worst (smallest) verdict first
        keys, codes = keys[order], codes[order]
        first = np.r_[True, keys[1:] != keys[:-1]]
        parts.append(part_id)
        counts.append(np.bincount(codes[first], minlength=len(KEY_VERDICTS)))
    table = np.array(counts, dtype=np.int64).reshape(len(parts), len(KEY_VERDICTS))
    columns = {"part_id": pa.array(np.array(parts, dtype=np.int64))}
    for i, verdict in enumerate(KEY_VERDICTS):
        columns[f"part_keys_{verdict.lower()}"] = pa.array(table[:, i])
    return _batch(columns, len(parts), schema)


def compare_keys(
    batches: Iterator[pa.RecordBatch], pairs: Sequence[PairPlan], region_names: Sequence[str], gaps: bool = False,
    state: StateFiles | None = None,
) -> Iterator[pa.RecordBatch]:
    """Steps 1-5 for every pair and key of one Spark partition (all rows of a key in a topic partition are here).

    Input rows: every data row, ``part_id, replica_id, key, offset, token, known`` (``U``
    known), ``missing`` (positions missing before the row in its dump), dense ``u_r``, ``m_r``, ``l_r`` (``U``, ``M``,
    and the reach ⊥ would have if the row were its key's first: ``L``, or ``L`` at the dump's first gap when a gap
    lies before the row; one column per region of ``region_names``) and the columns of ``_PAYLOAD``; with ``state``,
    the carried versions the snapshot continues are marked ``is_prior`` and hold what the state kept of them
    (``_prior_of``). Output: ``compare_columns``,
    one row per (pair, key) either replica of the pair holds here, one per (key, replica) with the key's last
    version there (for the replica state), and one per topic partition with its keys here per worst verdict.

    ``state``: the pass writes the replica state's VERSION rows itself instead (``StateFiles``, as
    ``next_state`` makes them), one file per task, and returns per replica partition only its rows and
    its share of the checksum (``state_rows``, ``state_checksum``). The file is in place once the
    returned iterator is exhausted.
    """
    regions = len(region_names)
    received = list(batches)
    if not received:
        return
    table = pa.Table.from_batches(received).combine_chunks()
    prior = None
    if "is_prior" in table.column_names:  # the carried versions, rows of their keys like the others
        prior = table.filter(table["is_prior"].fill_null(False)).combine_chunks()
    if table.num_rows == 0:
        return
    schema = pa.schema([pa.field(f.name, _ARROW[type(f.dataType)]) for f in compare_columns(regions).fields])
    rows = _Rows(table, regions)
    columns, count = _last_versions(rows, region_names, gaps)
    if state is None:
        yield _batch(columns, count, schema)
    else:
        file = state.stage.files(task_number())
        try:
            versions = _state_versions(columns, count, _prior_of(rows, prior, regions), region_names, state, gaps)
            written = state.written(columns)
            if written is not None:  # absent replica partitions: compared, their state not written again
                kept = pa.array(written)
                versions = versions.filter(kept)
                columns = {**columns, **{c: columns[c].filter(kept) for c in ("part_id", "replica_id")}}
            for batch in versions.to_batches():
                file.write(batch)
            file.close()
        except BaseException:
            file.abort()
            raise
        yield _state_sums(versions, columns, schema)
    present = set(np.unique(rows.part[rows.first]).tolist())
    found: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for plan in pairs:
        if plan.part_id in present:
            compared = _compare_pair(rows, plan, schema)
            if compared is not None:
                batch, keys, codes = compared
                found.setdefault(plan.part_id, []).append((keys, codes))
                yield batch
    counted = _key_counts(found, schema)
    if counted is not None:
        yield counted


_ARROW = {T.LongType: pa.int64(), T.StringType: pa.string(), T.BooleanType: pa.bool_()}

# The kernel runs in Spark's Python workers; they receive it by value (as pipelines/leapfrog.py), so executors
# need numpy and pyarrow but not this project.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
