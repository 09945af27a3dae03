"""A plain-Python reading of SPEC sections 2-4, written for tests: no Spark, no cleverness.

It pairs every version of a key in one replica with every version in the other
(quadratic, fine for test-sized streams) and follows the SPEC's sentences one by one.
Rows are dicts with the raw snapshot fields; one snapshot is assumed.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Iterable, Optional

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


@dataclass
class Dump:
    """One replica's rows of one topic partition, with everything SPEC section 3 derives."""

    rows: list[dict]
    starts_with_sop: bool = False
    pre_history: Optional[Vector] = None  # P
    lower_bounds: dict[int, Vector] = field(default_factory=dict)  # offset -> L(p)
    end: Vector = field(default_factory=dict)  # L(end)
    touch: dict[int, Optional[Vector]] = field(default_factory=dict)  # data row offset -> U
    reach: dict[int, Vector] = field(default_factory=dict)  # data row offset -> M
    segment: dict[int, int] = field(default_factory=dict)
    resolved_ts: dict[int, Optional[int]] = field(default_factory=dict)  # heartbeat offset -> resolved ts

    def data_rows(self, key: str) -> list[dict]:
        return [r for r in self.rows if r["kind"] in ("PUT", "DELETE") and r["key"] == key]

    def keys(self) -> set[str]:
        return {r["key"] for r in self.rows if r["kind"] in ("PUT", "DELETE")}

    def versions(self, key: str) -> list[Version]:
        rows = self.data_rows(key)
        out = []
        if self.starts_with_sop:
            bottom_reach = self.lower_bounds[rows[0]["offset"]] if rows else self.end
            out.append(Version(None, ABSENT, None, {}, bottom_reach))
        for r in rows:
            out.append(Version(r["offset"], token(r), r.get("value"), self.touch[r["offset"]], self.reach[r["offset"]]))
        return out


def contribution(row: dict) -> Vector:
    if row["kind"] == "HEARTBEAT":
        if row.get("hb_vector") is not None:
            return dict(row["hb_vector"])
        return {row["source_region"]: row["source_offset"]}
    if row["kind"] in ("PUT", "DELETE"):
        return {row["source_region"]: row["source_offset"]}
    return {}


def build_dump(rows: Iterable[dict]) -> Dump:
    rows = sorted((r for r in rows if r["kind"] != "EXPORTER_POSITION"), key=lambda r: r["offset"])
    dump = Dump(rows=rows)
    dump.starts_with_sop = bool(rows) and rows[0]["kind"] == "START_OF_PUSH"

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
    dump.end = so_far

    if dump.starts_with_sop:
        dump.pre_history = {}
    else:
        with_vector = [r for r in rows if r["kind"] == "HEARTBEAT" and r.get("hb_vector") is not None]
        dump.pre_history = dict(with_vector[0]["hb_vector"]) if with_vector else None

    for key in dump.keys():
        key_rows = dump.data_rows(key)
        for i, r in enumerate(key_rows):
            if dump.pre_history is None:
                dump.touch[r["offset"]] = None
            else:
                upto = [{j["source_region"]: j["source_offset"]} for j in key_rows if j["offset"] <= r["offset"]]
                dump.touch[r["offset"]] = vmax(dump.pre_history, *upto)
            nxt = key_rows[i + 1] if i + 1 < len(key_rows) else None
            dump.reach[r["offset"]] = dump.lower_bounds[nxt["offset"]] if nxt else dump.end
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


def dumps_of(rows: Iterable[dict]) -> dict[tuple[str, str, int], Dump]:
    grouped: dict[tuple[str, str, int], list[dict]] = {}
    for r in rows:
        grouped.setdefault((r["replica"], r["topic"], r["partition"]), []).append(r)
    return {k: build_dump(v) for k, v in grouped.items()}


def reference_verdicts(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, int, str, str, str], Finding]:
    """(topic, partition, replica_a, replica_b, key) -> Finding, for every compared key (CONSISTENT too)."""
    dumps = dumps_of(rows)
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


# Building streams by hand, for the tests' scenarios: one dict per message, offsets assigned in order.

def sop() -> dict:
    return {"kind": "START_OF_PUSH"}


def put(key: str, value: str, region: str, source_offset: int, write_ts: Optional[int] = None) -> dict:
    return {"kind": "PUT", "key": key, "value": value, "source_region": region,
            "source_offset": source_offset, "write_ts": write_ts}


def delete(key: str, region: str, source_offset: int, write_ts: Optional[int] = None) -> dict:
    return {"kind": "DELETE", "key": key, "source_region": region, "source_offset": source_offset,
            "write_ts": write_ts}


def heartbeat(region: str, source_offset: int, vector: Optional[Vector] = None, origin_ms: int = 1_000,
              applied_ms: int = 2_000) -> dict:
    return {"kind": "HEARTBEAT", "source_region": region, "source_offset": source_offset, "hb_vector": vector,
            "origin_ts_min_ms": origin_ms, "origin_ts_max_ms": origin_ms + 5,
            "applied_ts_min_ms": applied_ms, "applied_ts_max_ms": applied_ms + 5}


def stream(replica: str, topic: str, messages: list[dict], partition: int = 0, first_offset: int = 0) -> list[dict]:
    """One replica's dump of a topic partition: the messages at consecutive offsets."""
    return [
        {"replica": replica, "topic": topic, "partition": partition, "offset": first_offset + i, **m}
        for i, m in enumerate(messages)
    ]
