"""Ingestion under random and mutated input: whatever the files hold, every row is counted once,
accepted (by ``copies``) or quarantined, and what is accepted fits the model.

The expected row count is computed here from the bytes written, by the rule of
pipelines/ingest/reading.py's docstring: a JSONL line ends at LF (a CR before it belongs to the
CRLF ending), a UTF-8 BOM opening a file is dropped, and a line of only ASCII whitespace is
blank; every other line is a row. A Parquet row is a row; an unreadable file, or the
unreadable rest of a broken gzip file, is one row.
"""
from __future__ import annotations

import gzip
import json
import tempfile
import zlib
from pathlib import Path

import pyarrow as pa
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from pipelines.ingest import accounting_from_tables, judge_rows, read_snapshot_lines, validate_rows
from pipelines.ingest.long_lines import DEFAULT_MAX_LINE_BYTES, LINE_TOO_LONG, PREFIX_BYTES
from schemas.raw import KINDS, MESSAGE_FIELDS, NON_NEGATIVE, QUARANTINE_REASONS, RawTopicQuarantine, RawTopicSnapshots
from schemas.validation import validation_errors
from tests.examples import examples
from tests.test_ingest import spec_arrow_schema, write_parquet

SNAPSHOT = "fuzz"
UTF8_BOM = b"\xef\xbb\xbf"
ASCII_WHITESPACE = b" \t\n\x0b\x0c\r"
MAX_PARTITION_BYTES = "spark.sql.files.maxPartitionBytes"

# Lines that look blank, or end a line, to a reader that knows Unicode (or to Java's regex
# "$"), but hold more than ASCII whitespace: each is a row. The bytes are not UTF-8 (a lone
# BOM aside).
ODD_LINES = [
    "\u0085", "\u2028", "  \u2028", "\u2029", "\r\u0085", "\u0085\r", "\x0b\u2028", "\t\u00a0", "\u00a0",
    "\ufeff", " \u3000 ", "\u200b", "\u180e", "\x00", "\x1c", "\x1d\x1e", "\x1f", "a\rb", "\r{}",
    '{"kind": "PUT"}\r{"kind": "PUT"}', '{"kind":\r"PUT"}',
    b"\xc2", b"\x85", b"\xff\xfe", b"\xed\xa0\x80", b"\xc0\x8a", b"\xe2\x80", b"\xef\xbb", UTF8_BOM, b"\r\xff\r",
]
BLANK_LINES = ["", " ", "\t", " \t \x0b", "\x0c", "\r", " \r \r"]
SHAPES = ["{}", '\ufeff{"kind": "PUT"}', "[]", "null", "1", '"PUT"', "{", "}", '{"a": 1}, {"a": 2}', "[{}]", "{}] tail"]

# No LF: it would end the line. No lone surrogates: not encodable.
TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n"), max_size=12)
SMALL_TEXT = st.one_of(st.sampled_from(["k1", "k2", "v", "é", "鍵", "\u2028", "\u0085", "a b", ""]), TEXT)
JSON_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    SMALL_TEXT,
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(SMALL_TEXT, inner, max_size=3)),
    max_leaves=6,
)
POSITION_FIELDS = ("replica", "topic", "partition", "offset")
INT32_MAX = 2**31 - 1

# An item is a dict (a row every format can hold: JSON line or Parquet row) or the text or
# bytes of one JSONL line.
Item = dict | str | bytes


@st.composite
def spec_rows(draw) -> dict:
    """A row that SPEC section 1 accepts; small value ranges so that positions often collide."""
    kind = draw(st.sampled_from(KINDS))
    nat = st.integers(min_value=0, max_value=40)
    row = {
        "replica": draw(st.sampled_from(["dc-a", "dc-b", "dc-ü"])),
        "topic": draw(st.sampled_from(["t", "orders_v3"])),
        "partition": draw(st.integers(min_value=0, max_value=2)),
        "kind": kind,
    }
    if kind != "EXPORTER_POSITION":
        row["offset"] = draw(nat)
        if draw(st.booleans()):
            row["leader_epoch"] = draw(nat)
    if kind in ("PUT", "DELETE"):
        row.update(key=draw(SMALL_TEXT), source_region=draw(st.sampled_from(["dc-a", "dc-b"])), source_offset=draw(nat))
        if kind == "PUT":
            row["value"] = draw(SMALL_TEXT)
        if draw(st.booleans()):
            row["write_ts"] = draw(st.integers(min_value=0, max_value=2**62))
    elif kind == "HEARTBEAT":
        low, high = draw(nat), draw(nat)
        row.update(
            source_region=draw(st.sampled_from(["dc-a", "dc-b"])),
            source_offset=draw(nat),
            origin_ts_min_ms=low,
            origin_ts_max_ms=low + high,
            applied_ts_min_ms=low + 1,
            applied_ts_max_ms=low + high + 1,
        )
        if draw(st.booleans()):
            row["hb_vector"] = draw(st.dictionaries(st.sampled_from(["dc-a", "dc-b"]), nat, max_size=2))
    elif kind == "EXPORTER_POSITION":
        row.update(exporter=draw(st.sampled_from(["cdc-1", "cdc-2"])), exported_offset=draw(nat), reported_at_ms=draw(nat))
    return row


MUTATIONS = [
    "keep", "drop", "negative", "unknown_kind", "duplicate", "conflict",  # still rows a Parquet file can hold
    "retype", "extra", "truncate", "long", "garbage", "garbage_bytes", "shape", "odd",  # JSONL lines only
]


@st.composite
def mutated_items(draw) -> list[Item]:
    """One valid row, then maybe broken in one way: the items it becomes (a duplicate makes several)."""
    row = draw(spec_rows())
    mutation = draw(st.sampled_from(MUTATIONS))
    if mutation == "drop":
        del row[draw(st.sampled_from(sorted(row)))]
    elif mutation == "negative":
        name = draw(st.sampled_from([*NON_NEGATIVE, "hb_vector"]))
        amount = draw(st.integers(min_value=1, max_value=INT32_MAX if name == "partition" else 2**63))
        row[name] = {"dc-a": -amount} if name == "hb_vector" else -amount
    elif mutation == "unknown_kind":
        row["kind"] = draw(SMALL_TEXT.filter(lambda k: k not in KINDS))
    elif mutation == "duplicate":
        return [row] * draw(st.integers(min_value=2, max_value=3))
    elif mutation == "conflict" and "offset" in row:
        return [row, {**row, "leader_epoch": row.get("leader_epoch", 0) + 1}]
    elif mutation == "retype":
        row[draw(st.sampled_from(list(MESSAGE_FIELDS)))] = draw(JSON_VALUES)
        return [json.dumps(row, ensure_ascii=draw(st.booleans()))]
    elif mutation == "extra":
        row[draw(SMALL_TEXT.filter(lambda k: k not in MESSAGE_FIELDS))] = draw(JSON_VALUES)
        return [json.dumps(row, ensure_ascii=draw(st.booleans()))]
    elif mutation == "truncate":
        text = json.dumps(row, ensure_ascii=draw(st.booleans()))
        return [text[: draw(st.integers(min_value=0, max_value=len(text) - 1))]]
    elif mutation == "long":
        # Longer than Hadoop's 64 KiB read buffer at the top of the range.
        return [json.dumps({**row, "pad": "x" * draw(st.integers(min_value=1_000, max_value=70_000))})]
    elif mutation == "garbage":
        return [draw(TEXT)]
    elif mutation == "garbage_bytes":
        return [draw(st.binary(max_size=16).map(lambda b: b.replace(b"\n", b"")))]
    elif mutation == "shape":
        return [draw(st.sampled_from(SHAPES))]
    elif mutation == "odd":
        return [draw(st.sampled_from(ODD_LINES))]
    return [row]


# --- writing the files, and counting their rows from the bytes written ------------------


def is_row(line: bytes, limit: int) -> bool:
    """Whether a line (its bytes before the LF) is a row: not blank, or over the line limit (a LINE_TOO_LONG row)."""
    return line.strip(ASCII_WHITESPACE) != b"" or len(line) > limit


def jsonl_rows(data: bytes, limit: int = DEFAULT_MAX_LINE_BYTES) -> tuple[int, int]:
    """The rows of a JSONL file's bytes: its non-blank LF-terminated lines (the last may lack the LF), and how many
    of them are over the line limit."""
    lines = data.removeprefix(UTF8_BOM).split(b"\n")
    if lines[-1] == b"":
        lines.pop()  # a final LF ends the last line; it does not open one
    return sum(is_row(line, limit) for line in lines), sum(len(line) > limit for line in lines)


def broken_gzip_rows(cut: bytes, limit: int = DEFAULT_MAX_LINE_BYTES) -> tuple[int, int]:
    """The rows of a gzip file cut short: its complete non-blank lines, plus one for the lost rest; and how many of
    the complete ones are over the line limit."""
    readable = zlib.decompressobj(31).decompress(cut)
    complete = readable.removeprefix(UTF8_BOM).split(b"\n")[:-1]
    return sum(is_row(line, limit) for line in complete) + 1, sum(len(line) > limit for line in complete)


def jsonl_bytes(items: list[Item], layout: dict) -> bytes:
    out = []
    for i, item in enumerate(items):
        if isinstance(item, dict):
            item = json.dumps(item, ensure_ascii=layout["ascii"])
        out.append(item if isinstance(item, bytes) else item.encode("utf-8"))
        last = i == len(items) - 1
        if not last or layout["final_newline"]:
            out.append(layout["endings"][i % len(layout["endings"])])
    return (UTF8_BOM if layout["bom"] else b"") + b"".join(out)


def parquet_file(path: Path, rows: list[dict], variant: str) -> None:
    schema = spec_arrow_schema()
    if variant.startswith("string_"):
        # One number column stored as text: BAD_TYPE on every row that has it.
        name = variant.removeprefix("string_")
        schema = schema.set(schema.get_field_index(name), pa.field(name, pa.string()))
        rows = [{**r, name: str(r[name])} if r.get(name) is not None else r for r in rows]
    elif variant == "extra_column":
        schema = schema.append(pa.field("trace", pa.string()))
        rows = [{**r, "trace": f"t{i}"} for i, r in enumerate(rows)]
    write_parquet(path, rows, schema)


FORMATS = ["jsonl", "jsonl.gz", "broken.jsonl.gz", "parquet", "garbage.parquet"]
PARQUET_VARIANTS = ["spec", "extra_column", *[f"string_{n}" for n in ("offset", "source_offset", "write_ts")]]


@st.composite
def snapshots(draw) -> dict:
    """Items spread over one to four files of every format; how each file is laid out."""
    items: list[Item] = [i for group in draw(st.lists(mutated_items(), min_size=1, max_size=25)) for i in group]
    items = draw(st.permutations(items + draw(st.lists(st.sampled_from(BLANK_LINES), max_size=4))))
    formats = draw(st.lists(st.sampled_from(FORMATS), min_size=1, max_size=4))
    if not any(f.startswith("jsonl") or f == "broken.jsonl.gz" for f in formats):
        formats[0] = draw(st.sampled_from(["jsonl", "jsonl.gz"]))
    names = [f"part-{i}.{fmt}" for i, fmt in enumerate(formats)]
    text_files = [n for n in names if ".jsonl" in n]
    row_files = [n for n in names if "garbage" not in n]
    files = {name: {"items": [], "layout": {}} for name in names}
    for item in items:
        name = draw(st.sampled_from(row_files if isinstance(item, dict) else text_files))
        files[name]["items"].append(item)
    for name, spec in files.items():
        spec["layout"] = {
            "ascii": draw(st.booleans()),
            "bom": draw(st.booleans()),
            "final_newline": draw(st.booleans()),
            "endings": draw(st.sampled_from([[b"\n"], [b"\r\n"], [b"\n", b"\r\n"], [b"\r\n", b"\n", b"\n"]])),
            "parquet": draw(st.sampled_from(PARQUET_VARIANTS)),
            "cut": draw(st.floats(min_value=0.05, max_value=0.95)),
        }
    # Small splits make Spark's LF-delimited reader find lines across split boundaries. A small line limit makes
    # some lines too long (a JSON row is 60-200 bytes), on every reader's path, across splits too.
    return {"files": files, "split_bytes": draw(st.sampled_from([None, None, 997, 8192])),
            "line_limit": draw(st.sampled_from([DEFAULT_MAX_LINE_BYTES, DEFAULT_MAX_LINE_BYTES, 64, 150]))}


def write_snapshot(folder: Path, files: dict, limit: int = DEFAULT_MAX_LINE_BYTES) -> tuple[dict[str, int], dict[str, int]]:
    """Write the files and ``_SUCCESS``; return how many rows each holds, and how many lines over ``limit``."""
    folder.mkdir(parents=True)
    rows: dict[str, int] = {}
    long: dict[str, int] = {}
    for name, spec in files.items():
        items, layout, path = spec["items"], spec["layout"], folder / name
        if name.endswith("garbage.parquet"):
            path.write_bytes(b"PAR1 not parquet at all PAR1")
            rows[name] = 1
        elif name.endswith(".parquet"):
            parquet_file(path, items, layout["parquet"])
            rows[name] = len(items)
        else:
            data = jsonl_bytes(items, layout)
            if name.endswith("broken.jsonl.gz"):
                whole = gzip.compress(data)
                cut = whole[: max(1, min(len(whole) - 1, int(len(whole) * layout["cut"])))]
                path.write_bytes(cut)
                rows[name], long[name] = broken_gzip_rows(cut, limit)
            elif name.endswith(".gz"):
                path.write_bytes(gzip.compress(data))
                rows[name], long[name] = jsonl_rows(data, limit)
            else:
                path.write_bytes(data)
                rows[name], long[name] = jsonl_rows(data, limit)
    (folder / "_SUCCESS").write_bytes(b"")
    return rows, long


def check_accounting(
    spark, folder: Path, expected: dict[str, int], long: dict[str, int] | None = None,
    limit: int = DEFAULT_MAX_LINE_BYTES,
) -> None:
    lines = read_snapshot_lines(spark, str(folder), max_line_bytes=limit)
    read = lines.groupBy("source_file").agg(F.count(F.lit(1)).alias("n")).collect()
    per_file = {r["source_file"]: r["n"] for r in read}
    assert per_file == {name: n for name, n in expected.items() if n}, "rows read per file"
    # Each line over the limit is one row, never whole: its reason, where it stood and its first bytes only.
    too_long = lines.where(F.col("decoded_reason") == LINE_TOO_LONG).select(
        "source_file", F.octet_length("raw").alias("kept"), "read_error"
    ).collect()
    found = {name: sum(r["source_file"] == name for r in too_long) for name in expected}
    assert found == {name: (long or {}).get(name, 0) for name in expected}, "lines over the limit per file"
    assert all(r["kept"] <= PREFIX_BYTES and "over the limit" in r["read_error"] for r in too_long)

    # As the asset does: the accepted rows first, then the quarantine their pass's observations call for, which judges
    # only the lines in the buckets of quarantined lines; it must hold the rows that judging every line quarantines.
    judgement = judge_rows(lines, SNAPSHOT)
    accepted = judgement.accepted.cache()
    quarantined = None
    try:
        accepted_rows = accepted.collect()
        quarantined = judgement.quarantine().cache()
        quarantined_rows = quarantined.collect()
        every_line = sorted(repr(tuple(r)) for r in judgement.quarantined.collect())
        assert sorted(repr(tuple(r)) for r in quarantined_rows) == every_line, "not what judging every line quarantines"
        assert sum(r["reason"] == LINE_TOO_LONG for r in quarantined_rows) == sum((long or {}).values())
        copies = sum(r["copies"] for r in accepted_rows)
        total = sum(expected.values())
        assert copies + len(quarantined_rows) == total, (
            f"{total} rows written, but {copies} accepted + {len(quarantined_rows)} quarantined"
        )
        counts = accounting_from_tables(accepted, quarantined)
        assert (counts["rows_read"], counts["rows_accepted"], counts["rows_quarantined"]) == (
            total,
            copies,
            len(quarantined_rows),
        )
        positions = [tuple(r[f] for f in POSITION_FIELDS) for r in accepted_rows if r["offset"] is not None]
        assert len(positions) == len(set(positions)), "an accepted position holds two different rows"
        assert validation_errors(RawTopicSnapshots, accepted) == []
        # The quarantine model's checks, on the rows already collected (pandera would rescan).
        assert all(
            r["snapshot_id"] == SNAPSHOT and r["source_file"] and r["reason"] in QUARANTINE_REASONS
            for r in quarantined_rows
        )
        assert [(f.name, f.dataType) for f in quarantined.schema] == [
            (f.name, f.dataType) for f in RawTopicQuarantine.to_structtype()
        ]
    finally:
        accepted.unpersist()
        if quarantined is not None:
            quarantined.unpersist()


def ingest_written(spark, snapshot: dict) -> None:
    previous = spark.conf.get(MAX_PARTITION_BYTES)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / SNAPSHOT
        limit = snapshot.get("line_limit", DEFAULT_MAX_LINE_BYTES)
        expected, long = write_snapshot(folder, snapshot["files"], limit)
        try:
            if snapshot["split_bytes"]:
                spark.conf.set(MAX_PARTITION_BYTES, str(snapshot["split_bytes"]))
            check_accounting(spark, folder, expected, long, limit)
        finally:
            spark.conf.set(MAX_PARTITION_BYTES, previous)


def _odd_snapshot() -> dict:
    """Every odd line once, each after a valid message, through each line reader: Spark's
    (small splits, BOM, mixed CRLF and LF endings) and the Python salvage of a broken gzip."""
    put = {"replica": "dc-a", "topic": "t", "partition": 0, "kind": "PUT", "key": "k", "value": "v",
           "source_region": "dc-a", "source_offset": 0}
    files = {}
    for n, fmt in enumerate(["jsonl", "jsonl.gz", "broken.jsonl.gz"]):
        items: list[Item] = []
        for i, line in enumerate([*ODD_LINES, *BLANK_LINES]):
            items += [{**put, "offset": 1000 * n + i}, line]
        layout = {"ascii": False, "bom": n != 1, "final_newline": False, "endings": [b"\r\n", b"\n"], "parquet": "spec",
                  "cut": 0.9}
        files[f"odd-{n}.{fmt}"] = {"items": items, "layout": layout}
    return {"files": files, "split_bytes": 97}


@settings(
    max_examples=examples(6),
    deadline=None,
    # A failing example is reported as found: shrinking Spark-backed examples takes minutes.
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)
@example(snapshot=_odd_snapshot())
@given(snapshot=snapshots())
def test_every_row_is_accepted_or_quarantined(spark, snapshot):
    ingest_written(spark, snapshot)


# --- the odd lines found, one by one ------------------------------------------------------


def _rows_of(spark, folder: Path) -> list[str | None]:
    return sorted((r["raw"] for r in read_snapshot_lines(spark, str(folder)).collect()), key=lambda raw: raw or "")


LOOK_BLANK = ["\u0085", "\u2028", "  \u2028", "\u2029", "\r\u0085", "\x1c", "\x00", "\ufeff"]


def test_a_line_that_only_looks_blank_is_a_quarantined_row(spark, tmp_path):
    """A line of NEL, U+2028 or U+2029 (which end a line for Java's regex "$") or of another
    character that is not ASCII whitespace is a row: MALFORMED_JSON, never silently dropped."""
    data = "".join(f'{{"kind": "PUT"}}\n{line}\n \t\r\n' for line in LOOK_BLANK).encode()
    folder = tmp_path / SNAPSHOT
    folder.mkdir()
    (folder / "a.jsonl").write_bytes(data)
    (folder / "b.jsonl.gz").write_bytes(gzip.compress(data))
    accepted, quarantined = validate_rows(read_snapshot_lines(spark, str(folder)), SNAPSHOT)
    assert accepted.count() == 0
    quarantined_rows = quarantined.collect()
    for name in ("a.jsonl", "b.jsonl.gz"):
        rows = sorted((r["raw"], r["reason"]) for r in quarantined_rows if r["source_file"] == name)
        expected = [('{"kind": "PUT"}', "MISSING_FIELD")] * len(LOOK_BLANK)
        expected += [(line, "MALFORMED_JSON") for line in LOOK_BLANK]
        assert rows == sorted(expected), name


def test_lines_end_at_lf_only_and_crlf_loses_its_cr(spark, tmp_path):
    folder = tmp_path / SNAPSHOT
    folder.mkdir()
    data = UTF8_BOM + b'{"kind": "A"}\r\n{"kind":\r"B"}\r\r\na\rb\n\r\n \r \n{"kind": "C"}'
    (folder / "a.jsonl").write_bytes(data)
    # The same bytes through the Python salvage of a gzip file that lost its trailer.
    (folder / "b.jsonl.gz").write_bytes(gzip.compress(data + b"\n")[:-8])
    rows = _rows_of(spark, folder)
    text_rows = ['a\rb', '{"kind": "A"}', '{"kind": "C"}', '{"kind":\r"B"}\r']
    assert rows == sorted([*text_rows, *text_rows, None], key=lambda raw: raw or "")


def test_invalid_utf8_and_a_very_long_line_are_one_row_each(spark, tmp_path):
    folder = tmp_path / SNAPSHOT
    folder.mkdir()
    long_line = b'{"kind": "PUT", "pad": "' + b"x" * 3_000_000 + b'"}'
    (folder / "a.jsonl").write_bytes(b"\xff\xfe\r\n" + long_line + b"\r\n\xc0\x8a\n")
    previous = spark.conf.get(MAX_PARTITION_BYTES)
    spark.conf.set(MAX_PARTITION_BYTES, str(1 << 20))  # the long line spans several splits
    try:
        lines = read_snapshot_lines(spark, str(folder))
        lengths = sorted(r["n"] for r in lines.select(F.octet_length("raw").alias("n")).collect())
    finally:
        spark.conf.set(MAX_PARTITION_BYTES, previous)
    assert lengths == [2, 2, len(long_line)]
