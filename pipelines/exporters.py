"""Exporter positions, their regressions, and where compaction is safe (SPEC section 7, after Zeebe).

An exporter reports the last offset of a replica's topic partition it has exported.
Its history is ordered by ``reported_at_ms``, ties by ``exported_offset`` (so two
reports at the same instant never count as a regression). A report is a regression
when it is below *any* earlier report of the same exporter, i.e. below the running
maximum: the exporter went back, and every report until it catches up again is lower
than a position it had already announced. ``reports`` counts distinct report rows
(exact duplicates are stored once by ingestion, with ``copies``).

Lag in time: the applied time of the partition's last heartbeat minus that of the first
heartbeat at or after the exported offset, both taken as ``applied_ts_max_ms``. When no
heartbeat sits at or after the exported offset (the exporter is past the last
heartbeat), there is nothing to measure it against: ``first_heartbeat_offset`` and
``lag_ms`` are null.

Compaction: Zeebe compacts its log only below the lowest position every exporter has
exported and the state has processed. Here the "processed" position is the highest
offset the audit itself read for the partition, so the bound is never above what was
audited. After a fail-over the new leader re-exports from the lowest exporter position;
the rows between the lowest and highest positions are exported again (exporters must be
idempotent). The exposure counts them among the rows read, so for a dump that starts
after the lowest position it is a lower bound.

How: the three tables read the raw rows twice, whatever their size. ``exporter_inputs`` takes
the few rows they look at one by one (every report and every version-topic heartbeat, a few
columns: ``report_and_heartbeat_rows``), then, with the exporters' ranges those reports give,
one aggregation per replica topic partition of every version-topic row (``partition_reads``:
the highest offset read and the rows inside the range). Everything else is computed from those
two small frames; ``once`` (``pipelines.frames.computed_once`` in the asset) keeps each from
being computed again by the next table's job.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.conform import conform
from schemas.operations import CompactionBounds, ExporterPositions, ExporterRegressions
from schemas.raw import DATA_KINDS

PARTITION_KEYS = ("snapshot_id", "replica", "topic", "partition")
EXPORTER_KEYS = (*PARTITION_KEYS, "exporter")
# The columns of a report or a heartbeat the exporter tables read.
NARROW_COLUMNS = (*PARTITION_KEYS, "kind", "offset", "applied_ts_max_ms", "exporter", "exported_offset", "reported_at_ms")


def _version_topic(raw: DataFrame) -> DataFrame:
    return raw.where(F.col("offset").isNotNull() & (F.col("kind") != "EXPORTER_POSITION"))


def report_and_heartbeat_rows(raw: DataFrame) -> DataFrame:
    """Every EXPORTER_POSITION report and every version-topic HEARTBEAT of ``raw``, narrow: one scan of the rows."""
    kind = F.col("kind")
    wanted = (kind == "EXPORTER_POSITION") | ((kind == "HEARTBEAT") & F.col("offset").isNotNull())
    return raw.where(wanted).select(*NARROW_COLUMNS)


def _reports(rows: DataFrame) -> DataFrame:
    return rows.where(F.col("kind") == "EXPORTER_POSITION").select(*EXPORTER_KEYS, "exported_offset", "reported_at_ms")


def _heartbeats(rows: DataFrame) -> DataFrame:
    return rows.where(F.col("kind") == "HEARTBEAT")


def _report_history(rows: DataFrame) -> DataFrame:
    """Every exporter report with the report before it and the highest earlier position."""
    history = Window.partitionBy(*EXPORTER_KEYS).orderBy("reported_at_ms", "exported_offset")
    return (
        _reports(rows).withColumn(
            "max_earlier_exported_offset",
            F.max("exported_offset").over(history.rowsBetween(Window.unboundedPreceding, -1)),
        )
        .withColumn(
            "previous",
            F.last(F.struct(F.col("exported_offset"), F.col("reported_at_ms"))).over(history.rowsBetween(-1, -1)),
        )
        .withColumn(
            "is_regression",
            F.coalesce(F.col("exported_offset") < F.col("max_earlier_exported_offset"), F.lit(False)),
        )
    )


def _per_exporter(rows: DataFrame) -> DataFrame:
    """Per exporter: its reports, the highest position it reported, its regressions and its latest report."""
    return (
        _report_history(rows)
        .groupBy(*EXPORTER_KEYS)
        .agg(
            F.count(F.lit(1)).alias("reports"),
            F.max("exported_offset").alias("max_exported_offset_seen"),
            F.sum(F.col("is_regression").cast(T.LongType())).alias("regressions"),
            F.max(F.struct(F.col("reported_at_ms"), F.col("exported_offset"))).alias("latest"),
        )
        .select(
            *EXPORTER_KEYS,
            "reports",
            "max_exported_offset_seen",
            "regressions",
            F.col("latest.reported_at_ms").alias("reported_at_ms"),
            F.col("latest.exported_offset").alias("exported_offset"),
        )
    )


def _exporter_ranges(latest: DataFrame) -> DataFrame:
    """Per replica topic partition with exporters: how many, the lowest latest position (with its exporter) and the
    highest (``latest``: one row per exporter)."""
    return latest.groupBy(*PARTITION_KEYS).agg(
        F.count(F.lit(1)).alias("exporters"),
        F.min(F.struct(F.col("exported_offset"), F.col("exporter"))).alias("lowest"),
        F.max("exported_offset").alias("max_exported_offset"),
    )


def partition_reads(raw: DataFrame, latest: DataFrame) -> DataFrame:
    """Per replica topic partition with version-topic rows: the highest offset read, and the rows (and data rows)
    inside the exporters' range ``(lowest, highest]`` of their latest positions (``latest``: one row per exporter).

    One scan of ``raw``: the ranges (one small row per partition) are broadcast to every row, one aggregation counts.
    """
    ranges = _exporter_ranges(latest).select(
        *PARTITION_KEYS, F.col("lowest.exported_offset").alias("low"), F.col("max_exported_offset").alias("high")
    )
    in_range = (F.col("offset") > F.col("low")) & (F.col("offset") <= F.col("high"))
    return (
        _version_topic(raw)
        .join(F.broadcast(ranges), on=list(PARTITION_KEYS), how="left")
        .groupBy(*PARTITION_KEYS)
        .agg(
            F.max("offset").alias("processed_offset"),
            F.sum(F.when(in_range, 1).otherwise(0)).alias("reexport_exposure_rows"),
            F.sum(F.when(in_range & F.col("kind").isin(*DATA_KINDS), 1).otherwise(0)).alias(
                "reexport_exposure_data_rows"
            ),
        )
    )


@dataclass(frozen=True)
class ExporterInputs:
    """What the exporter tables read of the raw rows: ``rows`` (``report_and_heartbeat_rows``), ``latest`` (one row
    per exporter, ``_per_exporter``) and ``reads`` (``partition_reads``)."""

    rows: DataFrame
    latest: DataFrame
    reads: DataFrame


def exporter_inputs(raw: DataFrame, once: Callable[[DataFrame], DataFrame] = lambda df: df) -> ExporterInputs:
    """The two passes over ``raw`` the exporter tables need, each made by ``once`` (e.g. computed and kept)."""
    rows = once(report_and_heartbeat_rows(raw))
    latest = _per_exporter(rows)
    return ExporterInputs(rows=rows, latest=latest, reads=once(partition_reads(raw, latest)))


def exporter_regressions(inputs: ExporterInputs) -> DataFrame:
    """One row per exporter report below an earlier report of the same exporter and partition."""
    found = _report_history(inputs.rows).where(F.col("is_regression"))
    return conform(
        found,
        ExporterRegressions.to_structtype(),
        {
            "previous_exported_offset": F.col("previous.exported_offset"),
            "previous_reported_at_ms": F.col("previous.reported_at_ms"),
        },
    )


def _first_heartbeat_at_or_after(rows: DataFrame, latest: DataFrame) -> DataFrame:
    """For each latest report, the first heartbeat at or after its exported offset.

    The reports are merged into the heartbeat stream at their exported offsets; walking
    the merged stream backwards, the last heartbeat met at or before a report's place is
    the first at or after its offset. A heartbeat at exactly the exported offset sorts
    ahead of the report, so it counts.
    """
    heartbeats = _heartbeats(rows).select(
        *PARTITION_KEYS,
        F.col("offset").alias("position"),
        F.lit(0).alias("rank"),
        F.lit(None).cast(T.StringType()).alias("exporter"),
        F.struct(F.col("offset").alias("offset"), F.col("applied_ts_max_ms").alias("applied_ts_max_ms")).alias("hb"),
    )
    reports = latest.select(
        *PARTITION_KEYS,
        F.col("exported_offset").alias("position"),
        F.lit(1).alias("rank"),
        F.col("exporter"),
        F.lit(None).cast(heartbeats.schema["hb"].dataType).alias("hb"),
    )
    backwards = (
        Window.partitionBy(*PARTITION_KEYS)
        .orderBy(F.col("position").desc(), F.col("rank").asc())
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    return (
        heartbeats.unionByName(reports)
        .withColumn("first_heartbeat", F.last(F.col("hb"), ignorenulls=True).over(backwards))
        .where(F.col("rank") == 1)
        .select(*EXPORTER_KEYS, "first_heartbeat")
    )


def exporter_positions(inputs: ExporterInputs) -> DataFrame:
    """Latest report per (snapshot, replica, topic, partition, exporter) with its lag in positions and time."""
    # The partition's last heartbeat, from the heartbeats alone (the version-topic rows' highest offset is in reads).
    last_heartbeat = _heartbeats(inputs.rows).groupBy(*PARTITION_KEYS).agg(
        F.max("offset").alias("offset"), F.max_by("applied_ts_max_ms", "offset").alias("applied_ts_max_ms"),
    ).select(*PARTITION_KEYS, F.struct("offset", "applied_ts_max_ms").alias("last_heartbeat"))
    joined = (
        inputs.latest
        .join(inputs.reads.select(*PARTITION_KEYS, F.col("processed_offset").alias("last_offset")),
              on=list(PARTITION_KEYS), how="left")
        .join(last_heartbeat, on=list(PARTITION_KEYS), how="left")
        .join(_first_heartbeat_at_or_after(inputs.rows, inputs.latest), on=list(EXPORTER_KEYS), how="left")
    )
    return conform(
        joined,
        ExporterPositions.to_structtype(),
        {
            "lag_positions": F.col("last_offset") - F.col("exported_offset"),
            "first_heartbeat_offset": F.col("first_heartbeat.offset"),
            "last_heartbeat_offset": F.col("last_heartbeat.offset"),
            "lag_ms": F.col("last_heartbeat.applied_ts_max_ms") - F.col("first_heartbeat.applied_ts_max_ms"),
        },
    )


def compaction_bounds(inputs: ExporterInputs) -> DataFrame:
    """Per replica topic partition: compaction bound and re-export exposure after a fail-over."""
    joined = inputs.reads.join(_exporter_ranges(inputs.latest), on=list(PARTITION_KEYS), how="full")
    low = F.col("lowest.exported_offset")
    processed = F.col("processed_offset")
    return conform(
        joined,
        CompactionBounds.to_structtype(),
        {
            "exporters": F.coalesce(F.col("exporters"), F.lit(0)),
            "min_exported_offset": low,
            "holding_back_exporter": F.col("lowest.exporter"),
            # least() skips nulls; the bound needs both sides.
            "compaction_bound": F.when(low.isNotNull() & processed.isNotNull(), F.least(low, processed)),
            "bound_reason": F.when(low.isNull(), F.lit("NO_EXPORTER"))
            .when(processed.isNull(), F.lit("NOT_PROCESSED"))
            .when(low <= processed, F.lit("EXPORTERS"))
            .otherwise(F.lit("PROCESSED")),
            # No exporter: nothing to re-export; nothing read: unknown.
            "reexport_exposure_rows": F.when(processed.isNull(), F.lit(None)).otherwise(
                F.coalesce(F.col("reexport_exposure_rows"), F.lit(0))
            ),
            "reexport_exposure_data_rows": F.when(processed.isNull(), F.lit(None)).otherwise(
                F.coalesce(F.col("reexport_exposure_data_rows"), F.lit(0))
            ),
        },
    )
