"""The one place that maps a table name to its Delta Lake table and reads and writes it.

Every table lives at ``<warehouse_root>/<table_name>``, partitioned by ``snapshot_id``.
Writing a snapshot replaces exactly that snapshot's rows in one Delta commit, so a
reader sees either the old rows or the new ones, never a mix or two copies.

Two engines write the same table format:

- ``native``: delta-spark, when its jars are on the Spark class path (a cluster, or
  ``SparkResource.delta_jars_dir``). Writes use ``replaceWhere`` on the snapshot.
- ``embedded``: the default here, with packages from the registry alone. Spark writes
  the snapshot's Parquet files straight into the table folder (invisible to readers,
  since no commit names them yet), then delta-rs (the ``deltalake`` package) commits
  them in one transaction that also removes the snapshot's previous files. The data is
  written once, by Spark (or, for a table a pass fills from Arrow batches where it makes
  them, by that pass through pyarrow: ``arrow_stage``, ``resources/staged_files.py``);
  delta-rs only writes the log. A crash before the commit
  leaves the table at its previous version (the orphan files are never read and are
  removed by ``VACUUM``). Two writers of one snapshot at once end as if they had run one
  after the other: one copy, the later commit's.

``engine="auto"`` picks native when the session has delta-spark loaded.

The warehouse is a path or a URI (``file://``, ``s3://``/``s3a://``, ...). The embedded
commit lists the staged files, reads their footers and removes Spark's markers through
``resources/filesystem.py`` (pyarrow's filesystems), and delta-rs is given the storage
options of ``REPLICA_LENS_STORAGE_OPTIONS``: nothing assumes a local disk there. (Spark
reads and writes the same URIs through its Hadoop connectors.) Housekeeping lists and
measures files through the same layer.

Housekeeping (``DeltaStore.vacuum``) keeps the warehouse from growing without bound. A
VACUUM of each table removes every file that no Delta version still needs and that is
older than the retention: the files of superseded snapshot writes (removed from the table
by a later commit more than the retention ago) and files that no version ever named
(``write-<uuid>`` folders of writes that crashed before their commit). The retention is
what keeps a write in flight safe: its staged files are named by no version until it
commits, so only their age protects them (keep the retention well above the longest
run). It also bounds time travel: a version older than the retention may have lost its
files. Optionally, partitions of many small files are first compacted into fewer files
(delta-rs ``optimize.compact``, a commit that changes no row).
"""
from __future__ import annotations

import functools
import json
import os
import random
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Optional, Sequence

import dagster as dg
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pydantic import Field
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from resources.delta_reader import (
    PARTITION_COLUMN,
    TABLE_NAME,
    check_table_name,
    snapshot_column_max,
    table_uri,
    warehouse_uri,
)
from resources.delta_stats import file_stats
from resources.errors import InvalidSetting
from resources.filesystem import Location, delta_storage_options
from resources.session import has_native_delta
from resources.snapshots import UnsafeNameError, check_snapshot_id  # noqa: F401 (UnsafeNameError: re-exported)
from resources.staged_files import RULE_COUNTS, ArrowStage
from resources.tuning import DEFAULT_RETENTION_HOURS
from schemas.arrow_rules import ArrowRule
from schemas.conform import conform, local_frame, quoted, select_sql, sql_literal, to_arrow_schema

# Commits that lose a race to a concurrent writer are retried this many times in all.
_COMMIT_ATTEMPTS = 10
_ROWS = "__staged_rows"
# delta-rs' default target for compacted files; a file under half of it is "small": two fit in one.
COMPACT_TARGET_BYTES = 100 * 1024 * 1024


# Parquet's dictionary encoding pays off for columns whose values repeat (replica, topic, kind,
# region, verdict, ...). Offsets, timestamps and counts are nearly all distinct, and keys,
# values, hashes and texts mostly: the writer fills a dictionary per column chunk, checks
# after every value whether to give up, and re-encodes as plain once it does. So every
# table is written with dictionaries for its string columns only, less the ones below.
# A small gain, close to the noise, for files of the same size (docs/performance.md).
DISTINCT_STRINGS = ("key", "value", "value_hash", "raw", "detail")
DISTINCT_STRING_PREFIXES = ("witness_", "last_hash_")


# Columns that hold the input's values, of any size (raw text included).
VALUE_COLUMNS = ("value", "raw", "witness_value_a", "witness_value_b")
# A write folder whose every file holds every row of the streams it holds (``stage(whole_streams=True)``).
STREAMS_SUFFIX = ".streams"
# Value columns that a table keeps for rows written by earlier versions only: new rows leave them null.
NULL_VALUE_COLUMNS = {"replica_state": ("value",)}


def holds_values(table: str, struct: T.StructType) -> bool:
    """Whether ``table`` (shaped like ``struct``) holds the input's values: only Spark's writer bounds its pages."""
    nulls = NULL_VALUE_COLUMNS.get(table, ())
    return any(f.name in VALUE_COLUMNS and f.name not in nulls for f in struct.fields)


def parquet_options(struct: T.StructType) -> dict[str, str]:
    """Writer options: Parquet dictionary encoding for the string columns whose values repeat, and no others; and
    for a table holding values, a page's size checked after every row.

    Parquet checks the size of the page it fills after 100 rows at first, then after as many rows as it expects
    the page to take from the rows so far: after a few thousand small rows, a run of values of megabytes would
    fill one page of gigabytes (measured: 64 values of 16 MiB made one page of 1 GiB), held whole in the
    writer's memory and again in every reader's. Checked every row, a page closes at its size (1 MiB) or one
    value past it.
    """
    options = {"parquet.enable.dictionary": "false"}
    if any(f.name in VALUE_COLUMNS for f in struct.fields):
        options.update({"parquet.page.size.row.check.min": "1", "parquet.page.size.check.estimate": "false"})
    for name in dictionary_columns(struct):
        options[f"parquet.enable.dictionary#{name}"] = "true"
    return options


def dictionary_columns(struct: T.StructType) -> tuple[str, ...]:
    """The columns ``parquet_options`` gives Parquet dictionary encoding: string columns whose values repeat."""
    return tuple(
        f.name for f in struct.fields
        if isinstance(f.dataType, T.StringType) and f.name not in DISTINCT_STRINGS
        and not f.name.startswith(DISTINCT_STRING_PREFIXES)
    )


def _snapshot_folder(write_folder: str, snapshot_id: str) -> str:
    """Where a write's files of one snapshot go: Hive-style, as ``partitionBy`` would name it (safe ids need no escaping)."""
    return f"{write_folder}/{PARTITION_COLUMN}={snapshot_id}"


@dataclass(frozen=True)
class StagedWrite:
    """Parquet files written for a table but not yet committed: invisible to every reader."""

    table: str
    uri: str  # the table's
    snapshot_id: Optional[str]  # None: the staged files replace the whole table
    relative_dir: str  # the write's folder, relative to the table
    struct: T.StructType
    row_count: int
    metrics: dict = field(default_factory=dict)  # the observed aggregates, by name

    @property
    def folder(self) -> str:
        return f"{self.uri}/{self.relative_dir}"


@dataclass(frozen=True)
class WriteResult:
    """What one snapshot write produced: shown as metadata on the materialization."""

    table_uri: str
    version: int
    row_count: int
    engine: str
    files: int


@dataclass(frozen=True)
class VacuumResult:
    """What housekeeping did to one table (or, on a dry run, would do)."""

    table: str
    dry_run: bool
    files: int  # removed: superseded files past the retention and files no version names
    bytes: int
    folders: int = 0  # empty folders left by removed files (never counted on a dry run)
    compacted: tuple[str, ...] = ()  # snapshots whose small files were (or would be) compacted
    files_compacted: int = 0  # small files rewritten (on a dry run: that would be)
    files_written: int = 0  # files the compaction wrote
    note: str = ""  # e.g. a compaction that lost a race to a concurrent write

    def as_row(self) -> dict:
        return {
            "table": self.table,
            "files_removed": self.files,
            "bytes_removed": self.bytes,
            "folders_removed": self.folders,
            "snapshots_compacted": len(self.compacted),
            "files_compacted": self.files_compacted,
            "files_written": self.files_written,
            "note": self.note,
        }


def partitions_to_compact(
    files: Sequence[tuple[Optional[str], int]], target_bytes: int = COMPACT_TARGET_BYTES, min_files: int = 2
) -> list[Optional[str]]:
    """The partitions (snapshot ids) of ``(partition, size)`` live files that compaction would shrink.

    A partition needs it when it holds at least ``min_files`` files under half the target
    size: two of those fit in one target-size file. Partitions of one file, or of files
    near the target, are left alone (rewriting them would gain nothing).
    """
    small: dict[Optional[str], int] = {}
    for partition, size in files:
        if size < target_bytes // 2:
            small[partition] = small.get(partition, 0) + 1
    return sorted((p for p, n in small.items() if n >= min_files), key=lambda p: (p is None, p or ""))


def _remove_empty_folders(root: str, deleted: Sequence[str], cutoff: float) -> int:
    """Remove the empty folders under ``root`` that this vacuum emptied or that are older than ``cutoff``.

    The log (``_delta_log``) and hidden top-level folders are never touched. A folder of a
    write in flight is young and never emptied by a vacuum (its files are young too), so
    it stays; ``rmdir`` removes only empty folders, so a file arriving meanwhile wins.
    Returns how many folders were removed.
    """
    emptied = {os.path.dirname(os.path.join(root, path)) for path in deleted}
    removed = 0
    for top in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        if top.startswith(("_", ".")) or not os.path.isdir(os.path.join(root, top)):
            continue
        for folder, subfolders, names in os.walk(os.path.join(root, top), topdown=False):
            if names or any(os.path.isdir(os.path.join(folder, sub)) for sub in subfolders):
                continue
            try:
                if folder not in emptied and os.stat(folder).st_mtime >= cutoff:
                    continue
                os.rmdir(folder)
            except OSError:  # a file arrived, or another vacuum removed it first
                continue
            removed += 1
            emptied.add(os.path.dirname(folder))
    return removed


def _without_partition(struct: T.StructType) -> T.StructType:
    return T.StructType([f for f in struct.fields if f.name != PARTITION_COLUMN])


def _arrow_schema(struct: T.StructType):
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(struct)


def _add_actions(dt) -> dict[str, list]:
    """The live files of a delta-rs table as columns (delta-rs returns an Arrow-capsule table)."""
    import pyarrow as pa

    return pa.table(dt.get_add_actions(flatten=True)).to_pydict()


def _reader_features(dt) -> set[str]:
    """The Delta reader features a delta-rs table uses (e.g. ``columnMapping``, ``deletionVectors``)."""
    return set(getattr(dt.protocol(), "reader_features", None) or [])


def _commit_with_retries(uri: str, commit) -> int:
    """Run ``commit(DeltaTable)`` with delta-rs; one that lost a race is retried on the fresh table. The new version.

    A concurrent commit (another partition's write, a retention delete) makes delta-rs
    raise ``CommitFailedError``; the retry re-reads the table first, with a growing jitter.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    for attempt in range(1, _COMMIT_ATTEMPTS + 1):
        dt = DeltaTable(uri, storage_options=delta_storage_options())
        try:
            commit(dt)
            break
        except CommitFailedError:
            if attempt == _COMMIT_ATTEMPTS:
                raise
            time.sleep(random.uniform(0.05, 0.25) * attempt)
    dt.update_incremental()
    return dt.version()


class OutdatedSnapshot(RuntimeError):
    """A snapshot's files lack a column that its table's schema now declares non-nullable."""


@functools.lru_cache(maxsize=65_536)
def _file_columns(uri: str) -> frozenset[str]:
    """The top-level column names of one data file, from its Parquet footer (a committed file never changes)."""
    location = Location.of(uri)
    with location.fs.open_input_file(location.path) as handle:
        return frozenset(pq.ParquetFile(handle).schema_arrow.names)


@dataclass(frozen=True)
class LiveFile:
    """One data file of a table's current version, as the Delta log describes it."""

    uri: str
    null_counts: dict[str, Optional[int]]  # column -> the log's nullCount (absent or None: not recorded for it)


def _files_by_snapshot(actions: dict[str, list], uri: str, snapshot_id: Optional[str]) -> dict[str, list[LiveFile]]:
    """The live data files of ``snapshot_id`` (None: of every snapshot) by snapshot, from the log's ``_add_actions``."""
    paths = actions.get("path", [])
    partitions = actions.get(f"partition.{PARTITION_COLUMN}", [None] * len(paths))
    counted = {key[len("null_count."):]: values for key, values in actions.items() if key.startswith("null_count.")}
    by_snapshot: dict[str, list[LiveFile]] = {}
    for i, (path, part) in enumerate(zip(paths, partitions)):
        if snapshot_id is None or part == snapshot_id:
            nulls = {column: values[i] for column, values in counted.items()}
            by_snapshot.setdefault(part, []).append(LiveFile(f"{uri}/{path}", nulls))
    return by_snapshot


def _absent_columns(files: Sequence[LiveFile], columns: Sequence[str]) -> tuple[list[str], list[str]]:
    """Of ``columns``: those some file lacks (its footer), and those some file holds only as padding (the log).

    A column the log counts nulls for is in the file: no footer is read for it. A column
    without a count (a map or struct, a writer that left statistics out, a file written
    before the column existed) is looked up in the file's footer.
    """
    missing, padded = set(), set()
    for file in files:
        for name in columns:
            nulls = file.null_counts.get(name)
            if nulls is None:
                if name not in _file_columns(file.uri):
                    missing.add(name)
            elif nulls > 0:
                padded.add(name)
    return sorted(missing), sorted(padded)


def refuse_outdated_snapshots(table: str, required: Sequence[str], files: dict[str, list[LiveFile]]) -> None:
    """Raise ``OutdatedSnapshot`` when a file of these snapshots has no value in a ``required`` (non-nullable) column.

    Delta adds a new column to a table's schema on the first write that has it; the files
    of snapshots written before keep their old columns, and every reader (delta-spark and
    the embedded one alike) returns null for the missing column. For a nullable column that
    is the designed upgrade path (null: not known). For a column the schema declares
    non-nullable it would be a value no writer produced, so the snapshot is refused instead,
    naming the asset to materialize again.

    Two signs, neither of which reads the data: a file whose Parquet footer lacks the
    column (read once per process: files never change once committed), and a file whose
    Delta log entry counts nulls in it. Every write is validated against the model, so a
    null there was never written: it is what a compaction after the upgrade leaves
    (delta-rs and delta-spark rewrite an older snapshot's files with the table's current
    columns, padded with nulls). The log answers for the columns it has statistics for,
    so footers are read only for the others (maps, structs).
    """
    required = [name for name in required if name != PARTITION_COLUMN]  # in the path, not in the files
    if not required:
        return
    for snapshot, snapshot_files in sorted(files.items()):
        missing, padded = _absent_columns(snapshot_files, required)
        if missing or padded:
            raise OutdatedSnapshot(
                f"{table}: snapshot {snapshot} was written by an earlier version of Replica Lens, without the "
                f"column(s) {', '.join(sorted({*missing, *padded}))} that the table now requires"
                + (f" (its files hold {', '.join(padded)} as nulls: compacted after the upgrade)" if padded else "")
                + f": materialize {table} of snapshot {snapshot} again"
            )


class DeltaStore(dg.ConfigurableResource):
    """Delta Lake tables under one warehouse root, one table per asset, partitioned by snapshot."""

    warehouse_root: str = Field(description="Folder (or URI on a cluster) holding one Delta table per asset.")
    engine: str = Field(
        default="auto",
        description="auto (delta-spark when its jars are loaded, else embedded delta-rs), native, or embedded.",
    )

    # ----------------------------------------------------------------- paths
    def table_uri(self, table: str) -> str:
        # One name for Spark and delta-rs (both read s3a://), shared with the Spark-free reader.
        return table_uri(self.warehouse_root, table)

    def _root_uri(self) -> str:
        return warehouse_uri(self.warehouse_root)

    def _engine(self, spark: SparkSession) -> str:
        if self.engine == "embedded":
            return "embedded"
        native = has_native_delta(spark)
        if self.engine == "native" and not native:
            raise RuntimeError(
                "DeltaStore.engine=native, but delta-spark is not loaded in this Spark session: "
                "set SparkResource.delta_jars_dir (REPLICA_LENS_DELTA_JARS) to a folder with the Delta jars"
            )
        if self.engine not in ("auto", "native"):
            raise InvalidSetting(f"unknown Delta engine {self.engine!r}: use auto, native or embedded")
        return "native" if native else "embedded"

    def exists(self, table: str) -> bool:
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(self.table_uri(table), storage_options=delta_storage_options())

    # ----------------------------------------------------------------- write
    def write_snapshot(
        self, spark: SparkSession, df: DataFrame, table: str, snapshot_id: str, struct: T.StructType
    ) -> WriteResult:
        """Replace ``snapshot_id``'s rows of ``table`` with ``df`` (shaped like ``struct``) atomically."""
        return self.commit(spark, self.stage(spark, df, table, snapshot_id, struct))

    def write_table(self, spark: SparkSession, df: DataFrame, table: str, struct: T.StructType) -> WriteResult:
        """Replace every row of ``table`` (for tables that span snapshots) atomically."""
        return self.commit(spark, self.stage(spark, df, table, None, struct))

    def stage(
        self,
        spark: SparkSession,
        df: DataFrame,
        table: str,
        snapshot_id: Optional[str],
        struct: T.StructType,
        observe: Sequence[Column] = (),
        whole_streams: bool = False,
    ) -> StagedWrite:
        """Write ``df``'s rows as Parquet files that no reader sees yet; ``observe`` aggregates ride along.

        The files go to a fresh folder ``<table>/write-<uuid>`` (Hive-style by snapshot):
        never named by the Delta log until ``commit``, so a crash or a ``discard`` leaves the
        table as it was. ``observe`` are aggregate columns computed by the same Spark job that
        writes (``DataFrame.observe``): the schema check's counts cost no pass of their own.
        The row count is always observed. ``snapshot_id`` None stages a whole-table replacement.

        ``whole_streams``: the caller's ``df`` is hash-partitioned by stream (``schemas.raw.STREAM_COLUMNS``), so
        each task writes every row of its streams into its one file; the folder says so
        (``STREAMS_SUFFIX``) and ``stream_files`` finds such a snapshot's files. Not said when Spark
        may cut a task's rows into several files (``spark.sql.files.maxRecordsPerFile``).
        """
        if snapshot_id is not None:
            check_snapshot_id(snapshot_id)
            # The partition being written decides the snapshot of every row: no row can land elsewhere.
            df = df.withColumn(PARTITION_COLUMN, F.lit(snapshot_id))
        df = conform(df, struct)
        uri = self.table_uri(table)
        whole = whole_streams and snapshot_id is not None and int(
            spark.conf.get("spark.sql.files.maxRecordsPerFile", "0") or 0) <= 0
        relative_dir = f"write-{uuid.uuid4().hex}{STREAMS_SUFFIX if whole else ''}"
        folder = f"{uri}/{relative_dir}"
        observation = Observation()
        observed = df.observe(observation, F.count(F.lit(1)).alias(_ROWS), *observe)
        # (Not "_"-prefixed: VACUUM must be able to remove the files of a write that never committed.)
        options = parquet_options(struct)
        if snapshot_id is None:
            observed.write.mode("errorifexists").options(**options).partitionBy(PARTITION_COLUMN).parquet(folder)
        else:
            # Every row is the one snapshot's: its files go straight into the partition's folder
            # (Hive-style, as partitionBy names it; a safe id needs no escaping). A partitioned
            # write would first sort every row by the partition column.
            observed.drop(PARTITION_COLUMN).write.mode("errorifexists").options(**options).parquet(
                _snapshot_folder(folder, snapshot_id)
            )
        metrics = dict(observation.get)
        return StagedWrite(
            table=table,
            uri=uri,
            snapshot_id=snapshot_id,
            relative_dir=relative_dir,
            struct=struct,
            row_count=int(metrics.pop(_ROWS)),
            metrics=metrics,
        )

    def arrow_stage(
        self, table: str, snapshot_id: str, struct: T.StructType, rules: tuple[ArrowRule, ...] = (),
    ) -> ArrowStage:
        """A staged write of one snapshot that Arrow batches fill where they are made (``resources/staged_files.py``).

        Its files go where ``stage`` would put Spark's (a fresh ``write-<uuid>`` folder, the snapshot's
        Hive-style folder in it), with the writer settings ``stage`` gives Spark's writer (the codec,
        dictionaries for repeating strings); each counts the rows breaking each of ``rules`` as it
        writes them. Once every task has written, ``stage_arrow`` makes it a ``StagedWrite`` like any
        other. Not for tables holding values (``VALUE_COLUMNS``), whose pages Spark's writer bounds
        row by row; a value column that new rows leave null (``NULL_VALUE_COLUMNS``) is refused any
        value by the files (``ArrowStage.null_columns``).
        """
        check_snapshot_id(snapshot_id)
        if holds_values(table, struct):
            raise ValueError(f"{table} holds values: stage it with Spark's writer (DeltaStore.stage)")
        nulls = NULL_VALUE_COLUMNS.get(table, ())
        relative_dir = f"write-{uuid.uuid4().hex}"
        uri = self.table_uri(table)
        folder = Location.of(_snapshot_folder(f"{uri}/{relative_dir}", snapshot_id))
        return ArrowStage(
            table=table, uri=uri, relative_dir=relative_dir, snapshot_id=snapshot_id,
            schema=to_arrow_schema(_without_partition(struct)), fs=folder.fs, path=folder.path,
            dictionary_columns=dictionary_columns(struct), rules=tuple(rules), partition_column=PARTITION_COLUMN,
            null_columns=tuple(nulls),
        )

    @staticmethod
    def write_arrow(stage: ArrowStage, rows: pa.Table, name: str = "rows") -> int:
        """Write ``rows`` (the stage's columns, by name) here, on the driver, as one file of ``stage``; how many.

        Beside the files a pass's tasks write (``name`` is never a task's), or alone: a small
        table collected to the driver is staged with no Spark write job (``StepTables.stage``).
        """
        file = stage.files(0, name=name)
        try:
            for batch in rows.select(stage.schema.names).cast(stage.schema).to_batches():
                file.write(batch)
            return file.close()
        except BaseException:
            file.abort()
            raise

    def stage_arrow(self, stage: ArrowStage, struct: T.StructType) -> StagedWrite:
        """The staged write that ``stage``'s files make, once written; from their footers alone (no Spark job).

        ``metrics``: ``rule_counts``, per rule of ``stage.rules``, the rows of all the files that break it.
        No file (no task had rows): an empty write.
        """
        written = Location.of(_snapshot_folder(f"{stage.uri}/{stage.relative_dir}", stage.snapshot_id))
        rows, counts = 0, [0] * len(stage.rules)
        for info in written.walk_files() if written.is_dir() else []:
            if not info.base_name.endswith(".parquet"):
                continue
            with written.fs.open_input_file(info.path) as handle:
                footer = pq.ParquetFile(handle).metadata
            rows += footer.num_rows
            found = json.loads((footer.metadata or {}).get(RULE_COUNTS.encode(), b"null"))
            if found is None or len(found) != len(counts):
                raise ValueError(f"{info.path}: no rule counts for the {len(counts)} rules of {stage.table} in its footer")
            counts = [a + b for a, b in zip(counts, found)]
        return StagedWrite(table=stage.table, uri=stage.uri, snapshot_id=stage.snapshot_id,
                           relative_dir=stage.relative_dir, struct=struct, row_count=rows,
                           metrics={"rule_counts": counts})

    def stage_empty(self, table: str, snapshot_id: Optional[str], struct: T.StructType) -> StagedWrite:
        """A staged write of no rows, known empty without running Spark: committing it empties the snapshot.

        No file is written (a Spark job writing nothing still costs seconds in a fresh JVM);
        the commit then names no file and removes the snapshot's previous ones.
        """
        if snapshot_id is not None:
            check_snapshot_id(snapshot_id)
        return StagedWrite(
            table=table,
            uri=self.table_uri(table),
            snapshot_id=snapshot_id,
            relative_dir=f"write-{uuid.uuid4().hex}",
            struct=struct,
            row_count=0,
        )

    def read_staged(self, spark: SparkSession, staged: StagedWrite) -> DataFrame:
        """The staged rows, before they are committed (a later table of the same step may be built from them)."""
        if staged.row_count == 0:
            return local_frame(spark, [], staged.struct)
        if staged.snapshot_id is None:
            return spark.read.schema(staged.struct).parquet(staged.folder)
        files = spark.read.schema(_without_partition(staged.struct)).parquet(
            _snapshot_folder(staged.folder, staged.snapshot_id)
        )
        # One SQL text per column, sent together: a select of names is two round trips to the JVM per column.
        return select_sql(files, [
            f"{sql_literal(staged.snapshot_id)} AS {quoted(name)}" if name == PARTITION_COLUMN else quoted(name)
            for name in staged.struct.names
        ])

    def discard(self, staged: StagedWrite) -> None:
        """Remove a staged write that must not be published."""
        Location.of(staged.folder).delete_tree()

    def discard_arrow_stage(self, stage: ArrowStage) -> None:
        """Remove what a pass wrote for ``stage`` before it was staged (the step failed)."""
        Location.of(f"{stage.uri}/{stage.relative_dir}").delete_tree()

    def commit(self, spark: SparkSession, staged: StagedWrite) -> WriteResult:
        """Publish a staged write: the snapshot's (or table's) rows become exactly the staged ones, in one commit."""
        try:
            if self._engine(spark) == "native":
                return self._commit_native(spark, staged)
            return self._commit_embedded_files(staged)
        except Exception:
            self.discard(staged)
            raise

    def _commit_native(self, spark: SparkSession, staged: StagedWrite) -> WriteResult:
        """delta-spark writes and commits in one go: the validated staged files are written again through it."""
        from delta.tables import DeltaTable as SparkDeltaTable

        df = self.read_staged(spark, staged)
        writer = (
            df.write.format("delta").mode("overwrite").option("mergeSchema", "true")
            .options(**parquet_options(staged.struct)).partitionBy(PARTITION_COLUMN)
        )
        if staged.snapshot_id is not None:
            writer = writer.option("replaceWhere", f"{PARTITION_COLUMN} = '{staged.snapshot_id}'")
        writer.save(staged.uri)
        self.discard(staged)
        last = SparkDeltaTable.forPath(spark, staged.uri).history(1).collect()[0]
        metrics = last["operationMetrics"] or {}
        return WriteResult(
            table_uri=staged.uri,
            version=int(last["version"]),
            row_count=int(metrics.get("numOutputRows", staged.row_count)),
            engine="native",
            files=int(metrics.get("numFiles", 0)),
        )

    def _commit_embedded_files(self, staged: StagedWrite) -> WriteResult:
        from deltalake import DeltaTable
        from deltalake.transaction import AddAction

        uri = staged.uri
        arrow_schema = _arrow_schema(staged.struct)
        options = delta_storage_options()
        if not DeltaTable.is_deltatable(uri, storage_options=options):
            try:
                DeltaTable.create(
                    uri, schema=arrow_schema, partition_by=[PARTITION_COLUMN], name=staged.table, storage_options=options
                )
            except Exception:  # noqa: BLE001 - a concurrent run created it first; use theirs
                if not DeltaTable.is_deltatable(uri, storage_options=options):
                    raise
        actions = []
        rows = 0
        now_ms = int(time.time() * 1000)
        # Listed and read through the filesystem layer: the staged files may be on object storage.
        target = Location.of(staged.folder)
        for info in target.walk_files():
            relative = target.relative(info.path)  # "<snapshot_id=...>/part-....parquet"
            partition = relative.rsplit("/", 1)[0] if "/" in relative else ""
            if not info.base_name.endswith(".parquet"):
                target.fs.delete_file(info.path)  # Spark's _SUCCESS and .crc files: not part of the table
                continue
            with target.fs.open_input_file(info.path) as handle:
                footer = pq.ParquetFile(handle).metadata
            rows += footer.num_rows
            actions.append(
                AddAction(
                    path=f"{staged.relative_dir}/{relative}",
                    size=info.size,
                    partition_values={PARTITION_COLUMN: partition.split("=", 1)[1]},
                    modification_time=now_ms,
                    data_change=True,
                    stats=json.dumps(file_stats(footer, skip=(PARTITION_COLUMN,))),
                )
            )
        version = self._commit_embedded(uri, actions, arrow_schema, staged.snapshot_id)
        return WriteResult(table_uri=uri, version=version, row_count=rows, engine="embedded", files=len(actions))

    @staticmethod
    def _commit_embedded(uri: str, actions: list, arrow_schema, snapshot_id: Optional[str]) -> int:
        """Commit ``actions`` as the snapshot's (or table's) only files; return the new version.

        delta-rs finds no conflict between two overwrites of a partition that held no files
        (both would commit: two copies), and sees one between overwrites of different
        partitions (a false failure). So each commit claims its partition with an
        application transaction id, which two commits of one partition cannot both carry,
        and a commit that lost a race is retried on the fresh table: its overwrite then
        replaces what the winner wrote, as if the writes had run one after the other.
        """
        from deltalake import CommitProperties, Transaction

        claim = f"replica-lens:{PARTITION_COLUMN}={snapshot_id}" if snapshot_id is not None else "replica-lens:table"
        return _commit_with_retries(
            uri,
            lambda dt: dt.create_write_transaction(
                actions,
                mode="overwrite",
                schema=arrow_schema,
                partition_by=[PARTITION_COLUMN],
                partition_filters=None if snapshot_id is None else [(PARTITION_COLUMN, "=", snapshot_id)],
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(app_id=claim, version=dt.version() + 1)]
                ),
            ),
        )

    def delete_snapshots(self, spark: SparkSession, table: str, snapshot_ids: Sequence[str]) -> Optional[int]:
        """Remove every row of ``snapshot_ids`` from ``table`` in one Delta commit; return its version.

        A delete of whole partitions (the predicate names ``snapshot_id`` only): the log
        removes their files, no data file is rewritten, and ``VACUUM`` reclaims them later.
        None, and no commit, when there is nothing to delete. Used by ``replica_state``'s
        retention (``assets/divergence.py``).
        """
        ids = sorted({check_snapshot_id(s) for s in snapshot_ids})
        if not ids or not self.exists(table):
            return None
        uri = self.table_uri(table)
        if self._engine(spark) == "native":
            from delta.tables import DeltaTable as SparkDeltaTable

            delta = SparkDeltaTable.forPath(spark, uri)
            delta.delete(F.col(PARTITION_COLUMN).isin(*ids))
            return int(delta.history(1).collect()[0]["version"])
        predicate = f"{PARTITION_COLUMN} IN ({', '.join(repr(i) for i in ids)})"  # safe ids: no quote inside
        return _commit_with_retries(uri, lambda dt: dt.delete(predicate))

    # ------------------------------------------------------------------ read
    def read_snapshot(
        self, spark: SparkSession, table: str, snapshot_id: str, struct: T.StructType, required: Sequence[str] = ()
    ) -> DataFrame:
        """The rows of ``snapshot_id`` in ``table`` (empty, with ``struct``, when there are none).

        ``required``: the columns the table's schema declares non-nullable. A snapshot whose
        files lack one (written before the column existed) is refused with ``OutdatedSnapshot``.
        """
        check_snapshot_id(snapshot_id)
        return self._read(spark, table, struct, snapshot_id, required)

    def read_all(self, spark: SparkSession, table: str, struct: T.StructType, required: Sequence[str] = ()) -> DataFrame:
        """Every snapshot's rows of ``table`` (``required`` as for ``read_snapshot``)."""
        return self._read(spark, table, struct, None, required)

    def _read(
        self, spark: SparkSession, table: str, struct: T.StructType, snapshot_id: Optional[str], required: Sequence[str]
    ) -> DataFrame:
        from deltalake import DeltaTable

        uri = self.table_uri(table)
        if not self.exists(table):
            return local_frame(spark, [], struct)
        dt = DeltaTable(uri, storage_options=delta_storage_options())
        features = _reader_features(dt)
        native = self._engine(spark) == "native"
        files = _files_by_snapshot(_add_actions(dt), uri, snapshot_id)
        if "columnMapping" not in features:  # else a file's column names are not the table's
            refuse_outdated_snapshots(table, required, files)
        if native:
            df = spark.read.format("delta").load(uri)
            if snapshot_id is not None:
                df = df.where(F.col(PARTITION_COLUMN) == snapshot_id)
            return conform(df, struct)
        unsupported = features & {"deletionVectors", "columnMapping"}
        if unsupported:
            raise RuntimeError(
                f"{uri} uses Delta features {sorted(unsupported)} that the embedded reader does not "
                "support: read it with delta-spark (set REPLICA_LENS_DELTA_JARS)"
            )
        data_struct = _without_partition(struct)
        frames = [
            spark.read.schema(data_struct)
            .parquet(*(file.uri for file in part_files))
            .withColumn(PARTITION_COLUMN, F.lit(part))
            for part, part_files in sorted(files.items())
        ]
        if not frames:
            return local_frame(spark, [], struct)
        result = frames[0]
        for frame in frames[1:]:
            result = result.unionByName(frame)
        return conform(result, struct)

    def stream_files(self, spark: SparkSession, table: str, snapshot_id: str) -> Optional[list[Location]]:
        """The live files of ``snapshot_id`` in ``table`` when each holds every row of its streams, else None.

        So when every one lies in a write folder staged with ``whole_streams`` (by this embedded
        writer: delta-spark writes its own files) and the table uses no feature the embedded reader
        lacks. A pass reading them file by file then sees each stream whole, with no exchange.
        """
        from deltalake import DeltaTable

        check_snapshot_id(snapshot_id)
        if self._engine(spark) == "native" or not self.exists(table):
            return None
        uri = self.table_uri(table)
        dt = DeltaTable(uri, storage_options=delta_storage_options())
        if _reader_features(dt) & {"deletionVectors", "columnMapping"}:
            return None
        files = _files_by_snapshot(_add_actions(dt), uri, snapshot_id).get(snapshot_id, [])
        if not files or not all(file.uri[len(uri) + 1:].split("/", 1)[0].endswith(STREAMS_SUFFIX) for file in files):
            return None
        return [Location.of(file.uri) for file in files]

    def snapshot_ids(self, table: str) -> list[str]:
        """The snapshots present in ``table`` (from the Delta log alone)."""
        from deltalake import DeltaTable

        if not self.exists(table):
            return []
        actions = _add_actions(DeltaTable(self.table_uri(table), storage_options=delta_storage_options()))
        return sorted(set(actions.get(f"partition.{PARTITION_COLUMN}", [])))

    def snapshot_rows(self, table: str, snapshot_ids: Optional[Sequence[str]] = None) -> Optional[int]:
        """Rows of ``table`` in ``snapshot_ids`` (None: every snapshot), from the Delta log's file statistics.

        Nothing of the data is read. None when the table does not exist or a file's log entry
        has no ``numRecords`` (a writer that left statistics out): unknown, not zero.
        """
        from deltalake import DeltaTable

        if not self.exists(table):
            return None
        actions = _add_actions(DeltaTable(self.table_uri(table), storage_options=delta_storage_options()))
        counts = actions.get("num_records", [])
        parts = actions.get(f"partition.{PARTITION_COLUMN}", [None] * len(counts))
        wanted = None if snapshot_ids is None else set(snapshot_ids)
        chosen = [n for n, part in zip(counts, parts) if wanted is None or part in wanted]
        if any(n is None for n in chosen):
            return None
        return int(sum(chosen))

    def column_max(self, table: str, snapshot_id: str, column: str) -> Optional[int]:
        """The largest value of a numeric ``column`` in ``snapshot_id``'s rows, from the Delta log's file statistics
        (no data is read); None when the table does not exist or no file of the snapshot has one."""
        from deltalake import DeltaTable

        if not self.exists(table):
            return None
        dt = DeltaTable(self.table_uri(table), storage_options=delta_storage_options())
        return snapshot_column_max(dt, snapshot_id, column)

    def written_without(self, table: str, snapshot_id: str, column: str) -> bool:
        """Whether some file of ``snapshot_id`` in ``table`` lacks ``column`` (written before the column existed).

        From the log's statistics, and the Parquet footer of a file without any for the column; no data is read.
        """
        from deltalake import DeltaTable

        if not self.exists(table):
            return False
        actions = _add_actions(DeltaTable(self.table_uri(table), storage_options=delta_storage_options()))
        files = _files_by_snapshot(actions, self.table_uri(table), snapshot_id).get(snapshot_id, [])
        missing, _ = _absent_columns(files, [column])
        return bool(missing)

    def version(self, table: str) -> Optional[int]:
        from deltalake import DeltaTable

        return (
            DeltaTable(self.table_uri(table), storage_options=delta_storage_options()).version()
            if self.exists(table)
            else None
        )

    # ---------------------------------------------------------- housekeeping
    def tables(self) -> list[str]:
        """The Delta tables of the warehouse: its folders with a safe table name and a Delta log."""
        from deltalake import DeltaTable

        options = delta_storage_options()
        return sorted(
            entry.name
            for entry in Location.of(self._root_uri()).list()
            if entry.is_dir
            and TABLE_NAME.fullmatch(entry.name)
            and DeltaTable.is_deltatable(self.table_uri(entry.name), storage_options=options)
        )

    def vacuum(
        self,
        retention_hours: int = DEFAULT_RETENTION_HOURS,
        dry_run: bool = False,
        compact: bool = False,
        tables: Optional[Sequence[str]] = None,
        compact_target_bytes: int = COMPACT_TARGET_BYTES,
    ) -> list[VacuumResult]:
        """Vacuum every table of the warehouse (or ``tables``); see the module docstring.

        Per table: with ``compact``, the snapshots with several small files are compacted
        first (their old files become superseded, removed by a later vacuum once past the
        retention); then every file that no version needs and older than
        ``retention_hours`` is removed, with the folders that leaves empty. ``dry_run``
        changes nothing and reports what would be removed (and compacted).
        """
        if not isinstance(retention_hours, int) or isinstance(retention_hours, bool) or retention_hours < 0:
            raise InvalidSetting(f"retention_hours must be a whole number of hours >= 0, not {retention_hours!r}")
        names = self.tables() if tables is None else [check_table_name(t) for t in tables]
        return [
            self._vacuum_table(name, retention_hours, dry_run, compact, compact_target_bytes) for name in names
        ]

    def _vacuum_table(
        self, table: str, retention_hours: int, dry_run: bool, compact: bool, target_bytes: int
    ) -> VacuumResult:
        from deltalake import DeltaTable, WriterProperties
        from deltalake.exceptions import CommitFailedError

        uri = self.table_uri(table)
        dt = DeltaTable(uri, storage_options=delta_storage_options())
        compacted: list[Optional[str]] = []
        files_compacted = files_written = 0
        notes: list[str] = []
        if compact:
            actions = _add_actions(dt)
            live = list(
                zip(
                    actions.get(f"partition.{PARTITION_COLUMN}", [None] * len(actions.get("path", []))),
                    actions.get("size_bytes", []),
                )
            )
            by_snapshot = _files_by_snapshot(actions, uri, None)
            columns = [f.name for f in dt.schema().fields if f.name != PARTITION_COLUMN]
            # With column mapping a file's column names are not the table's: no footer tells (as for reads).
            mapped = "columnMapping" in _reader_features(dt)
            for partition in partitions_to_compact(live, target_bytes):
                small = sum(1 for p, size in live if p == partition and size < target_bytes // 2)
                # A compaction writes the table's current columns, padding those an older
                # snapshot's files lack with nulls; reads could no longer tell that the
                # snapshot predates them (see refuse_outdated_snapshots). Such a snapshot is
                # left as it is until it is materialized again.
                missing = [] if mapped else _absent_columns(by_snapshot.get(partition, []), columns)[0]
                if missing:
                    notes.append(
                        f"compaction of {partition} skipped (written before column(s) {', '.join(missing)}: "
                        f"materialize {table} of snapshot {partition} again first)"
                    )
                    continue
                if dry_run:
                    compacted.append(partition)
                    files_compacted += small
                    continue
                try:
                    metrics = dt.optimize.compact(
                        partition_filters=None if partition is None else [(PARTITION_COLUMN, "=", partition)],
                        target_size=target_bytes,
                        writer_properties=WriterProperties(compression="ZSTD"),
                    )
                except CommitFailedError as error:  # a write of the snapshot won: it is fresh anyway
                    notes.append(f"compaction of {partition} skipped (concurrent write: {str(error).splitlines()[0]})")
                    dt.update_incremental()
                    continue
                compacted.append(partition)
                files_compacted += int(metrics.get("numFilesRemoved", 0))
                files_written += int(metrics.get("numFilesAdded", 0))
        # The vacuum must see the latest version (the compaction's, a concurrent write's): with a
        # short retention a stale view would take their files for files no version names.
        dt.update_incremental()
        # The files to remove, measured before they go (delta-rs reports paths only).
        candidates = dt.vacuum(retention_hours=retention_hours, dry_run=True, enforce_retention_duration=False, full=True)
        location = Location.of(uri)
        sizes = {location.relative(info.path): info.size for info in location.walk_files()} if candidates else {}
        folders = 0
        if dry_run:
            removed = candidates
        else:
            cutoff = time.time() - retention_hours * 3600
            # (Nothing to remove: no VACUUM commits, which would only lengthen the log.)
            removed = candidates and dt.vacuum(
                retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False, full=True
            )
            # Object stores have no folders; a local warehouse keeps the empty ones a vacuum leaves.
            if isinstance(location.fs, pafs.LocalFileSystem):
                folders = _remove_empty_folders(location.path, removed, cutoff)
        return VacuumResult(
            table=table,
            dry_run=dry_run,
            files=len(removed),
            bytes=sum(sizes.get(path, 0) for path in removed),
            folders=folders,
            compacted=tuple(str(p) for p in compacted),
            files_compacted=files_compacted,
            files_written=files_written,
            note="; ".join(notes),
        )
