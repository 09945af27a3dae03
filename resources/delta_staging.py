"""Staged writes: a table's Parquet files written where no reader sees them until a commit names them.

A write goes to a fresh folder ``<table>/write-<uuid>`` (Hive-style by snapshot inside it), filled
by Spark's writer (``stage_frame``) or by Arrow batches where a pass makes them (``new_arrow_stage``,
``resources/staged_files.py``). Either engine then commits it (``resources/delta_embedded.py``
names the files in the log as they are; ``resources/delta_native.py`` writes their rows again
through delta-spark). The writer options (``parquet_options``) are the same for every writer.
"""
from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Optional, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from resources.delta_reader import PARTITION_COLUMN
from resources.filesystem import Location
from resources.snapshots import check_snapshot_id
from resources.staged_files import RULE_COUNTS, ArrowStage
from schemas.arrow_rules import ArrowRule
from schemas.conform import conform, local_frame, quoted, select_sql, sql_literal, to_arrow_schema

_ROWS = "__staged_rows"

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
# A write folder whose every file holds every row of the streams it holds (``stage_frame(whole_streams=True)``).
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


def snapshot_folder(write_folder: str, snapshot_id: str) -> str:
    """Where a write's files of one snapshot go: Hive-style, as ``partitionBy`` would name it (safe ids need no escaping)."""
    return f"{write_folder}/{PARTITION_COLUMN}={snapshot_id}"


def without_partition(struct: T.StructType) -> T.StructType:
    return T.StructType([f for f in struct.fields if f.name != PARTITION_COLUMN])


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
    """What one snapshot write produced (by either engine): shown as metadata on the materialization."""

    table_uri: str
    version: int
    row_count: int
    engine: str
    files: int


def stage_frame(
    spark: SparkSession,
    df: DataFrame,
    table: str,
    uri: str,
    snapshot_id: Optional[str],
    struct: T.StructType,
    observe: Sequence[Column] = (),
    whole_streams: bool = False,
) -> StagedWrite:
    """``DeltaStore.stage``: ``df``'s rows written by Spark into a fresh write folder of the table at ``uri``."""
    if snapshot_id is not None:
        check_snapshot_id(snapshot_id)
        # The partition being written decides the snapshot of every row: no row can land elsewhere.
        df = df.withColumn(PARTITION_COLUMN, F.lit(snapshot_id))
    df = conform(df, struct)
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
            snapshot_folder(folder, snapshot_id)
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


def new_arrow_stage(
    table: str, uri: str, snapshot_id: str, struct: T.StructType, rules: tuple[ArrowRule, ...] = (),
) -> ArrowStage:
    """``DeltaStore.arrow_stage``: a staged write of one snapshot of the table at ``uri`` that Arrow batches fill."""
    check_snapshot_id(snapshot_id)
    if holds_values(table, struct):
        raise ValueError(f"{table} holds values: stage it with Spark's writer (DeltaStore.stage)")
    nulls = NULL_VALUE_COLUMNS.get(table, ())
    relative_dir = f"write-{uuid.uuid4().hex}"
    folder = Location.of(snapshot_folder(f"{uri}/{relative_dir}", snapshot_id))
    return ArrowStage(
        table=table, uri=uri, relative_dir=relative_dir, snapshot_id=snapshot_id,
        schema=to_arrow_schema(without_partition(struct)), fs=folder.fs, path=folder.path,
        dictionary_columns=dictionary_columns(struct), rules=tuple(rules), partition_column=PARTITION_COLUMN,
        null_columns=tuple(nulls),
    )


def write_arrow(stage: ArrowStage, rows: pa.Table, name: str = "rows") -> int:
    """``DeltaStore.write_arrow``: ``rows`` written on the driver as one file of ``stage``; how many."""
    file = stage.files(0, name=name)
    try:
        for batch in rows.select(stage.schema.names).cast(stage.schema).to_batches():
            file.write(batch)
        return file.close()
    except BaseException:
        file.abort()
        raise


def staged_from_arrow(stage: ArrowStage, struct: T.StructType) -> StagedWrite:
    """``DeltaStore.stage_arrow``: the staged write ``stage``'s files make, from their footers alone."""
    written = Location.of(snapshot_folder(f"{stage.uri}/{stage.relative_dir}", stage.snapshot_id))
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


def empty_stage(table: str, uri: str, snapshot_id: Optional[str], struct: T.StructType) -> StagedWrite:
    """``DeltaStore.stage_empty``: a staged write of no rows, with no file written."""
    if snapshot_id is not None:
        check_snapshot_id(snapshot_id)
    return StagedWrite(
        table=table, uri=uri, snapshot_id=snapshot_id, relative_dir=f"write-{uuid.uuid4().hex}", struct=struct,
        row_count=0,
    )


def read_staged(spark: SparkSession, staged: StagedWrite) -> DataFrame:
    """The staged rows, before they are committed (a later table of the same step may be built from them)."""
    if staged.row_count == 0:
        return local_frame(spark, [], staged.struct)
    if staged.snapshot_id is None:
        return spark.read.schema(staged.struct).parquet(staged.folder)
    files = spark.read.schema(without_partition(staged.struct)).parquet(
        snapshot_folder(staged.folder, staged.snapshot_id)
    )
    # One SQL text per column, sent together: a select of names is two round trips to the JVM per column.
    return select_sql(files, [
        f"{sql_literal(staged.snapshot_id)} AS {quoted(name)}" if name == PARTITION_COLUMN else quoted(name)
        for name in staged.struct.names
    ])


def discard(staged: StagedWrite) -> None:
    """Remove a staged write that must not be published."""
    Location.of(staged.folder).delete_tree()


def discard_arrow_stage(stage: ArrowStage) -> None:
    """Remove what a pass wrote for ``stage`` before it was staged (the step failed)."""
    Location.of(f"{stage.uri}/{stage.relative_dir}").delete_tree()
