"""Data put into Markdown (Dagster's UI renders metadata Markdown with CommonMark and GitHub's tables).

Keys, values, paths, replica and topic names are data: a ``_`` or ``*`` in them must not open emphasis, a ``|``
must not end a table cell, a backtick must not open code, a ``<`` must not start HTML, a ``&`` must not start an
entity. ``md_text`` backslash-escapes every ASCII punctuation character (CommonMark shows each such escaped
character as itself, in table cells too) and spells characters a renderer would act on (newlines, escapes) as
escape sequences, so the text renders as itself. Every Markdown builder of the project puts data in through it.
"""
from __future__ import annotations

import string

_PUNCTUATION = frozenset(string.punctuation)


def md_text(value: object) -> str:
    """``value`` as Markdown text that renders as itself, on one line."""
    text = str(value)
    if not text.isprintable():
        text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return "".join("\\" + c if c in _PUNCTUATION else c for c in text)


def md_code_block(text: str) -> str:
    """``text`` as a fenced code block shown verbatim: the fence is longer than any run of backticks in it."""
    longest = 0
    run = 0
    for c in text:
        run = run + 1 if c == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{text}\n{fence}"
