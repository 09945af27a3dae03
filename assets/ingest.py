"""Stage 1: raw topic snapshots from the landing zone into Delta, with a quarantine for bad rows."""

import dagster as dg

from assets.partitions import snapshot_partitions
from assets.tables import StepTables, schema_check_spec
from pipelines.ingest import accounting_from_tables, judge_rows, list_snapshot_files, read_snapshot_lines
from resources.delta_store import DeltaStore
from resources.landing import LandingZone
from resources.spark import SparkResource

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
    judgement = judge_rows(read_snapshot_lines(session, folder), snapshot_id)

    tables = StepTables(session, store, snapshot_id)
    tables.stage(judgement.accepted, "raw_topic_snapshots")
    # Known empty from the accepted pass when no row was bad: then it costs no second pass
    # (and no Spark job at all).
    quarantine_empty = judgement.quarantine_is_empty()
    if quarantine_empty:
        tables.stage_empty("raw_topic_quarantine")
    else:
        tables.stage(judgement.quarantined, "raw_topic_quarantine")
    # Counted on the staged tables (two narrow columns each): no extra pass over the landing files.
    counts = accounting_from_tables(
        tables.frame("raw_topic_snapshots"), None if quarantine_empty else tables.frame("raw_topic_quarantine")
    )
    context.log.info(
        "snapshot %s: %s rows read = %s accepted + %s quarantined",
        snapshot_id,
        counts["rows_read"],
        counts["rows_accepted"],
        counts["rows_quarantined"],
    )
    tables.add_metadata(
        "raw_topic_snapshots",
        {
            "rows_read": counts["rows_read"],
            "rows_accepted": counts["rows_accepted"],
            "rows_quarantined": counts["rows_quarantined"],
            "duplicates_collapsed": counts["rows_accepted"] - counts["rows_stored"],
            "files_read": len(files.data_files),
            "files_not_read": dg.MetadataValue.json(files.other_files),
            "by_replica": dg.MetadataValue.json(counts["by_replica"]),
        },
    )
    tables.add_metadata(
        "raw_topic_quarantine",
        {"rows_quarantined": counts["rows_quarantined"], "by_reason": dg.MetadataValue.json(counts["by_reason"])},
    )
    yield from tables.publish()
