"""The one place that maps a table name to its Delta Lake table and reads and writes it.

Every table lives at ``<warehouse_root>/<table_name>``, partitioned by ``snapshot_id``.
Writing a snapshot replaces exactly that snapshot's rows in one Delta commit, so a
reader sees either the old rows or the new ones, never a mix or two copies.

``DeltaStore`` is the one resource; each concern lives in its own module:

- staging (``resources/delta_staging.py``): a write's Parquet files go to a fresh folder
  ``<table>/write-<uuid>`` that no reader sees, filled by Spark's writer or by a pass's Arrow
  batches (``resources/staged_files.py``);
- the engines, which publish a staged write in one commit and read tables back:
  ``embedded`` (``resources/delta_embedded.py``: delta-rs commits the staged files as they are,
  with statistics from their footers, ``resources/delta_stats.py``; reads hand the live files to
  Spark) and ``native`` (``resources/delta_native.py``: delta-spark writes the staged rows again
  with ``replaceWhere`` on the snapshot). ``engine="auto"`` picks native when the session has
  delta-spark loaded; unset, the environment decides (``resources/settings.py``: embedded unless
  ``REPLICA_LENS_DELTA_ENGINE`` or a named ``REPLICA_LENS_DELTA_JARS`` asks otherwise). Two writers of one snapshot at once end as if they had run one after the
  other: one copy, the later commit's;
- the log's view of the live files, and the refusal of snapshots written before a required
  column existed (``resources/delta_log.py``), read with delta-rs; Spark-free reads of a few rows
  (``resources/delta_reader.py``);
- housekeeping (``resources/delta_vacuum.py``): VACUUM of each table, optionally after
  compacting snapshots of many small files.

The warehouse is a path or a URI (``file://``, ``s3://``/``s3a://``, ...). Staged files are
listed, their footers read and Spark's markers removed through ``resources/filesystem.py``
(pyarrow's filesystems), and delta-rs is given the storage options of
``REPLICA_LENS_STORAGE_OPTIONS``: nothing assumes a local disk there. (Spark reads and writes
the same URIs through its Hadoop connectors.)
"""
from __future__ import annotations

from typing import Optional, Sequence

import dagster as dg
import pyarrow as pa
from pydantic import Field
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import types as T

from resources import delta_embedded, delta_native, delta_staging
from resources.delta_log import absent_columns, add_actions, files_by_snapshot, reader_features, refuse_outdated_snapshots
from resources.delta_reader import PARTITION_COLUMN, TABLE_NAME, check_table_name, snapshot_column_max, table_uri, warehouse_uri
from resources.delta_staging import StagedWrite, WriteResult
from resources.delta_vacuum import COMPACT_TARGET_BYTES, VacuumResult, vacuum_table
from resources.errors import InvalidSetting
from resources.filesystem import Location, delta_storage_options
from resources.settings import delta_settings_from_environment
from resources.snapshots import UnsafeNameError, check_snapshot_id  # noqa: F401 (UnsafeNameError: re-exported)
from resources.staged_files import ArrowStage
from resources.tuning import DEFAULT_RETENTION_HOURS
from schemas.arrow_rules import ArrowRule
from schemas.conform import local_frame


class DeltaStore(dg.ConfigurableResource):
    """Delta Lake tables under one warehouse root, one table per asset, partitioned by snapshot."""

    warehouse_root: str = Field(description="Folder (or URI on a cluster) holding one Delta table per asset.")
    engine: Optional[str] = Field(
        default=None,
        description=(
            "embedded (staged files committed by delta-rs), native (delta-spark), or auto (native when delta-spark is "
            "loaded in the session); None: REPLICA_LENS_DELTA_ENGINE, else auto when REPLICA_LENS_DELTA_JARS names a "
            "folder, else embedded (resources/settings.py)."
        ),
    )

    # ----------------------------------------------------------------- paths
    def table_uri(self, table: str) -> str:
        # One name for Spark and delta-rs (both read s3a://), shared with the Spark-free reader.
        return table_uri(self.warehouse_root, table)

    def _root_uri(self) -> str:
        return warehouse_uri(self.warehouse_root)

    def _engine(self, spark: SparkSession) -> str:
        requested = self.engine if self.engine else delta_settings_from_environment().engine
        return delta_native.choose_engine(requested, spark)

    def exists(self, table: str) -> bool:
        from deltalake import DeltaTable

        return DeltaTable.is_deltatable(self.table_uri(table), storage_options=delta_storage_options())

    def _table(self, table: str):
        from deltalake import DeltaTable

        return DeltaTable(self.table_uri(table), storage_options=delta_storage_options())

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
        return delta_staging.stage_frame(
            spark, df, table, self.table_uri(table), snapshot_id, struct, observe, whole_streams
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
        return delta_staging.new_arrow_stage(table, self.table_uri(table), snapshot_id, struct, rules)

    @staticmethod
    def write_arrow(stage: ArrowStage, rows: pa.Table, name: str = "rows") -> int:
        """Write ``rows`` (the stage's columns, by name) here, on the driver, as one file of ``stage``; how many.

        Beside the files a pass's tasks write (``name`` is never a task's), or alone: a small
        table collected to the driver is staged with no Spark write job (``StepTables.stage``).
        """
        return delta_staging.write_arrow(stage, rows, name)

    def stage_arrow(self, stage: ArrowStage, struct: T.StructType) -> StagedWrite:
        """The staged write that ``stage``'s files make, once written; from their footers alone (no Spark job).

        ``metrics``: ``rule_counts``, per rule of ``stage.rules``, the rows of all the files that break it.
        No file (no task had rows): an empty write.
        """
        return delta_staging.staged_from_arrow(stage, struct)

    def stage_empty(self, table: str, snapshot_id: Optional[str], struct: T.StructType) -> StagedWrite:
        """A staged write of no rows, known empty without running Spark: committing it empties the snapshot.

        No file is written (a Spark job writing nothing still costs seconds in a fresh JVM);
        the commit then names no file and removes the snapshot's previous ones.
        """
        return delta_staging.empty_stage(table, self.table_uri(table), snapshot_id, struct)

    def read_staged(self, spark: SparkSession, staged: StagedWrite) -> DataFrame:
        """The staged rows, before they are committed (a later table of the same step may be built from them)."""
        return delta_staging.read_staged(spark, staged)

    def discard(self, staged: StagedWrite) -> None:
        """Remove a staged write that must not be published."""
        delta_staging.discard(staged)

    def discard_arrow_stage(self, stage: ArrowStage) -> None:
        """Remove what a pass wrote for ``stage`` before it was staged (the step failed)."""
        delta_staging.discard_arrow_stage(stage)

    def commit(self, spark: SparkSession, staged: StagedWrite) -> WriteResult:
        """Publish a staged write: the snapshot's (or table's) rows become exactly the staged ones, in one commit."""
        try:
            if self._engine(spark) == "native":
                return delta_native.commit_staged(spark, staged)
            return delta_embedded.commit_staged(staged)
        except Exception:
            self.discard(staged)
            raise

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
            return delta_native.delete_snapshots(spark, uri, ids)
        return delta_embedded.delete_snapshots(uri, ids)

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
        if not self.exists(table):
            return local_frame(spark, [], struct)
        uri = self.table_uri(table)
        dt = self._table(table)
        features = reader_features(dt)
        native = self._engine(spark) == "native"
        files = files_by_snapshot(add_actions(dt), uri, snapshot_id)
        if "columnMapping" not in features:  # else a file's column names are not the table's
            refuse_outdated_snapshots(table, required, files)
        if native:
            return delta_native.read_frame(spark, uri, struct, snapshot_id)
        return delta_embedded.read_files(spark, uri, features, files, struct)

    def stream_files(self, spark: SparkSession, table: str, snapshot_id: str) -> Optional[list[Location]]:
        """The live files of ``snapshot_id`` in ``table`` when each holds every row of its streams, else None.

        So when every one lies in a write folder staged with ``whole_streams`` (by this embedded
        writer: delta-spark writes its own files) and the table uses no feature the embedded reader
        lacks. A pass reading them file by file then sees each stream whole, with no exchange.
        """
        check_snapshot_id(snapshot_id)
        if self._engine(spark) == "native" or not self.exists(table):
            return None
        return delta_embedded.stream_files(self.table_uri(table), snapshot_id)

    def snapshot_files(
        self, spark: SparkSession, table: str, snapshot_ids: Sequence[str],
    ) -> Optional[dict[str, list[Location]]]:
        """The live files of each of ``snapshot_ids`` in ``table``, for a task that reads them itself (pyarrow), or
        None when their rows are not simply their files' (delta-spark reads the table, or it uses a feature the
        embedded reader lacks). A file holds the columns it was written with: a later column is absent from it."""
        for snapshot_id in snapshot_ids:
            check_snapshot_id(snapshot_id)
        if self._engine(spark) == "native":
            return None
        if not self.exists(table):
            return {i: [] for i in snapshot_ids}
        return delta_embedded.snapshot_files(self.table_uri(table), snapshot_ids)

    def snapshot_ids(self, table: str) -> list[str]:
        """The snapshots present in ``table`` (from the Delta log alone)."""
        if not self.exists(table):
            return []
        return sorted(set(add_actions(self._table(table)).get(f"partition.{PARTITION_COLUMN}", [])))

    def snapshot_rows(self, table: str, snapshot_ids: Optional[Sequence[str]] = None) -> Optional[int]:
        """Rows of ``table`` in ``snapshot_ids`` (None: every snapshot), from the Delta log's file statistics.

        Nothing of the data is read. None when the table does not exist or a file's log entry
        has no ``numRecords`` (a writer that left statistics out): unknown, not zero.
        """
        if not self.exists(table):
            return None
        actions = add_actions(self._table(table))
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
        if not self.exists(table):
            return None
        return snapshot_column_max(self._table(table), snapshot_id, column)

    def written_without(self, table: str, snapshot_id: str, column: str) -> bool:
        """Whether some file of ``snapshot_id`` in ``table`` lacks ``column`` (written before the column existed).

        From the log's statistics, and the Parquet footer of a file without any for the column; no data is read.
        """
        if not self.exists(table):
            return False
        actions = add_actions(self._table(table))
        files = files_by_snapshot(actions, self.table_uri(table), snapshot_id).get(snapshot_id, [])
        missing, _ = absent_columns(files, [column])
        return bool(missing)

    def version(self, table: str) -> Optional[int]:
        return self._table(table).version() if self.exists(table) else None

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
        """Vacuum every table of the warehouse (or ``tables``); see ``resources/delta_vacuum.py``.

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
            vacuum_table(name, self.table_uri(name), retention_hours, dry_run, compact, compact_target_bytes)
            for name in names
        ]
