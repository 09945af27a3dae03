"""Ingestion of one complete snapshot folder: accepted rows, quarantined rows, and their accounting.

Reading (``read_snapshot_lines``) turns every file of the folder into text rows
``(source_file, raw, read_error)``: a JSONL line as it is, a Parquet row rendered as a
JSON object. So one validation path (``validate_rows``) judges every format: a Parquet
column whose type differs from SPEC 1 (an offset stored as a string, a float partition)
shows up as BAD_TYPE on each row, exactly as the same JSON line would.

Accounting, precisely:

    rows_read = non-blank JSONL lines + Parquet rows + one per unreadable file (or unreadable tail)
              = rows_accepted (sum of ``copies``) + rows_quarantined (rows of the quarantine)
                + rows_skipped (raw Venice records skipped by rule: rows of ``raw_topic_skipped``)

Raw Venice records: a Parquet file whose footer has the columns of Spark's Kafka source
(``key`` and ``value`` binary, ``topic``, ``partition``, ``offset``, ``timestamp``) plus
``region`` is decoded on the executors (``pipelines.venice_frame.venice_lines``): a record
that decodes to a SPEC 1 message becomes that message's JSON text and is judged like any
other row; one the decoder quarantines carries its reason (``decoded_reason``) into the
quarantine; one it skips by rule (``schemas.raw.SKIP_REASONS``) is dropped before judging
and counted by an observation of the accepted pass (``Judgement.skipped_by_reason``). Its
position was read all the same (SPEC 3a: not a gap): when the accepted pass saw skipped
records, ``read_skipped_positions`` reads them again, decoding only the control records, for
``raw_topic_skipped``. An upstream cluster id missing from the cluster -> region map fails the
Spark job, so nothing of the step is published.

A quarantined row keeps the position it names (``replica``, ``topic``, ``partition``,
``offset`` of RawTopicQuarantine, each when it has the field's JSON type): a position lost to
the quarantine, a gap of one position (``quarantined_positions``).

- A JSONL line ends at LF and only there; one CR before the LF is part of a CRLF ending.
  A UTF-8 byte order mark opening a file is dropped (Hadoop's line reader does so). A line
  that is empty or holds only ASCII whitespace (space, tab, LF, vertical tab, form feed,
  CR) is blank: it carries no message and is not a row. Every other line is a row whatever
  it holds (NUL, invalid UTF-8, a lone CR, NEL, U+2028/U+2029, a BOM later in the file):
  accepted or quarantined, MALFORMED_JSON at worst. Spark's text reader (``*.jsonl``) and
  the gzip reader (``pipelines/gzip_lines.py``, ``*.jsonl.gz``) apply this same rule, and
  both keep a line's bytes as they are (invalid UTF-8 included).
- A gzip file that breaks part-way (truncated, corrupt, trailing garbage) keeps its
  complete lines before the break; one UNREADABLE_FILE row (raw null) stands for the rest,
  whose lines cannot be counted. A Parquet file Spark or pyarrow cannot open is one
  UNREADABLE_FILE row.
- Only files directly inside the snapshot folder named ``*.jsonl``, ``*.jsonl.gz`` or
  ``*.parquet`` are data. ``_SUCCESS`` is the completion marker. Everything else
  (sub-folders, hidden or ``_``-prefixed files, other extensions) is not read and is
  listed in ``SnapshotFiles.other_files`` so the asset can show it.

Where the work runs: the driver lists the folder (names, sizes) and reads Parquet footers
(to group files by schema and find unreadable ones); nothing else of a file passes through
it. JSONL and Parquet files are read by Spark. Gzip files are read in Spark's Python
workers, one task per file (``_gzip_lines``: ``mapInArrow`` over ``pipelines/gzip_lines.py``,
shipped by value): each task streams its file through zlib once, yielding its lines and,
when the stream breaks, the row for the lost rest (so a broken file never fails the job,
as it would with Spark's own gzip reader). This used to be a check of every gzip file on
the driver before Spark read it again, and a broken file's lines gathered in the driver's
memory: the driver's memory and one machine's I/O bounded the snapshot, and whole files
were decompressed twice.

Known limits: a Parquet file with a readable footer but corrupt data pages fails the
Spark job (loudly, never silently); Spark's JSON parser ignores text after the closing
``]`` of an enclosing array, so a line ``{...}] tail`` is accepted with its tail ignored
(``{...}{...}``, ``{...}, {...}`` and ``{...} tail`` are all MALFORMED_JSON); a JSON
object with a repeated field name keeps the last value (as Spark and Python's json do).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import reduce
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, Observation, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.frames import observed
from pipelines.gzip_lines import BLANK, gzip_file_batches
from resources.filesystem import Location
from resources.snapshots import SUCCESS_MARKER
from schemas.conform import conform, local_frame
from pipelines.venice_frame import (
    REASON_DETAIL,
    cluster_ids_in,
    resolve_push_settings,
    venice_lines,
    venice_skipped_positions,
)
from pipelines.venice_values import PushSettings
from schemas.raw import (
    SKIP_REASONS,
    FORBIDDEN_BY_KIND,
    KINDS,
    MESSAGE_FIELDS,
    NON_NEGATIVE,
    REQUIRED_ALWAYS,
    REQUIRED_BY_KIND,
    RawTopicQuarantine,
    RawTopicSkipped,
    RawTopicSnapshots,
)

FORMATS = ("jsonl.gz", "jsonl", "parquet")  # longest suffix first: "x.jsonl.gz" is not "jsonl"
BYTES_PER_ROW = {"jsonl.gz": 20, "jsonl": 200, "parquet": 20}
UNKNOWN_REPLICA = "<unknown>"
# The columns (from the Parquet footer) that make a file raw Venice records: Spark's Kafka
# source (timestampType and headers may be there too; they are not used) plus region.
VENICE_COLUMNS = {"key": pa.binary(), "value": pa.binary(), "topic": None, "partition": None, "offset": None,
                  "timestamp": None, "region": None}


def is_venice_schema(schema: pa.Schema) -> bool:
    """Whether a Parquet footer's schema is that of raw Venice records (``VENICE_COLUMNS``)."""
    names = set(schema.names)
    if not set(VENICE_COLUMNS) <= names:
        return False
    return all(t is None or pa.types.is_binary(schema.field(n).type) or pa.types.is_large_binary(schema.field(n).type)
               for n, t in VENICE_COLUMNS.items())


@dataclass(frozen=True)
class VeniceSettings:
    """How raw Venice records are decoded: cluster id -> region, and a heartbeat's clock half-width."""

    cluster_regions: dict[int, str] = field(default_factory=dict)
    clock_uncertainty_ms: int = 0
    # Per version topic, its compression and chunking where the snapshot holds no START_OF_PUSH of it.
    push_settings: dict[str, PushSettings] = field(default_factory=dict)


# What read_snapshot_lines returns. read_error is set only on the one row standing for an
# unreadable file (or the unreadable rest of one); raw is then null. decoded_reason is set
# only on raw Venice records the decoder skipped or quarantined.
LINES_SCHEMA = T.StructType(
    [
        T.StructField("source_file", T.StringType(), nullable=False),
        T.StructField("raw", T.StringType(), nullable=True),
        T.StructField("read_error", T.StringType(), nullable=True),
        T.StructField("decoded_reason", T.StringType(), nullable=True),
    ]
)

# What a blank line may hold, on the Spark side (btrim) as in the gzip reader.
_BLANK_CHARS = BLANK.decode("ascii")
_GLOB_CHARS = re.compile(r"([\\{}\[\]*?])")

# Spark's JSON parser is lenient by default; a message is strict JSON.
_JSON_OPTIONS = {"allowSingleQuotes": "false", "allowNonNumericNumbers": "false", "allowComments": "false"}
_STRING_FIELDS = tuple(name for name, t in MESSAGE_FIELDS.items() if isinstance(t, T.StringType))
_MESSAGE_STRUCT = T.StructType([T.StructField(name, t) for name, t in MESSAGE_FIELDS.items()])
_FIELD_MAP = T.MapType(T.StringType(), T.VariantType())


@dataclass(frozen=True)
class SnapshotFile:
    path: str  # absolute path, or URI, as Spark reads it
    name: str  # relative to the snapshot folder; stored as source_file
    format: str  # one of FORMATS
    size: int = 0  # bytes


@dataclass(frozen=True)
class SnapshotFiles:
    """The files of a snapshot folder: those read as data, and those that are not (with why)."""

    data_files: list[SnapshotFile] = field(default_factory=list)
    other_files: list[dict[str, str]] = field(default_factory=list)  # {"file": name, "reason": why}

    def estimated_rows(self) -> int:
        """About how many rows the data files hold, from their sizes alone (nothing is read).

        Simulated snapshots take ~220 bytes a row as JSONL and 20-27 compressed (gzip,
        Parquet, raw Venice records); the divisors are the low ends, so the estimate errs
        towards more rows. Good enough to size the work (``SparkResource.sized_for``), never
        a count: the accounting counts rows.
        """
        return sum(f.size // BYTES_PER_ROW[f.format] for f in self.data_files)


def list_snapshot_files(folder: str) -> SnapshotFiles:
    """The data files directly inside ``folder`` (sorted by name), and every other entry but ``_SUCCESS``.

    ``folder`` is a path or a URI; it is listed through ``resources/filesystem.py`` (names,
    types and sizes only: nothing of a file's content is read here).
    """
    data: list[SnapshotFile] = []
    other: list[dict[str, str]] = []
    for entry in Location.of(folder).list():
        name = entry.name
        if name == SUCCESS_MARKER and entry.is_file:
            continue
        if entry.is_dir:
            other.append({"file": name, "reason": "folder: only files directly in the snapshot folder are read"})
        elif name.startswith((".", "_")):
            other.append({"file": name, "reason": "hidden or marker file (name starts with '.' or '_')"})
        elif not entry.is_file:
            other.append({"file": name, "reason": "not a regular file"})
        else:
            fmt = next((f for f in FORMATS if name.endswith("." + f)), None)
            if fmt is None:
                other.append({"file": name, "reason": "not a data file: expected *.jsonl, *.jsonl.gz or *.parquet"})
            else:
                data.append(SnapshotFile(path=entry.uri, name=name, format=fmt, size=entry.size or 0))
    return SnapshotFiles(data_files=data, other_files=other)


def _local_lines(spark: SparkSession, rows: list[tuple[str, str | None, str | None]]) -> DataFrame:
    """A small LINES_SCHEMA frame made on the driver (through Arrow: a local relation, no Python workers)."""
    return local_frame(spark, [(*row, None) for row in rows], LINES_SCHEMA)


def _spark_path(path: str) -> str:
    # Spark globs the paths it is given; a file named "a[1].jsonl" must be read literally.
    return _GLOB_CHARS.sub(r"\\\1", path)


def _source_file_name(frame: DataFrame) -> Column:
    # metadataColumn finds Spark's _metadata even when a Parquet file has a column of that
    # name. Its file_name is URI-encoded ("a%20b.jsonl"); url_decode would also turn a
    # literal '+' into a space, so protect it first.
    encoded = frame.metadataColumn("_metadata").getField("file_name")
    return F.url_decode(F.replace(encoded, F.lit("+"), F.lit("%2B")))


def _gzip_lines(spark: SparkSession, folder: str, files: list[SnapshotFile]) -> DataFrame:
    """The rows of gzip files, decompressed and checked on the executors: one task per file.

    The driver only hands out names and paths (and the pyarrow filesystem that reaches them,
    which pickles); each task streams its file through ``pipelines.gzip_lines``, shipped by
    value. A broken file yields its complete lines and one row for the rest, where Spark's
    own gzip reader would fail the whole job.
    """
    location = Location.of(folder)
    fs = location.fs
    tasks = [(location.child(f.name).path, f.name) for f in files]

    def read(batches):
        for batch in batches:
            for task in batch.column("id").to_pylist():
                yield from gzip_file_batches(fs, *tasks[task])

    schema = T.StructType(
        [
            T.StructField("source_file", T.StringType(), nullable=False),
            T.StructField("raw", T.BinaryType()),
            T.StructField("read_error", T.StringType()),
        ]
    )
    # range gives each task exactly one id (no shuffle, nothing for adaptive execution to merge).
    rows = spark.range(0, len(tasks), 1, numPartitions=len(tasks)).mapInArrow(read, schema)
    # Binary to string keeps the bytes, invalid UTF-8 included, as Spark's text reader does.
    return rows.select("source_file", F.col("raw").cast(T.StringType()).alias("raw"), "read_error")


def _text_lines(spark: SparkSession, files: list[SnapshotFile]) -> DataFrame:
    # Without lineSep, Hadoop's reader also ends a line at a lone CR, splitting one JSONL
    # line (a CR is JSON whitespace) into two rows.
    text = spark.read.option("lineSep", "\n").text([_spark_path(f.path) for f in files])
    value = F.col("value")
    # The CR of a CRLF ending is cut off as bytes, so that invalid UTF-8 stays byte for byte.
    without_cr = F.substring(value.cast(T.BinaryType()), F.lit(1), F.octet_length(value) - 1).cast(T.StringType())
    lines = text.select(
        _source_file_name(text).alias("source_file"),
        F.when(F.endswith(value, F.lit("\r")), without_cr).otherwise(value).alias("raw"),
        F.lit(None).cast(T.StringType()).alias("read_error"),
    )
    # Not a regex "^\s*$": Java's "$" also matches before a final NEL, U+2028 or U+2029,
    # which made lines holding only one of them vanish uncounted.
    # Trimmed (a copy of the whole line) only when the line is empty or starts with a blank
    # character (Spark's OR skips its right side when the left holds): a JSON line starts with "{".
    raw = F.col("raw")
    may_be_blank = F.substring(raw, 1, 1).isin("", *_BLANK_CHARS)
    return lines.where(~may_be_blank | (F.btrim(raw, F.lit(_BLANK_CHARS)) != F.lit("")))


def _parquet_tables(
    spark: SparkSession, files: list[SnapshotFile]
) -> tuple[list[tuple[DataFrame, bool]], list[tuple[str, str | None, str | None]]]:
    """One frame per group of Parquet files with identical schema, each with whether it is raw Venice records
    (``is_venice_schema``), and a row ``(file, None, error)`` for each unreadable file."""
    groups: dict[str, list[SnapshotFile]] = {}
    venice_keys: set[str] = set()
    unreadable: list[tuple[str, str | None, str | None]] = []
    for file in files:
        try:
            location = Location.of(file.path)
            schema = pq.read_schema(location.path, filesystem=location.fs)
        except Exception as exc:  # noqa: BLE001 - any failure to open the footer makes the file unreadable
            unreadable.append((file.name, None, f"cannot read the Parquet footer: {exc}"))
            continue
        key = schema.to_string(show_field_metadata=False, show_schema_metadata=False)
        groups.setdefault(key, []).append(file)
        if is_venice_schema(schema):
            venice_keys.add(key)

    tables: list[tuple[DataFrame, bool]] = []
    for key, group in groups.items():
        try:
            table = spark.read.parquet(*[_spark_path(f.path) for f in group])
        except Exception as exc:  # noqa: BLE001 - Spark resolves the schema eagerly and may refuse its types
            unreadable.extend((f.name, None, f"Spark cannot read this Parquet schema: {exc}") for f in group)
            continue
        tables.append((table, key in venice_keys))
    return tables, unreadable


def _parquet_rows(spark: SparkSession, files: list[SnapshotFile], venice: VeniceSettings) -> list[DataFrame]:
    """One frame per group of Parquet files with identical schema, plus rows for unreadable ones.

    A group whose schema is raw Venice records (``is_venice_schema``) is decoded (``venice_lines``).
    """
    tables, unreadable = _parquet_tables(spark, files)
    frames: list[DataFrame] = []
    for table, is_venice in tables:
        if is_venice:
            records = table.select("*", _source_file_name(table).alias("source_file"))
            push = resolve_push_settings(records, venice.push_settings)
            frames.append(venice_lines(records, venice.cluster_regions, venice.clock_uncertainty_ms, push))
            continue
        columns = [F.col("`" + name.replace("`", "``") + "`") for name in table.columns]
        frames.append(
            table.select(
                _source_file_name(table).alias("source_file"),
                F.to_json(F.struct(*columns), {"ignoreNullFields": "true"}).alias("raw"),
                F.lit(None).cast(T.StringType()).alias("read_error"),
            )
        )
    if unreadable:
        frames.append(_local_lines(spark, unreadable))
    return frames


def read_skipped_positions(
    spark: SparkSession, folder: str, snapshot_id: str, venice: VeniceSettings | None = None
) -> DataFrame:
    """The positions of the snapshot's raw Venice records skipped by rule, shaped like RawTopicSkipped.

    What ``read_snapshot_lines`` drops before judging (``decoded_reason`` in SKIP_REASONS), one
    row per record: its Kafka position was read (SPEC 3a), so it closes a gap though it holds no
    row. A pass of its own over the raw Venice files only, decoding only their control records
    (``venice_skipped_positions``); worth running only when the accepted pass saw skipped records
    (``Judgement.skipped_by_reason``). Unreadable files are the quarantine's business.
    """
    venice = venice or VeniceSettings()
    tables, _ = _parquet_tables(spark, [f for f in list_snapshot_files(folder).data_files if f.format == "parquet"])
    frames = []
    for table, is_venice in tables:
        if is_venice:
            records = table.select("*", _source_file_name(table).alias("source_file"))
            push = resolve_push_settings(records, venice.push_settings)
            frames.append(venice_skipped_positions(records, venice.cluster_regions, venice.clock_uncertainty_ms, push))
    struct = RawTopicSkipped.to_structtype()
    if not frames:
        return local_frame(spark, [], struct)
    return conform(reduce(DataFrame.unionByName, frames).withColumn("snapshot_id", F.lit(snapshot_id)), struct)


def venice_cluster_ids(spark: SparkSession, folder: str) -> list[int]:
    """Every upstream cluster id named by the raw Venice records of a snapshot folder (sorted; empty
    without any). Reads the Parquet footers again: it serves only an error's message."""
    paths = []
    for file in list_snapshot_files(folder).data_files:
        if file.format != "parquet":
            continue
        try:
            location = Location.of(file.path)
            if is_venice_schema(pq.read_schema(location.path, filesystem=location.fs)):
                paths.append(_spark_path(file.path))
        except Exception:  # noqa: BLE001 - an unreadable file is the quarantine's business
            continue
    return cluster_ids_in(spark.read.parquet(*paths)) if paths else []


def read_snapshot_lines(spark: SparkSession, folder: str, venice: VeniceSettings | None = None) -> DataFrame:
    """Every message of the snapshot folder as text: ``(source_file, raw, read_error, decoded_reason)``.

    ``decoded_reason`` is null but for raw Venice records the decoder skipped or quarantined
    (the reason). ``venice`` says how to decode raw Venice records.

    Blank lines are skipped (they are not rows). Spark reads the JSONL and Parquet files
    itself; gzip files are decompressed, checked and split into lines on the executors
    (``_gzip_lines``), a broken one giving its complete lines plus one UNREADABLE_FILE row.
    The driver reads file names, sizes and Parquet footers only.
    """
    files = list_snapshot_files(folder).data_files
    frames: list[DataFrame] = []
    text_files = [f for f in files if f.format == "jsonl"]
    if text_files:
        frames.append(_text_lines(spark, text_files))
    gzip_files = [f for f in files if f.format == "jsonl.gz" and f.size > 0]
    if gzip_files:
        frames.append(_gzip_lines(spark, folder, gzip_files))
    frames.extend(_parquet_rows(spark, [f for f in files if f.format == "parquet"], venice or VeniceSettings()))
    if not frames:
        frames.append(_local_lines(spark, []))
    frames = [f if "decoded_reason" in f.columns else f.withColumn("decoded_reason", F.lit(None).cast(T.StringType()))
              for f in frames]
    return reduce(DataFrame.unionByName, frames)


# --- validation ------------------------------------------------------------------------


def _present(name: str) -> Column:
    return F.col(f"present_{name}")


def _bad_type(name: str) -> Column:
    return F.col(f"bad_type_{name}")


def _field_flags(fields: Column, typed: Column) -> list[Column]:
    """Per field, once per row: is it there (not null), and does its JSON token not fit its type.

    ``fields`` is the line's map of every field to its JSON token (a variant). A JSON null is
    the same as an absent field. The map is only looked up here, never rebuilt or iterated:
    Spark evaluates map functions with lambdas (``map_filter``, ``exists``) without code
    generation, reading every entry through a path that is costly per element (it looked up
    the session configuration per entry in a profile of 2M rows), while a lookup by key is
    generated code.
    """
    flags = []
    for name, data_type in MESSAGE_FIELDS.items():
        token = fields[name]  # null when absent
        present = token.isNotNull() & ~F.is_variant_null(token)
        # A string field parses from any JSON token (an object becomes its text), so its
        # token type is read on the variant; a number or map field is null in the typed
        # parse when its token does not fit (a string "5", 5.0, an overflow, a non-integer
        # or null component).
        if name in _STRING_FIELDS:
            wrong = F.schema_of_variant(fields[name]) != F.lit("STRING")
        elif isinstance(data_type, T.MapType):
            wrong = typed[name].isNull() | F.exists(F.map_values(typed[name]), lambda v: v.isNull())
        else:
            wrong = typed[name].isNull()
        flags.append(present.alias(f"present_{name}"))
        flags.append((present & F.coalesce(wrong, F.lit(True))).alias(f"bad_type_{name}"))
    return flags


def _problem_lists(fields: Column, typed: Column, kind: Column) -> dict[str, tuple[Column, Column]]:
    """Per reason: whether a row has a problem of that kind, and the text listing them.

    The text is a ``concat_ws`` of one piece per possible problem; the caller builds it only
    for rows whose flag is set (``F.when(flag, text)``), so the great majority of rows, which
    have no problem, never assemble five empty strings (docs/performance.md, the levers table).
    """

    def kinds_with(table: dict[str, tuple[str, ...]], name: str) -> Column:
        kinds = [k for k, names in table.items() if name in names]
        return F.coalesce(kind.isin(kinds), F.lit(False)) if kinds else F.lit(False)

    def required(name: str) -> Column:
        return F.lit(True) if name in REQUIRED_ALWAYS else kinds_with(REQUIRED_BY_KIND, name)

    def negative(name: str) -> Column:
        if isinstance(MESSAGE_FIELDS[name], T.MapType):
            return F.coalesce(F.exists(F.map_values(typed[name]), lambda v: v < 0), F.lit(False))
        return F.coalesce(typed[name] < 0, F.lit(False))

    vectors = [n for n, t in MESSAGE_FIELDS.items() if isinstance(t, T.MapType)]
    # (condition, text when it holds) per possible problem.
    problems = {
        "MISSING_FIELD": [(required(n) & ~_present(n), F.lit(n)) for n in MESSAGE_FIELDS],
        "BAD_TYPE": [
            (
                _bad_type(n),
                F.concat(
                    F.lit(f"{n} ("),
                    F.schema_of_variant(fields[n]),
                    F.lit(f", expected {MESSAGE_FIELDS[n].simpleString()})"),
                ),
            )
            for n in MESSAGE_FIELDS
        ],
        "UNKNOWN_KIND": [
            (~kind.isin(list(KINDS)), F.concat(F.lit("kind '"), kind, F.lit(f"' is not one of {', '.join(KINDS)}")))
        ],
        "NEGATIVE_VALUE": [
            (negative(n), F.concat(F.lit(f"{n} = "), F.to_json(fields[n]))) for n in (*NON_NEGATIVE, *vectors)
        ],
        "UNEXPECTED_FIELD": [
            (kinds_with(FORBIDDEN_BY_KIND, n) & _present(n), F.concat(F.lit(f"{n} on a "), kind))
            for n in MESSAGE_FIELDS
            if any(n in names for names in FORBIDDEN_BY_KIND.values())
        ],
    }
    return {
        reason: (
            reduce(Column.__or__, [F.coalesce(condition, F.lit(False)) for condition, _ in pieces]),
            F.concat_ws(", ", *[F.when(condition, text) for condition, text in pieces]),
        )
        for reason, pieces in problems.items()
    }


# The quarantine's position columns (RawTopicQuarantine) -> the checked rows' columns that hold them.
RAW_POSITION = {"replica": "raw_replica", "topic": "raw_topic", "partition": "raw_partition", "offset": "raw_offset"}
# A quarantined row's position: known when all four are there.
QUARANTINE_POSITION = tuple(RAW_POSITION)


def _raw_position(typed: Column) -> list[Column]:
    """Each field of a row's position (``RAW_POSITION``) when the row has it with its JSON type and, for the
    partition and the offset, not negative (it is then no position); null otherwise. Reads the flags of
    ``_field_flags``."""
    fields = []
    for name, alias in RAW_POSITION.items():
        known = _present(name) & ~_bad_type(name)
        if name in NON_NEGATIVE:
            known = known & (typed[name] >= 0)
        fields.append(F.when(known, typed[name]).alias(alias))
    return fields


def _checked_rows(lines: DataFrame, snapshot_id: str) -> DataFrame:
    """Every line parsed, with its first problem as ``reason`` (null when none) and all of them in ``detail``.

    Built in steps (parse, per-field flags, problems, verdict) so that each is computed
    once per row: one flat expression would repeat the shared parts dozens of times, and
    Spark would spend more time compiling it than running it.
    """
    if "read_error" not in lines.columns:
        lines = lines.withColumn("read_error", F.lit(None).cast(T.StringType()))
    raw = F.col("raw")
    # The line is parsed twice: typed, for values (a field that does not fit its type is
    # null while the rest still parses), and as a map of variants, for which fields are
    # there, with what JSON type, and the unknown ones. The map parse reads the line
    # wrapped in [ ]: two objects on one line ("{..}{..}", "{..},{..}") or text after the
    # object then fail or give two elements, instead of the rest being silently ignored.
    wrapped = F.from_json(F.concat(F.lit("["), raw, F.lit("]")), T.ArrayType(_FIELD_MAP), _JSON_OPTIONS)
    parsed = (
        lines.select(
            "source_file",
            "raw",
            "read_error",
            "decoded_reason",
            F.from_json(raw, _MESSAGE_STRUCT, _JSON_OPTIONS).alias("typed"),
            wrapped.alias("wrapped"),
        )
        .select("*", F.when(F.size("wrapped") == 1, F.col("wrapped")[0]).alias("all_fields"))
    )
    fields, typed = F.col("all_fields"), F.col("typed")
    # Whether the line names a field SPEC 1 does not have: it has more fields than known ones.
    # A lookup is null only for an absent key (a JSON null is a variant null); the lookups
    # are the ones _field_flags makes, so the generated code looks each field up once.
    known_fields = sum(fields[name].isNotNull().cast(T.IntegerType()) for name in MESSAGE_FIELDS)
    flagged = (
        parsed.select(
            "source_file",
            "raw",
            "read_error",
            "decoded_reason",
            "typed",
            "all_fields",
            *_field_flags(fields, typed),
            (F.size(fields) > known_fields).alias("has_extra_fields"),
        )
        # The kind, when it is a JSON string: what decides the fields a row needs.
        .select("*", F.when(_present("kind") & ~_bad_type("kind"), typed["kind"]).alias("kind_text"))
    )
    listed = _problem_lists(fields, typed, F.col("kind_text"))
    with_problems = flagged.select(
        "source_file",
        "raw",
        "read_error",
        "decoded_reason",
        "typed",
        "all_fields",
        "has_extra_fields",
        *_raw_position(typed),
        # Null when the row has no problem of that kind.
        *[F.when(has, text).alias(f"problems_{code}") for code, (has, text) in listed.items()],
    )

    unreadable = F.col("read_error").isNotNull()
    malformed = F.col("all_fields").isNull()
    # A raw Venice record the decoder quarantined: its reason first (raw is then the Kafka record).
    decoded = F.col("decoded_reason").isNotNull()
    reason = (
        F.when(decoded, F.col("decoded_reason"))
        .when(unreadable, F.lit("UNREADABLE_FILE"))
        .when(malformed, F.lit("MALFORMED_JSON"))
    )
    for code in listed:
        reason = reason.when(F.col(f"problems_{code}").isNotNull(), F.lit(code))
    found = [
        F.when(F.col(f"problems_{code}").isNotNull(), F.concat(F.lit(code + ": "), F.col(f"problems_{code}")))
        for code in listed
    ]
    decoded_detail = F.create_map(*[F.lit(x) for kv in REASON_DETAIL.items() for x in kv])[F.col("decoded_reason")]
    detail = (
        F.when(decoded, F.coalesce(decoded_detail, F.col("decoded_reason")))
        .when(unreadable, F.col("read_error"))
        .when(malformed, F.lit("not a single JSON object (invalid JSON, another JSON value, or several on one line)"))
        .otherwise(F.concat_ws("; ", *found))
    )
    # Built only for the (rare) lines that have extra fields: map_filter is not generated code.
    extras = F.map_filter(F.col("all_fields"), lambda k, _v: ~k.isin(list(MESSAGE_FIELDS)))
    return with_problems.select(
        F.lit(snapshot_id).alias("snapshot_id"),
        "source_file",
        "raw",
        *[typed[name].alias(name) for name in MESSAGE_FIELDS],
        F.when(F.col("has_extra_fields"), F.transform_values(extras, lambda _k, v: F.to_json(v))).alias("extra_fields"),
        *RAW_POSITION.values(),
        reason.alias("reason"),
        detail.alias("detail"),
    )


# The accepted pass tells the quarantine's pass which lines it quarantines as buckets of their
# hash, the bits of one bitmap (Spark's bitmap_construct_agg: 32,768 bits, 4 KiB, whatever the
# number of rows quarantined). Above half the buckets, the quarantine's pass judges every line.
LINE_BUCKETS = 32768


def _line_bucket_sql() -> str:
    """The bucket (0 to LINE_BUCKETS - 1) of a line: a hash of its file and text, known before it is parsed."""
    return f"pmod(xxhash64(source_file, raw), {LINE_BUCKETS})"


def _bucket_bitmap(where: Column) -> Column:
    """An aggregate: the bitmap of the ``line_bucket`` column's values on the rows ``where`` holds."""
    # bitmap_bit_position(n) is n - 1 for n in 1..LINE_BUCKETS; a null sets no bit.
    return F.bitmap_construct_agg(F.bitmap_bit_position(F.when(where, F.col("line_bucket") + 1)))


def bitmap_buckets(*bitmaps: bytes | None) -> list[int]:
    """The buckets set in any of the bitmaps (``_bucket_bitmap``, read from an observation), in order."""
    return sorted({i for bitmap in bitmaps for i in range(len(bitmap or b"") * 8) if bitmap[i // 8] >> (i % 8) & 1})


def _sorted_entries(column: str) -> Column:
    # Maps cannot be compared or grouped on; their sorted entries can.
    return F.array_sort(F.map_entries(F.col(column)))


@dataclass(frozen=True)
class Judgement:
    """A snapshot's lines judged: the accepted rows, the quarantined rows, and what the accepted pass saw.

    ``accepted`` carries two observations (``DataFrame.observe``): the rows that had a
    problem of their own, and the candidates that sat at a conflicting position, each
    counted and as a bitmap of their lines' buckets (a hash of file and text, ``LINE_BUCKETS``
    of them; a fixed 4 KiB whatever the count). Both are filled by the job that computes the
    accepted rows, so once it has run, ``quarantine()`` knows whether the quarantine is
    empty: then it is, at no cost. Else it reads the lines again and judges only those in
    the bitmaps' buckets (a hash of the text, no parse, for the others), with only the
    parts the counts call for: the rows with a problem of their own when there are any, the
    conflicting positions (an exchange and sort of those lines by position, each carrying
    its text) only when there are any: a small part of judging every line again
    (docs/performance.md, ``dirty``).

    Judging a subset of the lines quarantines the same rows. Every quarantined line is in
    its bucket. A row's own problems are its own. Every candidate at a conflicting position
    is quarantined, so all of them are there to be compared again; the candidates of other
    positions that share a bucket are a part of their position's rows, which all have one
    content, and a part of them cannot disagree either.

    When no line reaches the exchange by position (every line quarantined or skipped by rule),
    Spark drops these observations from the plan it ran (``pipelines.frames.observed``): then
    the quarantine judges every line for both parts, and the skipped rows are counted by a
    query of their own. Reading the missing counts as none would lose every row of such a snapshot.

    The ``quarantined`` frame judges every line, for callers that ask before the accepted
    rows are computed. Either plan is built only when it is asked for: building and
    analysing it costs the driver noticeable time in a fresh JVM.
    """

    accepted: DataFrame
    # (own problems, conflicting positions, the quarantined lines' buckets or None for all) -> quarantine
    build_quarantined: Callable[[bool, bool, "list[int] | None"], DataFrame]
    own_problems: Observation
    conflicts: Observation
    skipped: Observation | None = None  # raw Venice records skipped by rule, per SKIP_REASONS
    count_skipped: Callable[[], dict[str, int]] = dict  # the same, counted by a query of its own

    def skipped_by_reason(self) -> dict[str, int]:
        """Rows skipped by rule, per reason (only those seen); call it after ``accepted`` has been computed."""
        if self.skipped is None:
            return {}
        counts = observed(self.skipped)
        if counts is None:  # Spark dropped the observation (no row was accepted): count the lines again
            counts = self.count_skipped()
        return {r: int(n) for r, n in sorted(counts.items()) if int(n or 0) > 0}

    @property
    def quarantined(self) -> DataFrame:
        """Every quarantined row, whatever the accepted pass counted (it need not have run)."""
        return self.build_quarantined(True, True, None)

    def quarantined_buckets(self) -> list[int] | None:
        """The buckets (``line_bucket``) of the lines the accepted pass quarantined; None if Spark dropped its count."""
        own, conflicts = observed(self.own_problems), observed(self.conflicts)
        if own is None or conflicts is None:
            return None
        return bitmap_buckets(own.get("lines"), conflicts.get("lines"))

    def _parts(self) -> tuple[bool, bool, list[int] | None]:
        """What the quarantine holds, from the accepted pass: rows with problems of their own, rows at conflicting
        positions, and the buckets of their lines (None: judge every line).

        Spark drops the observations when no row of the snapshot reaches the exchange by position
        (``pipelines.frames.observed``), every line quarantined for instance: then the quarantine
        may hold both parts, and every line is judged again.
        """
        own, conflicts = observed(self.own_problems), observed(self.conflicts)
        if own is None or conflicts is None:
            return True, True, None
        buckets = bitmap_buckets(own.get("lines"), conflicts.get("lines"))
        # When most buckets hold a quarantined line, the filter would keep most lines: judge them all.
        return (
            int(own.get("rows") or 0) > 0,
            int(conflicts.get("rows") or 0) > 0,
            buckets if len(buckets) <= LINE_BUCKETS // 2 else None,
        )

    def quarantine_is_empty(self) -> bool:
        """Whether no row was quarantined; call it after ``accepted`` has been computed (its observations are read)."""
        own, conflicting, _ = self._parts()
        return not (own or conflicting)

    def quarantine(self) -> DataFrame:
        """The quarantined rows; call it after ``accepted`` has been computed (its observations are read)."""
        own, conflicting, buckets = self._parts()
        if not own and not conflicting:
            return local_frame(self.accepted.sparkSession, [], RawTopicQuarantine.to_structtype())
        return self.build_quarantined(own, conflicting, buckets)


def validate_rows(lines: DataFrame, snapshot_id: str) -> tuple[DataFrame, DataFrame]:
    """Split read lines into (accepted, quarantined), shaped like RawTopicSnapshots and RawTopicQuarantine."""
    judgement = judge_rows(lines, snapshot_id)
    return judgement.accepted, judgement.quarantined


def judge_rows(lines: DataFrame, snapshot_id: str) -> Judgement:
    """Judge read lines: accepted and quarantined rows (RawTopicSnapshots, RawTopicQuarantine shapes).

    Rows without a problem of their own are candidates. Candidates at one (replica, topic,
    partition, offset) whose content differs are all CONFLICTING_POSITION: none can be
    trusted over the others. The rest are accepted once per distinct content (every field
    and the extra fields, so the position too; EXPORTER_POSITION rows, which have none,
    collapse on their content alone), with ``copies`` counting the identical rows and
    ``source_file`` the smallest file name among them.

    The accepted rows take one pass: parse and judge every line, one exchange by position
    and one sort by position and content, on which two windows run: per position (does it
    hold more than one distinct content?) and per distinct content (how many copies, which
    file first). Nothing is kept in between: the text of a line is needed only for the
    quarantine, which is usually empty and then costs nothing (``Judgement.quarantine``).
    """
    if "decoded_reason" not in lines.columns:
        lines = lines.withColumn("decoded_reason", F.lit(None).cast(T.StringType()))
    # Raw Venice records skipped by rule are dropped here, counted by the accepted pass. The
    # quarantine pass reads the lines without the observation (an Observation serves one job).
    skip = F.coalesce(F.col("decoded_reason").isin(list(SKIP_REASONS)), F.lit(False))
    skipped = Observation()
    observed_lines = lines.observe(
        skipped, *[F.count_if(F.col("decoded_reason") == F.lit(r)).alias(r) for r in SKIP_REASONS]
    )

    def judged_rows(frame: DataFrame, problems: Observation, positions: bool = False) -> DataFrame:
        """The judged lines, with ``problems`` counting those that have a problem of their own.

        ``positions``: with the rest of each row's position as the quarantine stores it (``RAW_POSITION``),
        for the quarantine's pass only; the accepted pass does not carry them.

        The observation is also what keeps every filter on ``reason`` above the judging. Spark
        moves a filter below a projection by writing each column it names as that column's
        expression, and does so projection after projection, so a filter on ``reason`` placed
        right on these rows would end up below the parse, holding its own ``from_json`` for
        every flag that the reason is made of: 988 parses of every line instead of 2. A filter
        cannot move below an observation, which would then
        count other rows, so each line is parsed and judged once and the filters come after.
        """
        checked = _checked_rows(frame.where(~skip), snapshot_id)
        judged = checked.select(
            *comparable,
            "source_file",
            "raw",
            "raw_replica",
            *([c for c in RAW_POSITION.values() if c != "raw_replica"] if positions else []),
            "reason",
            "detail",
            F.expr(_line_bucket_sql()).alias("line_bucket"),
        )
        return judged.observe(problems, F.count_if(~candidate).alias("rows"), _bucket_bitmap(~candidate).alias("lines"))

    content_names = ["snapshot_id", *MESSAGE_FIELDS, "extra_fields"]
    maps = {n for n in content_names if n == "extra_fields" or isinstance(MESSAGE_FIELDS.get(n), T.MapType)}
    comparable = [_sorted_entries(n).alias(n) if n in maps else F.col(n) for n in content_names]
    candidate = F.col("reason").isNull()
    own_problems = Observation()
    conflicts = Observation()

    # The position leads the content, so one sort by content and file serves both windows,
    # and the exchange by position clusters each distinct content too. Maps take part as
    # their sorted entries. The offset leads the sort, since the sort compares rows by a
    # prefix of their first column first; snapshot_id, the same on every row, is left out.
    position = ["offset", "replica", "topic", "partition"]
    rest = [n for n in content_names if n not in position and n != "snapshot_id"]
    at_position = Window.partitionBy(*position).orderBy(*rest, "source_file").rowsBetween(
        Window.unboundedPreceding, Window.unboundedFollowing
    )
    same_content = Window.partitionBy(*position, *rest).orderBy("source_file")
    content = F.struct(*[F.col(n) for n in rest])

    def at_positions(rows: DataFrame, carried: tuple[str, ...] = (), window: Window = at_position) -> DataFrame:
        """Every row, with whether its window (a position's candidates) holds more than one content, and its rows."""
        return rows.select(
            *content_names,
            "source_file",
            *carried,
            # EXPORTER_POSITION rows have no offset: they never conflict, whatever they hold.
            (
                F.col("offset").isNotNull()
                & ~F.first(content).over(window).eqNullSafe(F.last(content).over(window))
            ).alias("conflicting"),
            F.count(F.lit(1)).over(window).alias("rows_at_position"),
        )

    observed = judged_rows(observed_lines, own_problems)
    # Every candidate's line bucket goes through the exchange (8 bytes a row), for the bitmap of the conflicting
    # rows' lines; observed before the copies are collapsed, so that every conflicting line is in it.
    compared = (
        at_positions(observed.where(candidate), ("line_bucket",))
        .select(
            "*",
            F.row_number().over(same_content.rowsBetween(Window.unboundedPreceding, Window.currentRow)).alias("nth"),
            F.count(F.lit(1)).over(same_content.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing))
            .alias("copies"),
        )
        .observe(
            conflicts, F.count_if(F.col("conflicting")).alias("rows"), _bucket_bitmap(F.col("conflicting")).alias("lines")
        )
        .where(F.col("nth") == 1)
    )
    accepted_struct = RawTopicSnapshots.to_structtype()
    # The first copy in file order carries the smallest file name.
    accepted = conform(
        compared.where(~F.col("conflicting")), accepted_struct, {name: F.map_from_entries(F.col(name)) for name in maps}
    )

    def build_quarantined(own: bool, conflicting: bool, buckets: list[int] | None) -> DataFrame:
        """The quarantine, from one more read of the lines: the parts asked for, judging the lines in ``buckets`` only.

        ``buckets`` None: every line is judged.

        Built only here (planning it costs the driver time in a fresh JVM; most snapshots have no bad row). The
        lines are judged again without the accepted pass's observations (an Observation serves one query).
        """
        # Only the lines in the buckets of quarantined lines are judged: a quarantined line is in one. Judged alone,
        # they are judged the same, conflicts included: every candidate at a conflicting position is quarantined, so
        # all of them are in, while the candidates of another position that come along cannot disagree among themselves.
        # The buckets are one SQL text (a Column per bucket would be a round trip to the JVM each).
        listed = ", ".join(map(str, buckets or ()))
        in_buckets = lines if buckets is None else lines.where(f"{_line_bucket_sql()} IN ({listed})")
        judged = judged_rows(in_buckets, Observation(), positions=True)
        # Where the quarantined row stood, as far as it says (RawTopicQuarantine).
        stood = [F.col(column).alias(name) for name, column in RAW_POSITION.items()]
        quarantine_struct = RawTopicQuarantine.to_structtype()
        wanted = []
        if own:
            wanted.append(~candidate)
        if conflicting:
            wanted.append(candidate)
        rows = judged.where(reduce(Column.__or__, wanted))
        if not conflicting:
            return conform(
                rows.select("snapshot_id", "source_file", *stood, "raw", "reason", "detail"),
                quarantine_struct,
            )
        # Both parts from this one read: the rows with problems of their own go through the exchange by position
        # too (usually few), in windows of their line's bucket (a malformed line has no position), so the candidates'
        # windows (no bucket) hold candidates only. A row with a problem of its own keeps its own reason and detail
        # whoever shares its window. Their text is carried through, never read again for a join.
        own_line = F.when(~candidate, F.col("line_bucket"))
        windowed = at_positions(
            rows, ("raw", *RAW_POSITION.values(), "reason", "detail"), at_position.partitionBy(*position, own_line)
        )
        conflict_detail = F.format_string(
            "%d rows at replica %s, topic %s, partition %d, offset %d do not all have the same content",
            "rows_at_position",
            "replica",
            "topic",
            "partition",
            "offset",
        )
        quarantined = windowed.where(~candidate | F.col("conflicting")).select(
            "snapshot_id",
            "source_file",
            *stood,
            "raw",
            F.coalesce("reason", F.lit("CONFLICTING_POSITION")).alias("reason"),
            F.when(candidate, conflict_detail).otherwise(F.col("detail")).alias("detail"),
        )
        return conform(quarantined, quarantine_struct)

    def count_skipped() -> dict[str, int]:
        counted = lines.where(skip).groupBy("decoded_reason").agg(F.count(F.lit(1)).alias("rows")).collect()
        return {row["decoded_reason"]: row["rows"] for row in counted}

    return Judgement(
        accepted=accepted,
        build_quarantined=build_quarantined,
        own_problems=own_problems,
        conflicts=conflicts,
        skipped=skipped,
        count_skipped=count_skipped,
    )


def accounting_from_tables(
    accepted_df: DataFrame,
    quarantined_df: DataFrame | None,
    skipped_by_reason: dict[str, int] | None = None,
    skipped_df: DataFrame | None = None,
) -> dict:
    """Row accounting of one snapshot from its accepted and quarantined tables: one aggregation each.

    rows_read = rows_accepted (sum of copies) + rows_quarantined + rows_skipped (raw Venice
    records skipped by rule, ``Judgement.skipped_by_reason``, as many as ``raw_topic_skipped``
    holds); rows_stored
    counts the accepted table's rows (exact duplicates stored once). Per replica the same split; a
    quarantined row counts under the replica it names, or "<unknown>". ``quarantined_positions``:
    the distinct positions (``QUARANTINE_POSITION``) the quarantined rows name, by the same query.
    ``quarantined_df`` None: the quarantine is known to be empty (no Spark job for it; in a fresh JVM even an
    aggregation of no rows is not free). ``skipped_df`` (the staged ``raw_topic_skipped``, None when
    nothing was skipped) splits the skipped records per replica and kind (``skipped_kind``):
    ``by_replica`` then counts them too (read = accepted + quarantined + skipped) and
    ``skipped_by_kind`` lists them.
    """
    accepted = accepted_df.groupBy("replica").agg(
        F.sum("copies").alias("accepted"), F.count(F.lit(1)).alias("stored")
    ).collect()
    # One query: rows per (replica, reason) and, over all of them (the rollup's total, which also yields a row per
    # replica, unused), the distinct positions quarantined rows name.
    quarantined = (
        []
        if quarantined_df is None
        else quarantined_df.select(
            F.coalesce(F.col("replica"), F.lit(UNKNOWN_REPLICA)).alias("counted_as"), "reason", *QUARANTINE_POSITION
        )
        .rollup("counted_as", "reason")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.count_distinct(*QUARANTINE_POSITION).alias("positions"),
            F.grouping("counted_as").alias("all_replicas"),
            F.grouping("reason").alias("all_reasons"),
        )
        .collect()
    )
    by_replica: dict[str, dict[str, int]] = {}

    def replica_counts(name: str) -> dict[str, int]:
        return by_replica.setdefault(name, {"read": 0, "accepted": 0, "stored": 0, "quarantined": 0, "skipped": 0})

    skipped_by_kind: dict[str, dict[str, int]] = {}
    if skipped_df is not None:
        for row in skipped_df.groupBy("replica", skipped_kind().alias("kind")).count().collect():
            counts = replica_counts(row["replica"])
            counts["skipped"] += int(row["count"])
            counts["read"] += int(row["count"])
            skipped_by_kind.setdefault(row["replica"], {})[row["kind"]] = int(row["count"])

    for row in accepted:
        counts = replica_counts(row["replica"])
        counts["accepted"] += int(row["accepted"])
        counts["stored"] += int(row["stored"])
        counts["read"] += int(row["accepted"])
    by_reason: dict[str, int] = {}
    positions = 0
    for row in quarantined:
        if row["all_replicas"]:
            positions = int(row["positions"])
        if row["all_reasons"]:
            continue
        counts = replica_counts(row["counted_as"])
        counts["quarantined"] += int(row["rows"])
        counts["read"] += int(row["rows"])
        by_reason[row["reason"]] = by_reason.get(row["reason"], 0) + int(row["rows"])

    rows_accepted = sum(c["accepted"] for c in by_replica.values())
    rows_quarantined = sum(by_reason.values())
    skipped = {r: int(n) for r, n in sorted((skipped_by_reason or {}).items())}
    rows_skipped = sum(skipped.values())
    return {
        "rows_read": rows_accepted + rows_quarantined + rows_skipped,
        "rows_skipped": rows_skipped,
        "skipped_by_reason": skipped,
        "rows_accepted": rows_accepted,
        "rows_stored": sum(c["stored"] for c in by_replica.values()),
        "rows_quarantined": rows_quarantined,
        "quarantined_positions": positions,
        "by_reason": dict(sorted(by_reason.items())),
        "by_replica": dict(sorted(by_replica.items())),
        "skipped_by_kind": {r: dict(sorted(k.items())) for r, k in sorted(skipped_by_kind.items())},
    }


def skipped_kind() -> Column:
    """What a skipped record was, for counting: the control message's type name (START_OF_SEGMENT,
    DOL_STAMP, END_OF_PUSH, ...), else the rule that skipped it (VALUE_CHUNK, CHUNK_CLEANUP)."""
    return F.coalesce(F.col("control_message"), F.col("reason"))

