"""Staged Parquet files written from Arrow record batches, in any process: the driver or Spark's Python workers.

A staged write (``resources/delta_staging.py``) is a folder of Parquet files that no reader sees
until its commit names them. Spark's writer fills it for most tables. A pass that already holds
its rows as Arrow batches in a Python task (the stream pass, ``pipelines/stream_pass.py``) fills
it itself through an ``ArrowStage``: pyarrow writes the batches as Parquet where they are made,
with no conversion of every row into Spark's rows and no Parquet encoding in the JVM (writing
``heartbeat_segments`` and ``reconstructed_watermarks`` so took a fifth of the CPU at 2M rows,
docs/performance.md). What the commit and every reader see is the same: Parquet files of the
table's columns (without the partition column, which the folder names), checked by the same
compiled schema rules and committed by the same Delta commit as any staged write.

This module imports pyarrow only and travels by value to Spark's Python workers (as the stream
pass does): an executor needs numpy and pyarrow, not the project. An ``ArrowStage`` carries its
filesystem (pyarrow filesystems pickle with their options), resolved on the driver.

Each file carries, in its footer, how many of its rows break each of the table's schema rules
(``schemas/arrow_rules.py``), counted as they are written, as Spark's writer counts them for the
tables it writes: the staged write is judged from the footers, with no pass over its rows.

Each Python task writes at most one file per stage, named by the task's partition (``part-NNNNN``):
a task run again (a retry, a speculative copy, a lost block computed again) writes the same rows
under the same name, first to a hidden temporary name and then moved over it, so a staged
folder never holds a partial file or two copies of a task's rows.
"""
from __future__ import annotations

import json
import sys
import uuid
from dataclasses import dataclass
from typing import Optional

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark import cloudpickle

from schemas.arrow_rules import ArrowRule, violations

# Rows buffered before Parquet row groups are written, and the most a row group holds: a task's many small streams
# still make few row groups (each ``write_table`` call makes at least one), a long stream's rows several (a reader
# splits a file by row groups), and a buffer holds a few tens of MB (beyond a stream's own batch).
ROW_GROUP_ROWS = 262_144
# The footer's key of a file's rule counts: per rule of ``ArrowStage.rules``, the rows of the file that break it.
RULE_COUNTS = "replica_lens.rule_counts"
# Spark's codec for the tables it writes (``spark.sql.parquet.compression.codec`` of resources/session.py).
COMPRESSION = "zstd"


@dataclass(frozen=True)
class ArrowStage:
    """Where a staged write's Parquet files go, and their columns: everything a task needs to write them."""

    table: str
    uri: str  # the table's
    relative_dir: str  # the write's folder, relative to the table (``StagedWrite.relative_dir``)
    snapshot_id: str
    schema: pa.Schema  # the files' columns: the table's, less the partition column
    fs: pafs.FileSystem
    path: str  # the filesystem's path of the folder the files go to (the snapshot's, Hive-style)
    dictionary_columns: tuple[str, ...]  # columns with Parquet dictionary encoding (``parquet_options``' choice)
    rules: tuple[ArrowRule, ...] = ()  # the table's schema rules, counted on the rows as they are written
    partition_column: Optional[str] = None  # not in the files: the folder names it, ``snapshot_id`` on every row
    null_columns: tuple[str, ...] = ()  # columns every row leaves null (a value column kept for older rows)

    def files(self, part: int, name: Optional[str] = None) -> "PartFile":
        """The file of task ``part`` (its partition number), opened at its first rows.

        ``name``: a file the driver writes beside the tasks' (``<name>.parquet``, never a task's name).
        """
        return PartFile(self, part, name)


class PartFile:
    """One task's file of an ``ArrowStage``: batches in, one Parquet file out when closed (none without rows)."""

    def __init__(self, stage: ArrowStage, part: int, name: Optional[str] = None):
        self.stage = stage
        base = f"part-{part:05d}" if name is None else name
        if name is not None and name.startswith("part-"):
            raise ValueError(f"{name!r}: part-NNNNN names are the tasks' files")
        self.final = f"{stage.path}/{base}.parquet"
        # Hidden (a leading "."): never read as a table's file, and removed by the commit's listing if left behind.
        self.temporary = f"{stage.path}/.{base}-{uuid.uuid4().hex}.parquet.tmp"
        self.rows = 0
        self.broken = [0] * len(stage.rules)  # per rule, the rows written that break it
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self._writer: Optional[pq.ParquetWriter] = None

    def write(self, batch: pa.RecordBatch) -> None:
        """Add ``batch``'s rows (its columns of the stage's schema, by name; others are ignored)."""
        if not batch.num_rows:
            return
        schema = self.stage.schema
        for name in self.stage.null_columns:
            if batch.column(name).null_count != batch.num_rows:
                raise ValueError(f"{self.stage.table}.{name} must be null in the rows written here (it holds values)")
        self._buffer.append(pa.RecordBatch.from_arrays([batch.column(name) for name in schema.names], schema=schema))
        self._buffered += batch.num_rows
        if self._buffered >= ROW_GROUP_ROWS:
            self._flush()

    def _flush(self) -> None:
        if not self._buffered:
            return
        if self._writer is None:
            self.stage.fs.create_dir(self.stage.path, recursive=True)
            self._writer = pq.ParquetWriter(
                self.temporary, self.stage.schema, filesystem=self.stage.fs, compression=COMPRESSION,
                use_dictionary=list(self.stage.dictionary_columns) or False,
            )
        rows = pa.Table.from_batches(self._buffer)
        partition = self.stage.partition_column
        constants = {partition: self.stage.snapshot_id} if partition else None
        self.broken = [a + b for a, b in zip(self.broken, violations(self.stage.rules, rows, constants))]
        self._writer.write_table(rows, row_group_size=ROW_GROUP_ROWS)
        self.rows += self._buffered
        self._buffer, self._buffered = [], 0

    def close(self) -> int:
        """Write what is buffered and put the file in place; the rows it holds (0: no file was made)."""
        self._flush()
        if self._writer is not None:
            self._writer.add_key_value_metadata({RULE_COUNTS: json.dumps(self.broken)})
            self._writer.close()
            self._writer = None
            self.stage.fs.move(self.temporary, self.final)
        return self.rows

    def abort(self) -> None:
        """Drop the file being written (the task failed): nothing is put in place."""
        if self._writer is not None:
            try:
                self._writer.close()
                self.stage.fs.delete_file(self.temporary)
            except Exception:  # noqa: BLE001 - the task's own error is the one to report
                pass
            self._writer = None


# Sent to Spark's Python workers by value, with the pass that writes through it.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
