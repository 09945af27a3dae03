"""The HTML pages of explained keys: one key's page (``replica-lens explain --html``) and a snapshot's report.

Both are single self-contained HTML5 files: inline CSS, the timeline inline as SVG
(``timeline.svg``), no script and nothing fetched from anywhere. A key reads the same on both
(``explanation_html``), in the words of ``text.py``: this module lays those sentences and cells
out as HTML and escapes every piece of data (keys and values are untrusted). The snapshot's
report folds each key in a ``<details>``; only the first ``pictures`` keys get a picture (drawing
costs ~0.1 s each), the others name the command that draws it, so a page of thousands of keys
is string building only.
"""
from __future__ import annotations

from html import escape
from typing import Optional

from explain import text
from explain.document import VERDICT_ORDER, worst_verdict

OPEN_FOLDS = 3  # the report opens the first few keys
PICTURE_FILE = "FILE"

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 1.5em auto; max-width: 1200px;
       padding: 0 1em; color: #1b1b1b; line-height: 1.4; }
h1 { font-size: 1.4em; overflow-wrap: anywhere; } h2 { font-size: 1.2em; margin-top: 1.6em; }
h3 { font-size: 1.05em; margin: 1.2em 0 .3em; }
code, .mono, td.value, td.vector { font-family: ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace;
       font-size: .9em; }
.key, td.value, .compare td { white-space: pre-wrap; word-break: break-all; }
table { border-collapse: collapse; margin: .4em 0; }
th, td { border: 1px solid #d0d0d0; padding: .15em .45em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; font-weight: 600; }
.facts th { width: 9em; }
.legend { color: #555; font-size: .9em; }
.pair { border-left: 5px solid #999; padding: .2em .8em; margin: 1em 0; }
.pair.DIVERGENT { border-color: #d62728; } .pair.MISSING { border-color: #9467bd; }
.pair.IN_FLIGHT { border-color: #ff7f0e; } .pair.CONSISTENT { border-color: #2ca02c; }
.proof code { display: block; white-space: pre-wrap; }
.verdict-count { display: inline-block; margin-right: 1.2em; font-weight: 600; }
tr.witness td { background: #fde8e8; }
tr.witness td.mark { color: #d62728; font-weight: 700; }
tr.gap-after td { border-bottom: 3px dashed #7f7f7f; }
tr.gap-before td.gaps, tr.gap-after td.gaps { color: #7f7f7f; font-weight: 600; }
tr.reread td { font-size: .85em; color: #444; border-top: none; }
details.key { border: 1px solid #d0d0d0; border-radius: 4px; margin: .5em 0; padding: .3em .8em; }
details.key > summary { cursor: pointer; font-weight: 600; overflow-wrap: anywhere; }
.timeline svg { max-width: 100%; height: auto; }
.command { background: #f6f6f6; padding: .3em .5em; }
"""

# The version table's columns (VersionFacts fields), the value's and the vectors' cells set in monospace.
_COLUMNS = ("mark", "name", "kind", "value", "hash", "source", "written", "touch", "reach", "gaps", "witness")
_CELL_CLASS = {"mark": "mark", "value": "value", "hash": "mono", "touch": "vector", "reach": "vector", "gaps": "gaps"}


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _class(name: str) -> str:
    return f' class="{name}"' if name else ""


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


# ------------------------------------------------------------------ one key
def _legend() -> str:
    return f'<p class="legend">{_e(text.LEGEND)}</p>'


def _facts(doc: dict) -> str:
    rows = "".join(
        f'<tr><th>{_e(label)}</th><td{_class("key" if label == "key" else "")}>{_e(value)}</td></tr>'
        for label, value in text.header_facts(doc)
    )
    return f'<table class="facts">{rows}</table>'


def _comparison(doc: dict, pair: dict) -> str:
    rows = text.comparison_rows(doc, pair)
    if not rows:
        return ""
    (_, head_a, head_b), *cells = rows
    body = "".join(f"<tr><th>{_e(what)}</th><td>{_e(a)}</td><td>{_e(b)}</td></tr>" for what, a, b in cells)
    return f'<table class="compare"><tr><th></th><th>{_e(head_a)}</th><th>{_e(head_b)}</th></tr>{body}</table>'


def _pair(doc: dict, pair: dict) -> str:
    parts = [f'<p class="verdict">{_e(text.verdict_sentence(doc, pair))}</p>']
    if pair["witness"] is not None:
        parts += [f'<p class="proof"><code>{_e(line)}</code></p>' for line in text.witness_inequalities(doc, pair)]
    parts.append(_comparison(doc, pair))
    resolved = text.resolution_sentence(doc, pair)
    if resolved is not None:
        parts.append(f'<p class="resolution">{_e(resolved)}</p>')
    blocking = text.blocking_sentences(doc, pair)
    if blocking:
        parts.append('<ul class="blocking">' + "".join(f"<li>{_e(s)}</li>" for s in blocking) + "</ul>")
    return (f'<section class="pair {_e(pair["verdict"])}" data-verdict="{_e(pair["verdict"])}">'
            + "".join(parts) + "</section>")


def _row_class(version: dict, facts: text.VersionFacts) -> str:
    flags = (("witness", facts.mark), ("gap-before", version["gap_before"]), ("gap-after", version["gap_after"]))
    return " ".join(name for name, on in flags if on)


def _version_row(version: dict, facts: text.VersionFacts) -> str:
    offset = "" if version["offset"] is None else f' data-offset="{version["offset"]}"'
    cells = "".join(f'<td{_class(_CELL_CLASS.get(c, ""))}>{_e(getattr(facts, c))}</td>' for c in _COLUMNS)
    row = f'<tr{_class(_row_class(version, facts))}{offset}>{cells}</tr>'
    if facts.reread is not None:
        row += (f'<tr class="reread"><td></td><td colspan="{len(_COLUMNS) - 1}">reread: '
                f"<code>{_e(facts.reread)}</code></td></tr>")
    return row


def _replica(replica: dict, roles: dict) -> str:
    name = replica["replica"]
    head = f'<h3>replica {_e(name)}</h3><p class="dump">{_e(text.dump_sentence(replica))}</p>'
    if not replica["versions"]:
        return f"{head}<p>{_e(text.NO_VERSIONS)}</p>"
    headings = "".join(f"<th>{_e(getattr(text.VERSION_HEADINGS, c))}</th>" for c in _COLUMNS)
    rows = "".join(_version_row(v, text.version_facts(name, v, roles)) for v in replica["versions"])
    return f'{head}<table class="versions" data-replica="{_e(name)}"><tr>{headings}</tr>{rows}</table>'


def _odd_one_out(doc: dict) -> str:
    entries = doc.get("odd_one_out") or []
    if not entries:
        return ""
    items = "".join(f'<li data-replica="{_e(o["replica"])}">{_e(text.odd_one_out_sentence(o))}</li>' for o in entries)
    return f'<h2>Odd one out</h2><ul class="odd-one-out">{items}</ul>'


def explanation_html(doc: dict, picture: str) -> str:
    """The body of one key's explanation; ``picture`` is HTML already (an inline ``<svg>``, or a note)."""
    roles = text.witness_roles(doc)
    return "".join([
        _facts(doc),
        f'<div class="timeline">{picture}</div>',
        "<h2>Pairs</h2>",
        *(_pair(doc, pair) for pair in doc["pairs"]),
        _odd_one_out(doc),
        "<h2>Replicas</h2>",
        *(_replica(replica, roles) for replica in doc["replicas"]),
    ])


def key_page(doc: dict) -> str:
    """One key's self-contained page: its explanation with the timeline picture inline."""
    from explain.timeline import svg

    title = f"{worst_verdict(doc)} {text.shown(doc['key'])} in {doc['topic']}/{doc['partition']}"
    body = f"<h1>{_e(title)}</h1>{_legend()}{explanation_html(doc, svg(doc))}"
    return _page(f"{title} · {doc['snapshot_id']}", body)


# ------------------------------------------------------------------ the snapshot's report
def picture_command(doc: dict, warehouse: str) -> str:
    """The ``replica-lens explain`` command that writes the key's page with its picture."""
    return text.explain_command(doc, warehouse, "--html", PICTURE_FILE)


def _fold_line(doc: dict) -> str:
    unsettled = [f"{text.pair_name(p)} {p['verdict']}" for p in doc["pairs"] if p["verdict"] != "CONSISTENT"]
    return (f"{worst_verdict(doc)} – {doc['topic']}/{doc['partition']} – {text.shown(doc['key'])} – "
            + ("; ".join(unsettled) or "all pairs CONSISTENT"))


def _fold(doc: dict, i: int, picture: Optional[str], warehouse: str) -> str:
    if picture is None:
        picture = f'<p>picture: <code class="command">{_e(picture_command(doc, warehouse))}</code></p>'
    verdict = worst_verdict(doc)
    return (f'<details class="key" data-verdict="{_e(verdict)}" data-key="{_e(doc["key"])}"'
            f'{" open" if i < OPEN_FOLDS else ""}><summary>{_e(_fold_line(doc))}</summary>'
            f"{explanation_html(doc, picture)}</details>\n")


def _summary(summary: dict, docs: list[dict], pictures: int) -> str:
    counts = "".join(f'<span class="verdict-count" data-verdict="{_e(v)}">{_e(v)} keys: {_e(summary[v])}</span>'
                     for v in sorted(VERDICT_ORDER, key=VERDICT_ORDER.get) if v in summary)
    extra = "".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in summary.items()
                    if k != "snapshot_id" and k not in VERDICT_ORDER)
    pictured = min(pictures, len(docs))
    listing = (f"<p>{len(docs)} key(s) below, most important first; the first {pictured} with a picture.</p>" if docs
               else "<p>No key is reported: every key compared is CONSISTENT.</p>")
    return (f"<h1>Divergence report of snapshot {_e(summary['snapshot_id'])}</h1>"
            f'<p class="counts">{counts}</p>' + (f'<table class="facts">{extra}</table>' if extra else "")
            + _legend() + listing)


def snapshot_page(summary: dict, docs: list[dict], pictures: int) -> str:
    """The report of one snapshot: ``summary`` then every one of ``docs`` (in the order given) as a fold.

    ``summary``: ``snapshot_id``; the keys per verdict under the verdict names (``DIVERGENT``: 10 ...; each key once,
    under its worst verdict: key pairs only under a name that says so, in the other items);
    ``warehouse`` (named in the commands that draw the pictures left out); any other item is shown
    in a small table. The first ``pictures`` documents get their picture inline.
    """
    from explain.timeline import svg

    warehouse = str(summary.get("warehouse", "WAREHOUSE"))
    folds = "".join(
        _fold(doc, i, svg(doc, prefix=f"key{i}-") if i < pictures else None, warehouse) for i, doc in enumerate(docs)
    )
    return _page(f"Divergence report · {summary['snapshot_id']}", _summary(summary, docs, pictures) + folds)
