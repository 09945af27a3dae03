"""The native engine: delta-spark (Delta Lake's own Spark writer) commits and reads the tables.

Used when delta-spark's jars are on the session's class path (``REPLICA_LENS_DELTA_JARS``, or a
cluster that has them) and the store's engine allows it (``choose_engine``). A staged write's rows
(already validated) are written again through delta-spark with ``replaceWhere`` on the snapshot:
one Delta commit whose files and statistics delta-spark makes itself. The tables are the same
format either engine writes, so each reads the other's.
"""
from __future__ import annotations

from typing import Optional, Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from resources.delta_reader import PARTITION_COLUMN
from resources.delta_staging import StagedWrite, WriteResult, discard, parquet_options, read_staged
from resources.errors import InvalidSetting
from resources.session import has_native_delta
from schemas.conform import conform

ENGINES = ("auto", "native", "embedded")


def choose_engine(requested: str, spark: SparkSession) -> str:
    """The engine a store configured with ``requested`` uses in ``spark``: ``native`` or ``embedded``.

    ``embedded`` always; ``native`` only where delta-spark is loaded (else refused, naming the setting);
    ``auto``: native where it is loaded, else embedded.
    """
    if requested == "embedded":
        return "embedded"
    if requested not in ENGINES:
        raise InvalidSetting(f"unknown Delta engine {requested!r}: use auto, native or embedded")
    native = has_native_delta(spark)
    if requested == "native" and not native:
        raise RuntimeError(
            "DeltaStore.engine=native, but delta-spark is not loaded in this Spark session: "
            "set SparkResource.delta_jars_dir (REPLICA_LENS_DELTA_JARS) to a folder with the Delta jars"
        )
    return "native" if native else "embedded"


def commit_staged(spark: SparkSession, staged: StagedWrite) -> WriteResult:
    """delta-spark writes and commits in one go: the validated staged files are written again through it."""
    from delta.tables import DeltaTable as SparkDeltaTable

    df = read_staged(spark, staged)
    writer = (
        df.write.format("delta").mode("overwrite").option("mergeSchema", "true")
        .options(**parquet_options(staged.struct)).partitionBy(PARTITION_COLUMN)
    )
    if staged.snapshot_id is not None:
        writer = writer.option("replaceWhere", f"{PARTITION_COLUMN} = '{staged.snapshot_id}'")
    writer.save(staged.uri)
    discard(staged)
    last = SparkDeltaTable.forPath(spark, staged.uri).history(1).collect()[0]
    metrics = last["operationMetrics"] or {}
    return WriteResult(
        table_uri=staged.uri,
        version=int(last["version"]),
        row_count=int(metrics.get("numOutputRows", staged.row_count)),
        engine="native",
        files=int(metrics.get("numFiles", 0)),
    )


def delete_snapshots(spark: SparkSession, uri: str, ids: Sequence[str]) -> int:
    """Remove every row of ``ids`` with delta-spark in one commit; its version."""
    from delta.tables import DeltaTable as SparkDeltaTable

    delta = SparkDeltaTable.forPath(spark, uri)
    delta.delete(F.col(PARTITION_COLUMN).isin(*ids))
    return int(delta.history(1).collect()[0]["version"])


def read_frame(spark: SparkSession, uri: str, struct: T.StructType, snapshot_id: Optional[str]) -> DataFrame:
    """The rows of ``snapshot_id`` (None: every snapshot) read by delta-spark."""
    df = spark.read.format("delta").load(uri)
    if snapshot_id is not None:
        df = df.where(F.col(PARTITION_COLUMN) == snapshot_id)
    return conform(df, struct)
