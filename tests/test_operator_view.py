"""What an operator reads (issue 71): the odd replica out, data escaped in Markdown, timeline labels, config.

Pure Python over documents built in memory (no Spark); the audited snapshots' side is in
tests/test_venice_simulated.py (keys against the reference) and tests/test_audit_e2e.py.
"""
from __future__ import annotations

import hashlib
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from explain.document import ReplicaInput, explain, odd_one_out
from explain.page import key_page
from explain.text import render_text
from tests.examples import examples

MS = 1_700_000_000_000


def _h(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def _dump(end: dict) -> dict:
    return {"first_offset": 0, "last_offset": 20, "starts_with_sop": True, "gaps": 0, "gap_positions": 0,
            "pre_history_bound": {}, "end_lower_bound": end, "first_gap_lower_bound": None}


def _row(offset, value, source, ms=MS):
    region, source_offset = source
    return {"offset": offset, "kind": "PUT", "value": value, "value_hash": _h(value), "source_region": region,
            "source_offset": source_offset, "write_ts": ms << 18, "touch_bound": {"a": 10, "b": 21},
            "reach": {"a": 30, "b": 30}, "applied_lower_bound": {"a": 20, "b": 15}, "missing_before": 0}


def _report(a, b, verdict, offset_a=None, offset_b=None):
    return {"replica_a": a, "replica_b": b, "verdict": verdict, "missing_in": None, "witness_offset_a": offset_a,
            "witness_offset_b": offset_b}


def three_replicas(b_values=("corrupt",), c_value="apple") -> dict:
    """Write dc-b@21 made dc-a @11 "apple", dc-b @12 ``b_values`` (one version each), dc-c @13 ``c_value``."""
    a = ReplicaInput("dc-a", _dump({"a": 30, "b": 30}), [_row(11, "apple", ("dc-b", 21))])
    b = ReplicaInput("dc-b", _dump({"a": 30, "b": 30}),
                     [_row(12 + 10 * i, v, ("dc-b", 21)) for i, v in enumerate(b_values)])
    c = ReplicaInput("dc-c", _dump({"a": 30, "b": 30}), [_row(13, c_value, ("dc-b", 21))])
    reports = [_report("dc-a", "dc-b", "DIVERGENT", 11, 12)]
    if c_value != "apple":
        reports.append(_report("dc-a", "dc-c", "DIVERGENT", 11, 13))
    if c_value != b_values[0]:
        reports.append(_report("dc-b", "dc-c", "DIVERGENT", 12, 13))
    return explain("snap", "store_v1", 0, "k1", [a, b, c], reports)


def test_the_replica_holding_other_content_for_a_write_two_others_agree_on_is_named():
    """Issue 71, item 2: with three replicas where dc-a and dc-c hold the same content for write dc-b@21 and dc-b
    another, ``explain`` only said "which replica deviates cannot be told". Catches ``odd_one_out`` missing from the
    JSON, the text or the page, the agreeing replicas unsorted or counted wrong."""
    doc = three_replicas()
    assert doc["odd_one_out"] == [
        {"replica": "dc-b", "source_region": "dc-b", "source_offset": 21, "agreeing": ["dc-a", "dc-c"]}
    ]
    sentence = "dc-b holds other content for write dc-b@21 than dc-a and dc-c, which agree"
    text = " ".join(line.strip() for line in render_text(doc).splitlines())
    assert sentence in text
    # The pair's own sentence says what the other replicas tell, beside "cannot be told" from the write times.
    assert "cannot be told: both hold the same write" in text and "The other replicas tell: dc-b holds" in text
    page = key_page(doc)
    assert '<ul class="odd-one-out"><li data-replica="dc-b">' + sentence in page


def test_no_replica_is_named_when_the_others_disagree_among_themselves():
    """Catches naming a replica when the rest do not agree (three different contents), and a replica holding several
    versions of the write counted as agreeing when one of them differs."""
    assert three_replicas(c_value="plum")["odd_one_out"] == []
    # dc-b holds "apple" and "corrupt" for the write: it is not one of the agreeing, and it holds other content.
    doc = three_replicas(b_values=("apple", "corrupt"))
    assert [(o["replica"], o["agreeing"]) for o in doc["odd_one_out"]] == [("dc-b", ["dc-a", "dc-c"])]
    # Two replicas only: nothing to tell by (at least two must agree beside the odd one).
    two = explain("snap", "store_v1", 0, "k1", [
        ReplicaInput("dc-a", _dump({"a": 30, "b": 30}), [_row(11, "apple", ("dc-b", 21))]),
        ReplicaInput("dc-b", _dump({"a": 30, "b": 30}), [_row(12, "corrupt", ("dc-b", 21))]),
    ], [_report("dc-a", "dc-b", "DIVERGENT", 11, 12)])
    assert two["odd_one_out"] == []


_CONTENTS = st.sampled_from(["x", "y", "z"])
_REPLICA = st.lists(st.tuples(st.sampled_from([("r", 1), ("r", 2), ("s", 1)]), _CONTENTS), max_size=4)


@settings(max_examples=examples(200), deadline=None)
@given(held=st.lists(_REPLICA, min_size=2, max_size=5), proofs=st.lists(st.tuples(
    st.integers(0, 4), st.integers(0, 4), st.integers(0, 3), st.integers(0, 3)), max_size=6))
def test_odd_one_out_names_exactly_the_writes_where_all_but_one_replica_agree(held, proofs):
    """Property (SPEC 10, ``odd_one_out``) over random replicas, each holding versions made by a few writes with a few
    contents, and random DIVERGENT witness pairs: an entry exactly for each write behind both witnesses of a
    DIVERGENT pair (same write, other content) where three or more replicas hold a version of it, all but one hold
    one same content only, and that one holds other content; ordered by write. Catches a replica named while the
    others disagree, a replica with one agreeing and one other version counted as agreeing, fewer than two agreeing,
    writes that were no witness of a DIVERGENT pair, and entries out of order."""
    names = [f"dc-{i}" for i in range(len(held))]
    replicas = [{"replica": n, "versions": [
        {"offset": 10 * i + j, "source_region": w[0], "source_offset": w[1], "value_hash": c}
        for j, (w, c) in enumerate(versions)]} for i, (n, versions) in enumerate(zip(names, held))]
    pairs = []
    for ia, ib, ja, jb in proofs:
        if ia >= ib or ib >= len(held) or ja >= len(held[ia]) or jb >= len(held[ib]):
            continue
        (wa, ca), (wb, cb) = held[ia][ja], held[ib][jb]
        if ca == cb:  # a DIVERGENT witness pair holds different content
            continue
        pairs.append({"replica_a": names[ia], "replica_b": names[ib], "verdict": "DIVERGENT",
                      "witness": {"offset_a": 10 * ia + ja, "offset_b": 10 * ib + jb}})
    got = odd_one_out(replicas, pairs)
    # The oracle, by brute force over every replica that could be the odd one.
    witnessed = sorted({held[ia][ja][0] for ia, ib, ja, jb in proofs
                        if ia < ib < len(held) and ja < len(held[ia]) and jb < len(held[ib])
                        and held[ia][ja][0] == held[ib][jb][0] and held[ia][ja][1] != held[ib][jb][1]})
    want = []
    for write in witnessed:
        contents = {n: {c for w, c in versions if w == write} for n, versions in zip(names, held)}
        contents = {n: c for n, c in contents.items() if c}
        for odd in sorted(contents):
            rest = [c for n, c in contents.items() if n != odd]
            if len(rest) >= 2 and all(c == rest[0] and len(c) == 1 for c in rest) and contents[odd] != rest[0]:
                want.append({"replica": odd, "source_region": write[0], "source_offset": write[1],
                             "agreeing": sorted(n for n in contents if n != odd)})
    assert got == want
    for entry in got:
        assert len(entry["agreeing"]) >= 2 and entry["replica"] not in entry["agreeing"]


def test_the_trend_counts_keys_once_per_topic_partition_and_never_key_pairs(spark):
    """Issue 71, item 1, in ``audit_trend``: it summed ``divergence_summary``'s pair rows, so a key DIVERGENT in two
    of three pairs counted twice. Catches the pair counts summed, a partition's key counts (the same on each of its
    pair rows) summed once per pair, and a snapshot audited before key counts existed shown with key pairs instead of
    null."""
    from pipelines.trend import audit_trend
    from schemas.registry import struct_for

    def summary(sid, topic, partition, pair, pair_divergent, keys):
        row = {"snapshot_id": sid, "topic": topic, "partition": partition, "replica_a": pair[0], "replica_b": pair[1],
               "keys_compared": 10, "consistent": 10 - pair_divergent, "divergent": pair_divergent, "missing": 0,
               "in_flight": 0}
        names = ("compared", "consistent", "divergent", "missing", "in_flight")
        return row | {f"partition_keys_{n}": None if keys is None else keys[i] for i, n in enumerate(names)}

    pairs = (("a", "b"), ("a", "c"), ("b", "c"))
    rows = [summary("new", "t", 0, p, d, (10, 9, 1, 0, 0)) for p, d in zip(pairs, (1, 1, 0))]
    rows += [summary("new", "t", 1, p, 0, (5, 5, 0, 0, 0)) for p in pairs]
    rows += [summary("old", "t", 0, p, 1, None) for p in pairs]
    frame = spark.createDataFrame(rows, struct_for("divergence_summary"))
    empty = {t: spark.createDataFrame([], struct_for(t))
             for t in ("raw_topic_quarantine", "replication_lag", "stream_anomalies")}
    got = {r["snapshot_id"]: r.asDict() for r in audit_trend(
        frame, empty["raw_topic_quarantine"], empty["replication_lag"], empty["stream_anomalies"]).collect()}
    assert [got["new"][c] for c in ("keys_compared", "divergent", "missing", "in_flight")] == [15, 1, 0, 0]
    assert [got["old"][c] for c in ("keys_compared", "divergent", "missing", "in_flight")] == [None] * 4


# ------------------------------------------------------------------ Markdown (issue 71, item 3)
HOSTILE_KEYS = ["a_b_c", "*star*", "pipe|key", "tick`key", "<b>bold</b>", "amp&lt;", "[link](x)", "\\back", "#1. x"]


def _rendered_text(markdown: str) -> str:
    """What a CommonMark renderer with GitHub's tables (markdown-it-py, as Dagster's UI) shows, as plain text."""
    from html import unescape

    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").enable("table").render(markdown)
    return unescape(re.sub(r"<[^>]+>", "", html))


def _tags(markdown: str) -> list[str]:
    from markdown_it import MarkdownIt

    return re.findall(r"<(\w+)", MarkdownIt("commonmark").enable("table").render(markdown))


def test_md_text_renders_every_character_as_itself():
    """The escaping function: a key with ``*``, ``_``, ``|``, a backtick, ``<``, ``&``, brackets, a backslash or a
    leading list marker renders as itself (no emphasis, code, HTML, entity, link, list), also inside a table cell."""
    from explain.markdown import md_text

    for key in HOSTILE_KEYS:
        assert _rendered_text(md_text(key)).strip() == key, key
        assert _tags(md_text(key)) == ["p"], key
        table = f"| key | n |\n|---|---|\n| {md_text(key)} | 1 |\n"
        assert _rendered_text(table).split() == ["key", "n", *key.split(), "1"], key


def test_the_materialization_markdown_shows_keys_and_the_report_path_as_they_are():
    """Issue 71, item 3: ``most_important_keys`` ended with ``_2 more key(s) in the report page
    (/…/_reports/ui1/divergence.html)._``, whose underscore of ``_reports`` broke the emphasis and lost itself; a key
    with ``*`` or a backtick broke its line the same way. Catches any key, path or name put into the materialization's
    Markdown unescaped."""
    from explain.report import SnapshotReport, key_markdown

    docs = [divergent_doc(key) for key in HOSTILE_KEYS]
    uri = "/tmp/ware_house/_reports/ui_1/divergence.html"
    markdown = SnapshotReport(uri=uri, docs=docs, pictured=0).ui_markdown(2)
    shown = _rendered_text(markdown)
    assert f"{len(HOSTILE_KEYS) - 2} more key(s) in the report page: {uri}" in shown
    for key in HOSTILE_KEYS[:2]:
        assert f"DIVERGENT {key} in store_v1/0" in shown, key
    assert "em" not in _tags(markdown.split("\n")[-1][len("_7 more key(s) in the report page:_"):])
    for key in HOSTILE_KEYS:
        full = key_markdown(divergent_doc(key))
        assert f"DIVERGENT {key} in store_v1/0" in _rendered_text(full), key
        assert not {"em", "strong", "a", "b"} & set(_tags(full.split("\n")[0].replace("**DIVERGENT**", ""))), key


def test_markdown_tables_of_the_materializations_escape_names():
    """The ``by_replica_pair`` and lag tables: a replica or topic name with ``|`` or ``_`` stays one cell, itself."""
    from assets.previews import divergence_by_pair

    rows = [{"replica_a": "dc_a|x", "replica_b": "*dc-b*", "keys_compared": 3, "divergent": 1, "missing": 0,
             "in_flight": 0}]
    shown = _rendered_text(divergence_by_pair(rows))
    assert "dc_a|x" in shown and "*dc-b*" in shown
    assert "key pairs compared" in shown


def divergent_doc(key: str) -> dict:
    doc = three_replicas()
    doc["key"] = key
    return doc


# ------------------------------------------------------------------ the timeline's labels (issue 71, item 4)
def crowded() -> dict:
    """dc-a: versions 7300 (1 ms before 7312), 7312 (1 ms before the witness 7392): narrow spans before a witness."""
    a = ReplicaInput("dc-a", _dump({"a": 30, "b": 30}), [
        _row(7300, "old", ("dc-a", 1), MS), _row(7312, "older", ("dc-a", 2), MS + 1),
        _row(7392, "apple", ("dc-b", 21), MS + 2), _row(7400, "later", ("dc-a", 3), MS + 60_000)])
    b = ReplicaInput("dc-b", _dump({"a": 30, "b": 30}), [
        _row(12, "old", ("dc-a", 1), MS), _row(13, "corrupt", ("dc-b", 21), MS + 2),
        _row(14, "later", ("dc-a", 3), MS + 60_000)])
    return explain("snap", "store_v1", 0, "k1", [a, b], [_report("dc-a", "dc-b", "DIVERGENT", 7392, 13)])


def test_timeline_labels_never_overlap_another_span_and_the_axis_says_its_unit():
    """Issue 71, item 4: a narrow span's offset label spilled onto the next span (in a witness box headed ``w: 7392``
    the text read ``7312``). Measured with matplotlib's renderer (``get_window_extent``): every offset label lies
    inside its own span and over no other span; each witness's own label is drawn; the time axis names its unit.
    Catches labels placed by an estimate of their width, a witness label dropped, and an axis title without unit."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from explain.timeline import figure, label_id, span_id, witness_label_id

    doc = crowded()
    fig = figure(doc)
    renderer = FigureCanvasAgg(fig).get_renderer()
    (ax,) = fig.axes
    spans = {p.get_gid(): p.get_window_extent(renderer) for p in ax.patches
             if (p.get_gid() or "").startswith(("span-", "witness-"))}
    texts = {t.get_gid(): t for t in ax.texts if t.get_gid()}
    drawn = 0
    for replica in doc["replicas"]:
        name = replica["replica"]
        for version in replica["versions"]:
            offset = "bottom" if version["offset"] is None else version["offset"]
            own = next(gid for gid in spans if gid.endswith(f"-{name}-{offset}") and gid.startswith(("span-", "witness-")))
            label = texts.get(label_id(name, version["offset"]))
            if label is None:
                continue
            drawn += 1
            box = label.get_window_extent(renderer)
            assert spans[own].x0 - 0.5 <= box.x0 and box.x1 <= spans[own].x1, (name, version["offset"])
            for gid, other in spans.items():
                if gid != own and other.y0 < box.y1 and box.y0 < other.y1:
                    assert box.x1 <= other.x0 + 0.5 or other.x1 <= box.x0 + 0.5, (name, version["offset"], gid)
    assert drawn >= 3, "the wide spans keep their labels"
    assert label_id("dc-a", 7312) not in texts, "7312's span is too narrow for its label"
    for name, offset, mark in (("dc-a", 7392, "v: 7392"), ("dc-b", 13, "w: 13")):
        assert texts[witness_label_id(name, offset)].get_text() == mark
    assert span_id("dc-a", 7312) in spans
    assert "clock time (hh:mm:ss" in ax.get_xlabel() and "UTC" in ax.get_xlabel(), ax.get_xlabel()
