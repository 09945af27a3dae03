"""Reading one complete snapshot folder into text lines: every message of every file, whatever its format.

``read_snapshot_lines`` turns every file of the folder into text rows ``(source_file, raw,
read_error, decoded_reason)`` (``LINES_SCHEMA``): a JSONL line as it is, a Parquet row rendered
as a JSON object. So one validation path (``pipelines.ingest.judging``, ``validate_rows``) judges every
format: a Parquet column whose type differs from SPEC 1 (an offset stored as a string, a float
partition) shows up as BAD_TYPE on each row, exactly as the same JSON line would. What is read
here is the ``rows_read`` of the accounting (``pipelines.ingest.accounting``): non-blank JSONL lines +
Parquet rows + one per unreadable file (or unreadable tail).

Raw Venice records: a Parquet file whose footer has the columns of Spark's Kafka source
(``key`` and ``value`` binary, ``topic``, ``partition``, ``offset``, ``timestamp``) plus
``region`` (``is_venice_schema``) is decoded on the executors
(``pipelines.venice.frame.venice_lines``): a record that decodes to a SPEC 1 message becomes
that message's JSON text and is judged like any other row; one the decoder quarantines or
skips by rule (``schemas.raw.SKIP_REASONS``) carries its reason (``decoded_reason``), for the
judging (``pipelines.ingest.judging``) to quarantine it, or to drop it before judging and count it.
A skipped record's position was read all the same (SPEC 3a: not a gap): when the accepted
pass saw skipped records, ``read_skipped_positions`` reads them again, decoding only the
control records, for ``raw_topic_skipped``. An upstream cluster id missing from the cluster
-> region map fails the Spark job, so nothing of the step is published
(``venice_cluster_ids`` names the ids the folder holds, for the error's message).

- A JSONL line ends at LF and only there; one CR before the LF is part of a CRLF ending.
  A UTF-8 byte order mark opening a file is dropped (Hadoop's line reader does so). A line
  that is empty or holds only ASCII whitespace (space, tab, LF, vertical tab, form feed,
  CR) is blank: it carries no message and is not a row. Every other line is a row whatever
  it holds (NUL, invalid UTF-8, a lone CR, NEL, U+2028/U+2029, a BOM later in the file):
  accepted or quarantined, MALFORMED_JSON at worst. Spark's text reader (``*.jsonl``) and
  the gzip reader (``pipelines/ingest/gzip_lines.py``, ``*.jsonl.gz``) apply this same rule, and
  both keep a line's bytes as they are (invalid UTF-8 included).
- A line longer than the line limit (``max_line_bytes``: its bytes before the LF, default
  64 MiB) is never held whole by any reader: it is one LINE_TOO_LONG row keeping its first
  kilobyte and where it stood (``pipelines/ingest/long_lines.py``). Plain files larger than the limit
  are probed for such lines first (``holding_long_lines``, LFs only); a file holding one is
  split on the executors like a gzip file, the others by Spark's reader.
- A gzip file that breaks part-way (truncated, corrupt, trailing garbage) keeps its
  complete lines before the break; one UNREADABLE_FILE row (raw null) stands for the rest,
  whose lines cannot be counted. A Parquet file Spark or pyarrow cannot open is one
  UNREADABLE_FILE row. A Parquet page larger than the line limit is never given to a reader
  (which holds a page whole): its file is read around it on the executors, and the rows of its
  row group are PAGE_TOO_LARGE at their positions (``pipelines/ingest/parquet_pages.py``).
- Only files directly inside the snapshot folder named ``*.jsonl``, ``*.jsonl.gz`` or
  ``*.parquet`` are data. ``_SUCCESS`` is the completion marker. Everything else
  (sub-folders, hidden or ``_``-prefixed files, other extensions) is not read and is
  listed in ``SnapshotFiles.other_files`` so the asset can show it.

Where the work runs: the driver lists the folder (names, sizes) and reads Parquet footers
(to group files by schema and find unreadable ones); nothing else of a file passes through
it. JSONL and Parquet files are read by Spark. Gzip files are read in Spark's Python
workers, one task per file (``_gzip_lines``: ``mapInArrow`` over ``pipelines/ingest/gzip_lines.py``,
shipped by value): each task streams its file through zlib once, yielding its lines and,
when the stream breaks, the row for the lost rest (so a broken file never fails the job,
as it would with Spark's own gzip reader). This used to be a check of every gzip file on
the driver before Spark read it again, and a broken file's lines gathered in the driver's
memory: the driver's memory and one machine's I/O bounded the snapshot, and whole files
were decompressed twice.

Known limit: a Parquet file with a readable footer but corrupt data pages fails the
Spark job (loudly, never silently).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import reduce
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from pipelines.ingest.gzip_lines import BLANK, gzip_file_batches, has_long_line, plain_file_batches
from pipelines.ingest.long_lines import DEFAULT_MAX_LINE_BYTES
from pipelines.ingest.parquet_pages import (
    LARGE_PAGE_FIELD,
    PAGE_TOO_LARGE,
    UNREADABLE_FIELD,
    UnreadablePages,
    guarded_batches,
    large_pages,
    page_detail,
)
from pipelines.venice.frame import (
    cluster_ids_in,
    CarriedSettings,
    PushResolution,
    resolve_push_settings,
    venice_lines,
    venice_skipped_positions,
)
from pipelines.venice.values import Limits, PushSettings
from resources.filesystem import Location
from resources.snapshots import SUCCESS_MARKER
from schemas.conform import conform, local_frame, quoted
from schemas.raw import RawTopicSkipped

FORMATS = ("jsonl.gz", "jsonl", "parquet")  # longest suffix first: "x.jsonl.gz" is not "jsonl"
BYTES_PER_ROW = {"jsonl.gz": 20, "jsonl": 200, "parquet": 20}
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
    # The largest value (decompressed, reassembled) and chunk count one record may make the decoder hold.
    limits: Limits = field(default_factory=Limits)
    # What earlier snapshots' START_OF_PUSH records declared, for a dump that continues a stream (None: not looked up).
    carried_push_settings: "CarriedSettings | None" = None
    # Told each resolution of a snapshot's push settings (where each topic's came from, what disagreed).
    on_resolved: "Callable[[PushResolution], None] | None" = None


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


def _per_file(spark: SparkSession, folder: str, files: list[SnapshotFile], batches: Callable, schema) -> DataFrame:
    """``batches(fs, path, name)`` of each file, one task per file, in Spark's Python workers.

    The driver only hands out names and paths (and the pyarrow filesystem that reaches them,
    which pickles); each task reads its file through the executor-side module that
    ``batches`` comes from, shipped by value.
    """
    location = Location.of(folder)
    fs = location.fs
    tasks = [(location.child(f.name).path, f.name) for f in files]

    def read(ids):
        for batch in ids:
            for task in batch.column("id").to_pylist():
                yield from batches(fs, *tasks[task])

    # range gives each task exactly one id (no shuffle, nothing for adaptive execution to merge).
    return spark.range(0, len(tasks), 1, numPartitions=len(tasks)).mapInArrow(read, schema)


# What the executor-side line reader yields (pipelines/ingest/gzip_lines.py, SCHEMA).
_READ_ROWS = T.StructType(
    [
        T.StructField("source_file", T.StringType(), nullable=False),
        T.StructField("raw", T.BinaryType()),
        T.StructField("read_error", T.StringType()),
        T.StructField("decoded_reason", T.StringType()),
    ]
)


def _file_tasks(spark: SparkSession, folder: str, files: list[SnapshotFile], batches: Callable) -> DataFrame:
    """The rows ``batches`` reads from each file (``_per_file``) as LINES_SCHEMA text rows."""
    rows = _per_file(spark, folder, files, batches, _READ_ROWS)
    # Binary to string keeps the bytes, invalid UTF-8 included, as Spark's text reader does.
    return rows.select("source_file", F.col("raw").cast(T.StringType()).alias("raw"), "read_error", "decoded_reason")


def _gzip_lines(spark: SparkSession, folder: str, files: list[SnapshotFile], max_line_bytes: int) -> DataFrame:
    """The rows of gzip files, decompressed and checked on the executors: one task per file.

    Each task streams its file through ``pipelines.ingest.gzip_lines``. A broken file yields its
    complete lines and one row for the rest, where Spark's own gzip reader would fail the
    whole job; a line over the limit yields its LINE_TOO_LONG row.
    """
    return _file_tasks(spark, folder, files, lambda fs, path, name: gzip_file_batches(fs, path, name, max_line_bytes))


def _plain_lines(spark: SparkSession, folder: str, files: list[SnapshotFile], max_line_bytes: int) -> DataFrame:
    """The rows of plain JSONL files holding a line over the limit, split on the executors as gzip files are."""
    return _file_tasks(spark, folder, files, lambda fs, path, name: plain_file_batches(fs, path, name, max_line_bytes))


def holding_long_lines(spark: SparkSession, folder: str, files: list[SnapshotFile], max_line_bytes: int) -> set[str]:
    """The names of the plain JSONL ``files`` holding a line over the limit (``pipelines/ingest/long_lines.py``).

    Only a file larger than the limit can hold one, so only those are looked at: one Spark job,
    a task per file, each reading its file a chunk at a time (LFs only) up to its first long line.
    """
    larger = [f for f in files if f.size > max_line_bytes]
    if not larger:
        return set()

    def probe(fs, path: str, name: str):
        if has_long_line(fs, path, max_line_bytes):
            yield pa.RecordBatch.from_arrays([pa.array([name], pa.string())], names=["name"])

    return {row["name"] for row in _per_file(spark, folder, larger, probe, "name string").collect()}


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


@dataclass(frozen=True)
class _ParquetGroup:
    """Parquet files with one schema: read by Spark (``frame``, None when every file is guarded), and those holding a
    page over the line limit (``guarded``: name -> the row groups' large columns and detail), read around them."""

    frame: DataFrame | None
    schema: T.StructType
    is_venice: bool
    guarded: dict[str, dict[int, tuple[set[str], str]]] = field(default_factory=dict)


def _parquet_tables(
    spark: SparkSession, files: list[SnapshotFile], max_line_bytes: int | None = None
) -> tuple[list[_ParquetGroup], list[tuple[str, str | None, str | None]]]:
    """One group per set of Parquet files with identical schema, each with whether it is raw Venice records
    (``is_venice_schema``), and a row ``(file, None, error)`` for each unreadable file.

    With ``max_line_bytes``, the files' column chunks larger than it have their page headers read
    (``pipelines/ingest/parquet_pages.py``): a file holding a page over it is guarded, not given to Spark's reader.
    """
    groups: dict[str, list[SnapshotFile]] = {}
    venice_keys: set[str] = set()
    large: dict[str, dict[int, tuple[set[str], str]]] = {}
    unreadable: list[tuple[str, str | None, str | None]] = []
    for file in files:
        try:
            location = Location.of(file.path)
            with location.fs.open_input_file(location.path) as handle:
                metadata = pq.read_metadata(handle)
                schema = metadata.schema.to_arrow_schema()
                pages = [] if max_line_bytes is None else large_pages(handle, metadata, max_line_bytes)
        except UnreadablePages as exc:
            unreadable.append((file.name, None, f"cannot read the Parquet page headers: {exc}"))
            continue
        except Exception as exc:  # noqa: BLE001 - any failure to open the footer makes the file unreadable
            unreadable.append((file.name, None, f"cannot read the Parquet footer: {exc}"))
            continue
        key = schema.to_string(show_field_metadata=False, show_schema_metadata=False)
        groups.setdefault(key, []).append(file)
        if is_venice_schema(schema):
            venice_keys.add(key)
        if pages:
            large[file.name] = page_detail(file.name, pages, max_line_bytes)

    tables: list[_ParquetGroup] = []
    for key, group in groups.items():
        try:
            # Resolves the schema from the footers (no job); only the files without large pages are read through it.
            everything = spark.read.parquet(*[_spark_path(f.path) for f in group])
            read = [f for f in group if f.name not in large]
            frame = None if not read else everything if len(read) == len(group) else spark.read.parquet(
                *[_spark_path(f.path) for f in read])
        except Exception as exc:  # noqa: BLE001 - Spark resolves the schema eagerly and may refuse its types
            unreadable.extend((f.name, None, f"Spark cannot read this Parquet schema: {exc}") for f in group)
            continue
        tables.append(_ParquetGroup(frame, everything.schema, key in venice_keys,
                                    {f.name: large[f.name] for f in group if f.name in large}))
    return tables, unreadable


def _spec_json(columns: list[str]) -> Column:
    """A SPEC Parquet row rendered as the JSON line it stands for (null columns left out)."""
    return F.to_json(F.struct(*[F.col(quoted(name)) for name in columns]), {"ignoreNullFields": "true"})


def _guarded(spark: SparkSession, folder: str, group: _ParquetGroup) -> DataFrame:
    """The rows of the group's files holding a page over the line limit, read around it on the executors (one task
    per file): the group's columns (null where a row group's large page holds them), ``source_file``, and the two
    markers of ``pipelines.ingest.parquet_pages`` (why a row's row group was read without some columns; why a row group
    could not be read at all)."""
    schema = T.StructType([*group.schema.fields, T.StructField(LARGE_PAGE_FIELD, T.StringType()),
                           T.StructField(UNREADABLE_FIELD, T.StringType())])
    arrow = to_arrow_schema(schema, timezone="UTC")  # Spark takes zoned Arrow timestamps as instants (UTC)
    files = [SnapshotFile(path="", name=name, format="parquet") for name in sorted(group.guarded)]
    guarded = group.guarded

    def batches(fs, path: str, name: str):
        for batch in guarded_batches(fs, path, arrow, guarded[name]):
            yield batch.append_column(_SOURCE, pa.array([name] * batch.num_rows, pa.string()))

    return _per_file(spark, folder, files, batches, schema.add(_SOURCE, T.StringType()))


# The file a Parquet row came from, under a name no column of the file can have taken.
_SOURCE = "__replica_lens_source_file"


def _whole() -> Column:
    return F.col(LARGE_PAGE_FIELD).isNull() & F.col(UNREADABLE_FIELD).isNull()


def _records(spark: SparkSession, folder: str, group: _ParquetGroup) -> DataFrame | None:
    """The group's rows that were read whole, with their file (``_SOURCE``): Spark's reading and the guarded files'
    other row groups (None when there are none)."""
    frames = []
    if group.frame is not None:
        frames.append(group.frame.select("*", _source_file_name(group.frame).alias(_SOURCE)))
    if group.guarded:
        frames.append(_guarded(spark, folder, group).where(_whole()).drop(LARGE_PAGE_FIELD, UNREADABLE_FIELD))
    return reduce(DataFrame.unionByName, frames) if frames else None


def _resolved(records: DataFrame, venice: VeniceSettings) -> tuple[DataFrame, PushResolution]:
    """Raw Venice records (``_records``) named for the decoder, and their version topics' push settings."""
    records = records.withColumnRenamed(_SOURCE, "source_file")
    resolved = resolve_push_settings(records, venice.push_settings, venice.carried_push_settings)
    if venice.on_resolved is not None:
        venice.on_resolved(resolved)
    return records, resolved


def _not_read_whole(spark: SparkSession, folder: str, group: _ParquetGroup, position: Column) -> DataFrame:
    """The rows of row groups holding a large page (PAGE_TOO_LARGE, ``raw`` the ``position`` JSON of the columns
    read), and one unreadable row per row group pyarrow could not convert."""
    rows = _guarded(spark, folder, group).where(~_whole())
    unread, large = F.col(UNREADABLE_FIELD), F.col(LARGE_PAGE_FIELD)
    return rows.select(
        F.col(_SOURCE).alias("source_file"),
        F.when(unread.isNull(), position).alias("raw"),
        F.coalesce(unread, large).alias("read_error"),
        F.when(unread.isNull(), F.lit(PAGE_TOO_LARGE)).alias("decoded_reason"),
    )


def _parquet_rows(
    spark: SparkSession, folder: str, files: list[SnapshotFile], venice: VeniceSettings,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> list[DataFrame]:
    """One frame per group of Parquet files with identical schema, plus rows for unreadable ones.

    A group whose schema is raw Venice records (``is_venice_schema``) is decoded (``venice_lines``).
    Files holding a page over the line limit are read around it (``_guarded``): the rows of a row group holding
    one are PAGE_TOO_LARGE, at the position their other columns give.
    """
    tables, unreadable = _parquet_tables(spark, files, max_line_bytes)
    frames: list[DataFrame] = []
    for group in tables:
        records = _records(spark, folder, group)
        if group.is_venice:
            if records is not None:
                records, resolved = _resolved(records, venice)
                frames.append(venice_lines(records, venice.cluster_regions, venice.clock_uncertainty_ms,
                                           resolved.settings, venice.limits, frozenset(resolved.refused)))
            position = F.to_json(F.struct(F.col("region").alias("replica"), "topic", "partition", "offset"))
        else:
            if records is not None:
                frames.append(records.select(F.col(_SOURCE).alias("source_file"), _spec_json(group.schema.fieldNames()).alias("raw"),
                                             F.lit(None).cast(T.StringType()).alias("read_error")))
            position = _spec_json(group.schema.fieldNames())
        if group.guarded:
            frames.append(_not_read_whole(spark, folder, group, position))
    if unreadable:
        frames.append(_local_lines(spark, unreadable))
    return frames


def read_skipped_positions(
    spark: SparkSession, folder: str, snapshot_id: str, venice: VeniceSettings | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> DataFrame:
    """The positions of the snapshot's raw Venice records skipped by rule, shaped like RawTopicSkipped.

    What ``read_snapshot_lines`` drops before judging (``decoded_reason`` in SKIP_REASONS), one
    row per record: its Kafka position was read (SPEC 3a), so it closes a gap though it holds no
    row. A pass of its own over the raw Venice files only, decoding only their control records
    (``venice_skipped_positions``); worth running only when the accepted pass saw skipped records
    (``Judgement.skipped_by_reason``). Unreadable files are the quarantine's business, and so are
    the row groups holding a page over ``max_line_bytes`` (never read here either).
    """
    venice = venice or VeniceSettings()
    parquet = [f for f in list_snapshot_files(folder).data_files if f.format == "parquet"]
    tables, _ = _parquet_tables(spark, parquet, max_line_bytes)
    frames = []
    for group in tables:
        records = _records(spark, folder, group) if group.is_venice else None
        if records is not None:
            records, resolved = _resolved(records, venice)
            frames.append(venice_skipped_positions(records, venice.cluster_regions, venice.clock_uncertainty_ms,
                                                   resolved.settings, frozenset(resolved.refused)))
    struct = RawTopicSkipped.to_structtype()
    if not frames:
        return local_frame(spark, [], struct)
    return conform(reduce(DataFrame.unionByName, frames).withColumn("snapshot_id", F.lit(snapshot_id)), struct)


def venice_cluster_ids(spark: SparkSession, folder: str, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> list[int]:
    """Every upstream cluster id named by the raw Venice records of a snapshot folder (sorted; empty
    without any). Reads the Parquet footers again (and around pages over ``max_line_bytes``): it serves
    only an error's message."""
    parquet = [f for f in list_snapshot_files(folder).data_files if f.format == "parquet"]
    tables, _ = _parquet_tables(spark, parquet, max_line_bytes)
    records = [r for r in (_records(spark, folder, group) for group in tables if group.is_venice) if r is not None]
    return cluster_ids_in(reduce(DataFrame.unionByName, records)) if records else []


def read_snapshot_lines(
    spark: SparkSession, folder: str, venice: VeniceSettings | None = None,
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES,
) -> DataFrame:
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
    # A file holding a line over the limit is split on the executors, never by Spark's reader (which holds a line whole).
    long = holding_long_lines(spark, folder, text_files, max_line_bytes)
    if len(long) < len(text_files):
        frames.append(_text_lines(spark, [f for f in text_files if f.name not in long]))
    if long:
        frames.append(_plain_lines(spark, folder, [f for f in text_files if f.name in long], max_line_bytes))
    gzip_files = [f for f in files if f.format == "jsonl.gz" and f.size > 0]
    if gzip_files:
        frames.append(_gzip_lines(spark, folder, gzip_files, max_line_bytes))
    frames.extend(_parquet_rows(spark, folder, [f for f in files if f.format == "parquet"], venice or VeniceSettings(),
                                max_line_bytes))
    if not frames:
        frames.append(_local_lines(spark, []))
    frames = [f if "decoded_reason" in f.columns else f.withColumn("decoded_reason", F.lit(None).cast(T.StringType()))
              for f in frames]
    return reduce(DataFrame.unionByName, frames)
