"""The rows of one gzip JSONL file, read in Spark's Python workers (``pipelines/ingest/reading.py``).

``gzip_file_batches`` streams a file through zlib (concatenated gzip members are one
stream; at most a megabyte is decompressed at a time, whatever a member expands to) and
yields Arrow record batches of ``(source_file, raw, read_error, decoded_reason)``: every
complete non-blank line as its bytes, in order; a line over the line limit as its prefix,
where it stood and ``LINE_TOO_LONG`` (``pipelines/ingest/long_lines.py``), never held whole; and,
when the stream breaks part-way (truncated, corrupt, trailing garbage), one last row with
``raw`` null and ``read_error`` saying where it broke and what is lost. Lines follow the rule of ``pipelines/ingest/reading.py``'s
docstring (LF ends a line, a CR before it is cut off, a UTF-8 BOM opening the file is
dropped, a line of ASCII whitespace only is blank), the rule Spark's text reader applies to
plain ``*.jsonl`` files there. Line bytes are kept as they are, invalid UTF-8 included, as
Spark's reader keeps them.

The file is opened through the pyarrow filesystem the driver resolved (it pickles), so it
is reached on an executor as on the driver: local path, object store or HDFS. Only zlib and
pyarrow are needed: this module is shipped to the executors by value (the project need not
be installed there).
"""
from __future__ import annotations

import sys
import zlib
from typing import Generator, Iterator

import pyarrow as pa
import pyarrow.fs as pafs
from pyspark import cloudpickle

from pipelines.ingest.long_lines import (
    DEFAULT_MAX_LINE_BYTES,
    LINE_TOO_LONG,
    PREFIX_BYTES,
    LongLine,
    find_long_lines,
    long_line_detail,
)

# raw: a line's bytes (a long line's prefix); read_error: where the stream broke, or where a long line stood.
SCHEMA = pa.schema(
    [
        pa.field("source_file", pa.string(), nullable=False),
        pa.field("raw", pa.binary()),
        pa.field("read_error", pa.string()),
        pa.field("decoded_reason", pa.string()),
    ]
)
# What a blank line may hold: ASCII whitespace (Spark's side of ingest trims the same characters).
BLANK = b" \t\n\x0b\f\r"
UTF8_BOM = b"\xef\xbb\xbf"
_CHUNK = 1 << 20
_GZIP_WBITS = 31  # zlib with a gzip header and trailer


def gunzip(fs: pafs.FileSystem, path: str) -> Generator[bytes, None, str | None]:
    """Stream-decompress a gzip file, yielding its decompressed chunks.

    Returns None when the file is whole, else where and why it broke.
    """
    decompressor = zlib.decompressobj(_GZIP_WBITS)
    in_member = False
    read = 0
    produced = 0
    try:
        with fs.open_input_stream(path, compression=None) as fh:
            while chunk := fh.read(_CHUNK):
                read += len(chunk)
                pending = chunk
                while pending:
                    in_member = True
                    # At most _CHUNK bytes out per call: a member of a few kilobytes that expands to
                    # gigabytes is read a chunk at a time, never whole.
                    out = decompressor.decompress(pending, _CHUNK)
                    produced += len(out)
                    if out:
                        yield out
                    if decompressor.eof:
                        # Concatenated gzip members are one valid stream.
                        pending = decompressor.unused_data
                        decompressor = zlib.decompressobj(_GZIP_WBITS)
                        in_member = False
                    else:
                        pending = decompressor.unconsumed_tail
    except (OSError, zlib.error) as exc:
        return f"gzip stream broke after {produced} decompressed bytes (near compressed byte {read}): {exc}"
    if in_member:
        return f"gzip stream truncated after {produced} decompressed bytes ({read} compressed bytes)"
    return None


def _without_bom(chunks: Generator[bytes, None, str | None]) -> Generator[bytes, None, str | None]:
    """The same stream with a UTF-8 BOM opening it dropped (Hadoop's line reader drops it too)."""
    head = b""
    while len(head) < len(UTF8_BOM):
        try:
            head += next(chunks)
        except StopIteration as stop:  # a stream shorter than a BOM
            yield head
            return stop.value
    yield head.removeprefix(UTF8_BOM)
    return (yield from chunks)


def _rows(pieces: list[bytes]) -> list[bytes]:
    # bytes.splitlines would also end a line at a lone CR: Spark's reader, told LF, does not.
    return [piece.removesuffix(b"\r") for piece in pieces if piece.strip(BLANK)]


class _Line:
    """The line being read, up to its LF: its pieces while it is within the limit, else its prefix and length."""

    def __init__(self, max_line_bytes: int):
        self.max_line_bytes = max_line_bytes
        self.number = 1  # 1-based, every line counted (blank ones too)
        self.offset = 0  # of its first byte in the decompressed text
        self.pieces: list[bytes] = []
        self.length = 0
        self.prefix: bytes | None = None  # set once the line is over the limit: then its pieces are dropped

    def add(self, piece: bytes) -> None:
        self.length += len(piece)
        if self.prefix is not None:
            if len(self.prefix) < PREFIX_BYTES:
                self.prefix += piece[: PREFIX_BYTES - len(self.prefix)]
            return
        if self.length > self.max_line_bytes:
            prefix = b""
            for kept in (*self.pieces, piece):
                prefix += kept[: PREFIX_BYTES - len(prefix)]
            self.prefix, self.pieces = prefix, []
        else:
            self.pieces.append(piece)

    def end(self) -> bytes | LongLine:
        """The line as its LF (or the end of the text) ends it: its bytes, or the long line it was."""
        out = (
            b"".join(self.pieces) if self.prefix is None
            else LongLine(self.number, self.offset, self.length, self.prefix)
        )
        self.number += 1
        self.offset += self.length + 1
        self.pieces, self.length, self.prefix = [], 0, None
        return out


def plain_chunks(fs: pafs.FileSystem, path: str) -> Generator[bytes, None, str | None]:
    """A plain file's bytes, a chunk at a time (the same stream as ``gunzip``'s, which never breaks)."""
    with fs.open_input_stream(path, compression=None) as fh:
        while chunk := fh.read(_CHUNK):
            yield chunk
    return None


def has_long_line(fs: pafs.FileSystem, path: str, max_line_bytes: int) -> bool:
    """Whether a plain file holds a line over the limit: read a chunk at a time, up to the first such line."""
    return next(find_long_lines(_without_bom(plain_chunks(fs, path)), max_line_bytes), None) is not None


def gzip_lines(
    fs: pafs.FileSystem, path: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> Generator[list[bytes | LongLine], None, str | None]:
    """The non-blank lines of a gzip file (``text_lines`` of its decompressed stream)."""
    return (yield from text_lines(gunzip(fs, path), max_line_bytes))


def text_lines(
    stream: Generator[bytes, None, str | None], max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> Generator[list[bytes | LongLine], None, str | None]:
    """The non-blank lines of a byte stream, in order, a chunk at a time, by the LF rule.

    A line longer than ``max_line_bytes`` comes as a ``LongLine`` (its prefix and where it stood),
    never held whole. Returns None when the stream is whole (its last line, without LF, then counts
    too); when it breaks (the stream returns why), its complete lines before the break have been
    yielded and the text of the row standing for the rest is returned.
    """
    chunks = _without_bom(stream)
    line = _Line(max_line_bytes)
    complete = 0
    while True:
        try:
            out = next(chunks)
        except StopIteration as stop:
            problem = stop.value
            break
        pieces = out.split(b"\n")
        line.add(pieces[0])
        if len(pieces) == 1:
            continue
        ended = [line.end()]
        middle = pieces[1:-1]
        if len(out) > max_line_bytes:
            # A line lying inside this chunk could be over the limit (a limit below the chunk size): line by line.
            for piece in middle:
                line.add(piece)
                ended.append(line.end())
            middle = []
        else:
            line.offset += sum(map(len, middle)) + len(middle)
            line.number += len(middle)
        rows = [row for end in ended for row in ([end] if isinstance(end, LongLine) else _rows([end]))]
        rows.extend(_rows(middle))
        line.add(pieces[-1])
        complete += len(rows)
        if rows:
            yield rows
    if problem is None:
        last = line.end()
        rows = [last] if isinstance(last, LongLine) else _rows([last])
        if rows:
            yield rows
        return None
    return (
        f"{problem}; {complete} complete lines before the break were read, "
        f"an incomplete last line of {line.length} bytes and everything after it are lost"
    )


def gzip_file_batches(
    fs: pafs.FileSystem, path: str, name: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> Iterator[pa.RecordBatch]:
    """The rows of one gzip file as ``SCHEMA`` batches, ``name`` as their ``source_file``."""
    return _line_batches(text_lines(gunzip(fs, path), max_line_bytes), name, max_line_bytes)


def plain_file_batches(
    fs: pafs.FileSystem, path: str, name: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
) -> Iterator[pa.RecordBatch]:
    """The rows of one plain JSONL file as ``SCHEMA`` batches (for a file holding a line over the limit)."""
    return _line_batches(text_lines(plain_chunks(fs, path), max_line_bytes), name, max_line_bytes)


def _line_batches(
    lines: Generator[list[bytes | LongLine], None, str | None], name: str, max_line_bytes: int
) -> Iterator[pa.RecordBatch]:

    def batch(raws: list[bytes | None], errors: list[str | None], reasons: list[str | None]) -> pa.RecordBatch:
        names = pa.array([name] * len(raws), pa.string())
        columns = [names, pa.array(raws, pa.binary()), pa.array(errors, pa.string()), pa.array(reasons, pa.string())]
        return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)

    while True:
        try:
            rows = next(lines)
        except StopIteration as stop:
            if stop.value is not None:  # the file broke: one row for what is lost
                yield batch([None], [stop.value], [None])
            return
        if not any(isinstance(row, LongLine) for row in rows):
            yield batch(rows, [None] * len(rows), [None] * len(rows))
            continue
        yield batch(
            [row.prefix if isinstance(row, LongLine) else row for row in rows],
            [long_line_detail(row, max_line_bytes) if isinstance(row, LongLine) else None for row in rows],
            [LINE_TOO_LONG if isinstance(row, LongLine) else None for row in rows],
        )


# Spark's Python workers receive this module by value with each task.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
