"""Operational tables: replication lag, exporter positions (SPEC 6, 7); the stream anomalies (SPEC 5) come from the
stream pass (``assets/watermarks.py``)."""

import dagster as dg
from pydantic import Field
from pyspark.sql import Column
from pyspark.sql import functions as F

from assets.partitions import snapshot_partitions
from assets.previews import compaction_holdbacks, lag_trends, lagging_rows, worst_lag, worst_lagging
from assets.tables import StepTables, matching_rows, read_stage, schema_check_spec
from pipelines.exporters import compaction_bounds, exporter_inputs, exporter_positions, exporter_regressions
from pipelines.frames import computed_once
from pipelines.lag import heartbeat_lag, lag_summary
from resources.delta_store import DeltaStore
from resources.spark import SparkResource

GROUP = "operations"
KINDS = {"spark", "delta"}
EXAMPLES = 10


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "heartbeat_lag",
            group_name=GROUP,
            kinds=KINDS,
            deps=["raw_topic_snapshots"],
            description="Per heartbeat: lower and upper replication lag bounds from the clock intervals (SPEC 6).",
        ),
        dg.AssetSpec(
            "replication_lag",
            group_name=GROUP,
            kinds=KINDS,
            deps=["raw_topic_snapshots"],
            description="Per replica and origin region: lag count, p50, p99, max and end-of-snapshot staleness.",
        ),
    ],
    check_specs=[schema_check_spec("heartbeat_lag"), schema_check_spec("replication_lag")],
    partitions_def=snapshot_partitions,
)
def replication_lag(context: dg.AssetExecutionContext, spark: SparkResource, store: DeltaStore):
    snapshot_id = context.partition_key
    session = spark.spark_session
    rows = store.snapshot_rows("raw_topic_snapshots", [snapshot_id])
    with spark.sized_for(rows) as evaluation:
        tables = StepTables(session, store, snapshot_id, evaluation=evaluation, rows=rows)
        tables.stage(heartbeat_lag(read_stage(session, store, "raw_topic_snapshots", snapshot_id)), "heartbeat_lag")
        tables.stage(lag_summary(tables.frame("heartbeat_lag")), "replication_lag")
        lagging = lagging_rows(tables.frame("replication_lag"))
        tables.add_metadata(
            "replication_lag",
            {"worst_lagging": dg.MetadataValue.md(worst_lagging(lagging)), "worst_lag": dg.MetadataValue.json(worst_lag(lagging) or {}),
             **lag_trends(lagging)},
        )
        yield from tables.publish()


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "exporter_positions",
            group_name=GROUP,
            kinds=KINDS,
            deps=["raw_topic_snapshots"],
            description="Latest position of each downstream exporter, with its lag in positions and time (SPEC 7).",
        ),
        dg.AssetSpec(
            "exporter_regressions",
            group_name=GROUP,
            kinds=KINDS,
            deps=["raw_topic_snapshots"],
            description="Exporter reports whose position went back below an earlier report.",
        ),
        dg.AssetSpec(
            "compaction_bounds",
            group_name=GROUP,
            kinds=KINDS,
            deps=["raw_topic_snapshots"],
            description="Per replica partition: the offset below which compaction is safe, and the re-export exposure.",
        ),
    ],
    check_specs=[
        schema_check_spec("exporter_positions"),
        schema_check_spec("exporter_regressions"),
        schema_check_spec("compaction_bounds"),
    ],
    partitions_def=snapshot_partitions,
)
def exporter_tables(context: dg.AssetExecutionContext, spark: SparkResource, store: DeltaStore):
    snapshot_id = context.partition_key
    session = spark.spark_session
    rows = store.snapshot_rows("raw_topic_snapshots", [snapshot_id])
    with spark.sized_for(rows) as evaluation:
        raw = read_stage(session, store, "raw_topic_snapshots", snapshot_id)
        tables = StepTables(session, store, snapshot_id, evaluation=evaluation, rows=rows)
        # Two passes over the raw rows, each computed once and kept; the three tables are made of them.
        inputs = exporter_inputs(raw, once=computed_once)
        tables.stage(exporter_positions(inputs), "exporter_positions")
        tables.stage(exporter_regressions(inputs), "exporter_regressions")
        tables.stage(compaction_bounds(inputs), "compaction_bounds")
        preview = compaction_holdbacks(tables.frame("compaction_bounds"))
        tables.add_metadata("compaction_bounds", {"holding_back_compaction": dg.MetadataValue.md(preview)})
        yield from tables.publish()


class LagBounds(dg.Config):
    max_lag_p99_ms: int = Field(
        default=60_000, description="Warn when a replica's p99 upper lag bound from an origin exceeds this."
    )
    max_staleness_ms: int = Field(
        default=300_000, description="Warn when a replica's end-of-snapshot staleness from an origin exceeds this."
    )


@dg.asset_check(
    asset="replication_lag",
    name="lag_within_bounds",
    description="Warns when a replica's p99 lag or staleness from an origin region is above the configured bound.",
    partitions_def=snapshot_partitions,
)
def lag_within_bounds(
    context: dg.AssetCheckExecutionContext, config: LagBounds, spark: SparkResource, store: DeltaStore
) -> dg.AssetCheckResult:
    return _bound_check(
        spark, store, "replication_lag", context.partition_key,
        (F.col("p99_upper_ms") > config.max_lag_p99_ms) | (F.col("staleness_ms") > config.max_staleness_ms),
        "p99_upper_ms", ["replica", "origin_region", "p99_upper_ms", "staleness_ms"],
        {"max_lag_p99_ms": config.max_lag_p99_ms, "max_staleness_ms": config.max_staleness_ms},
        "replica/origin pair(s) lag beyond the bound",
    )


class ExporterBounds(dg.Config):
    max_lag_positions: int = Field(default=100_000, description="Warn when an exporter is more offsets behind.")
    max_lag_ms: int = Field(default=600_000, description="Warn when an exporter is further behind in applied time.")


@dg.asset_check(
    asset="exporter_positions",
    name="exporters_within_bounds",
    description="Warns when an exporter lags its partition by more than the configured positions or time.",
    partitions_def=snapshot_partitions,
)
def exporters_within_bounds(
    context: dg.AssetCheckExecutionContext, config: ExporterBounds, spark: SparkResource, store: DeltaStore
) -> dg.AssetCheckResult:
    return _bound_check(
        spark, store, "exporter_positions", context.partition_key,
        (F.col("lag_positions") > config.max_lag_positions) | (F.col("lag_ms") > config.max_lag_ms),
        "lag_positions", ["exporter", "replica", "topic", "partition", "lag_positions", "lag_ms"],
        {"max_lag_positions": config.max_lag_positions, "max_lag_ms": config.max_lag_ms},
        "exporter position(s) lag beyond the bound",
    )


def _bound_check(
    spark: SparkResource, store: DeltaStore, table: str, snapshot_id: str, over: Column, worst_first: str,
    columns: list[str], bounds: dict, what: str,
) -> dg.AssetCheckResult:
    """WARN when rows of ``table`` are ``over`` their bound: their count, and the worst ``EXAMPLES`` (one query)."""
    examples, counts = matching_rows(
        spark, store, table, snapshot_id, over, [F.desc_nulls_last(worst_first)], {"over": F.count(F.lit(1))}, EXAMPLES,
        columns,
    )
    total = counts["over"]
    return dg.AssetCheckResult(
        passed=total == 0,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={
            "over_bound": total,
            **bounds,
            "examples": dg.MetadataValue.json([{c: r[c] for c in columns} for r in examples]),
        },
        description=None if total == 0 else f"{total} {what}",
    )
