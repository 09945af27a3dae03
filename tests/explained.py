"""Explanations (``explain/``) against the plain reference of the SPEC rules (``replica_lens/reference.py``).

Shared by the test files that audit histories (tests/test_venice_simulated.py: SPEC rows and Venice records;
tests/test_audit_e2e.py: a compacted, lossy dump with gaps), so that each audit serves this check too.
"""
from __future__ import annotations

from collections import Counter

from explain.reading import SnapshotTables, explain_keys
from resources.delta_reader import TableReader
from tests.reference_leapfrog import blocking, dumps_of, reference_verdicts, resolution

CONSISTENT_PER_PARTITION = 15


def reference_of(warehouse: str, snapshot_id: str) -> tuple[dict, dict]:
    """The plain reference's dumps and findings of a snapshot, from its raw rows and its read-but-skipped positions."""
    reader = TableReader(warehouse)
    raw = [r for r in reader.read("raw_topic_snapshots", snapshot_id).to_pylist() if r["kind"] != "EXPORTER_POSITION"]
    for r in raw:
        r["hb_vector"] = None if r["hb_vector"] is None else dict(r["hb_vector"])
    skipped: dict = {}
    for r in reader.read("raw_topic_skipped", snapshot_id, columns=["replica", "topic", "partition", "offset"]).to_pylist():
        skipped.setdefault((r["replica"], r["topic"], r["partition"]), []).append(r["offset"])
    return dumps_of(raw, skipped), reference_verdicts(raw, skipped)


def _explained(doc: dict) -> tuple[dict, dict]:
    """An explanation's versions and pairs, in the reference's terms."""
    versions = {
        r["replica"]: [(v["offset"], v["value_hash"] or "ABSENT", v["touch_bound"], v["reach"], v["reach_row"],
                        v["gap_before"], v["gap_after"]) for v in r["versions"]]
        for r in doc["replicas"]
    }
    pairs = {
        (p["replica_a"], p["replica_b"]): (
            p["verdict"], p["witness"] and (p["witness"]["offset_a"], p["witness"]["offset_b"]),
            [(b["replica"], b["region"], b["needs"], b["has"]) for b in p["blocking"]],
            p["resolution"] and (p["resolution"]["expected_replica"], p["resolution"]["deviating_replica"]),
        )
        for p in doc["pairs"]
    }
    return versions, pairs


def reference_odd_one_out(rows: list[dict], findings: dict, topic: str, partition: int, key: str) -> list[dict]:
    """SPEC 10's ``odd_one_out`` of one key from its raw rows and the reference's findings (not from ``explain``):
    the writes behind both witnesses of a DIVERGENT pair, and per write the contents each replica holds for it."""
    rows = [r for r in rows if r["kind"] in ("PUT", "DELETE")]
    at = {(r["replica"], r["offset"]): r for r in rows}
    writes = set()
    for (t, p, a, b, k), f in findings.items():
        if (t, p, k) != (topic, partition, key) or f.verdict != "DIVERGENT" or f.witness_a.offset is None \
                or f.witness_b.offset is None:
            continue
        v, w = at[(a, f.witness_a.offset)], at[(b, f.witness_b.offset)]
        if (v["source_region"], v["source_offset"]) == (w["source_region"], w["source_offset"]):
            writes.add((v["source_region"], v["source_offset"]))
    out = []
    for write in sorted(writes):
        held: dict = {}
        for r in rows:
            if (r["source_region"], r["source_offset"]) == write:
                held.setdefault(r["replica"], set()).add(r["value"] if r["kind"] == "PUT" else None)
        for odd in sorted(held):
            rest = [c for name, c in held.items() if name != odd]
            if len(rest) >= 2 and all(len(c) == 1 and c == rest[0] for c in rest) and held[odd] != rest[0]:
                out.append({"replica": odd, "source_region": write[0], "source_offset": write[1],
                            "agreeing": sorted(name for name in held if name != odd)})
    return out


def assert_explanations_equal_the_reference(warehouse: str, snapshot_id: str, odd: list | None = None) -> int:
    """Every non-consistent key's explanation, and ``CONSISTENT_PER_PARTITION`` consistent ones' per partition,
    equal the reference: U, M, the row M comes from, the gap marks, verdict, witness, blocking and resolution.
    Returns how many keys were compared. ``odd``: a list that receives every ``odd_one_out`` entry seen (each checked
    against ``reference_odd_one_out``).

    Catches a reach_row taken from the key's next row across a gap, ⊥'s reach row when the key's first row follows
    a gap, a position read but skipped taken for a gap, blocking entries on the wrong side or with M's component
    taken from the wrong version, a resolution that ignores write times, and a witness read from another pair."""
    dumps, findings = reference_of(warehouse, snapshot_id)
    raw = TableReader(warehouse).read(
        "raw_topic_snapshots", snapshot_id,
        columns=["replica", "topic", "partition", "offset", "key", "kind", "value", "source_region", "source_offset"],
    ).to_pylist()
    raw_by_key: dict = {}
    for r in raw:
        raw_by_key.setdefault((r["topic"], r["partition"], r["key"]), []).append(r)
    chosen: dict = {}
    consistent = Counter()
    for (topic, partition, _, _, key), finding in findings.items():
        if finding.verdict != "CONSISTENT" or consistent[(topic, partition)] < CONSISTENT_PER_PARTITION:
            consistent[(topic, partition)] += finding.verdict == "CONSISTENT"
            chosen.setdefault((topic, partition), set()).add(key)
    tables = SnapshotTables(warehouse, snapshot_id)
    compared = 0
    for (topic, partition), keys in sorted(chosen.items()):
        replicas = sorted(r for (r, t, p) in dumps if (t, p) == (topic, partition))
        for key, doc in explain_keys(tables, topic, partition, sorted(keys), heartbeats=False).items():
            versions, pairs = _explained(doc)
            expected_versions = {
                r: [(v.offset, v.token, v.touch, v.reach, v.reach_row, v.gap_before, v.gap_after)
                    for v in dumps[(r, topic, partition)].versions(key)]
                for r in replicas
            }
            assert versions == expected_versions, (snapshot_id, topic, partition, key)
            expected_pairs = {}
            for i, a in enumerate(replicas):
                for b in replicas[i + 1:]:
                    f = findings[(topic, partition, a, b, key)]
                    va, vb = dumps[(a, topic, partition)].versions(key), dumps[(b, topic, partition)].versions(key)
                    proven = f.verdict in ("DIVERGENT", "MISSING")
                    expected_pairs[(a, b)] = (
                        f.verdict, (f.witness_a.offset, f.witness_b.offset) if proven else None,
                        blocking(va, vb, a, b) if f.verdict == "IN_FLIGHT" else [], resolution(f, a, b),
                    )
            assert pairs == expected_pairs, (snapshot_id, topic, partition, key)
            assert doc["odd_one_out"] == reference_odd_one_out(
                raw_by_key.get((topic, partition, key), []), findings, topic, partition, key), (
                snapshot_id, topic, partition, key)
            if odd is not None:
                odd.extend(doc["odd_one_out"])
            compared += 1
    return compared
