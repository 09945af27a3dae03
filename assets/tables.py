"""The thin layer between assets and the Delta store: read a stage, write a stage, validate it.

Every asset writes its table through ``write_stage``, which replaces the snapshot's
rows in one Delta commit and returns the materialization metadata (row count, column
schema, table URI and Delta version); ``schema_check`` reads the written table back
and validates it against the stage's pandera model, as a blocking asset check, so a
downstream stage never starts from a table that breaks its schema.
"""

import time
from typing import Any

import dagster as dg
from pyspark.sql import DataFrame, SparkSession

from resources.delta_store import DeltaStore, WriteResult
from schemas.registry import model_for, struct_for
from schemas.validation import dagster_table_schema, validation_errors

SCHEMA_CHECK = "matches_schema"
MAX_LISTED_ERRORS = 20
# Tables up to this many rows are validated from a local copy (see schema_check).
LOCAL_VALIDATION_ROWS = 20_000


def read_stage(spark: SparkSession, store: DeltaStore, table: str, snapshot_id: str | None) -> DataFrame:
    """One snapshot of ``table``, or every snapshot when ``snapshot_id`` is None."""
    if snapshot_id is None:
        return store.read_all(spark, table, struct_for(table))
    return store.read_snapshot(spark, table, snapshot_id, struct_for(table))


def write_stage(spark: SparkSession, store: DeltaStore, df: DataFrame, table: str, snapshot_id: str) -> WriteResult:
    return store.write_snapshot(spark, df, table, snapshot_id, struct_for(table))


def table_metadata(result: WriteResult, table: str) -> dict[str, Any]:
    return {
        "dagster/row_count": result.row_count,
        "dagster/column_schema": dagster_table_schema(struct_for(table)),
        "dagster/uri": dg.MetadataValue.path(result.table_uri),
        "dagster/table_name": table,
        "delta_version": result.version,
        "delta_engine": result.engine,
        "files_written": result.files,
    }


def schema_check_spec(table: str) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(
        name=SCHEMA_CHECK,
        asset=table,
        blocking=True,
        description=f"The written {table} table passes its pandera schema (blocking: downstream waits for it).",
    )


def schema_check(
    spark: SparkSession, store: DeltaStore, table: str, snapshot_id: str | None, rows: int | None = None
) -> dg.AssetCheckResult:
    """Validate the table as written (read back from Delta) against its pandera model.

    pandera runs one Spark job per column check. When the table is known to be small
    (``rows``, from the write's own Parquet footers, at most ``LOCAL_VALIDATION_ROWS``),
    its rows are read back once into a local relation and the checks run on that: about
    half the jobs and half the time (measured: 0.8 s instead of 1.8 s for a 10-column
    table of 50 rows), for the dozen small tables of every audit.
    """
    written = read_stage(spark, store, table, snapshot_id)
    if rows is not None and rows <= LOCAL_VALIDATION_ROWS:
        written = spark.createDataFrame(written.toArrow())
    errors = validation_errors(model_for(table), written)
    return dg.AssetCheckResult(
        asset_key=table,
        check_name=SCHEMA_CHECK,
        passed=not errors,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "violations": len(errors),
            "errors": dg.MetadataValue.json([e.as_dict() for e in errors[:MAX_LISTED_ERRORS]]),
        },
        description=None if not errors else f"{len(errors)} schema violation(s) in {table}: {errors[0].error}",
    )


def materialize_stage(
    spark: SparkSession,
    store: DeltaStore,
    df: DataFrame,
    table: str,
    snapshot_id: str,
    extra_metadata: dict[str, Any] | None = None,
) -> dg.MaterializeResult:
    """Write ``df`` as ``table``'s snapshot partition, validate it, and describe it for Dagster."""
    started = time.perf_counter()
    result = write_stage(spark, store, df, table, snapshot_id)
    written = time.perf_counter()
    check = schema_check(spark, store, table, snapshot_id, rows=result.row_count)
    checked = time.perf_counter()
    metadata = {
        **table_metadata(result, table),
        # Spark is lazy: writing includes computing the frame, i.e. the stage's own work.
        "write_seconds": round(written - started, 2),
        "check_seconds": round(checked - written, 2),
        **(extra_metadata or {}),
    }
    return dg.MaterializeResult(asset_key=table, metadata=metadata, check_results=[check])
