"""The per-snapshot report: one self-contained page explaining every key that is not CONSISTENT.

Written by the divergence step once its tables are committed, beside the tables at
``<warehouse>/_reports/<snapshot_id>/divergence.html`` (a leading underscore is never a table
name, and Delta and Spark skip such folders). It is built from the published tables with
delta-rs (``reading.py``), no Spark job: every reported key is explained, most important first
(DIVERGENT, MISSING, then IN_FLIGHT; more pairs first), with a timeline picture for the first
``pictures`` of them (bounded, so that a snapshot of ten thousand IN_FLIGHT keys does not draw
ten thousand pictures; each other key says which command draws its picture). A snapshot whose
keys are all CONSISTENT gets a page with its summary alone, and nothing is drawn.

``ui_markdown`` is what the ``divergence_reports`` materialization embeds: the few most
important keys, each as a line of facts and a PNG picture (Dagster renders Markdown images
given as data URIs, as its own examples do).
"""
from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Optional

from explain.markdown import md_code_block, md_text
from explain.document import REPORT_VALUE_CHARS, VERDICT_ORDER, display_value, redact, worst_verdict
from explain.reading import SnapshotTables, explain_places
from resources.delta_reader import warehouse_uri
from resources.filesystem import Location

REPORTS_FOLDER = "_reports"
PAGE_NAME = "divergence.html"


def report_uri(warehouse: str, snapshot_id: str) -> str:
    return f"{warehouse_uri(warehouse)}/{REPORTS_FOLDER}/{snapshot_id}/{PAGE_NAME}"


def importance(doc: dict) -> tuple:
    """The sort key of the page: the worst verdict first, then the keys with more non-consistent pairs."""
    unsettled = sum(p["verdict"] != "CONSISTENT" for p in doc["pairs"])
    return VERDICT_ORDER[worst_verdict(doc)], -unsettled, doc["topic"], doc["partition"], doc["key"]


@dataclass
class SnapshotReport:
    uri: str
    docs: list[dict]  # every explained key, most important first
    pictured: int

    def ui_markdown(self, count: int) -> Optional[str]:
        """The ``count`` most important keys with their pictures, as Markdown for the materialization."""
        shown = self.docs[:count]
        if not shown:
            return None
        parts = [key_markdown(doc, full=False) for doc in shown]
        more = len(self.docs) - len(shown)
        if more:
            parts.append(f"_{more} more key(s) in the report page:_ {md_text(self.uri)}")
        return "\n".join(parts)


def key_markdown(doc: dict, full: bool = True) -> str:
    """One key as Markdown (Dagster's UI): its verdicts in a line, the picture as a PNG data URI and, when ``full``,
    the whole text explanation."""
    from explain.text import odd_one_out_sentence, pair_headline, render_text
    from explain.timeline import png

    picture = base64.b64encode(png(doc)).decode("ascii")
    # Every piece of data is escaped (keys, names and paths are user data: md_text); the picture's data URI is ours.
    lines = [
        f"**{worst_verdict(doc)}** {md_text(doc['key'])} in {md_text(doc['topic'])}/{doc['partition']}: "
        + md_text("; ".join(pair_headline(doc, p) for p in doc["pairs"] if p["verdict"] != "CONSISTENT")),
        "",
    ]
    lines += [f"- {md_text(sentence)}" for sentence in map(odd_one_out_sentence, doc.get("odd_one_out") or [])]
    lines += [
        "" if doc.get("odd_one_out") else None,
        f"![timeline of {md_text(doc['key'])}](data:image/png;base64,{picture})",
        "",
    ]
    lines = [line for line in lines if line is not None]
    if full:
        lines += [md_code_block(render_text(doc).rstrip("\n")), ""]
    return "\n".join(lines)


def build_report(
    warehouse: str, snapshot_id: str, totals: dict[str, Optional[int]], pictures: int, redacting: bool,
    pair_totals: Optional[dict[str, int]] = None,
) -> SnapshotReport:
    """Explain every reported key of the snapshot and write the page; return where, and the explanations.

    ``totals``: keys per verdict (``DIVERGENT``, ... and ``COMPARED``; each key once, under its worst verdict), as
    the divergence step counted them; ``pair_totals``: key pairs per verdict (a key once per replica pair).
    """
    from explain.page import snapshot_page

    # Every value is read no longer than it is shown: a page of many keys with values of megabytes stays small.
    # (twice what is shown, so that a Venice value, base64 text, still decodes past it).
    read_chars = 2 * REPORT_VALUE_CHARS
    tables = SnapshotTables(warehouse, snapshot_id, value_chars=read_chars)
    reported = tables.reader.read("divergence_reports", snapshot_id, columns=["topic", "partition", "key"])
    wanted: dict[tuple[str, int], set[str]] = {}
    for row in ([] if reported is None else reported.to_pylist()):
        wanted.setdefault((row["topic"], row["partition"]), set()).add(row["key"])
    venice = tables.is_venice() if wanted else False
    explained = explain_places(tables, {place: sorted(keys) for place, keys in wanted.items()}, venice, heartbeats=False)
    docs = sorted((doc for by_key in explained.values() for doc in by_key.values()), key=importance)
    # The pictured keys are explained again with their heartbeats (marked on the picture): one more read per table.
    pictured: dict[tuple[str, int], list[str]] = {}
    for doc in docs[:pictures]:
        pictured.setdefault((doc["topic"], doc["partition"]), []).append(doc["key"])
    again = explain_places(tables, pictured, venice)
    docs[:pictures] = [again[(d["topic"], d["partition"])][d["key"]] for d in docs[:pictures]]
    for doc in docs:  # the values were read cut past what the page shows
        for replica in doc["replicas"]:
            for version in replica["versions"]:
                value = version["value"]
                version["value_display"] = display_value(
                    value, version["kind"], REPORT_VALUE_CHARS, read_cut=value is not None and len(value) > read_chars
                )
    if redacting:
        for doc in docs:
            redact(doc)
    uri = report_uri(warehouse, snapshot_id)
    summary = {"snapshot_id": snapshot_id, **{v: totals[v] for v in VERDICT_ORDER if totals.get(v) is not None},
               "keys compared": totals.get("COMPARED")}
    if pair_totals is not None:  # key pairs only under a name that says so (SPEC 10)
        summary["key pairs compared"] = pair_totals.get("COMPARED")
        summary["key pairs per verdict"] = ", ".join(
            f"{v} {pair_totals[v]}" for v in sorted(VERDICT_ORDER, key=VERDICT_ORDER.get) if v in pair_totals)
    summary |= {"warehouse": warehouse, "values": "redacted (hashes only)" if redacting else "shown"}
    Location.of(uri).write_text(snapshot_page(summary, docs, pictures))
    return SnapshotReport(uri=uri, docs=docs, pictured=min(pictures, len(docs)))
