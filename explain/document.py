"""The explanation of one key (docs/explain.md): every replica's versions and every pair's verdict, as one document.

Pure Python over rows already read (``explain/reading.py`` reads them from the
published tables): nothing here touches Spark or storage, so the text, the JSON, the pages
and the Dagster metadata all show the same facts, and the tests check them against the
plain reference of the SPEC rules (``replica_lens/reference.py``).

What each field means (the contract is docs/explain.md):

- Per replica, ``dump``: the replica partition's first and last offset, whether it starts with
  START_OF_PUSH, its gaps (how many, how many positions, and each gap's range).
- Per replica, ``versions`` in offset order, ⊥ (kind ABSENT, offset null) first when the dump
  starts with START_OF_PUSH. ``touch_bound`` (U) and ``reach`` (M) are the vectors the
  divergence verdict used (``reconstructed_watermarks``); ``reach_row`` is the row whose ``L``
  is M: the key's next row when no gap lies between, else the first row after the first gap
  after the version (SPEC 3a), null when M is ``L(end)``.
- Per pair, the verdict of ``divergence_reports`` (CONSISTENT when the pair has no row), its
  witness, ``blocking`` (IN_FLIGHT: which components keep the last versions from proving
  anything, and on which side) and ``resolution`` (DIVERGENT/MISSING: which replica holds
  what deterministic conflict resolution keeps).
- ``odd_one_out``: with three or more replicas, per write behind both witness versions of a DIVERGENT pair, the
  replica holding other content for it than all the others, which agree (evidence apart from ``resolution``).
"""
from __future__ import annotations

import base64
import binascii
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any, Iterable, Optional

from explain.carried import Stream, as_vector

Vector = dict[str, int]

ABSENT = "ABSENT"
FORMAT_VERSION = 1
# Venice values are stored as "{schemaId}:{base64(value bytes)}" (docs/venice-input.md).
_VENICE_VALUE = re.compile(r"^(-?\d+):([A-Za-z0-9+/]*={0,2})$")
REDACTED = "redacted"


@dataclass
class ReplicaInput:
    """What the tables hold about one replica partition and the key: the inputs of ``explain``."""

    replica: str
    dump: dict  # a ``partition_watermarks`` row
    rows: list[dict]  # the key's ``reconstructed_watermarks`` rows, any order
    gap_rows: list[dict] = field(default_factory=list)  # ``heartbeat_segments`` rows with gap_before > 0
    # When this dump continues an earlier snapshot's state (docs/incremental.md): the stream's facts, and ``rows``
    # are the key's rows as the comparison used them (``explain/carried.py``). None: a fresh stream.
    stream: Optional[Stream] = None


def leq(u: Vector, v: Vector) -> bool:
    """SPEC 3's order: every component of u is present in v and not larger."""
    return all(region in v and offset <= v[region] for region, offset in u.items())


def failing(u: Vector, m: Vector) -> list[tuple[str, int, Optional[int]]]:
    """The components of ``u <= m`` that fail: (region, needed, had or None)."""
    return [(r, u[r], m.get(r)) for r in sorted(u) if r not in m or u[r] > m[r]]


def physical_ms(write_ts: Optional[int]) -> Optional[int]:
    """The physical milliseconds of a hybrid logical clock (``write_ts >> 18``)."""
    return None if write_ts is None else write_ts >> 18


# The most characters of a value shown for one key (text, page, UI; a long value wraps, whole up to this), and on
# the page of every reported key; the JSON document of ``replica-lens explain`` holds the value whole.
DISPLAY_MAX_CHARS = 65_536
REPORT_VALUE_CHARS = 2_048


def display_value(value: Optional[str], kind: str, limit: int = DISPLAY_MAX_CHARS, read_cut: bool = False) -> Optional[str]:
    """A value as a person reads it: Venice's ``schemaId:base64`` decoded where the bytes are text, and at most
    ``limit`` characters of it, with a note where it was cut (a value of megabytes is not read by a person).
    ``read_cut``: ``value`` is the start of a longer value (read no longer than shown): noted too."""
    shown = _display_value(value, kind)
    if shown is None or (len(shown) <= limit and not read_cut):
        return shown
    return f"{shown[:limit]}... (cut at {min(limit, len(shown)):,} characters: the whole value is in replica-lens " \
           "explain --json)"


def _display_value(value: Optional[str], kind: str) -> Optional[str]:
    if kind == "DELETE":
        return "TOMBSTONE"
    if kind == ABSENT:
        return "ABSENT"
    if value is None:
        return None
    match = _VENICE_VALUE.match(value)
    if match is None:
        return value
    encoded = match.group(2)
    try:
        # A value read cut (the page of every key reads no more than it shows) decodes up to where it was cut.
        raw = base64.b64decode(encoded[: len(encoded) - len(encoded) % 4], validate=True)
    except binascii.Error:
        return value
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:  # a value read cut may end inside a character: up to it
        text = raw[: error.start].decode("utf-8") if error.reason == "unexpected end of data" else None
    if text is not None and text.isprintable():
        return f"schema {match.group(1)}: {text!r}"
    return f"schema {match.group(1)}: {len(raw)} bytes 0x{raw[:32].hex()}{'...' if len(raw) > 32 else ''}"


def key_text(key: str) -> Optional[str]:
    """A Venice key (base64 of its bytes) as text, when its bytes are printable UTF-8; else None."""
    try:
        raw = base64.b64decode(key, validate=True)
        text = raw.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    return text if text and text.isprintable() else None


def looks_like_venice(rows: Iterable[dict]) -> bool:
    """Every PUT value is spelled ``schemaId:base64`` (how the Venice decoder writes values) and the key is base64."""
    puts = [r for r in rows if r["kind"] == "PUT"]
    return bool(puts) and all(r.get("value") is not None and _VENICE_VALUE.match(r["value"]) for r in puts)


def _gap_ranges(gap_rows: Iterable[dict], first_offset: int) -> list[dict]:
    """The dump's own gaps (a continuing dump's gap before its first offset is the stream's: ``carried_from``)."""
    ranges = [
        # gap_start/gap_end: the positions missing since the row before (read positions between them are not);
        # snapshots audited before they existed say only how many were missing right before the row.
        {"first": _or(r.get("gap_start"), r["offset"] - r["gap_before"]), "last": _or(r.get("gap_end"), r["offset"] - 1)}
        for r in sorted(gap_rows, key=lambda r: r["offset"])
    ]
    return [r for r in ranges if r["first"] >= first_offset]


def _or(value, default):
    return default if value is None else value


def _versions(inp: ReplicaInput) -> list[dict]:
    """The key's versions in one replica, ⊥ first when the dump starts with START_OF_PUSH."""
    rows = sorted(inp.rows, key=lambda r: r["offset"])
    gap_after_rows = sorted(r["offset"] for r in inp.gap_rows)  # rows right after a gap

    def first_gap_row_after(offset: int) -> Optional[int]:
        i = bisect_right(gap_after_rows, offset)
        return gap_after_rows[i] if i < len(gap_after_rows) else None

    versions = []
    dump, stream = inp.dump, inp.stream
    starts_with_sop = dump["starts_with_sop"] if stream is None else stream.starts_with_sop
    if starts_with_sop:
        first = rows[0] if rows else None
        first_gap = as_vector(dump["first_gap_lower_bound"]) if stream is None else stream.first_gap_lower_bound
        earlier = False  # ⊥'s reach is L at a row of an earlier snapshot's dump
        if first is not None and first["missing_before"] == 0:
            # A carried first row's L is the key's first row in the stream: in an earlier dump.
            earlier = bool(first.get("carried_from"))
            reach_row = None if earlier else first["offset"]
            reach, cut = as_vector(first["applied_lower_bound"]), False
        elif stream is not None and stream.first_gap_earlier:  # the stream's first gap lies before this snapshot
            reach, reach_row, cut = first_gap, stream.first_gap_row, True
            earlier = reach_row is None
        elif gap_after_rows:  # a gap lies before the key's first row (or the key never appears): L at the first gap
            reach, reach_row, cut = first_gap, gap_after_rows[0], True
        else:
            end = as_vector(dump["end_lower_bound"]) if stream is None else stream.end_lower_bound
            reach, reach_row, cut = end, None, False
        versions.append({
            "offset": None, "kind": ABSENT, "value_hash": None, "value": None, "source_region": None,
            "source_offset": None, "write_ts": None, "write_ms": None, "touch_bound": {}, "reach": reach,
            "reach_row": reach_row, "gap_before": False, "gap_after": cut, "reach_in_earlier_dump": earlier,
            "carried_from": None,
        })
    for i, row in enumerate(rows):
        nxt = rows[i + 1] if i + 1 < len(rows) else None
        gap_row = first_gap_row_after(row["offset"])
        if "reach_row" in row:  # a carried version: explain/carried.py tells where its reach comes from
            reach_row, cut = row["reach_row"], row["gap_after"]
        elif nxt is not None and nxt["missing_before"] == row["missing_before"]:
            reach_row, cut = nxt["offset"], False
        elif gap_row is not None:  # a gap lies between the version and its next row (or the end): M = L(g)
            reach_row, cut = gap_row, True
        else:
            reach_row, cut = None, False
        versions.append({
            "offset": row["offset"],
            "kind": row["kind"],
            "value_hash": row["value_hash"],
            "value": row.get("value") if row["kind"] == "PUT" else None,
            "source_region": row["source_region"],
            "source_offset": row["source_offset"],
            "write_ts": row.get("write_ts"),
            "write_ms": physical_ms(row.get("write_ts")),
            "touch_bound": as_vector(row["touch_bound"]),
            "reach": as_vector(row["reach"]),
            "reach_row": reach_row,
            "gap_before": row.get("gap_before", row["missing_before"] > 0),
            "gap_after": cut,
            "reach_in_earlier_dump": row.get("reach_in_earlier_dump", False),
            "carried_from": row.get("carried_from"),
        })
    return versions


def _window(versions: list[dict], heartbeats: list[dict]) -> list[dict]:
    """The heartbeats from just before the key's first data row to the last row its reach rests on."""
    offsets = [v["offset"] for v in versions if v["offset"] is not None]
    if not offsets:
        return []
    last = versions[-1]["reach_row"]
    first = max((h["offset"] for h in heartbeats if h["offset"] < offsets[0]), default=-1)
    return [
        {"offset": h["offset"], "region": h["source_region"], "applied_ms": h["applied_ts_min_ms"],
         "vector": as_vector(h["hb_vector"])}
        for h in heartbeats if h["offset"] >= first and (last is None or h["offset"] <= last)
    ]


def _replica(inp: ReplicaInput, heartbeats: Optional[list[dict]]) -> dict:
    dump = inp.dump
    versions = _versions(inp)
    out = {
        "replica": inp.replica,
        "carried_from": None if inp.stream is None else inp.stream.as_json(),
        "dump": {
            "first_offset": dump["first_offset"],
            "last_offset": dump["last_offset"],
            "starts_with_start_of_push": bool(dump["starts_with_sop"]),
            "gaps": int(dump["gaps"]),
            "gap_positions": int(dump["gap_positions"]),
            "gap_ranges": _gap_ranges(inp.gap_rows, dump["first_offset"]),
            "pre_history_bound": as_vector(dump.get("pre_history_bound")),
            "end_lower_bound": as_vector(dump["end_lower_bound"]),
        },
        "versions": versions,
    }
    if dump.get("absent"):  # no rows in the snapshot: compared on its carried state only (explain/carried.py)
        out["absent"] = True
    if heartbeats is not None:
        out["heartbeats"] = _window(versions, heartbeats)
    return out


def _by_offset(versions: list[dict], offset: Optional[int]) -> dict:
    return next(v for v in versions if v["offset"] == offset)


def blocking(a: list[dict], b: list[dict], name_a: str, name_b: str) -> list[dict]:
    """Why an IN_FLIGHT pair is not proven, from the last versions (SPEC 10)."""
    if not a or not b:
        return []
    last_a, last_b = a[-1], b[-1]
    out = []
    for holder, mine, theirs in ((name_a, last_a, last_b), (name_b, last_b, last_a)):
        if theirs["touch_bound"] is None:
            out.append({"replica": holder, "region": "*", "needs": -1, "has": None})
            continue
        out.extend({"replica": holder, "region": r, "needs": needs, "has": has}
                   for r, needs, has in failing(theirs["touch_bound"], mine["reach"]))
    return out


def resolution(report: dict, v: dict, w: dict, name_a: str, name_b: str) -> Optional[dict]:
    """Which replica holds what conflict resolution keeps, for a proven pair (SPEC 10)."""
    if report["verdict"] == "MISSING":
        lacking = report["missing_in"]
        return {"expected_replica": name_b if lacking == name_a else name_a, "deviating_replica": lacking,
                "rule": "MISSING"}
    if v["write_ts"] is None or w["write_ts"] is None or v["write_ts"] == w["write_ts"]:
        return None
    newer_a = v["write_ts"] > w["write_ts"]
    return {"expected_replica": name_a if newer_a else name_b, "deviating_replica": name_b if newer_a else name_a,
            "rule": "LARGER_WRITE_TS"}


def odd_one_out(replicas: list[dict], pairs: list[dict]) -> list[dict]:
    """SPEC 10's ``odd_one_out``: per write that made both witness versions of a DIVERGENT pair (the same write, other
    content), the one replica holding other content for it than all the others, which agree (at least two).

    Evidence from the other replicas, apart from ``resolution``: three or more replicas hold a version made by the
    write; every one but one holds only the same content for it (a replica holding several versions made by the
    write agrees only when all of them hold that content); the one left holds other content. Nothing is named when
    the others disagree among themselves. Ordered by (source_region, source_offset).
    """
    by_name = {r["replica"]: r for r in replicas}
    writes = set()
    for pair in pairs:
        if pair["verdict"] != "DIVERGENT" or pair["witness"] is None:
            continue
        v = _by_offset(by_name[pair["replica_a"]]["versions"], pair["witness"]["offset_a"])
        w = _by_offset(by_name[pair["replica_b"]]["versions"], pair["witness"]["offset_b"])
        source = (v["source_region"], v["source_offset"])
        if None not in source and source == (w["source_region"], w["source_offset"]):
            writes.add(source)
    found = []
    for region, offset in sorted(writes):
        contents = {}  # replica -> the contents it holds for the write
        for replica in replicas:
            held = {x["value_hash"] for x in replica["versions"]
                    if (x["source_region"], x["source_offset"]) == (region, offset)}
            if held:
                contents[replica["replica"]] = held
        if len(contents) < 3:
            continue
        for odd in sorted(contents):
            others = [held for name, held in contents.items() if name != odd]
            agreed = others[0]
            if len(agreed) == 1 and all(held == agreed for held in others) and contents[odd] != agreed:
                found.append({"replica": odd, "source_region": region, "source_offset": offset,
                              "agreeing": sorted(name for name in contents if name != odd)})
                break
    return found


def _pair(a: dict, b: dict, report: Optional[dict]) -> dict:
    name_a, name_b = a["replica"], b["replica"]
    va, vb = a["versions"], b["versions"]
    if report is None:
        return {"replica_a": name_a, "replica_b": name_b, "verdict": "CONSISTENT", "missing_in": None,
                "witness": None, "blocking": [], "resolution": None}
    verdict = report["verdict"]
    pair = {"replica_a": name_a, "replica_b": name_b, "verdict": verdict, "missing_in": report.get("missing_in"),
            "witness": None, "blocking": [], "resolution": None}
    if verdict in ("DIVERGENT", "MISSING"):
        offset_a, offset_b = report["witness_offset_a"], report["witness_offset_b"]
        pair["witness"] = {"offset_a": offset_a, "offset_b": offset_b}
        pair["resolution"] = resolution(report, _by_offset(va, offset_a), _by_offset(vb, offset_b), name_a, name_b)
    else:
        pair["blocking"] = blocking(va, vb, name_a, name_b)
    return pair


def explain(
    snapshot_id: str, topic: str, partition: int, key: str, replicas: Iterable[ReplicaInput],
    reports: Iterable[dict], venice: Optional[bool] = False, heartbeats: Optional[dict[str, list[dict]]] = None,
) -> dict:
    """The document of SPEC 10 for one key: ``replicas`` hold the (topic, partition), ``reports`` its report rows.

    ``heartbeats``: per replica, its heartbeats in offset order (``offset``, ``source_region``,
    ``applied_ts_min_ms``, ``hb_vector``); each replica then lists those around the key's versions.
    """
    replicas = sorted(replicas, key=lambda i: i.replica)
    explained = [_replica(inp, None if heartbeats is None else heartbeats.get(inp.replica, [])) for inp in replicas]
    if venice is None:  # not known from the snapshot: the key's own values tell
        venice = looks_like_venice(row for inp in replicas for row in inp.rows) and key_text(key) is not None
    by_pair = {(r["replica_a"], r["replica_b"]): r for r in reports}
    pairs = [_pair(a, b, by_pair.get((a["replica"], b["replica"]))) for a, b in combinations(explained, 2)]
    doc = {
        "format_version": FORMAT_VERSION,
        "snapshot_id": snapshot_id,
        "topic": topic,
        "partition": partition,
        "key": key,
        "key_display": key_text(key) if venice else None,
        "venice": venice,
        "redacted": False,
        "replicas": explained,
        "pairs": pairs,
        "odd_one_out": odd_one_out(explained, pairs),
    }
    for replica in explained:
        for version in replica["versions"]:
            version["value_display"] = display_value(version["value"], version["kind"])
            if venice and version["offset"] is not None:
                version["reread_command"] = reread_command(replica["replica"], topic, partition, version["offset"])
    return doc


def reread_command(replica: str, topic: str, partition: int, offset: int) -> str:
    """Venice's admin tool reading one version-topic record back from the brokers (docs/explain.md)."""
    return (
        "java -jar venice-admin-tool-all.jar --dump-kafka-topic --url <controller-url> --cluster <cluster> "
        f"--kafka-bootstrap-servers <brokers-of-{replica}> --kafka-topic-name {topic} "
        f"--kafka-topic-partition {partition} --starting_offset {offset} --message_count 1 "
        "--log-data-record --log-metadata"
    )


def redact(doc: dict) -> dict:
    """``doc`` with every value's text removed: hashes only (the redaction setting)."""
    for replica in doc["replicas"]:
        for version in replica["versions"]:
            if version["kind"] == "PUT":
                version["value"] = None
                version["value_display"] = REDACTED
    doc["redacted"] = True
    return doc


# ------------------------------------------------------------------- reading the document back
def version_name(version: dict) -> str:
    return "⊥" if version["offset"] is None else f"@{version['offset']}"


def witness_versions(doc: dict, pair: dict) -> tuple[dict, dict]:
    """The witness versions (v of replica_a, w of replica_b) of a proven pair."""
    by_name = {r["replica"]: r for r in doc["replicas"]}
    w = pair["witness"]
    return (_by_offset(by_name[pair["replica_a"]]["versions"], w["offset_a"]),
            _by_offset(by_name[pair["replica_b"]]["versions"], w["offset_b"]))


VERDICT_ORDER = {"DIVERGENT": 0, "MISSING": 1, "IN_FLIGHT": 2, "CONSISTENT": 3}


def worst_verdict(doc: dict) -> str:
    return min((p["verdict"] for p in doc["pairs"]), key=VERDICT_ORDER.__getitem__, default="CONSISTENT")
