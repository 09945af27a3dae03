"""Parquet pages over the line limit (pipelines/ingest/parquet_pages.py), found from page headers and read around, no Spark.

The files are written by pyarrow with a page cut after every value (``write_batch_size=1``,
``data_page_size=1``), so each value's page holds it alone: a row group has a page over the
limit exactly when one of its values is longer than the limit (a page adds a few bytes of
length prefix and levels to its value; lengths are drawn away from that margin).
"""
from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyarrow import fs as pafs
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from pipelines.ingest.parquet_pages import (
    COMPRESSED_PAGE_SIZE,
    LARGE_PAGE_FIELD,
    PAGE_TOO_LARGE,
    UNCOMPRESSED_PAGE_SIZE,
    UNREADABLE_FIELD,
    UnreadablePages,
    guarded_batches,
    large_pages,
    page_detail,
    page_header_sizes,
)

LIMIT = 4096
MARGIN = 64  # a page's bytes beside its one value: length prefix, definition levels, their length
SCHEMA = pa.schema([("offset", pa.int64()), ("key", pa.string()), ("value", pa.string()),
                    ("hb_vector", pa.map_(pa.string(), pa.int64()))])


class CountingFile(io.BytesIO):
    """A file that counts its reads (the page walk's cost)."""

    reads = 0

    def read(self, *args):
        self.reads += 1
        return super().read(*args)


def _written(lengths: list[int], rows_per_group: int, compression: str) -> bytes:
    rows = [{"offset": i, "key": f"k{i}", "value": "v" * n, "hb_vector": [("dc-a", i)]} for i, n in enumerate(lengths)]
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), sink, row_group_size=rows_per_group, compression=compression,
                   use_dictionary=False, write_batch_size=1, data_page_size=1)
    return sink.getvalue()


def _header(uncompressed: int, compressed: int, statistics: bytes = b"") -> bytes:
    """A PageHeader (type DATA_PAGE, the two sizes, then, given ``statistics``, a data page header whose statistics
    hold them as the maximum value), as Parquet writers encode it."""
    from thrift.protocol.TCompactProtocol import TCompactProtocol
    from thrift.protocol.TProtocol import TType
    from thrift.transport.TTransport import TMemoryBuffer

    out = TMemoryBuffer()
    p = TCompactProtocol(out)
    p.writeStructBegin("PageHeader")
    for field, value in ((1, 0), (UNCOMPRESSED_PAGE_SIZE, uncompressed), (COMPRESSED_PAGE_SIZE, compressed)):
        p.writeFieldBegin("", TType.I32, field)
        p.writeI32(value)
        p.writeFieldEnd()
    if statistics:
        p.writeFieldBegin("data_page_header", TType.STRUCT, 5)
        p.writeStructBegin("DataPageHeader")
        for field in (1, 2, 3, 4):  # num_values and three encodings
            p.writeFieldBegin("", TType.I32, field)
            p.writeI32(1 if field == 1 else 0)
            p.writeFieldEnd()
        p.writeFieldBegin("statistics", TType.STRUCT, 5)
        p.writeStructBegin("Statistics")
        p.writeFieldBegin("max_value", TType.STRING, 5)
        p.writeBinary(statistics)
        p.writeFieldEnd()
        p.writeFieldStop()
        p.writeStructEnd()
        p.writeFieldEnd()
        p.writeFieldStop()
        p.writeStructEnd()
        p.writeFieldEnd()
    p.writeFieldStop()
    p.writeStructEnd()
    return out.getvalue()


def test_a_header_is_read_within_its_bytes_and_binary_statistics_are_skipped():
    # Catches: a reader that goes past the bytes it was given when a header is cut short (fastparquet's Cython reader
    # did: the process crashed now and then, with a segmentation fault, on a header cut at the window's end), one
    # that reads a cut header as whole (sizes from whatever memory follows), and statistics that are not UTF-8 (a
    # binary column's) refused as garbage.
    statistics = bytes(range(256)) * 40  # not UTF-8; 10 KiB
    header = _header(LIMIT * 3, LIMIT, statistics)
    assert page_header_sizes(header + b"page bytes") == ((LIMIT * 3, LIMIT), len(header))
    for cut in (1, 2, 5, 12, len(header) // 2, len(header) - 1):
        with pytest.raises(EOFError):
            page_header_sizes(header[:cut])


lengths = st.one_of(st.integers(0, LIMIT - MARGIN), st.integers(LIMIT + 1, 3 * LIMIT))


@settings(max_examples=60, deadline=None)
@given(st.lists(lengths, min_size=1, max_size=12), st.integers(1, 5), st.sampled_from(["none", "snappy", "zstd", "gzip"]))
def test_the_row_groups_with_a_page_over_the_limit_are_those_holding_a_longer_value(values, rows_per_group, compression):
    # Catches: a page missed (the dictionary page or the first data page skipped, the walk stopping early), a
    # compressed page judged by its compressed size (a repetitive gigabyte compresses to kilobytes), a row group
    # index or column named wrong, and a page flagged below the limit.
    file = CountingFile(_written(values, rows_per_group, compression))
    metadata = pq.read_metadata(file)
    found = large_pages(file, metadata, LIMIT)
    groups = [values[i:i + rows_per_group] for i in range(0, len(values), rows_per_group)]
    assert sorted((p.row_group, p.column, p.leaf) for p in found) == [
        (g, "value", "value") for g, held in enumerate(groups) if max(held) > LIMIT
    ]
    for page in found:
        assert max(groups[page.row_group]) < page.page_bytes <= max(groups[page.row_group]) + MARGIN
        assert page.rows == len(groups[page.row_group])


def test_chunks_within_the_limit_have_no_page_header_read():
    # Catches: every page header of every file read (a seek per page of every Parquet file on every audit).
    file = CountingFile(_written([10, 20, LIMIT // 4], 2, "zstd"))  # every chunk within the limit
    metadata = pq.read_metadata(file)
    file.reads = 0
    assert large_pages(file, metadata, LIMIT) == []
    assert file.reads == 0


@pytest.mark.parametrize("damage", ["garbage", "zeros", "truncated"])
def test_a_page_header_that_cannot_be_read_makes_the_file_unreadable(damage):
    # Catches: Thrift garbage raising whatever it trips on (an AttributeError out of the audit), a header of
    # zero sizes looping forever at one offset, or a page said to end past its chunk being followed.
    data = bytearray(_written([LIMIT * 2, 1], 2, "none"))
    metadata = pq.read_metadata(io.BytesIO(bytes(data)))
    chunk = metadata.row_group(0).column(2)
    start = chunk.data_page_offset
    if damage == "garbage":
        data[start:start + 16] = b"\xff" * 16
    elif damage == "zeros":
        data[start:start + 16] = b"\x00" * 16
    else:  # a header whose page runs past the end of its chunk: its own sizes, written with Thrift's compact protocol
        (uncompressed, _), length = page_header_sizes(bytes(data[start:start + 1024]))
        rewritten = _header(uncompressed, 1 << 30)
        data[start:start + length] = rewritten.ljust(length, b"\x00")
    with pytest.raises(UnreadablePages, match="page header at byte"):
        large_pages(io.BytesIO(bytes(data)), metadata, LIMIT)


def test_a_page_header_longer_than_its_first_window_is_read_whole(monkeypatch):
    # Catches: a header cut at the window's end parsed as it stands (pyarrow writes a page's statistics, its
    # min and max value, into the header: a long value makes a long header), so the next page is looked for
    # at a wrong offset and the file called unreadable, or its large page missed.
    monkeypatch.setattr("pipelines.ingest.parquet_pages.HEADER_WINDOW", 64)
    file = io.BytesIO(_written([LIMIT * 2, 3, LIMIT // 2], 3, "snappy"))
    (page,) = large_pages(file, pq.read_metadata(file), LIMIT)
    assert (page.row_group, page.column) == (0, "value")


def test_a_row_group_with_a_large_page_is_read_without_that_column_and_says_why(tmp_path):
    # Catches: the large column read all the same (the page held whole), the other row groups' rows changed or
    # dropped, a detail on rows of a row group without a large page, and rows not in the file's order.
    path = tmp_path / "d.parquet"
    path.write_bytes(_written([1, 2, LIMIT * 3, 4, 5], 2, "zstd"))
    with open(path, "rb") as handle:
        metadata = pq.read_metadata(handle)
        large = page_detail("d.parquet", large_pages(handle, metadata, LIMIT), LIMIT)
    assert list(large) == [1] and large[1][0] == {"value"}
    assert large[1][1].startswith(f"{PAGE_TOO_LARGE}: row group 1 of d.parquet (2 rows) has a page of ")
    spark_schema = T.StructType([T.StructField("offset", T.LongType()), T.StructField("key", T.StringType()),
                                 T.StructField("value", T.StringType()),
                                 T.StructField("hb_vector", T.MapType(T.StringType(), T.LongType())),
                                 T.StructField(LARGE_PAGE_FIELD, T.StringType()), T.StructField(UNREADABLE_FIELD, T.StringType())])
    rows = pa.Table.from_batches(
        list(guarded_batches(pafs.LocalFileSystem(), str(path), to_arrow_schema(spark_schema), large))
    ).to_pylist()
    assert [(r["offset"], r["key"], r["value"] is None, r[LARGE_PAGE_FIELD] is not None) for r in rows] == [
        (0, "k0", False, False), (1, "k1", False, False), (2, "k2", True, True), (3, "k3", True, True),
        (4, "k4", False, False),
    ]
    assert [r["value"] for r in rows if r["value"] is not None] == ["v", "vv", "vvvvv"]
    assert all(r["hb_vector"] == [("dc-a", r["offset"])] for r in rows) and not any(r[UNREADABLE_FIELD] for r in rows)


def test_a_row_group_that_does_not_convert_is_one_row_saying_so(tmp_path):
    # Catches: a conversion error out of the task (the Spark job failing, the whole snapshot with it).
    path = tmp_path / "e.parquet"
    path.write_bytes(_written([1, 2], 2, "none"))
    wrong = pa.schema([("offset", pa.int64()), ("key", pa.int32()), ("value", pa.string()),
                       ("hb_vector", pa.map_(pa.string(), pa.int64())), (LARGE_PAGE_FIELD, pa.string()),
                       (UNREADABLE_FIELD, pa.string())])
    (batch,) = guarded_batches(pafs.LocalFileSystem(), str(path), wrong, {})
    assert batch.num_rows == 1
    assert batch.column(UNREADABLE_FIELD)[0].as_py().startswith("row group 0 (2 rows) cannot be read as Spark reads")


def test_a_parquet_file_nested_deeper_than_its_reader_takes_is_one_unreadable_row(tmp_path):
    # Catches: a schema nested past pyarrow's depth limit (100 levels) raising out of the footer read and stopping
    # the audit, instead of the file becoming one UNREADABLE_FILE row that says why (no Spark is involved).
    from pipelines.ingest.reading import SnapshotFile, _parquet_tables

    nested, value = pa.int64(), 1
    for _ in range(60):  # a list is two levels
        nested, value = pa.list_(nested), [value]
    path = tmp_path / "deep.parquet"
    pq.write_table(pa.table({"offset": pa.array([0], pa.int64()), "deep": pa.array([value], nested)}), path)
    tables, unreadable = _parquet_tables(None, [SnapshotFile(str(path), "deep.parquet", "parquet")], LIMIT)
    assert tables == [] and len(unreadable) == 1
    name, raw, error = unreadable[0]
    assert (name, raw) == ("deep.parquet", None) and "too deeply nested" in error
