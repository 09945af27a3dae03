"""JSONL lines over the line limit, on the executors' side and without Spark (``pipelines/ingest/long_lines.py``,
``pipelines/ingest/gzip_lines.py``): found where they stand, kept as a prefix, never held whole.

The Spark side (which files go to which reader, the rows judged LINE_TOO_LONG and accounted) is in
tests/test_ingest_fuzz.py, whose generated snapshots draw small line limits on every reader's path.
"""
from __future__ import annotations

import gzip
import tracemalloc
import zlib

import pyarrow.fs as pafs
from hypothesis import given, settings
from hypothesis import strategies as st

import pipelines.ingest.gzip_lines as gz
from pipelines.ingest.gzip_lines import UTF8_BOM, has_long_line
from pipelines.ingest.long_lines import LINE_TOO_LONG, PREFIX_BYTES, LongLine, find_long_lines
from tests.examples import examples

BLANK = b" \t\n\x0b\f\r"
MIB = 1024 * 1024


def reference(data: bytes, limit: int, rows: bool = False) -> list:
    """By the rule, from the whole text: the lines over ``limit`` (bytes before the LF; a leading BOM is no line's and
    offsets count from after it) as ``LongLine``; with ``rows``, every other non-blank line too, as the executors'
    line reader yields them."""
    lines = data.removeprefix(UTF8_BOM).split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    out, start = [], 0
    for number, line in enumerate(lines, 1):
        if len(line) > limit:
            out.append(LongLine(number, start, len(line), line[:PREFIX_BYTES]))
        elif rows and line.strip(BLANK):
            out.append(line.removesuffix(b"\r"))
        start += len(line) + 1
    return out


LINE = st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")) | st.sampled_from([b"", b" \r", b"\r", b"x" * 1500])


@st.composite
def texts(draw) -> tuple[bytes, list[int], int]:
    lines = draw(st.lists(LINE, max_size=8))
    data = (UTF8_BOM if draw(st.booleans()) else b"") + b"\n".join(lines) + (b"\n" if draw(st.booleans()) else b"")
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=5)))
    return data, cuts, draw(st.sampled_from([1, 2, 5, 17, 40, 1024]))


def pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)]) if b > a]


@settings(max_examples=examples(300), deadline=None)
@given(texts())
def test_the_long_lines_of_a_plain_file_are_found_whatever_its_chunks(case):
    # Catches: a long line missed when it spans chunks or lies inside one, a wrong line number or offset
    # (a BOM, a CR, an unterminated last line), a prefix cut at a chunk boundary.
    data, cuts, limit = case
    assert list(find_long_lines(gz._without_bom(iter(pieces(data, cuts))), limit)) == reference(data, limit)


@settings(max_examples=examples(200), deadline=None)
@given(texts(), st.sampled_from([3, 16, 1 << 20]))
def test_gzip_lines_give_each_line_over_the_limit_as_a_long_line(tmp_path_factory, case, chunk):
    # Catches: a long gzip line held whole or split into rows, the lines around it shifted or lost, blank lines
    # kept, a long line inside one decompressed chunk (a limit below the chunk size) let through.
    data, cuts, limit = case
    path = tmp_path_factory.mktemp("gz") / "x.jsonl.gz"
    path.write_bytes(b"".join(gzip.compress(p) for p in pieces(data, cuts)) or gzip.compress(b""))
    previous, gz._CHUNK = gz._CHUNK, chunk
    try:
        got = [row for rows in gz.gzip_lines(pafs.LocalFileSystem(), str(path), limit) for row in rows]
    finally:
        gz._CHUNK = previous
    assert got == reference(data, limit, rows=True)


def _gzip_of_one_line(length: int, tail: bytes) -> bytes:
    """A gzip member of ``{"pad": "xxx...`` ``length`` bytes long, then LF and ``tail``: compressed as it is made."""
    deflate = zlib.compressobj(1, zlib.DEFLATED, 31)
    out = [deflate.compress(b'{"pad": "')]
    block = b"x" * MIB
    for _ in range((length - 9) // MIB):
        out.append(deflate.compress(block))
    out.append(deflate.compress(b"x" * ((length - 9) % MIB) + b"\n" + tail))
    out.append(deflate.flush())
    return b"".join(out)


def test_a_gzip_line_of_a_quarter_gibibyte_costs_the_reader_a_few_mebibytes(tmp_path):
    # Catches: the decompression unbounded (a member of a quarter of a megabyte expanded in one call), or the
    # line's pieces kept until its LF: either holds the whole line.
    length = 256 * MIB
    path = tmp_path / "bomb.jsonl.gz"
    path.write_bytes(_gzip_of_one_line(length, b'{"after": 1}\n'))
    assert path.stat().st_size < 2 * MIB
    warm = tmp_path / "warm.jsonl.gz"  # the first read's one-off allocations (imports, buffers) are not the line's
    warm.write_bytes(gzip.compress(b"{}\n"))
    list(gz.gzip_file_batches(pafs.LocalFileSystem(), str(warm), "warm.jsonl.gz", 4 * MIB))
    tracemalloc.start()
    try:
        batches = list(gz.gzip_file_batches(pafs.LocalFileSystem(), str(path), "bomb.jsonl.gz", 4 * MIB))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    rows = [row for batch in batches for row in batch.to_pylist()]
    assert [r["decoded_reason"] for r in rows] == [LINE_TOO_LONG, None]
    assert rows[0]["raw"] == (b'{"pad": "' + b"x" * PREFIX_BYTES)[:PREFIX_BYTES]
    assert f"line 1 (byte 0 of the file) is {length} bytes long" in rows[0]["read_error"]
    assert rows[1]["raw"] == b'{"after": 1}'
    # About the limit (the pieces kept until the line passes it) and a few chunks: not the line.
    assert peak < 16 * MIB, f"peak {peak / MIB:.1f} MiB"


def test_a_plain_file_is_probed_and_split_a_chunk_at_a_time(tmp_path):
    # Catches: the probe or the reader holding the file (or the line) whole, a line counted from the wrong LF, the
    # probe missing a long last line without LF.
    path = tmp_path / "a.jsonl"
    with path.open("wb") as out:
        out.write(b'{"a": 1}\n')
        for _ in range(64):
            out.write(b"y" * MIB)
        out.write(b'\n{"b": 2}\n' + b"z" * 2000)
    fs = pafs.LocalFileSystem()
    tracemalloc.start()
    try:
        probed = has_long_line(fs, str(path), 4 * MIB)
        rows = [row for batch in gz.plain_file_batches(fs, str(path), "a.jsonl", 1024) for row in batch.to_pylist()]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert probed
    assert [(r["decoded_reason"], len(r["raw"])) for r in rows] == [
        (None, 8), (LINE_TOO_LONG, PREFIX_BYTES), (None, 8), (LINE_TOO_LONG, PREFIX_BYTES)
    ]
    assert f"line 2 (byte 9 of the file) is {64 * MIB} bytes long" in rows[1]["read_error"]
    assert f"line 4 (byte {9 + 64 * MIB + 10} of the file) is 2000 bytes long" in rows[3]["read_error"]
    assert peak < 40 * MIB, f"peak {peak / MIB:.1f} MiB"
    assert not has_long_line(fs, str(path), 64 * MIB) and has_long_line(fs, str(path), 64 * MIB - 1)
    last = tmp_path / "b.jsonl"
    last.write_bytes(b'{"a": 1}\n' + b"z" * 2000)  # only the last line, without LF, is long
    assert has_long_line(fs, str(last), 1999) and not has_long_line(fs, str(last), 2000)


def test_the_line_limit_comes_from_the_landing_resource_or_the_environment_within_its_bounds(tmp_path, monkeypatch):
    # Catches: the setting ignored (the default always), the field losing to the environment, and a limit no
    # reader can keep (below a kilobyte: every message a LINE_TOO_LONG row; 2 GiB or more: no Spark string holds it).
    import pydantic
    import pytest

    from pipelines.ingest.long_lines import DEFAULT_MAX_LINE_BYTES, MAX_MAX_LINE_BYTES
    from resources.errors import InvalidSetting
    from resources.landing import MAX_LINE_BYTES_ENV, LandingZone

    monkeypatch.delenv(MAX_LINE_BYTES_ENV, raising=False)
    assert LandingZone(root=str(tmp_path)).line_limit() == DEFAULT_MAX_LINE_BYTES
    monkeypatch.setenv(MAX_LINE_BYTES_ENV, "4096")
    assert LandingZone(root=str(tmp_path)).line_limit() == 4096
    assert LandingZone(root=str(tmp_path), max_line_bytes=2048).line_limit() == 2048
    for bad in ("1023", str(MAX_MAX_LINE_BYTES + 1), "64M"):
        monkeypatch.setenv(MAX_LINE_BYTES_ENV, bad)
        with pytest.raises(InvalidSetting, match=MAX_LINE_BYTES_ENV):
            LandingZone(root=str(tmp_path)).line_limit()
    with pytest.raises(pydantic.ValidationError):
        LandingZone(root=str(tmp_path), max_line_bytes=1023)
