"""The renderers of an explained key: terminal text, timeline picture, HTML pages (no Spark, no tables).

Documents are built with ``explain`` from hand-made rows (two regions ``a`` and ``b``, two replicas
dumped from START_OF_PUSH, numbers chosen so each inequality is known), or loaded from
``tests/data/explain/`` (documents of audited snapshots: ``divergent.json`` three replicas with
heartbeats, ``in_flight_gaps.json`` a compacted dump with gaps, ``venice.json`` raw Venice records).
"""
from __future__ import annotations

import hashlib
import json
import re
import shlex
import struct
import subprocess
import sys
import xml.etree.ElementTree as ET
from copy import deepcopy
from html.parser import HTMLParser
from pathlib import Path

import pytest

from explain.document import DISPLAY_MAX_CHARS, REPORT_VALUE_CHARS, ReplicaInput, display_value, explain, redact
from explain.page import OPEN_FOLDS, key_page, snapshot_page
from explain.text import NO_VERSIONS, WIDTH, render_text
from explain.timeline import gap_id, lane_id, png, svg, uses_time_axis, witness_id

DATA = Path(__file__).parent / "data" / "explain"
MS = 1_700_000_000_000
VERDICTS = re.compile(r"\b(DIVERGENT|MISSING|IN_FLIGHT|CONSISTENT)\b")


def load(name: str) -> dict:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


def _dump(end: dict) -> dict:
    return {"first_offset": 0, "last_offset": 20, "starts_with_sop": True, "gaps": 0, "gap_positions": 0,
            "pre_history_bound": {}, "end_lower_bound": end, "first_gap_lower_bound": None}


def _row(offset, value, source, ms, touch, reach, applied, kind="PUT"):
    region, source_offset = source
    return {"offset": offset, "kind": kind, "value": value if kind == "PUT" else None,
            "value_hash": "TOMBSTONE" if kind == "DELETE" else hashlib.sha256(value.encode()).hexdigest(),
            "source_region": region, "source_offset": source_offset, "write_ts": ms << 18, "touch_bound": touch,
            "reach": reach, "applied_lower_bound": applied, "missing_before": 0}


def divergent(value_a="apple", value_b="pear", key="k1", ms_b=MS + 1000) -> dict:
    """dc-a @11 holds value_a, dc-b @12 value_b; U(w)={a:10 b:21} <= M(v)={a:30 b:30}, U(v) <= M(w)={a:30 b:29}."""
    a = ReplicaInput("dc-a", _dump({"a": 30, "b": 30}), [
        _row(3, "same", ("a", 10), MS, {"a": 10}, {"a": 20, "b": 15}, {"a": 2}),
        _row(11, value_a, ("b", 21), MS + 1000, {"a": 10, "b": 21}, {"a": 30, "b": 30}, {"a": 20, "b": 15}),
    ])
    b = ReplicaInput("dc-b", _dump({"a": 30, "b": 29}), [
        _row(4, "same", ("a", 10), MS, {"a": 10}, {"a": 19, "b": 22}, {"a": 1}),
        _row(12, value_b, ("b", 21), ms_b, {"a": 10, "b": 21}, {"a": 30, "b": 29}, {"a": 19, "b": 22}),
    ])
    report = {"replica_a": "dc-a", "replica_b": "dc-b", "verdict": "DIVERGENT", "missing_in": None,
              "witness_offset_a": 11, "witness_offset_b": 12}
    return explain("snap", "store_v1", 0, key, [a, b], [report])


def in_flight() -> dict:
    """dc-b lags: its last version @4 reaches b:15 only, dc-a's last @11 needs b:21."""
    a = ReplicaInput("dc-a", _dump({"a": 30, "b": 30}), [
        _row(3, "same", ("a", 10), MS, {"a": 10}, {"a": 20, "b": 15}, {"a": 2}),
        _row(11, "newer", ("b", 21), MS + 1000, {"a": 10, "b": 21}, {"a": 30, "b": 30}, {"a": 20, "b": 15}),
    ])
    b = ReplicaInput("dc-b", _dump({"a": 19, "b": 15}), [
        _row(4, "same", ("a", 10), MS, {"a": 10}, {"a": 19, "b": 15}, {"a": 1}),
    ])
    report = {"replica_a": "dc-a", "replica_b": "dc-b", "verdict": "IN_FLIGHT", "missing_in": None,
              "witness_offset_a": None, "witness_offset_b": None}
    return explain("snap", "store_v1", 0, "k2", [a, b], [report])


def missing() -> dict:
    """dc-b never held the key: dc-a @3 against dc-b's ⊥, which reaches a:30 b:30."""
    a = ReplicaInput("dc-a", _dump({"a": 30, "b": 30}), [
        _row(3, "lost", ("a", 10), MS, {"a": 10}, {"a": 30, "b": 30}, {"a": 2}),
    ])
    b = ReplicaInput("dc-b", _dump({"a": 30, "b": 30}), [])
    report = {"replica_a": "dc-a", "replica_b": "dc-b", "verdict": "MISSING", "missing_in": "dc-b",
              "witness_offset_a": 3, "witness_offset_b": None}
    return explain("snap", "store_v1", 0, "k3", [a, b], [report])


def mid_stream() -> dict:
    """dc-b's dump starts mid-stream with no vector heartbeat (U unknown); dc-c's starts mid-stream without the key."""
    dump = {**_dump({"a": 30, "b": 30}), "first_offset": 100, "last_offset": 200, "starts_with_sop": False,
            "pre_history_bound": None}
    a = ReplicaInput("dc-a", _dump({"a": 30, "b": 30}), [
        _row(3, "same", ("a", 10), MS, {"a": 10}, {"a": 30, "b": 30}, {"a": 2}),
    ])
    b = ReplicaInput("dc-b", dump, [_row(104, "other", ("b", 12), MS, None, {"a": 30, "b": 30}, {"a": 20})])
    c = ReplicaInput("dc-c", dump, [])
    reports = [{"replica_a": x, "replica_b": y, "verdict": "IN_FLIGHT", "missing_in": None, "witness_offset_a": None,
                "witness_offset_b": None} for x, y in (("dc-a", "dc-b"), ("dc-a", "dc-c"), ("dc-b", "dc-c"))]
    return explain("snap", "store_v1", 0, "k4", [a, b, c], reports)


def flat(text: str) -> str:
    """The text with its line breaks and indentation folded into single spaces (how wrapped sentences read)."""
    return " ".join(line.strip() for line in text.splitlines() if line.strip())


def joined(text: str) -> str:
    """The text's lines stripped and joined with nothing between (how a value cut over lines reads back)."""
    return "".join(line.strip() for line in text.splitlines())


class PageText(HTMLParser):
    """The text a reader sees on a page, outside the pictures and the style sheet; and its start tags."""

    def __init__(self):
        super().__init__()
        self.parts: list[str] = []
        self.tags: list[str] = []
        self._skip = 0

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self._skip += tag in ("svg", "style")

    def handle_endtag(self, tag):
        self._skip -= tag in ("svg", "style")

    def handle_data(self, data):
        if not self._skip:
            self.parts.append(data)


def page_text(page: str) -> PageText:
    parser = PageText()
    parser.feed(page)
    return parser


def facts(text: str) -> dict[str, set]:
    return {
        "offsets": set(re.findall(r"@(\d+)", text)),
        "verdicts": set(VERDICTS.findall(text)),
        "has": set(re.findall(r"up to (\d+)", text)),
        "needs": set(re.findall(r"needs (\d+)", text)),
    }


@pytest.fixture(scope="module")
def divergent_svg() -> str:
    return svg(load("divergent.json"))


# ------------------------------------------------------------------ text
def test_text_shows_every_offset_and_both_witness_inequalities_with_their_numbers():
    """Catches a text that leaves a version out, or writes the proof with the wrong vectors (M(w) for M(v) ...)."""
    doc = divergent()
    text = flat(render_text(doc))
    for replica in doc["replicas"]:
        for version in replica["versions"]:
            assert ("⊥" if version["offset"] is None else f"@{version['offset']}") in text
    assert "U(w)=a:10 b:21 <= M(v)=a:30 b:30 : holds (a 10<=30, b 21<=30)" in text
    assert "U(v)=a:10 b:21 <= M(w)=a:30 b:29 : holds (a 10<=30, b 21<=29)" in text
    assert "cannot be told: both hold the same write (b:21" in text


def test_text_names_the_deviating_replica_by_the_larger_write_timestamp():
    """Catches a resolution sentence that blames the replica holding the newer write."""
    text = flat(render_text(divergent(ms_b=MS + 2000)))
    assert "dc-a deviates" in text and "dc-b @12" in text


def test_real_divergent_document_shows_witnesses_and_every_version():
    """Catches witness marks or versions lost on a document of an audited snapshot (3 replicas, ~26 versions each)."""
    doc = load("divergent.json")
    text = render_text(doc)
    rows = {line.split()[1] for line in text.splitlines() if line.startswith("    *")}
    assert rows == {"@6942", "@7062", "@7040"}
    for replica in doc["replicas"]:
        for version in replica["versions"][1:]:
            assert f"@{version['offset']}" in text
    assert "both hold the same write (dc-a:2366" in flat(text)


def test_text_writes_each_blocking_entry_with_its_numbers():
    """Catches an IN_FLIGHT explanation that drops what is not yet applied, or swaps needs and has."""
    doc = in_flight()
    [pair] = doc["pairs"]
    assert pair["blocking"] == [{"replica": "dc-b", "region": "b", "needs": 21, "has": 15}]
    text = flat(render_text(doc))
    assert ("dc-b has applied b's real-time topic up to 15 but dc-a @11 needs 21: the next heartbeat of dc-b whose "
            "vector covers b >= 21 would settle it.") in text


def test_text_says_a_gap_keeps_a_heartbeat_from_settling_an_in_flight_pair():
    """Catches promising a heartbeat will settle a pair whose last version's reach a gap cut short."""
    text = flat(render_text(load("in_flight_gaps.json")))
    assert "dc-b has applied dc-a's real-time topic up to 973 but dc-a @2843 needs 1019." in text
    assert "A gap after dc-b @2656 cuts its reach at row 2760" in text
    assert "27 gap(s), 1451 position(s) missing: 1..1423, 1516," in text


def test_text_never_truncates_a_long_key_or_value_and_keeps_lines_short():
    """Catches cutting a 300-character key or a 5000-character value to fit the terminal, or lines past WIDTH."""
    key = "K" + "".join(f"{i:03d}" for i in range(100))[:299]
    value = "".join(f"{i:04x}" for i in range(1250))
    text = render_text(divergent(value_a=value, key=key))
    assert len(key) == 300 and len(value) == 5000
    assert key in joined(text) and value in joined(text)
    assert max(len(line) for line in text.splitlines()) <= WIDTH


def test_text_escapes_control_characters_of_a_value():
    """Catches a value's newline or terminal escape sequence reaching the terminal raw."""
    text = render_text(divergent(value_a="two\nlines\x1b[31m"))
    assert "\x1b" not in text and "two\\nlines\\x1b[31m" in text


def test_venice_text_lists_every_reread_command_whole():
    """Catches a Venice explanation that cuts or leaves out the command reading a record back."""
    doc = load("venice.json")
    text = render_text(doc)
    commands = [v["reread_command"] for r in doc["replicas"] for v in r["versions"] if v["offset"] is not None]
    assert commands
    for command in commands:
        assert command in re.sub(r" \\\n\s*", " ", text)  # the lines continued with " \\" read as one command


# ------------------------------------------------------------------ pages
EXAMPLES = {
    "divergent": divergent, "in_flight": in_flight, "missing": missing, "mid_stream": mid_stream,
    "divergent.json": lambda: load("divergent.json"), "in_flight_gaps.json": lambda: load("in_flight_gaps.json"),
    "venice.json": lambda: load("venice.json"),
}


@pytest.mark.parametrize("example", EXAMPLES)
def test_text_and_page_show_the_same_facts(example):
    """Catches a page that words a verdict, an offset or a blocking number differently from the text (or omits it)."""
    doc = EXAMPLES[example]()
    text, page = render_text(doc), page_text(key_page(doc))
    assert facts(flat(text)) == facts(" ".join(page.parts))
    assert facts(flat(text))["verdicts"] == {p["verdict"] for p in doc["pairs"]}


def test_page_escapes_a_hostile_value_and_key():
    """Catches a value or key written into the page as markup (a stored-XSS in the report)."""
    hostile = "<script>alert(1)</script>"
    doc = divergent(value_a=hostile, key='k"><img src=x onerror=alert(2)>')
    for page in (key_page(doc), snapshot_page({"snapshot_id": "snap", "DIVERGENT": 1}, [doc], pictures=1)):
        parsed = page_text(page)
        assert "script" not in parsed.tags and "img" not in parsed.tags
        assert hostile not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert hostile in "".join(parsed.parts)


def test_page_is_self_contained():
    """Catches a page that loads anything (a stylesheet, a font, a script) from elsewhere."""
    page = key_page(load("divergent.json"))
    # Only references inside the page itself (the picture's href="#id", url(#id)).
    assert not re.search(r"""(src|href)\s*=\s*["'](?!#)|@import|url\((?!#)|<script""", page, re.IGNORECASE)
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 1


def test_page_marks_witness_and_gap_rows():
    """Catches a version table that no longer highlights the witness rows or marks the gaps."""
    page = key_page(load("divergent.json"))
    witness_rows = re.findall(r'<tr class="witness[^"]*" data-offset="(\d+)"', page)
    assert sorted(witness_rows) == ["6942", "7040", "7062"]
    gappy = key_page(load("in_flight_gaps.json"))
    assert '<tr class="gap-before gap-after" data-offset="1550">' in gappy


def test_redacted_document_shows_the_value_nowhere():
    """Catches a value's text leaking through any view of a redacted document."""
    secret = "ZEBRA-SECRET-4711"
    doc = redact(divergent(value_a=secret, value_b=f"{secret}-b"))
    views = {
        "text": render_text(doc),
        "page": key_page(doc),
        "svg": svg(doc),
        "report": snapshot_page({"snapshot_id": "snap", "DIVERGENT": 1}, [doc], pictures=1),
    }
    for name, view in views.items():
        assert secret not in view, name
    assert "redacted" in views["text"] and doc["replicas"][0]["versions"][2]["value_hash"][:12] in views["text"]


def test_snapshot_page_folds_thousands_of_documents_with_two_pictures():
    """Catches a report that draws every picture, drops keys, or writes a command that a shell would split."""
    small = missing()
    docs = []
    for i in range(3000):
        doc = deepcopy(small)
        doc["key"] = f"key {i}'s"
        docs.append(doc)
    page = snapshot_page({"snapshot_id": "snap", "warehouse": "/data/ware house", "MISSING": 3000}, docs, pictures=2)
    assert page.count("<details ") == 3000 and page.count(" open>") == OPEN_FOLDS
    assert page.count("<svg") == 2 and 'id="key0-lane-dc-a"' in page and 'id="key1-lane-dc-a"' in page
    assert len(re.findall(r'data-verdict="MISSING" data-key="key \d+&#x27;s"', page)) == 3000
    command = (f"replica-lens explain --warehouse {shlex.quote('/data/ware house')} --snapshot-id snap --topic "
               f"store_v1 --partition 0 --key {shlex.quote('key 2999' + chr(39) + 's')} --html FILE")
    assert page.count("picture: <code") == 2998
    assert command.replace("'", "&#x27;").replace('"', "&quot;") in page


# ------------------------------------------------------------------ picture
def _ids(svg_text: str) -> set[str]:
    return {e.get("id") for e in ET.fromstring(svg_text).iter() if e.get("id")}


def test_svg_has_a_lane_per_replica_and_the_witness_ids(divergent_svg):
    """Catches lanes or witness highlights losing the ids a browser test finds them by, or an XML prolog inline."""
    doc = load("divergent.json")
    ids = _ids(divergent_svg)
    assert divergent_svg.startswith("<svg")
    assert {i for i in ids if i.startswith("lane-")} == {lane_id(r["replica"]) for r in doc["replicas"]}
    assert {i for i in ids if i.startswith("witness-")} == {
        witness_id("dc-a", 6942), witness_id("dc-b", 7062), witness_id("dc-c", 7040)}
    assert {"lane-dc-a", "witness-dc-b-7062"} <= ids


def test_svg_is_the_same_for_the_same_document_and_keeps_text(divergent_svg):
    """Catches random ids or a date in the SVG (pages that differ on every run), or text drawn as paths."""
    assert svg(load("divergent.json")) == divergent_svg
    assert "<text" in divergent_svg and "k0173" in divergent_svg


def test_svg_marks_the_bottom_witness_and_gaps():
    """Catches a ⊥ witness without its id, or gaps of a compacted dump left unshaded."""
    assert witness_id("dc-b", None) in _ids(svg(missing()))
    doc = load("in_flight_gaps.json")
    ids = _ids(svg(doc))
    assert {gap_id(r["replica"], 0) for r in doc["replicas"]} <= ids


def test_time_axis_only_when_every_data_version_has_a_write_time():
    """Catches placing versions without a write time on a time axis (they would have no x)."""
    doc = divergent()
    assert uses_time_axis(doc)
    doc["replicas"][1]["versions"][1]["write_ms"] = None
    assert not uses_time_axis(doc)


def test_mid_stream_dumps_explain_why_nothing_compares():
    """Catches a crash or a silent pair when a version's U is unknown or a dump never saw the key."""
    doc = mid_stream()
    text = flat(render_text(doc))
    assert "The touch bound U of dc-b @104 is unknown" in text
    assert "dc-c's dump starts mid-stream (offset 100) and holds no row of the key" in text
    assert "U unknown" in text
    ids = _ids(svg(doc))
    assert {lane_id(n) for n in ("dc-a", "dc-b", "dc-c")} <= ids
    assert NO_VERSIONS in " ".join(page_text(key_page(doc)).parts)


def test_png_is_900_pixels_wide_and_120_plus_70_per_lane_high():
    """Catches a picture drawn at a size the report's Markdown and the pages were not laid out for."""
    picture = png(missing())
    assert picture[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", picture[16:24])
    assert (width, height) == (900, 120 + 70 * 2)


def test_importing_the_renderers_does_not_import_matplotlib():
    """Catches a module-level matplotlib import, which every ``replica-lens explain`` run would pay for."""
    code = ("import sys, explain.page, explain.timeline; "
            "assert 'matplotlib' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parent.parent)


def test_markdown_for_the_ui_keeps_a_value_holding_backticks_inside_its_code_block():
    """The job's and the materialization's Markdown put the text in a fenced block: a value holding a fence of its own
    must not end it early (the rest of the explanation would render as Markdown). Catches a fixed ``` fence."""
    from explain.report import key_markdown

    doc = load("divergent.json")
    version = next(v for v in doc["replicas"][0]["versions"] if v["kind"] == "PUT")
    version["value_display"] = "before ```` after"
    fence = next(line for line in key_markdown(doc).splitlines() if line.startswith("```"))
    assert len(fence) > 4 and set(fence) == {"`"}, fence


def test_a_snapshot_whose_carried_state_is_gone_is_refused_with_a_clear_error():
    """A snapshot compared with a predecessor's state that retention later dropped: explain says so (exit 2) instead
    of failing to find the carried witness. Catches a StopIteration (a traceback) for such a key."""
    from explain.reading import StateNotKept, explain_places

    class Tables:  # what explain_places reads, for a snapshot s2 whose dc-b continued s1's state (now dropped)
        snapshot_id = "s2"

        def replica_partitions(self, places):
            return {p: [{"replica": "dc-b", "gaps": 0}] for p in places}

        def gap_rows(self, places):
            return {}

        def heartbeats(self, places):
            return {}

        def carried_from(self, places):
            return {("orders", 0): {"dc-b": "s1"}}

        def absent_from(self, replicas):
            return {}  # no replica partition compared on its carried state only

        def carried_state(self, carried, keys):
            return {}, {}  # s1's partition of replica_state is gone

        def versions(self, places, keys):
            return {}

        def reports(self, places, keys):
            return {}

        def is_venice(self):
            return None

    with pytest.raises(StateNotKept, match=r"dc-b/orders/0 \(state of s1\)"):
        explain_places(Tables(), {("orders", 0): ["k4"]})


def test_a_value_longer_than_shown_is_cut_with_a_note_and_a_cut_venice_value_still_decodes():
    """Catches a value of megabytes shown whole (a page of gigabytes), a cut without the note saying where the whole
    value is, and a Venice value read cut (the report reads no more than it shows) shown as raw base64."""
    import base64

    long = "x" * (DISPLAY_MAX_CHARS + 10)
    shown = display_value(long, "PUT")
    assert shown.startswith("x" * DISPLAY_MAX_CHARS) and "x" * (DISPLAY_MAX_CHARS + 1) not in shown
    assert "replica-lens explain --json" in shown
    assert display_value("y" * DISPLAY_MAX_CHARS, "PUT") == "y" * DISPLAY_MAX_CHARS  # up to the limit: whole
    text = "é" * 3000
    encoded = "7:" + base64.b64encode(text.encode("utf-8")).decode("ascii")
    cut = encoded[: 2 * REPORT_VALUE_CHARS + 1]  # what the report reads of it: one character past what it keeps
    page = display_value(cut, "PUT", REPORT_VALUE_CHARS, read_cut=True)
    assert page.startswith("schema 7: 'éé") and "the whole value is in replica-lens explain --json" in page
    assert display_value(encoded, "PUT") == f"schema 7: {text!r}"  # read whole: no note
