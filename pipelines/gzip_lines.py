"""The rows of one gzip JSONL file, read in Spark's Python workers (``pipelines/reading.py``).

``gzip_file_batches`` streams a file through zlib (concatenated gzip members are one
stream) and yields Arrow record batches of ``(source_file, raw, read_error)``: every
complete non-blank line as its bytes, in order, and, when the stream breaks part-way
(truncated, corrupt, trailing garbage), one last row with ``raw`` null and ``read_error``
saying where it broke and what is lost. Lines follow the rule of ``pipelines/reading.py``'s
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

SCHEMA = pa.schema(
    [
        pa.field("source_file", pa.string(), nullable=False),
        pa.field("raw", pa.binary()),
        pa.field("read_error", pa.string()),
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
                    out = decompressor.decompress(pending)
                    produced += len(out)
                    yield out
                    if decompressor.eof:
                        # Concatenated gzip members are one valid stream.
                        pending = decompressor.unused_data
                        decompressor = zlib.decompressobj(_GZIP_WBITS)
                        in_member = False
                    else:
                        pending = b""
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


def gzip_lines(fs: pafs.FileSystem, path: str) -> Generator[list[bytes], None, str | None]:
    """The non-blank lines of a gzip file, in order, a decompressed chunk at a time, by the LF rule.

    Returns None when the file is whole (its last line, without LF, then counts too); when
    it breaks, its complete lines before the break have been yielded and the text of the
    row standing for the rest is returned.
    """
    chunks = _without_bom(gunzip(fs, path))
    partial: list[bytes] = []  # the line being read, up to its LF
    complete = 0
    while True:
        try:
            out = next(chunks)
        except StopIteration as stop:
            problem = stop.value
            break
        pieces = out.split(b"\n")
        if len(pieces) == 1:
            partial.append(out)
            continue
        pieces[0] = b"".join([*partial, pieces[0]])
        partial = [pieces.pop()]
        lines = _rows(pieces)
        complete += len(lines)
        if lines:
            yield lines
    tail = b"".join(partial)  # after the last LF: the last line, or what is left of it
    if problem is None:
        last = _rows([tail])
        if last:
            yield last
        return None
    return (
        f"{problem}; {complete} complete lines before the break were read, "
        f"an incomplete last line of {len(tail)} bytes and everything after it are lost"
    )


def gzip_file_batches(fs: pafs.FileSystem, path: str, name: str) -> Iterator[pa.RecordBatch]:
    """The rows of one gzip file as ``SCHEMA`` batches, ``name`` as their ``source_file``."""

    def batch(raws: list[bytes | None], errors: list[str | None]) -> pa.RecordBatch:
        names = pa.array([name] * len(raws), pa.string())
        columns = [names, pa.array(raws, pa.binary()), pa.array(errors, pa.string())]
        return pa.RecordBatch.from_arrays(columns, schema=SCHEMA)

    lines = gzip_lines(fs, path)
    while True:
        try:
            raws = next(lines)
        except StopIteration as stop:
            if stop.value is not None:  # the file broke: one row for what is lost
                yield batch([None], [stop.value])
            return
        yield batch(raws, [None] * len(raws))


# Spark's Python workers receive this module by value with each task.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
