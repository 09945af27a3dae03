"""Stage 4: Leap Frog divergence reports between every pair of replicas (SPEC 4)."""

import dagster as dg
from pyspark.sql import functions as F

from assets.partitions import snapshot_partitions
from assets.previews import divergence_by_pair
from assets.tables import materialize_stage, read_stage, schema_check_spec
from pipelines.leapfrog import compare_replicas
from resources.delta_store import DeltaStore
from resources.spark import SparkResource

GROUP = "divergence"
KINDS = {"spark", "delta"}
PROVEN = ("DIVERGENT", "MISSING")
EXAMPLE_KEYS = 10


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "divergence_reports",
            group_name=GROUP,
            kinds=KINDS,
            deps=["reconstructed_watermarks", "partition_watermarks"],
            description="Every key that is not CONSISTENT between two replicas, with its verdict and witness (SPEC 4).",
            owners=["team:replication"],
        ),
        dg.AssetSpec(
            "divergence_summary",
            group_name=GROUP,
            kinds=KINDS,
            deps=["reconstructed_watermarks", "partition_watermarks"],
            description="Keys per verdict for each replica pair, topic and partition.",
        ),
    ],
    check_specs=[schema_check_spec("divergence_reports"), schema_check_spec("divergence_summary")],
    partitions_def=snapshot_partitions,
)
def divergence_reports(context: dg.AssetExecutionContext, spark: SparkResource, store: DeltaStore):
    snapshot_id = context.partition_key
    session = spark.spark_session
    reports, summary = compare_replicas(
        read_stage(session, store, "reconstructed_watermarks", snapshot_id),
        read_stage(session, store, "partition_watermarks", snapshot_id),
    )
    reports_result = materialize_stage(session, store, reports, "divergence_reports", snapshot_id)
    summary_result = materialize_stage(session, store, summary, "divergence_summary", snapshot_id)
    written_summary = read_stage(session, store, "divergence_summary", snapshot_id)
    totals = verdict_totals(written_summary)
    yield dg.MaterializeResult(
        asset_key="divergence_reports",
        metadata={
            **reports_result.metadata,
            **{f"keys_{k.lower()}": v for k, v in totals.items()},
            "by_replica_pair": dg.MetadataValue.md(divergence_by_pair(written_summary)),
        },
        check_results=reports_result.check_results,
    )
    yield summary_result


def verdict_totals(summary) -> dict[str, int]:
    row = summary.agg(
        F.sum("keys_compared").alias("COMPARED"),
        F.sum("consistent").alias("CONSISTENT"),
        F.sum("divergent").alias("DIVERGENT"),
        F.sum("missing").alias("MISSING"),
        F.sum("in_flight").alias("IN_FLIGHT"),
    ).first()
    return {name: int(row[name] or 0) for name in ("COMPARED", "CONSISTENT", "DIVERGENT", "MISSING", "IN_FLIGHT")}


@dg.asset_check(
    asset="divergence_reports",
    name="no_proven_divergence",
    description="Fails (ERROR) when any key is proven DIVERGENT or MISSING between two replicas.",
    partitions_def=snapshot_partitions,
)
def no_proven_divergence(context: dg.AssetCheckExecutionContext, spark: SparkResource, store: DeltaStore):
    session = spark.spark_session
    snapshot_id = context.partition_key
    reports = read_stage(session, store, "divergence_reports", snapshot_id)
    proven = reports.where(F.col("verdict").isin(*PROVEN))
    counts = {r["verdict"]: int(r["count"]) for r in proven.groupBy("verdict").count().collect()}
    examples = [
        {k: r[k] for k in ("topic", "partition", "replica_a", "replica_b", "key", "verdict")}
        for r in proven.orderBy("topic", "partition", "replica_a", "replica_b", "key").limit(EXAMPLE_KEYS).collect()
    ]
    total = sum(counts.values())
    return dg.AssetCheckResult(
        passed=total == 0,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "divergent": counts.get("DIVERGENT", 0),
            "missing": counts.get("MISSING", 0),
            "example_keys": dg.MetadataValue.json(examples),
        },
        description=None if total == 0 else f"{total} key(s) proven divergent or missing",
    )
