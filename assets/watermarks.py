"""Stages 2 and 3 in one step, with the stream anomalies: segments and watermarks (SPEC 2, 3) and the anomalies of
SPEC 5, from one pass per stream."""

import dagster as dg
from pydantic import Field
from pyspark.sql import functions as F

from assets.partitions import CRITICAL_PATH, snapshot_partitions
from assets.tables import StepTables, read_stage, schema_check_spec
from pipelines.ingest.judging import value_token
from pipelines.anomalies import AnomalyBounds
from pipelines.stream_pass import WRITTEN, anomaly_rows, stream_pass_of_files, summary_rows
from pipelines.stream_pass import stream_pass as pass_streams
from pipelines.watermarks import partition_watermarks
from resources.delta_store import DeltaStore
from resources.spark import SparkResource
from resources.tuning import on_driver
from schemas.operations import ANOMALIES

GROUP = "watermarks"
KINDS = {"spark", "delta"}
STREAM_TABLES = (
    "heartbeat_segments", "heartbeat_segment_summary", "reconstructed_watermarks", "partition_watermarks",
    "stream_anomalies",
)
_DEFAULT_BOUNDS = AnomalyBounds()


class AnomalyConfig(dg.Config):
    heartbeat_gap_ms: int = Field(
        default=_DEFAULT_BOUNDS.heartbeat_gap_ms,
        description="HEARTBEAT_GAP when the applied time between consecutive heartbeats exceeds this.",
    )
    clock_uncertainty_ms: int = Field(
        default=_DEFAULT_BOUNDS.clock_uncertainty_ms,
        description="CLOCK_UNCERTAINTY when a heartbeat's clock interval is wider than this.",
    )


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
            # Of the same pass over the raw rows as the segments (the lineage keeps its two columns).
            deps=["raw_topic_snapshots", "raw_topic_skipped"],
            description="One row per heartbeat segment: baseline, closing watermark, rows per kind, resolved timestamp.",
        ),
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
        dg.AssetSpec(
            "stream_anomalies",
            group_name="operations",
            kinds=KINDS,
            # Found by the same pass; DATA_BEYOND_HEARTBEAT judges a data row by the next vector heartbeat.
            deps=["raw_topic_snapshots", "heartbeat_segments", "heartbeat_segment_summary"],
            description="Rows where a version-topic stream misbehaves, with the anomaly and its position (SPEC 5).",
        ),
    ],
    check_specs=[schema_check_spec(t) for t in STREAM_TABLES],
    partitions_def=snapshot_partitions,
    # The longest chain of the audit (stream pass -> divergence) starts first.
    op_tags=CRITICAL_PATH,
)
def stream_pass(context: dg.AssetExecutionContext, config: AnomalyConfig, spark: SparkResource, store: DeltaStore):
    """One pass per stream (``pipelines/stream_pass.py``) and the five tables made of it, published together."""
    snapshot_id = context.partition_key
    session = spark.spark_session
    rows = store.snapshot_rows("raw_topic_snapshots", [snapshot_id])
    with spark.sized_for(rows) as evaluation:
        tables = StepTables(session, store, snapshot_id, evaluation=evaluation, rows=rows)
        raw = read_stage(session, store, "raw_topic_snapshots", snapshot_id)
        tokens_missing = store.written_without("raw_topic_snapshots", snapshot_id, "value_hash")
        if tokens_missing:
            # Ingested before raw_topic_snapshots kept each value's token: made here, from the values (re-materialize
            # raw_topic_snapshots to keep the values out of this stage, docs/tables.md).
            raw = raw.withColumn("value_hash", value_token())
        # Positions read that hold no row (raw Venice records skipped by rule) are not gaps; none to read when the
        # Delta log says so (every JSONL or SPEC Parquet snapshot).
        skipped = store.snapshot_rows("raw_topic_skipped", [snapshot_id])
        read_positions = None if skipped == 0 else read_stage(session, store, "raw_topic_skipped", snapshot_id)
        bounds = AnomalyBounds(heartbeat_gap_ms=config.heartbeat_gap_ms, clock_uncertainty_ms=config.clock_uncertainty_ms)
        # The two per-row tables are written by the pass itself, as Parquet from its Arrow batches where it makes
        # them (on the driver or in Spark's Python workers); what comes back is the summaries and anomalies, computed
        # once (docs/performance.md).
        written = {table: tables.arrow_stage(table) for table in WRITTEN}
        # A snapshot ingested by stream (each file holds its streams whole) is read file by file by the pass's tasks,
        # with no exchange; read positions to merge, tokens to make, or a small snapshot (on the driver) go by Spark.
        files = None
        if read_positions is None and not tokens_missing and not on_driver(rows):
            files = store.stream_files(session, "raw_topic_snapshots", snapshot_id)
        if files is not None:
            passed = stream_pass_of_files(session, [(f.fs, f.path) for f in files], snapshot_id, bounds, written)
        else:
            passed = pass_streams(raw, read_positions, rows=rows, bounds=bounds, written=written)
        for stage in written.values():
            tables.stage_arrow(stage)
        tables.add_metadata("heartbeat_segments", {"read_by_file": files is not None})
        tables.stage(summary_rows(passed), "heartbeat_segment_summary")
        # Whether any dump has a gap, and which, observed by the same write, for the materialization's metadata.
        tables.stage(
            partition_watermarks(tables.frame("heartbeat_segment_summary")), "partition_watermarks",
            observe=gap_observations(),
        )
        tables.add_metadata("partition_watermarks", gap_metadata(tables.observed("partition_watermarks")))
        # Rows per anomaly, counted by the job that writes them.
        tables.stage(anomaly_rows(passed), "stream_anomalies",
                     observe={a: F.count_if(F.col("anomaly") == a) for a in ANOMALIES})
        by_kind = {a: n for a, n in tables.observed("stream_anomalies").items() if n}
        tables.add_metadata("stream_anomalies", {"by_anomaly": dg.MetadataValue.json(by_kind), **bounds.__dict__})
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
