"""Stage 4: Leap Frog divergence reports between every pair of replicas (SPEC 4), with carried state.

A snapshot whose dumps continue earlier ones is compared with the state carried over
from them (``pipelines/state.py``); the state after it is written last, in one commit.
A dump that overlaps the state it continues is verified against the predecessor's raw
rows first; ``carried_from`` says, per replica partition, which overlap was verified.
"""

import dagster as dg
from pyspark.sql import functions as F

from assets.partitions import snapshot_partitions
from assets.previews import divergence_by_pair
from assets.tables import StepTables, read_stage, schema_check_spec
from pipelines.leapfrog import compare_replicas
from pipelines.state import StateRefused, carry_over, next_state, prior_state
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
            # raw_topic_snapshots: a dump that overlaps the state it continues is verified against it.
            deps=["reconstructed_watermarks", "partition_watermarks", "raw_topic_snapshots"],
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
        dg.AssetSpec(
            "replica_state",
            group_name=GROUP,
            kinds=KINDS,
            deps=["reconstructed_watermarks", "partition_watermarks", "raw_topic_snapshots"],
            description="Each key's last version and a commit context per replica partition, for the next snapshot.",
        ),
    ],
    check_specs=[
        schema_check_spec("divergence_reports"),
        schema_check_spec("divergence_summary"),
        schema_check_spec("replica_state"),
    ],
    partitions_def=snapshot_partitions,
)
def divergence_reports(context: dg.AssetExecutionContext, spark: SparkResource, store: DeltaStore):
    snapshot_id = context.partition_key
    session = spark.spark_session
    rows = read_stage(session, store, "reconstructed_watermarks", snapshot_id)
    partitions = read_stage(session, store, "partition_watermarks", snapshot_id)
    try:
        # Every snapshot's state but this one's: re-materializing it starts from the state before it. The raw
        # rows are read only where a dump overlaps the state it continues, to verify the overlap.
        prior = prior_state(
            read_stage(session, store, "replica_state", None), partitions, snapshot_id,
            read_stage(session, store, "raw_topic_snapshots", None),
        )
    except StateRefused as refused:
        raise dg.Failure(description=str(refused), allow_retries=False) from refused
    if prior.links:
        carried_rows, carried_partitions = carry_over(rows, partitions, prior.versions, prior.context)
    else:  # a fresh stream everywhere: nothing to carry, the snapshot's own tables are the stream's
        carried_rows, carried_partitions = rows, partitions
    carried = {
        "carried_partitions": len(prior.links),
        "carried_versions": prior.carried_versions,
        "previous_snapshot_ids": dg.MetadataValue.json(prior.previous_snapshot_ids),
        "carried_from": dg.MetadataValue.json(prior.links),
    }
    reports, summary = compare_replicas(carried_rows, carried_partitions)
    tables = StepTables(session, store, snapshot_id)
    tables.stage(reports, "divergence_reports")
    tables.stage(summary, "divergence_summary")
    written_summary = tables.frame("divergence_summary")
    totals = verdict_totals(written_summary)
    tables.add_metadata(
        "divergence_reports",
        {
            **{f"keys_{k.lower()}": v for k, v in totals.items()},
            **carried,
            "by_replica_pair": dg.MetadataValue.md(divergence_by_pair(written_summary)),
        },
    )
    state = next_state(carried_rows, carried_partitions, prior.versions, prior.context)
    tables.stage(state, "replica_state", extra_metadata=carried)
    yield from tables.publish()


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
