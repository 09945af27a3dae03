"""Parquet pages larger than the line limit: found before any value is read, and the rows around them kept.

Every Parquet reader (Spark's, pyarrow's) decompresses a page whole, and a value never spans
pages: a page holding one value of a gigabyte (a few kilobytes once compressed) costs an
executor a gigabyte or more, whatever the file's size on disk, and took the whole audit down
with it. A SPEC Parquet row is judged as the JSON line it renders to, so the line limit
(``max_line_bytes``, pipelines/ingest/long_lines.py) bounds its pages too. Writers aim at pages of about
1 MiB but look at the size only every 100 rows (parquet-mr) or 1024 (pyarrow): a page over 64 MiB
takes one value near that size, or values averaging over 64 KiB (then raise the limit: reading
that page costs its size, as it always did).

- Finding them (``large_pages``, on the driver, which reads the footers anyway): only a column
  chunk whose footer gives it more uncompressed bytes than the limit can hold such a page, and
  only those chunks' page headers are read (Apache Thrift's compact protocol, never past the bytes
  read; a header is a few dozen bytes, the page data is skipped). A header that cannot be read
  makes the file unreadable, as a broken footer does.
- Reading around them (``guarded_batches``, in Spark's Python workers, pyarrow only): a file
  holding one is read row group by row group. A row group without large pages is read whole;
  one with a large page is read without the columns holding it, and each of its rows carries
  why (``detail``): the judging quarantines it PAGE_TOO_LARGE with its position, which is known
  from the columns read (a gap of one position, SPEC 3a). Files of raw Venice records are read
  the same way; their quarantined records are never decoded. Its other rows share the row group's
  fate: their values in those columns cannot be read without the page.

Known limit: a footer that understates a chunk's uncompressed size hides its pages from this
check (reading every page header of every file would cost a seek per page on every audit).

This module is shipped to Spark's Python workers by value; they need pyarrow only.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import BinaryIO, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark import cloudpickle

PAGE_TOO_LARGE = "PAGE_TOO_LARGE"
# Bytes read at each page's start: its Thrift header fits, unless its statistics hold long values; then it is read
# again up to MAX_HEADER_BYTES (a header longer than that makes the file unreadable).
HEADER_WINDOW = 64 * 1024
MAX_HEADER_BYTES = 16 * 1024 * 1024
LARGE_PAGE_FIELD = "__large_page"  # the detail column ``guarded_batches`` adds to the file's own
UNREADABLE_FIELD = "__unreadable"  # set on the one row standing for a row group pyarrow could not convert


@dataclass(frozen=True)
class LargePage:
    """The largest page of one column chunk, over the limit."""

    row_group: int
    column: str  # the top-level column (a map's or struct's leaves are under one column)
    leaf: str  # the leaf column's path in the schema ("hb_vector.key_value.key")
    page_bytes: int  # its uncompressed size
    rows: int  # rows of the row group


class UnreadablePages(ValueError):
    """A page header of the file could not be read: the file is unreadable."""


def large_pages(file: BinaryIO, metadata: pq.FileMetaData, limit: int) -> list[LargePage]:
    """The column chunks of ``file`` whose largest page is over ``limit`` bytes uncompressed.

    Only chunks the footer says are larger than ``limit`` are looked at (a page is part of its chunk).
    """
    found = []
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        for column in range(group.num_columns):
            chunk = group.column(column)
            if chunk.total_uncompressed_size <= limit:
                continue
            largest = largest_page(file, chunk)
            if largest > limit:
                leaf = chunk.path_in_schema
                found.append(LargePage(index, leaf.split(".", 1)[0], leaf, largest, group.num_rows))
    return found


def largest_page(file: BinaryIO, chunk: pq.ColumnChunkMetaData) -> int:
    """The uncompressed size of the chunk's largest page, dictionary page included, from the page headers only."""
    start = chunk.data_page_offset
    if chunk.has_dictionary_page and chunk.dictionary_page_offset:
        start = min(start, chunk.dictionary_page_offset)
    end = start + chunk.total_compressed_size  # headers included
    largest, offset, window_bytes = 0, start, HEADER_WINDOW
    while offset < end:
        file.seek(offset)
        window = file.read(min(window_bytes, end - offset))
        try:
            sizes, read = page_header_sizes(window)
        except EOFError as exc:
            if len(window) < end - offset and window_bytes < MAX_HEADER_BYTES:
                # The header goes on past the window (statistics holding long values): read it again, whole.
                window_bytes *= 16
                continue
            sizes, read, problem = None, 0, f"it runs past {len(window)} bytes ({type(exc).__name__})"
        except Exception as exc:  # noqa: BLE001 - Thrift garbage raises whatever its decoding trips on
            sizes, read, problem = None, 0, f"{type(exc).__name__}: {exc}"
        if sizes is None:
            raise UnreadablePages(f"the page header at byte {offset} of column {chunk.path_in_schema} cannot be read: "
                                  f"{problem}") from None
        if not all(isinstance(s, int) and s >= 0 for s in sizes) or read <= 0 or offset + read + sizes[1] > end:
            raise UnreadablePages(
                f"the page header at byte {offset} of column {chunk.path_in_schema} is not a page of its chunk "
                f"(sizes {sizes}, chunk bytes {start}..{end})"
            )
        window_bytes = HEADER_WINDOW
        largest = max(largest, sizes[0])
        offset += read + sizes[1]
    return largest


# Parquet's PageHeader (parquet.thrift): field 2 is the page's uncompressed size, field 3 its compressed size (the
# bytes that follow the header); both required i32. The other fields (its type, CRC, the per-kind headers with their
# statistics) are skipped.
UNCOMPRESSED_PAGE_SIZE, COMPRESSED_PAGE_SIZE = 2, 3


def page_header_sizes(window: bytes) -> tuple[tuple, int]:
    """``((uncompressed, compressed), header bytes)`` of the Thrift PageHeader at the start of ``window``.

    Read with Apache Thrift's compact protocol over the window's bytes only: a header that runs past the window raises
    ``EOFError`` (read a larger window), garbage raises whatever its decoding trips on, never reads beyond the window.
    (fastparquet's Cython reader, used before, reads past the end of a buffer that stops inside a header: a header cut
    by the window crashed the process now and then.) A missing size is None.
    """
    from thrift.protocol.TCompactProtocol import TCompactProtocol
    from thrift.protocol.TProtocol import TType
    from thrift.transport.TTransport import TMemoryBuffer

    class BytesAsBinary(TCompactProtocol):
        """Skips string fields as bytes: statistics of a binary column are not UTF-8."""

        def readString(self):  # noqa: N802 - Thrift's name
            return self.readBinary()

    buffer = TMemoryBuffer(window)
    protocol = BytesAsBinary(buffer)
    sizes: dict[int, int] = {}
    protocol.readStructBegin()
    while True:
        _, kind, field = protocol.readFieldBegin()
        if kind == TType.STOP:
            break
        if field in (UNCOMPRESSED_PAGE_SIZE, COMPRESSED_PAGE_SIZE) and kind == TType.I32:
            sizes[field] = protocol.readI32()
        else:
            protocol.skip(kind)  # depth-limited (64 levels)
        protocol.readFieldEnd()
    protocol.readStructEnd()
    return (sizes.get(UNCOMPRESSED_PAGE_SIZE), sizes.get(COMPRESSED_PAGE_SIZE)), buffer.cstringio_buf.tell()


def page_detail(name: str, pages: list[LargePage], limit: int) -> dict[int, tuple[set[str], str]]:
    """Per row group holding large pages: the columns left unread, and why its rows are quarantined."""
    by_group: dict[int, list[LargePage]] = {}
    for page in pages:
        by_group.setdefault(page.row_group, []).append(page)
    return {
        group: (
            {p.column for p in held},
            f"{PAGE_TOO_LARGE}: row group {group} of {name} ({held[0].rows} rows) has "
            + ", ".join(f"a page of {p.page_bytes} bytes in column {p.leaf}" for p in held)
            + f", over the line limit of {limit} bytes (REPLICA_LENS_MAX_LINE_BYTES); its rows are read without "
            + ", ".join(sorted({p.column for p in held})),
        )
        for group, held in sorted(by_group.items())
    }


def guarded_batches(fs, path: str, schema: pa.Schema, large: dict[int, tuple[set[str], str]]) -> Iterator[pa.RecordBatch]:
    """The file's rows as ``schema`` (the file's columns as Spark reads them, then the two marker columns).

    A row group in ``large`` is read without its large columns (null), each row carrying the
    row group's detail; one pyarrow cannot convert to ``schema`` is one row carrying the error.
    """
    columns = [f for f in schema if f.name not in (LARGE_PAGE_FIELD, UNREADABLE_FIELD)]
    with fs.open_input_file(path) as handle:
        parquet = pq.ParquetFile(handle)
        for group in range(parquet.metadata.num_row_groups):
            unread, detail = large.get(group, (set(), None))
            rows = parquet.metadata.row_group(group).num_rows
            try:
                table = parquet.read_row_group(group, columns=[f.name for f in columns if f.name not in unread])
                arrays = [
                    pa.nulls(rows, f.type) if f.name in unread else table.column(f.name).cast(f.type, safe=False)
                    for f in columns
                ]
                marker = pa.array([detail] * rows, pa.string())
                yield pa.RecordBatch.from_arrays(
                    [a.combine_chunks() if isinstance(a, pa.ChunkedArray) else a for a in arrays]
                    + [marker, pa.nulls(rows, pa.string())],
                    schema=schema,
                )
            except (pa.ArrowException, ValueError) as exc:
                error = f"row group {group} ({rows} rows) cannot be read as Spark reads this schema: {exc}"
                yield pa.RecordBatch.from_arrays(
                    [pa.nulls(1, f.type) for f in columns] + [pa.nulls(1, pa.string()), pa.array([error], pa.string())],
                    schema=schema,
                )


# Spark's Python workers receive this module by value with each task.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
