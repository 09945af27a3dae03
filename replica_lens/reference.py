"""A plain-Python reading of SPEC sections 2-4 and 3a: no Spark, no cleverness.

The tests check the Spark pipeline against it (``tests/reference_leapfrog.py`` re-exports it
with helpers that build streams by hand), and ``replica-lens simulate`` uses it to list what the
complete topic proves when it damages a dump (``--compact-below``, ``--lose-records``).

It pairs every version of a key in one replica with every version in the other
(quadratic in one key's versions) and follows the SPEC's sentences one by one; each
dump is walked once and its rows grouped by key once, so ~200k rows take seconds.
Rows are dicts with the raw snapshot fields; one snapshot is assumed.

Gaps (section 3a) are found from the offsets: every position between two consecutive
read positions that holds no row. Positions that were read but hold no row (records
skipped by rule, chunks) are passed as ``read_positions`` (``build_dump``) or per
(replica, topic, partition) (``dumps_of``, ``reference_verdicts``); they are not gaps.
"""
from __future__ import annotations

import hashlib
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Iterable, Mapping, Optional

Vector = dict[str, int]

ABSENT = "ABSENT"
TOMBSTONE = "TOMBSTONE"


def vmax(*vectors: Optional[Vector]) -> Vector:
    out: Vector = {}
    for v in vectors:
        for region, offset in (v or {}).items():
            out[region] = max(out.get(region, offset), offset)
    return out


def leq(u: Vector, v: Vector) -> bool:
    """Every component present in u is present in v and not larger."""
    return all(region in v and offset <= v[region] for region, offset in u.items())


def token(row: dict) -> str:
    if row["kind"] == "DELETE":
        return TOMBSTONE
    return hashlib.sha256(row["value"].encode("utf-8")).hexdigest()


@dataclass
class Version:
    offset: Optional[int]  # None for the pre-dump version
    token: str
    value: Optional[str]
    touch: Optional[Vector]  # U; None when unknown
    reach: Vector  # M
    # Where M comes from (SPEC 10): the offset of the row whose L is M (None: L(end)); whether a gap
    # lies before the version (U rests on the first vector heartbeat after it) or cut M short.
    reach_row: Optional[int] = None
    gap_before: bool = False
    gap_after: bool = False
    write_ts: Optional[int] = None


@dataclass
class Dump:
    """One replica's rows of one topic partition, with everything SPEC sections 3 and 3a derive."""

    rows: list[dict]
    starts_with_sop: bool = False
    pre_history: Optional[Vector] = None  # P
    lower_bounds: dict[int, Vector] = field(default_factory=dict)  # offset -> L(p)
    end: Vector = field(default_factory=dict)  # L(end)
    touch: dict[int, Optional[Vector]] = field(default_factory=dict)  # data row offset -> U
    reach: dict[int, Vector] = field(default_factory=dict)  # data row offset -> M
    segment: dict[int, int] = field(default_factory=dict)
    resolved_ts: dict[int, Optional[int]] = field(default_factory=dict)  # heartbeat offset -> resolved ts
    # Section 3a: (first_missing, last_missing) of every gap, in offset order, and per row
    # (offset) whether a gap lies right before it.
    gaps: list[tuple[int, int]] = field(default_factory=list)
    gap_before: dict[int, bool] = field(default_factory=dict)
    bottom_reach: dict[str, Vector] = field(default_factory=dict)  # key -> M(⊥), keys seen; see versions()
    unseen_reach: Vector = field(default_factory=dict)  # M(⊥) of a key the dump never holds
    # The row whose L is each M (None: L(end)), and whether a gap cut that M short (SPEC 10).
    reach_row: dict[int, Optional[int]] = field(default_factory=dict)  # data row offset -> row
    cut: dict[int, bool] = field(default_factory=dict)
    bottom_reach_row: dict[str, Optional[int]] = field(default_factory=dict)
    bottom_cut: dict[str, bool] = field(default_factory=dict)
    unseen_reach_row: Optional[int] = None
    by_key: dict[str, list[dict]] = field(default_factory=dict)  # data rows per key, in offset order

    def data_rows(self, key: str) -> list[dict]:
        return self.by_key.get(key, [])

    def keys(self) -> set[str]:
        return set(self.by_key)

    def versions(self, key: str) -> list[Version]:
        rows = self.data_rows(key)
        out = []
        if self.starts_with_sop:
            seen = key in self.bottom_reach
            out.append(Version(
                None, ABSENT, None, {}, self.bottom_reach.get(key, self.unseen_reach),
                reach_row=self.bottom_reach_row[key] if seen else self.unseen_reach_row,
                gap_after=self.bottom_cut[key] if seen else bool(self.gaps),
            ))
        for r in rows:
            o = r["offset"]
            out.append(Version(o, token(r), r.get("value"), self.touch[o], self.reach[o], reach_row=self.reach_row[o],
                               gap_before=self.gap_positions_before(o) > 0, gap_after=self.cut[o],
                               write_ts=r.get("write_ts")))
        return out

    def gap_positions_before(self, offset: int) -> int:
        return sum(last - first + 1 for first, last in self.gaps if last < offset)


def contribution(row: dict) -> Vector:
    if row["kind"] == "HEARTBEAT":
        if row.get("hb_vector") is not None:
            return dict(row["hb_vector"])
        return {row["source_region"]: row["source_offset"]}
    if row["kind"] in ("PUT", "DELETE"):
        return {row["source_region"]: row["source_offset"]}
    return {}


def find_gaps(offsets: Iterable[int]) -> list[tuple[int, int]]:
    """(first_missing, last_missing) of every run of positions between two consecutive read positions."""
    read = sorted(set(offsets))
    return [(a + 1, b - 1) for a, b in zip(read, read[1:]) if b > a + 1]


def build_dump(rows: Iterable[dict], read_positions: Optional[Iterable[int]] = None) -> Dump:
    """SPEC sections 2, 3 and 3a over one replica's rows of one topic partition.

    ``read_positions``: offsets that were read but hold no row (records skipped by rule, chunks
    of a larger record); they are not gaps. Every other position between two read positions
    that holds no row is a gap.
    """
    rows = sorted((r for r in rows if r["kind"] != "EXPORTER_POSITION"), key=lambda r: r["offset"])
    dump = Dump(rows=rows)
    dump.starts_with_sop = bool(rows) and rows[0]["kind"] == "START_OF_PUSH"
    offsets = [r["offset"] for r in rows]
    dump.gaps = find_gaps([*offsets, *(read_positions or ())])
    gap_ends = [last for _, last in dump.gaps]
    # gaps_before[i]: how many gaps lie before rows[i].
    gaps_before = [bisect_right(gap_ends, o) for o in offsets]
    for i, o in enumerate(offsets):
        dump.gap_before[o] = gaps_before[i] > 0 and dump.gaps[gaps_before[i] - 1][1] == o - 1

    # L(p): max over the rows strictly before p.
    so_far: Vector = {}
    heartbeats_seen = 0
    latest_origin_ts: dict[str, int] = {}
    for r in rows:
        dump.lower_bounds[r["offset"]] = dict(so_far)
        so_far = vmax(so_far, contribution(r))
        if r["kind"] == "HEARTBEAT":
            heartbeats_seen += 1
            latest_origin_ts[r["source_region"]] = r["origin_ts_min_ms"]
            dump.resolved_ts[r["offset"]] = min(latest_origin_ts.values())
        dump.segment[r["offset"]] = heartbeats_seen
        if r["kind"] in ("PUT", "DELETE"):
            dump.by_key.setdefault(r["key"], []).append(r)
    dump.end = so_far

    # after_gap[n]: L(g) for g the first row after gap n (L(end) when no row follows it).
    after_gap: list[Vector] = []
    row_after_gap: list[Optional[int]] = []  # g: the first row after gap n
    # vector_after_gap[n]: hb_vector of the first HEARTBEAT that has one after gap n, or None.
    vector_after_gap: list[Optional[Vector]] = []
    next_vector: list[Optional[Vector]] = [None] * (len(rows) + 1)  # from rows[i] on
    for i in range(len(rows) - 1, -1, -1):
        r = rows[i]
        has = r["kind"] == "HEARTBEAT" and r.get("hb_vector") is not None
        next_vector[i] = dict(r["hb_vector"]) if has else next_vector[i + 1]
    for _, last in dump.gaps:
        i = bisect_right(offsets, last)
        after_gap.append(dump.lower_bounds[offsets[i]] if i < len(rows) else dump.end)
        row_after_gap.append(offsets[i] if i < len(rows) else None)
        vector_after_gap.append(next_vector[i])
    index = {o: i for i, o in enumerate(offsets)}

    if dump.starts_with_sop:
        dump.pre_history = {}
    else:
        first = next((r for r in rows if r["kind"] == "HEARTBEAT" and r.get("hb_vector") is not None), None)
        dump.pre_history = dict(first["hb_vector"]) if first is not None else None
    dump.unseen_reach = after_gap[0] if dump.gaps else dump.end
    dump.unseen_reach_row = row_after_gap[0] if dump.gaps else None

    for key, key_rows in dump.by_key.items():
        first_i = index[key_rows[0]["offset"]]
        dump.bottom_reach[key] = after_gap[0] if gaps_before[first_i] else dump.lower_bounds[key_rows[0]["offset"]]
        dump.bottom_reach_row[key] = row_after_gap[0] if gaps_before[first_i] else key_rows[0]["offset"]
        dump.bottom_cut[key] = bool(gaps_before[first_i])
        running: Vector = {}
        for j, r in enumerate(key_rows):
            i = index[r["offset"]]
            running = vmax(running, {r["source_region"]: r["source_offset"]})
            bound = vector_after_gap[gaps_before[i] - 1] if gaps_before[i] else dump.pre_history
            dump.touch[r["offset"]] = None if bound is None else vmax(bound, running)
            nxt = key_rows[j + 1] if j + 1 < len(key_rows) else None
            crossed = (gaps_before[index[nxt["offset"]]] if nxt else len(dump.gaps)) > gaps_before[i]
            dump.cut[r["offset"]] = crossed
            if crossed:
                dump.reach[r["offset"]] = after_gap[gaps_before[i]]
                dump.reach_row[r["offset"]] = row_after_gap[gaps_before[i]]
            else:
                dump.reach[r["offset"]] = dump.lower_bounds[nxt["offset"]] if nxt else dump.end
                dump.reach_row[r["offset"]] = nxt["offset"] if nxt else None
    return dump


@dataclass
class Finding:
    verdict: str
    missing_in: Optional[str] = None
    witness_a: Optional[Version] = None
    witness_b: Optional[Version] = None


def compare_key(a: Dump, b: Dump, key: str, name_a: str, name_b: str) -> Finding:
    versions_a = a.versions(key)
    versions_b = b.versions(key)
    # Earliest w of B (pre-dump version first), then the earliest v of A.
    for w in versions_b:
        for v in versions_a:
            if v.touch is None or w.touch is None:
                continue
            if v.token != w.token and leq(w.touch, v.reach) and leq(v.touch, w.reach):
                if a.starts_with_sop and not a.data_rows(key):
                    return Finding("MISSING", name_a, v, w)
                if b.starts_with_sop and not b.data_rows(key):
                    return Finding("MISSING", name_b, v, w)
                return Finding("DIVERGENT", None, v, w)
    if not versions_a or not versions_b or versions_a[-1].token != versions_b[-1].token:
        return Finding("IN_FLIGHT")
    return Finding("CONSISTENT")


def blocking(a: list[Version], b: list[Version], name_a: str, name_b: str) -> list[tuple]:
    """SPEC 10: for the last versions a, b, every component where U(b) <= M(a) fails (replica_a's entries), then
    every one where U(a) <= M(b) fails; (replica, region, needs, has). Empty when a side holds no version."""
    if not a or not b:
        return []
    out = []
    for holder, mine, theirs in ((name_a, a[-1], b[-1]), (name_b, b[-1], a[-1])):
        if theirs.touch is None:
            out.append((holder, "*", -1, None))
            continue
        for region in sorted(theirs.touch):
            if region not in mine.reach or theirs.touch[region] > mine.reach[region]:
                out.append((holder, region, theirs.touch[region], mine.reach.get(region)))
    return out


def resolution(finding: Finding, name_a: str, name_b: str) -> Optional[tuple[str, str]]:
    """SPEC 10: (expected, deviating) replica of a proven key; None when the write times cannot tell."""
    if finding.verdict == "MISSING":
        return (name_b if finding.missing_in == name_a else name_a), finding.missing_in
    if finding.verdict != "DIVERGENT":
        return None
    ts_a, ts_b = finding.witness_a.write_ts, finding.witness_b.write_ts
    if ts_a is None or ts_b is None or ts_a == ts_b:
        return None
    return (name_a, name_b) if ts_a > ts_b else (name_b, name_a)


Place = tuple[str, str, int]  # (replica, topic, partition)


def dumps_of(
    rows: Iterable[dict], read_positions: Optional[Mapping[Place, Iterable[int]]] = None
) -> dict[Place, Dump]:
    """One Dump per (replica, topic, partition); ``read_positions`` as build_dump's, per place."""
    grouped: dict[Place, list[dict]] = {}
    for r in rows:
        grouped.setdefault((r["replica"], r["topic"], r["partition"]), []).append(r)
    read_positions = read_positions or {}
    return {k: build_dump(v, read_positions.get(k)) for k, v in grouped.items()}


def reference_verdicts(
    rows: Iterable[dict[str, Any]], read_positions: Optional[Mapping[Place, Iterable[int]]] = None
) -> dict[tuple[str, int, str, str, str], Finding]:
    """(topic, partition, replica_a, replica_b, key) -> Finding, for every compared key (CONSISTENT too)."""
    dumps = dumps_of(rows, read_positions)
    out: dict[tuple[str, int, str, str, str], Finding] = {}
    partitions = {(t, p) for (_, t, p) in dumps}
    for topic, partition in sorted(partitions):
        replicas = sorted(r for (r, t, p) in dumps if (t, p) == (topic, partition))
        for name_a, name_b in combinations(replicas, 2):
            a = dumps[(name_a, topic, partition)]
            b = dumps[(name_b, topic, partition)]
            for key in sorted(a.keys() | b.keys()):
                out[(topic, partition, name_a, name_b, key)] = compare_key(a, b, key, name_a, name_b)
    return out
