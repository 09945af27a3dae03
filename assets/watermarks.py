"""Stage 2 and 3: heartbeat-annotated segments and reconstructed watermarks (SPEC 2, 3)."""

import dagster as dg
from pyspark.sql import functions as F

from assets.partitions import CRITICAL_PATH, snapshot_partitions
from assets.tables import StepTables, read_stage, schema_check_spec
from pipelines.ingest.judging import value_token
from pipelines.segments import annotate_segments, summarize_segments
from pipelines.vectors import PARTITION_VECTORS, universe
from pipelines.watermarks import partition_watermarks, reconstruct_watermarks
from resources.delta_store import DeltaStore
from resources.spark import SparkResource

GROUP = "watermarks"
KINDS = {"spark", "delta"}


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "heartbeat_segments",
            group_name=GROUP,
            kinds=KINDS,
            deps=["raw_topic_snapshots", "raw_topic_skipped"],
            description="Every version-topic row with its heartbeat segment, baseline vector and applied time (SPEC 2).",
        ),
        dg.AssetSpec(
            "heartbeat_segment_summary",
            group_name=GROUP,
            kinds=KINDS,
            deps=["raw_topic_snapshots", "raw_topic_skipped"],
            description="One row per heartbeat segment: baseline, closing watermark, rows per kind, resolved timestamp.",
        ),
    ],
    check_specs=[schema_check_spec("heartbeat_segments"), schema_check_spec("heartbeat_segment_summary")],
    partitions_def=snapshot_partitions,
    # The longest chain of the audit (segments -> watermarks -> divergence) starts first.
    op_tags=CRITICAL_PATH,
)
def heartbeat_segments(context: dg.AssetExecutionContext, spark: SparkResource, store: DeltaStore):
    snapshot_id = context.partition_key
    session = spark.spark_session
    with spark.sized_for(store.snapshot_rows("raw_topic_snapshots", [snapshot_id])) as evaluation:
        tables = StepTables(session, store, snapshot_id, evaluation=evaluation)
        raw = read_stage(session, store, "raw_topic_snapshots", snapshot_id)
        if store.written_without("raw_topic_snapshots", snapshot_id, "value_hash"):
            # Ingested before raw_topic_snapshots kept each value's token: made here, from the values (re-materialize
            # raw_topic_snapshots to keep the values out of this stage, docs/tables.md).
            raw = raw.withColumn("value_hash", value_token())
        # Positions read that hold no row (raw Venice records skipped by rule) are not gaps; none to read when the
        # Delta log says so (every JSONL or SPEC Parquet snapshot).
        skipped = store.snapshot_rows("raw_topic_skipped", [snapshot_id])
        read_positions = None if skipped == 0 else read_stage(session, store, "raw_topic_skipped", snapshot_id)
        tables.stage(annotate_segments(raw, read_positions), "heartbeat_segments")
        tables.stage(summarize_segments(tables.frame("heartbeat_segments")), "heartbeat_segment_summary")
        yield from tables.publish()


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "reconstructed_watermarks",
            group_name=GROUP,
            kinds=KINDS,
            deps=["heartbeat_segments"],
            description="Per data row: applied lower bound L, touch bound U and reach M (SPEC 3).",
        ),
        dg.AssetSpec(
            "partition_watermarks",
            group_name=GROUP,
            kinds=KINDS,
            deps=["heartbeat_segment_summary"],
            description="Per replica partition: L at the end of the dump, pre-history bound P, resolved timestamp, gaps.",
        ),
    ],
    check_specs=[schema_check_spec("reconstructed_watermarks"), schema_check_spec("partition_watermarks")],
    partitions_def=snapshot_partitions,
    # The longest chain of the audit (segments -> watermarks -> divergence) starts first.
    op_tags=CRITICAL_PATH,
)
def reconstructed_watermarks(context: dg.AssetExecutionContext, spark: SparkResource, store: DeltaStore):
    snapshot_id = context.partition_key
    session = spark.spark_session
    with spark.sized_for(store.snapshot_rows("heartbeat_segments", [snapshot_id])) as evaluation:
        annotated = read_stage(session, store, "heartbeat_segments", snapshot_id)
        tables = StepTables(session, store, snapshot_id, evaluation=evaluation)
        # The few partition rows first, from the segments' summary (not from every row again): P and L(end) of every
        # data row are then read from them.
        summary = read_stage(session, store, "heartbeat_segment_summary", snapshot_id)
        # Their regions (what partition_regions would collect) and whether any dump has a gap are observed by the
        # same write.
        tables.stage(
            partition_watermarks(summary), "partition_watermarks",
            observe={"regions": universe(vector_columns=PARTITION_VECTORS), **gap_observations()},
        )
        observed = tables.observed("partition_watermarks")
        tables.add_metadata("partition_watermarks", gap_metadata(observed))
        tables.stage(
            reconstruct_watermarks(
                annotated, tables.frame("partition_watermarks"), observed["regions"], gaps=bool(observed["gaps"]),
            ),
            "reconstructed_watermarks",
        )
        yield from tables.publish()


MAX_LISTED_GAPS = 20


def gap_observations() -> dict:
    """Aggregates of ``partition_watermarks`` for its metadata: the gaps of every dump, and which dumps have any."""
    has = F.col("gaps") > 0
    listed = F.struct(
        F.concat_ws("/", "replica", "topic", F.col("partition").cast("string")).alias("dump"),
        "gaps", "gap_positions", "first_gap_offset", "last_gap_offset",
    )
    return {
        "gaps": F.coalesce(F.sum("gaps"), F.lit(0)),
        "gap_positions": F.coalesce(F.sum("gap_positions"), F.lit(0)),
        "dumps_with_gaps": F.count_if(has),
        "gapped": F.slice(F.array_sort(F.collect_list(F.when(has, listed))), 1, MAX_LISTED_GAPS),
    }


def gap_metadata(observed: dict) -> dict:
    """What an operator reads on the materialization: where proofs rest on a dump with gaps (SPEC 3a)."""
    listed = [{k: row[k] for k in ("dump", "gaps", "gap_positions", "first_gap_offset", "last_gap_offset")}
              for row in observed["gapped"] or []]
    return {
        "gaps": int(observed["gaps"]),
        "gap_positions": int(observed["gap_positions"]),
        "dumps_with_gaps": int(observed["dumps_with_gaps"]),
        "dumps_with_gaps_listed": dg.MetadataValue.json(listed),
    }
