"""Floors, measured in the benchmark's own JVM: reading the landing files, parsing them, and writing the per-row tables."""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from replica_lens.benchmark.essential import _json_files, raw_message_schema


def _floor_seconds(spark, folder: str) -> tuple[float, int]:
    """Spark reading the snapshot's files once and counting them: the least any audit must do."""
    files = [str(p) for p in Path(folder).iterdir() if p.name.endswith((".jsonl", ".jsonl.gz", ".parquet"))]
    start = time.perf_counter()
    text = [f for f in files if not f.endswith(".parquet")]
    parquet = [f for f in files if f.endswith(".parquet")]
    rows = 0
    if text:
        rows += spark.read.text(text).count()
    if parquet:
        rows += spark.read.parquet(*parquet).count()
    return time.perf_counter() - start, rows


def _parse_floor_seconds(spark, folder: str) -> float:
    """Spark parsing every JSON line once into the SPEC 1 fields (no checks, nothing written).

    Not the issue's floor (that one only counts lines), but what any audit must at least
    pay to read the messages: it separates the cost of JSON parsing from our own.
    """
    files = _json_files(folder)
    if not files:
        return 0.0
    start = time.perf_counter()
    spark.read.schema(raw_message_schema()).json(files).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


# The per-row tables of an audit: the SPEC's raw table, segments and watermarks (sections
# 1-3), and the state carried to the next snapshot. Every audit writes each once.
OUTPUT_FLOOR_TABLES = ("raw_topic_snapshots", "heartbeat_segments", "reconstructed_watermarks", "replica_state")


def output_floor(spark, warehouse: Path, snapshot_id: str, scratch: Path) -> dict[str, dict[str, Any]]:
    """What writing each per-row table costs by itself, measured on the audit's own rows in this JVM.

    Per table of ``OUTPUT_FLOOR_TABLES``: the snapshot's committed rows are read and thrown
    away (``noop``: ``read_seconds``), then read and written again as Parquet with the
    audit's writer options into ``scratch`` (``copy_seconds``; the copy is removed). Their
    difference, ``write_seconds``, is what the write alone costs: a floor for the step that
    computes the table, whatever the computation. It is not clamped: noise can make it
    slightly negative on a small table. ``rows`` is counted by the copy (an observation).
    """
    from pyspark.sql import Observation
    from pyspark.sql import functions as F

    from resources.delta_reader import PARTITION_COLUMN
    from resources.delta_staging import parquet_options
    from resources.delta_store import DeltaStore
    from schemas.registry import struct_for

    store = DeltaStore(warehouse_root=str(warehouse))
    floor = {}
    for table in OUTPUT_FLOOR_TABLES:
        struct = struct_for(table)
        # Written as the audit writes a snapshot: without the partition column, into its own folder.
        rows = store.read_snapshot(spark, table, snapshot_id, struct).drop(PARTITION_COLUMN)
        start = time.perf_counter()
        rows.write.format("noop").mode("overwrite").save()
        read = time.perf_counter() - start
        counted = Observation()
        target = scratch / f"output-floor-{table}"
        start = time.perf_counter()
        rows.observe(counted, F.count(F.lit(1)).alias("rows")).write.mode("errorifexists").options(
            **parquet_options(struct)
        ).parquet(str(target))
        copy = time.perf_counter() - start
        shutil.rmtree(target, ignore_errors=True)
        read, copy = round(read, 2), round(copy, 2)
        # From the rounded figures, so that the report's three add up exactly.
        floor[table] = {"rows": int(counted.get["rows"]), "read_seconds": read, "copy_seconds": copy,
                        "write_seconds": round(copy - read, 2)}
    return floor
