"""JSONL lines longer than the line limit: never held whole, kept as quarantine rows, never lost.

A line is the bytes before its LF (a CR before the LF counts; a UTF-8 BOM opening the file
does not). One longer than ``max_line_bytes`` is never held whole by any reader:

- ``*.jsonl.gz``, and ``*.jsonl`` files that hold such a line: ``pipelines/ingest/gzip_lines.py``
  splits the lines itself, a chunk at a time, and past the limit keeps only the line's first
  ``PREFIX_BYTES`` bytes and counts the rest (``LongLine``).
- Which plain files hold one is found first (``find_long_lines`` through
  ``pipelines.ingest.gzip_lines.has_long_line``, one task per file larger than the limit: a smaller
  one cannot hold such a line): each is scanned a chunk at a time, looking
  only for LFs, and stops at the first long line. The other plain files go to Spark's text
  reader, which holds each line whole. (Hadoop's own ``line.maxlength`` is no way out: when a
  line it skips is longer than the rest of its split, it goes on reading from the middle of
  that line, and its pieces come out as rows.)

Each such line is one row quarantined ``LINE_TOO_LONG``, ``detail`` saying where it stood
(``long_line_detail``). Its position in the topic is unknown (the line is not parsed), so the
offset it held is a gap in its partition, as SPEC 3a treats any position a dump lacks.

This module is shipped to Spark's Python workers by value with each task (nothing but the
standard library is needed there).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Iterator

from pyspark import cloudpickle

LINE_TOO_LONG = "LINE_TOO_LONG"
DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024
MIN_MAX_LINE_BYTES = 1024
MAX_MAX_LINE_BYTES = 2**31 - 3  # a Spark string holds under 2 GiB
PREFIX_BYTES = 1024  # what a quarantine row keeps of a long line


@dataclass(frozen=True)
class LongLine:
    """One line over the limit: where it stood in its file and what is kept of it."""

    number: int  # 1-based line number in the file (LF-terminated lines before it, plus one)
    offset: int  # byte offset of its first byte in the (decompressed) text, after a BOM opening it
    length: int  # its bytes before the LF
    prefix: bytes  # its first PREFIX_BYTES bytes


def long_line_detail(line: LongLine, max_line_bytes: int) -> str:
    return (
        f"line {line.number} (byte {line.offset} of the file) is {line.length} bytes long, over the limit of "
        f"{max_line_bytes} (max_line_bytes, REPLICA_LENS_MAX_LINE_BYTES): it was not read; raw keeps its first "
        f"{min(line.length, PREFIX_BYTES)} bytes, and the position it held is a gap"
    )


def find_long_lines(chunks: Iterator[bytes], max_line_bytes: int) -> Iterator[LongLine]:
    """The lines of a stream of byte chunks (a BOM opening it already dropped) longer than ``max_line_bytes`` bytes.

    Holds one chunk and a prefix at a time. The chunks are cut to at most ``max_line_bytes + 1``
    bytes, so that only the LFs nearest each one's ends need looking for: a line lying whole
    inside such a piece cannot be over the limit.
    """
    start = 0  # offset of the current line's first byte
    position = 0  # offset of the next chunk's first byte
    lines_before = 0  # LF-terminated lines before the current one
    prefix = b""  # the current line's first bytes
    for chunk in _sliced(chunks, max_line_bytes + 1):
        lf = chunk.find(b"\n")
        if lf < 0:
            if len(prefix) < PREFIX_BYTES:
                prefix += chunk[: PREFIX_BYTES - len(prefix)]
            position += len(chunk)
            continue
        end = position + lf  # the current line ends here
        if end - start > max_line_bytes:
            yield LongLine(lines_before + 1, start, end - start, prefix + chunk[: min(lf, PREFIX_BYTES - len(prefix))])
        lines_before += chunk.count(b"\n")
        last = chunk.rfind(b"\n")
        start = position + last + 1
        prefix = chunk[last + 1: last + 1 + PREFIX_BYTES]
        position += len(chunk)
    if position - start > max_line_bytes:  # the last line, without LF
        yield LongLine(lines_before + 1, start, position - start, prefix[:PREFIX_BYTES])


def _sliced(chunks: Iterator[bytes], size: int) -> Iterator[bytes]:
    """The same bytes in pieces of at most ``size`` bytes, empty pieces left out."""
    for chunk in chunks:
        for at in range(0, len(chunk), size):
            yield chunk[at: at + size]


# Spark's Python workers receive this module by value with each task.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
