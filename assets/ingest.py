"""Stage 1: raw topic snapshots from the landing zone into Delta, with a quarantine for bad rows."""

import dagster as dg

from assets.partitions import snapshot_partitions
from assets.tables import materialize_stage, schema_check_spec
from pipelines.ingest import accounting_from_tables, list_snapshot_files, read_snapshot_lines, validate_rows
from resources.delta_store import DeltaStore
from resources.landing import LandingZone
from resources.spark import SparkResource
from schemas.registry import struct_for

GROUP = "ingest"
KINDS = {"spark", "delta"}


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "raw_topic_snapshots",
            group_name=GROUP,
            kinds=KINDS,
            description="Every valid version-topic message of a snapshot, as read from the landing zone (SPEC 1).",
            tags={"stage": "raw"},
        ),
        dg.AssetSpec(
            "raw_topic_quarantine",
            group_name=GROUP,
            kinds=KINDS,
            description="Rows of a snapshot that break SPEC 1, with the reason and the file they came from.",
            tags={"stage": "raw"},
        ),
    ],
    check_specs=[schema_check_spec("raw_topic_snapshots"), schema_check_spec("raw_topic_quarantine")],
    partitions_def=snapshot_partitions,
)
def raw_topic_snapshots(
    context: dg.AssetExecutionContext, spark: SparkResource, store: DeltaStore, landing: LandingZone
):
    snapshot_id = context.partition_key
    session = spark.spark_session
    folder = landing.require_complete(snapshot_id)
    files = list_snapshot_files(folder)
    accepted, quarantined = validate_rows(read_snapshot_lines(session, folder), snapshot_id)

    accepted_result = materialize_stage(session, store, accepted, "raw_topic_snapshots", snapshot_id)
    quarantine_result = materialize_stage(session, store, quarantined, "raw_topic_quarantine", snapshot_id)

    # Counted on the written tables, one aggregation each: no extra pass over the landing files.
    counts = accounting_from_tables(
        store.read_snapshot(session, "raw_topic_snapshots", snapshot_id, struct_for("raw_topic_snapshots")),
        store.read_snapshot(session, "raw_topic_quarantine", snapshot_id, struct_for("raw_topic_quarantine")),
    )
    context.log.info(
        "snapshot %s: %s rows read = %s accepted + %s quarantined",
        snapshot_id,
        counts["rows_read"],
        counts["rows_accepted"],
        counts["rows_quarantined"],
    )
    accounting = {
        "rows_read": counts["rows_read"],
        "rows_accepted": counts["rows_accepted"],
        "rows_quarantined": counts["rows_quarantined"],
        "duplicates_collapsed": counts["rows_accepted"] - counts["rows_stored"],
        "files_read": len(files.data_files),
        "files_not_read": dg.MetadataValue.json(files.other_files),
        "by_replica": dg.MetadataValue.json(counts["by_replica"]),
    }
    yield dg.MaterializeResult(
        asset_key="raw_topic_snapshots",
        metadata={**accepted_result.metadata, **accounting},
        check_results=accepted_result.check_results,
    )
    yield dg.MaterializeResult(
        asset_key="raw_topic_quarantine",
        metadata={
            **quarantine_result.metadata,
            "rows_quarantined": counts["rows_quarantined"],
            "by_reason": dg.MetadataValue.json(counts["by_reason"]),
        },
        check_results=quarantine_result.check_results,
    )
