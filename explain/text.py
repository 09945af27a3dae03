"""The terminal text of one explained key (``replica-lens explain``), and the wording every view shares.

``render_text`` lays the document (``document.py``) out for an 80-120 column terminal. The
sentence and cell functions above it (``verdict_sentence``, ``inequality``, ``blocking_sentences``,
``resolution_sentence``, ``dump_sentence``, ``version_facts`` ...) are the only place the facts
are worded: the pages (``page.py``) and the Dagster metadata (``report.py``) call them and only
escape the result for their medium. Nothing is cut: a long key or value is wrapped onto lines of
its own, whole, and characters a terminal would act on (newlines, escapes) are shown escaped.
"""
from __future__ import annotations

import shlex
import textwrap
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Optional

from explain.document import leq, version_name, witness_versions, worst_verdict

WIDTH = 100
INDENT = "    "
HASH_PREFIX = 12
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

LEGEND = (
    "U = touch bound: the upstream writes (region:real-time-topic offset) a version can depend on. "
    "M = reach: what the replica had applied while the version was current (L, the applied lower bound, "
    "at the row named, or at the end of the dump). u <= m when every region of u is in m with a value not "
    "larger. ⊥ = the key before the dump's first row (ABSENT); an unknown U proves nothing. "
    "* = a witness version."
)
NO_VERSIONS = "no version of the key (the dump starts mid-stream and never saw it)"

MEANINGS = {
    "DIVERGENT": "proven: each replica had applied everything behind the other's version, and the two still held "
                 "different content; healthy replicas that resolve conflicts deterministically never show this.",
    "MISSING": "proven: each replica had applied everything behind the other's version, and {missing_in} never "
               "held the key (its dump starts at START_OF_PUSH and has no row of it).",
    "IN_FLIGHT": "not provable yet: the last versions differ (or a dump never saw the key), but not everything "
                 "behind them has been applied on both sides; a later snapshot settles it or proves it.",
    "CONSISTENT": "the last versions are equal and nothing proves a difference.",
}


# ------------------------------------------------------------------ words for single facts
def shown(text: str) -> str:
    """``text`` whole, with the characters a terminal or a page would act on escaped (``\\n``, ``\\x1b`` ...)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def vector_text(vector: Optional[dict]) -> str:
    """``dc-a:2366 dc-b:2073``; ``{}`` for the empty vector, ``unknown`` for None."""
    if vector is None:
        return "unknown"
    if not vector:
        return "{}"
    return " ".join(f"{region}:{vector[region]}" for region in sorted(vector))


def utc_time(ms: Optional[int]) -> str:
    """Milliseconds since the epoch as UTC ISO 8601 with milliseconds (``2023-11-14T22:13:20.288Z``); ``-`` for None."""
    if ms is None:
        return "-"
    moment = _EPOCH + timedelta(milliseconds=ms)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def replica_version(replica: str, version: dict) -> str:
    """``dc-a @6942``, ``dc-a ⊥``."""
    return f"{replica} {version_name(version)}"


def _by_replica(doc: dict) -> dict[str, dict]:
    return {r["replica"]: r for r in doc["replicas"]}


def _last(doc: dict, replica: str) -> Optional[dict]:
    versions = _by_replica(doc)[replica]["versions"]
    return versions[-1] if versions else None


def _other(pair: dict, replica: str) -> str:
    return pair["replica_b"] if replica == pair["replica_a"] else pair["replica_a"]


# ------------------------------------------------------------------ the sentences of a pair
def pair_name(pair: dict) -> str:
    return f"{pair['replica_a']} ~ {pair['replica_b']}"


def verdict_sentence(doc: dict, pair: dict) -> str:
    """One sentence: the pair, its verdict, the versions it rests on and what the verdict means."""
    meaning = MEANINGS[pair["verdict"]].format(missing_in=pair["missing_in"])
    return f"{pair_headline(doc, pair)}: {meaning}"


def pair_headline(doc: dict, pair: dict) -> str:
    """The pair, its verdict and the versions it rests on (the witness, or the last versions)."""
    verdict = pair["verdict"]
    a, b = pair["replica_a"], pair["replica_b"]
    if pair["witness"] is not None:
        v, w = witness_versions(doc, pair)
        on = f"witness v = {replica_version(a, v)}, w = {replica_version(b, w)}"
    else:
        last_a, last_b = _last(doc, a), _last(doc, b)
        on = "last versions " + ", ".join(
            replica_version(name, last) if last is not None else f"{name}: none"
            for name, last in ((a, last_a), (b, last_b))
        )
    return f"{pair_name(pair)} {verdict} ({on})"


def _component(region: str, needed: int, had: Optional[int]) -> str:
    if had is None:
        return f"{region} {needed} not in M: fails"
    return f"{region} {needed}<={had}" if needed <= had else f"{region} {needed}<={had} fails"


def inequality(u_name: str, u: Optional[dict], m_name: str, m: dict) -> str:
    """SPEC 4's ``U <= M`` with its numbers, component by component, and whether it holds."""
    if u is None:
        return f"{u_name} is unknown, so {u_name} <= {m_name} cannot hold: the version proves nothing"
    components = ", ".join(_component(r, u[r], m.get(r)) for r in sorted(u)) or "{} is below every vector"
    holds = "holds" if leq(u, m) else "fails"
    return f"{u_name}={vector_text(u)} <= {m_name}={vector_text(m)} : {holds} ({components})"


def witness_inequalities(doc: dict, pair: dict) -> tuple[str, str]:
    """The two inequalities of a proof: ``U(w) <= M(v)`` (a had applied all behind w) and ``U(v) <= M(w)``."""
    v, w = witness_versions(doc, pair)
    return (inequality("U(w)", w["touch_bound"], "M(v)", v["reach"]),
            inequality("U(v)", v["touch_bound"], "M(w)", w["reach"]))


def _written(version: dict) -> str:
    if version["write_ts"] is None:
        return "no write timestamp"
    return f"written {utc_time(version['write_ms'])} (write_ts {version['write_ts']})"


def resolution_sentence(doc: dict, pair: dict) -> Optional[str]:
    """Which replica deviates from what conflict resolution keeps, and why; or why it cannot be told. None unproven."""
    if pair["witness"] is None:
        return None
    v, w = witness_versions(doc, pair)
    a, b = pair["replica_a"], pair["replica_b"]
    found = pair["resolution"]
    if found is not None:
        expected, deviating = found["expected_replica"], found["deviating_replica"]
        kept, lost = (v, w) if expected == a else (w, v)
        if found["rule"] == "MISSING":
            return (f"{deviating} deviates: it never held the key, while {expected} holds "
                    f"{replica_version(expected, kept)}.")
        return (f"{deviating} deviates: conflict resolution keeps the larger write timestamp, "
                f"{replica_version(expected, kept)} {_written(kept)} over "
                f"{replica_version(deviating, lost)} {_written(lost)}.")
    unknown = [replica_version(name, x) for name, x in ((a, v), (b, w)) if x["write_ts"] is None]
    if unknown:
        return f"Which replica deviates cannot be told: {' and '.join(unknown)} carries no write timestamp."
    if (v["source_region"], v["source_offset"]) == (w["source_region"], w["source_offset"]):
        told = [odd_one_out_sentence(o) for o in doc.get("odd_one_out") or []
                if (o["source_region"], o["source_offset"]) == (v["source_region"], v["source_offset"])
                and o["replica"] in (a, b)]
        return (f"Which replica deviates cannot be told: both hold the same write "
                f"({v['source_region']}:{v['source_offset']}, write_ts {v['write_ts']}) with different content."
                + "".join(f" The other replicas tell: {sentence}" for sentence in told))
    return (f"Which replica deviates cannot be told: both versions carry write_ts {v['write_ts']}, "
            "so conflict resolution does not order them.")


def _names(names: list[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"


def odd_one_out_sentence(entry: dict) -> str:
    """One ``odd_one_out`` entry: ``dc-b holds other content for write dc-a@123 than dc-a and dc-c, which agree``."""
    agreeing = entry["agreeing"]
    return (f"{entry['replica']} holds other content for write {entry['source_region']}@{entry['source_offset']} "
            f"than {_names(agreeing)}, which agree ({len(agreeing)} of the {len(agreeing) + 1} replicas holding it): "
            f"{entry['replica']} is the odd one out.")


def _blocked(doc: dict, pair: dict, entry: dict) -> str:
    holder, region, needs, has = entry["replica"], entry["region"], entry["needs"], entry["has"]
    other = _other(pair, holder)
    theirs = replica_version(other, _last(doc, other))
    if region == "*":
        return (f"The touch bound U of {theirs} is unknown ({other}'s dump starts mid-stream with no heartbeat "
                f"vector before it, or has none after its gap): nothing {holder} applies settles it; a dump of "
                f"{other} from START_OF_PUSH, or with a vector heartbeat after its gaps, would.")
    applied = (f"{holder} has applied nothing of {region}'s real-time topic" if has is None
               else f"{holder} has applied {region}'s real-time topic up to {has}")
    if _last(doc, holder)["gap_after"]:
        return f"{applied} but {theirs} needs {needs}."
    return (f"{applied} but {theirs} needs {needs}: the next heartbeat of {holder} whose vector covers "
            f"{region} >= {needs} would settle it.")


def _cut(doc: dict, holder: str) -> str:
    mine = _last(doc, holder)
    return (f"A gap after {replica_version(holder, mine)} cuts its reach at row {mine['reach_row']}: no later "
            f"heartbeat of {holder} raises it, only a dump of {holder} that holds the gap's records (or a later "
            "version of the key) does.")


def blocking_sentences(doc: dict, pair: dict) -> list[str]:
    """IN_FLIGHT: what keeps the last versions from proving anything, a sentence per blocking entry."""
    by_name = _by_replica(doc)
    unseen = [
        f"{name}'s dump starts mid-stream (offset {by_name[name]['dump']['first_offset']}) and holds no row of the "
        f"key: nothing compares it until a dump of {name} reaches back to a version of the key."
        for name in (pair["replica_a"], pair["replica_b"]) if not by_name[name]["versions"]
    ]
    holders = dict.fromkeys(e["replica"] for e in pair["blocking"] if e["region"] != "*")
    cuts = [_cut(doc, holder) for holder in holders if _last(doc, holder)["gap_after"]]
    return unseen + [_blocked(doc, pair, entry) for entry in pair["blocking"]] + cuts


def _compared_versions(doc: dict, pair: dict) -> Optional[tuple[dict, dict]]:
    """The versions a pair's explanation sets side by side: the witness, else the last ones (None: a side has none)."""
    if pair["witness"] is not None:
        return witness_versions(doc, pair)
    last_a, last_b = _last(doc, pair["replica_a"]), _last(doc, pair["replica_b"])
    return None if last_a is None or last_b is None else (last_a, last_b)


def comparison_rows(doc: dict, pair: dict) -> list[tuple[str, str, str]]:
    """(what, replica_a's side, replica_b's side) of the compared versions: title, value, hash prefix, source, time."""
    versions = _compared_versions(doc, pair)
    if versions is None:
        return []
    v, w = versions
    roles = ("v", "w") if pair["witness"] is not None else ("last", "last")
    return [
        ("version", f"{roles[0]} = {replica_version(pair['replica_a'], v)}", f"{roles[1]} = "
         f"{replica_version(pair['replica_b'], w)}"),
        ("value", _value(v), _value(w)),
        ("hash", _hash(v), _hash(w)),
        ("source", _source(v), _source(w)),
        ("written", utc_time(v["write_ms"]), utc_time(w["write_ms"])),
    ]


# ------------------------------------------------------------------ the words of a replica
def _gap_range(gap: dict) -> str:
    return str(gap["first"]) if gap["first"] == gap["last"] else f"{gap['first']}..{gap['last']}"


def dump_sentence(replica: dict) -> str:
    """The replica partition's dump: offsets, how it starts, P and L(end), its gaps with every range."""
    dump = replica["dump"]
    stream = replica.get("carried_from")
    if replica.get("absent") and stream:  # the broker cut read nothing of it: its carried state is the stream
        return (
            f"dump: no rows in this snapshot (its broker cut read nothing of it): compared on the state of snapshot "
            f"{stream['previous_snapshot_id']} (up to offset {stream['previous_last_offset']}), the key's last "
            f"version carried from it with the stream's bounds (P={vector_text(stream['stream_pre_history_bound'])}, "
            f"L(end)={vector_text(stream['stream_end_lower_bound'])})."
        )
    start = "starts with START_OF_PUSH (⊥ first)" if dump["starts_with_start_of_push"] else "starts mid-stream"
    if dump["gaps"]:
        gaps = (f"{dump['gaps']} gap(s), {dump['gap_positions']} position(s) missing: "
                + ", ".join(_gap_range(g) for g in dump["gap_ranges"]))
    else:
        gaps = "no gaps"
    carried = ""
    if stream:
        between = stream["gap_before_snapshot"]
        carried = (
            f" It continues the state of snapshot {stream['previous_snapshot_id']} (up to offset "
            f"{stream['previous_last_offset']}"
            + (f"; {between} position(s) between that state and this dump are missing, a gap" if between else "")
            + "): the versions below are the stream's as the verdicts compared them, the key's last version carried "
            f"from that state and this dump's rows after it, with the stream's bounds (P="
            f"{vector_text(stream['stream_pre_history_bound'])}, L(end)={vector_text(stream['stream_end_lower_bound'])}"
            f", {stream['stream_gap_positions_before_snapshot']} position(s) missing before this dump)."
        )
    return (f"dump: offsets {dump['first_offset']}..{dump['last_offset']}, {start}, "
            f"P={vector_text(dump['pre_history_bound'])}, L(end)={vector_text(dump['end_lower_bound'])}, {gaps}."
            + carried)


def witness_roles(doc: dict) -> dict[tuple[str, Optional[int]], list[str]]:
    """(replica, offset) -> the roles its version plays: ``v of dc-a ~ dc-b`` ..."""
    roles: dict[tuple[str, Optional[int]], list[str]] = {}
    for pair in doc["pairs"]:
        if pair["witness"] is not None:
            for role, name, offset in (("v", pair["replica_a"], pair["witness"]["offset_a"]),
                                       ("w", pair["replica_b"], pair["witness"]["offset_b"])):
                roles.setdefault((name, offset), []).append(f"{role} of {pair_name(pair)}")
    return roles


def _value(version: dict) -> str:
    return "-" if version["value_display"] is None else shown(version["value_display"])


def _hash(version: dict) -> str:
    return "-" if version["value_hash"] is None else version["value_hash"][:HASH_PREFIX]


def _source(version: dict) -> str:
    return "-" if version["source_region"] is None else f"{version['source_region']}:{version['source_offset']}"


def _gaps(version: dict) -> str:
    flags = (("before", version["gap_before"]), ("after", version["gap_after"]))
    return "+".join(where for where, flag in flags if flag)


def _reach(version: dict) -> str:
    if version.get("reach_in_earlier_dump"):
        row = "a row of an earlier snapshot's dump"
    else:
        row = "end" if version["reach_row"] is None else f"@{version['reach_row']}"
    cut = ", cut by a gap" if version["gap_after"] else ""
    return f"{vector_text(version['reach'])} = L({row}){cut}"


@dataclass(frozen=True)
class VersionFacts:
    """The cells of one row of a replica's version table, worded."""

    mark: str  # "*" for a witness version
    name: str  # "@6942" or "⊥"
    kind: str
    value: str  # value_display, whole, escaped for a terminal
    hash: str  # the first HASH_PREFIX characters
    source: str  # region:offset
    written: str  # UTC ISO with ms
    touch: str  # U
    reach: str  # M, with the row whose L it is
    gaps: str  # "before", "after", "before+after" or ""
    witness: str  # the roles of a witness version
    reread: Optional[str]  # Venice: the command reading the record back


VERSION_HEADINGS = VersionFacts(
    mark="", name="version", kind="kind", value="value", hash="hash", source="source", written="written (UTC)",
    touch="U", reach="M", gaps="gaps", witness="witness", reread="reread",
)


def version_facts(replica: str, version: dict, roles: dict) -> VersionFacts:
    """The words of one version; ``roles`` from ``witness_roles``."""
    witness = roles.get((replica, version["offset"]), [])
    return VersionFacts(
        mark="*" if witness else "",
        name=version_name(version) + (f" (carried from {version['carried_from']})" if version.get("carried_from")
                                       else ""),
        kind=version["kind"],
        value=_value(version),
        hash=_hash(version),
        source=_source(version),
        written=utc_time(version["write_ms"]),
        touch=vector_text(version["touch_bound"]),
        reach=_reach(version),
        gaps=_gaps(version),
        witness=", ".join(witness),
        reread=version.get("reread_command"),
    )


def explain_command(doc: dict, warehouse: str, *more: str) -> str:
    """The ``replica-lens explain`` command line of a document's key, every argument shell-quoted."""
    args = ["replica-lens", "explain", "--warehouse", warehouse, "--snapshot-id", doc["snapshot_id"],
            "--topic", doc["topic"], "--partition", str(doc["partition"]), "--key", doc["key"], *more]
    if doc["redacted"]:
        args.append("--redact-values")
    return " ".join(shlex.quote(a) for a in args)


def header_facts(doc: dict) -> list[tuple[str, str]]:
    """(label, text) of the document's header."""
    facts = [("key", shown(doc["key"]))]
    if doc.get("key_display"):
        facts.append(("key bytes as text", shown(doc["key_display"])))
    facts += [("topic", doc["topic"]), ("partition", str(doc["partition"])),
             ("snapshot", doc["snapshot_id"]), ("worst verdict", worst_verdict(doc))]
    if doc["redacted"]:
        facts.append(("values", "redacted: hashes only"))
    return facts


# ------------------------------------------------------------------ laying the text out
def _wrap(text: str, indent: str = "", later: Optional[str] = None) -> list[str]:
    """A sentence over lines of WIDTH, broken at spaces only (a long word stays whole on its own line)."""
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=indent if later is None else later,
                         break_long_words=False, break_on_hyphens=False) or [indent]


def pieces(text: str, width: int) -> list[str]:
    """``text`` cut into pieces of ``width`` characters, nothing dropped (joined back they are ``text``)."""
    return [text[i:i + width] for i in range(0, len(text), width)] or [""]


def _block(label: str, text: str, indent: str) -> list[str]:
    """``label: text`` on one line when it fits, else the label and then ``text`` whole on lines of its own."""
    line = f"{indent}{label}: {text}"
    if len(line) <= WIDTH:
        return [line]
    inner = indent + INDENT
    return [f"{indent}{label}:"] + [inner + piece for piece in pieces(text, WIDTH - len(inner))]


def _command(label: str, command: str, indent: str) -> list[str]:
    """A shell command over lines ending in `` \\`` (pasted whole into a shell, it runs as it is)."""
    lines = _wrap(command, f"{indent}{label}: ", indent + INDENT * 2)
    return [line + " \\" for line in lines[:-1]] + lines[-1:]


def _side_by_side(rows: list[tuple[str, str, str]], indent: str) -> list[str]:
    """Two columns (one per replica), each cell wrapped whole inside its column."""
    label_width = max((len(label) for label, _, _ in rows), default=0)
    room = WIDTH - len(indent) - label_width - 6
    column = min(room // 2, max((len(left) for _, left, _ in rows), default=0))
    out = []
    for label, left, right in rows:
        lefts, rights = pieces(left, column), pieces(right, room - column)
        for i in range(max(len(lefts), len(rights))):
            l = lefts[i] if i < len(lefts) else ""
            r = rights[i] if i < len(rights) else ""
            out.append(f"{indent}{label if i == 0 else '':<{label_width}} | {l:<{column}} | {r}".rstrip())
    return out


def _pair_lines(doc: dict, pair: dict) -> list[str]:
    lines = _wrap(verdict_sentence(doc, pair), "", INDENT)
    if pair["witness"] is not None:
        for line in witness_inequalities(doc, pair):
            lines += _wrap(line, INDENT, INDENT * 2)
    lines += _side_by_side(comparison_rows(doc, pair), INDENT)
    resolved = resolution_sentence(doc, pair)
    if resolved is not None:
        lines += _wrap(resolved, INDENT, INDENT)
    for sentence in blocking_sentences(doc, pair):
        lines += _wrap(sentence, INDENT + "- ", INDENT + "  ")
    return lines


_MAIN = ("mark", "name", "kind", "hash", "source", "written", "gaps")


def _version_rows(replica: dict, roles: dict) -> list[str]:
    """The version table: one aligned line per version (value last, or on lines of its own when long), then U and M."""
    facts = [version_facts(replica["replica"], v, roles) for v in replica["versions"]]
    widths = {f: max(len(getattr(x, f)) for x in [VERSION_HEADINGS, *facts]) for f in _MAIN}

    def main(x: VersionFacts) -> str:
        return INDENT + "  ".join(f"{getattr(x, f):<{widths[f]}}" for f in _MAIN) + "  "

    lines = [(main(VERSION_HEADINGS) + VERSION_HEADINGS.value).rstrip()]
    detail = INDENT + " " * (widths["mark"] + widths["name"] + 4)  # under the kind column
    for x in facts:
        start = main(x)
        if len(start) + len(x.value) <= WIDTH:
            lines.append(start + x.value)
        else:
            lines.append(start.rstrip())
            lines += _block("value", x.value, detail)
        lines += _wrap(f"U {x.touch}   M {x.reach}", detail, detail + INDENT)
        if x.witness:
            lines += _wrap(f"witness: {x.witness}", detail, detail + INDENT)
        if x.reread is not None:
            lines += _command("reread", x.reread, detail)
    return lines


def _replica_lines(replica: dict, roles: dict) -> list[str]:
    lines = [f"replica {replica['replica']}"] + _wrap(dump_sentence(replica), INDENT, INDENT * 2)
    if not replica["versions"]:
        return lines + [INDENT + NO_VERSIONS]
    return lines + _version_rows(replica, roles)


def render_text(doc: dict) -> str:
    """The explanation of one key as terminal text: header, legend, every pair, every replica's versions."""
    lines = []
    for label, text in header_facts(doc):
        lines += _block(label, text, "")
    lines += [""] + _wrap(LEGEND)
    for pair in doc["pairs"]:
        lines += [""] + _pair_lines(doc, pair)
    odd = doc.get("odd_one_out") or []
    if odd:
        lines += ["", "odd one out (the other replicas' evidence, apart from the write times):"]
        for entry in odd:
            lines += _wrap(odd_one_out_sentence(entry), INDENT + "- ", INDENT + "  ")
    roles = witness_roles(doc)
    for replica in doc["replicas"]:
        lines += [""] + _replica_lines(replica, roles)
    return "\n".join(lines) + "\n"
