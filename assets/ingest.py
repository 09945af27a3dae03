"""Stage 1: raw topic snapshots from the landing zone into Delta, with a quarantine for bad rows and the positions
of the raw Venice records skipped by rule."""

import json
from typing import Sequence

import dagster as dg
from pyspark.sql import functions as F

from assets.partitions import snapshot_partitions
from assets.tables import StepTables, schema_check_spec
from pipelines.ingest.accounting import accounting_from_tables
from pipelines.ingest.judging import JUDGING_SPARK_SETTINGS, judge_rows
from pipelines.ingest.reading import (
    VeniceSettings,
    list_snapshot_files,
    read_skipped_positions,
    read_snapshot_lines,
    venice_cluster_ids,
)
from pipelines.venice.push_settings import DECLARED_FIELD, carried_from_rows, parse_push_settings
from pipelines.venice.frame import (
    UNKNOWN_PUSH_SETTINGS,
    CarriedSettings,
    PushResolution,
    unknown_cluster_id_in,
    unknown_cluster_ids_message,
)
from pipelines.venice.values import Limits
from pipelines.venice.kafka_cut import CUT_FILE, cut_rows
from resources.delta_store import DeltaStore
from resources.filesystem import Location
from resources.landing import LandingZone
from resources.session import session_settings
from resources.spark import SparkResource
from schemas.registry import struct_for

GROUP = "ingest"
KINDS = {"spark", "delta"}


EVERY_TOPIC_DECODED = "every_topic_decoded"
NAME_THE_SETTINGS = ("name their compression and chunking with --venice-push-settings FILE (the landing resource's "
                     "venice_push_settings), or audit the snapshot holding their START_OF_PUSH first, and audit this "
                     "one again: their records are kept in raw_topic_quarantine")

# The tables of the ingestion step, with what each holds.
TABLES = {
    "raw_topic_snapshots": "Every valid version-topic message of a snapshot, as read from the landing zone (SPEC 1).",
    "raw_topic_quarantine": "Rows of a snapshot that break SPEC 1, with the reason and the file they came from.",
    "raw_topic_skipped": "Positions of the raw Venice records skipped by rule: read, so not gaps (SPEC 3a).",
}


def earlier_start_of_push(session, store: DeltaStore, snapshot_id: str) -> CarriedSettings:
    """What the START_OF_PUSH rows of the other snapshots in ``raw_topic_snapshots`` declared, per version topic asked
    for: the settings of a dump that continues a stream (docs/incremental.md). One read of the table's
    START_OF_PUSH rows of those topics (the filters reach the Parquet scan), made only when a snapshot holds raw
    Venice records, once per snapshot (its lines and its skipped positions ask for the same topics)."""
    found: dict[tuple[str, ...], dict] = {}

    def carried(topics: Sequence[str]) -> dict:
        asked = tuple(sorted(topics))
        if asked not in found:
            found[asked] = read(asked)
        return found[asked]

    def read(topics: tuple[str, ...]) -> dict:
        if not store.exists("raw_topic_snapshots"):
            return {}
        declared = F.col("extra_fields").getItem(DECLARED_FIELD)
        rows = (store.read_all(session, "raw_topic_snapshots", struct_for("raw_topic_snapshots"))
                .where((F.col("kind") == "START_OF_PUSH") & F.col("topic").isin(list(topics))
                       & (F.col("snapshot_id") != snapshot_id) & declared.isNotNull())
                .select("snapshot_id", "topic", declared.alias("declared")).distinct().collect())
        return carried_from_rows([(r["snapshot_id"], r["topic"], r["declared"]) for r in rows])

    return carried


@dg.multi_asset(
    specs=[
        dg.AssetSpec(table, group_name=GROUP, kinds=KINDS, description=description, tags={"stage": "raw"})
        for table, description in TABLES.items()
    ],
    check_specs=[schema_check_spec(table) for table in TABLES] + [
        dg.AssetCheckSpec(
            EVERY_TOPIC_DECODED, asset="raw_topic_snapshots",
            description="Every version topic of raw Venice records was decoded: fails (ERROR) naming the topics whose "
            "compression and chunking are not known (no START_OF_PUSH, none in the push settings file, or ones that "
            "disagree); their records are kept in raw_topic_quarantine and every other topic is audited.",
        ),
    ],
    partitions_def=snapshot_partitions,
)
def raw_topic_snapshots(
    context: dg.AssetExecutionContext, spark: SparkResource, store: DeltaStore, landing: LandingZone
):
    snapshot_id = context.partition_key
    session = spark.spark_session
    folder = landing.require_complete(snapshot_id)
    files = list_snapshot_files(folder)
    # Raw Venice records, if the snapshot holds any: cluster id -> region from the landing resource.
    with spark.sized_for(files.estimated_rows()) as evaluation, session_settings(session, JUDGING_SPARK_SETTINGS):
        resolutions: list[PushResolution] = []
        venice = VeniceSettings(landing.cluster_region_map(), landing.clock_uncertainty_ms(),
                                parse_push_settings(landing.push_settings_file()), Limits.checked(**landing.limit_settings()),
                                carried_push_settings=earlier_start_of_push(session, store, snapshot_id),
                                on_resolved=resolutions.append)
        lines = read_snapshot_lines(session, folder, venice, landing.line_limit())
        judgement = judge_rows(lines, snapshot_id)

        tables = StepTables(session, store, snapshot_id, evaluation=evaluation, rows=files.estimated_rows())
        try:
            tables.stage(judgement.accepted, "raw_topic_snapshots", whole_streams=True)
        except Exception as exc:
            # A raw Venice record from a cluster the map does not name: the Spark job failed, nothing
            # is committed. Say so plainly instead of with the executor's traceback.
            unknown = unknown_cluster_id_in(exc)
            if unknown is None:
                raise
            # The failed job stopped at the first unknown id; one more job names them all.
            try:
                unknown = unknown_cluster_ids_message(venice_cluster_ids(session, folder, landing.line_limit()),
                                                      landing.cluster_region_map())
            except Exception:  # noqa: BLE001 - the first id still tells the operator what to fix
                pass
            raise dg.Failure(
                description=f"{unknown}: name every upstream cluster with --cluster-regions, the landing resource's "
                "cluster_regions or REPLICA_LENS_CLUSTER_REGIONS (e.g. 0=dc-a,1=dc-b); no table was written"
            ) from None
        # Known empty from the accepted pass when no row was bad: then it costs no second pass
        # (and no Spark job at all).
        quarantine_empty = judgement.quarantine_is_empty()
        if quarantine_empty:
            tables.stage_empty("raw_topic_quarantine")
        else:
            # Only the parts the accepted pass's counts call for (rows with problems of their own, conflicts).
            tables.stage(judgement.quarantine(), "raw_topic_quarantine")
        # The positions of the records skipped by rule, read again from the raw Venice files only when the accepted
        # pass saw some (a JSONL or SPEC Parquet snapshot never has any: no Spark job).
        skipped = judgement.skipped_by_reason()
        if skipped:
            staged = tables.stage(read_skipped_positions(session, folder, snapshot_id, venice, landing.line_limit()),
                                  "raw_topic_skipped")
            if staged.row_count != sum(skipped.values()):
                tables.discard()
                raise dg.Failure(
                    description=f"raw_topic_skipped holds {staged.row_count} position(s) of records skipped by rule, "
                    f"the accepted pass skipped {sum(skipped.values())} ({skipped}): no table was written"
                )
        else:
            tables.stage_empty("raw_topic_skipped")
        # Counted on the staged tables (two narrow columns each): no extra pass over the landing files.
        counts = accounting_from_tables(
            tables.frame("raw_topic_snapshots"),
            None if quarantine_empty else tables.frame("raw_topic_quarantine"),
            skipped,
            tables.frame("raw_topic_skipped") if skipped else None,
        )
        context.log.info(
            "snapshot %s: %s rows read = %s accepted + %s quarantined + %s skipped",
            snapshot_id,
            counts["rows_read"],
            counts["rows_accepted"],
            counts["rows_quarantined"],
            counts["rows_skipped"],
        )
        tables.add_metadata(
            "raw_topic_snapshots",
            {
                "rows_read": counts["rows_read"],
                "rows_accepted": counts["rows_accepted"],
                "rows_quarantined": counts["rows_quarantined"],
                "rows_skipped": counts["rows_skipped"],
                "skipped_by_reason": dg.MetadataValue.json(counts["skipped_by_reason"]),
                "rows_duplicates_collapsed": counts["rows_accepted"] - counts["rows_stored"],
                "files_read": len(files.data_files),
                "files_not_read": dg.MetadataValue.json(files.other_files),
                "by_replica": dg.MetadataValue.json(counts["by_replica"]),
                "skipped_by_kind": dg.MetadataValue.json(counts["skipped_by_kind"]),
            },
        )
        # Version topics whose push settings are not known: kept, not audited; every other topic is (a few rows).
        not_audited = {} if not counts["by_reason"].get(UNKNOWN_PUSH_SETTINGS) else {
            r["topic"]: r["count"] for r in tables.frame("raw_topic_quarantine")
            .where(F.col("reason") == UNKNOWN_PUSH_SETTINGS).groupBy("topic").count().collect()
        }
        if not_audited:
            context.log.warning(f"version topics not audited, their push settings unknown: {not_audited}; "
                                f"{NAME_THE_SETTINGS}")
        # Where each version topic's push settings came from, and where the snapshot, the file and earlier snapshots
        # disagreed (the first of them was used). The two reads of the snapshot resolve the same.
        sources = {t: src for r in resolutions for t, src in r.sources.items()}
        disagreements = {t: text for r in resolutions for t, text in r.disagreements.items()}
        why_not = {t: text for r in resolutions for t, text in r.refused.items() if t in not_audited}
        for topic, text in sorted(disagreements.items()):
            context.log.warning(f"version topic {topic}: push settings disagree: {text}")
        tables.add_metadata(
            "raw_topic_quarantine",
            {
                "topics_not_audited": dg.MetadataValue.json(dict(sorted(not_audited.items()))),
                "why_not_audited": dg.MetadataValue.json(dict(sorted(why_not.items()))),
                "push_settings_from": dg.MetadataValue.json(dict(sorted(sources.items()))),
                "push_settings_disagreements": dg.MetadataValue.json(dict(sorted(disagreements.items()))),
                "rows_quarantined": counts["rows_quarantined"],
                "by_reason": dg.MetadataValue.json(counts["by_reason"]),
                # Positions lost to quarantine (SPEC 3a): each a gap of one position in its dump.
                "quarantined_positions": counts["quarantined_positions"],
            },
        )
        tables.add_metadata(
            "raw_topic_skipped",
            {"rows_skipped": counts["rows_skipped"], "skipped_by_reason": dg.MetadataValue.json(counts["skipped_by_reason"]),
             # Per replica, per control message kind (DOL_STAMP, END_OF_PUSH, ...) or rule (VALUE_CHUNK, CHUNK_CLEANUP).
             "skipped_by_kind": dg.MetadataValue.json(counts["skipped_by_kind"])},
        )
        yield from tables.publish()
        yield dg.AssetCheckResult(
            asset_key="raw_topic_snapshots",
            check_name=EVERY_TOPIC_DECODED,
            passed=not not_audited,
            severity=dg.AssetCheckSeverity.ERROR,
            metadata={"topics_not_audited": dg.MetadataValue.json(dict(sorted(not_audited.items())))},
            description=None if not not_audited else (
                f"{len(not_audited)} version topic(s) not audited, push settings unknown: "
                f"{', '.join(sorted(not_audited))}; {NAME_THE_SETTINGS}"),
        )


REGIONS_ANSWERING = "regions_answering"
CUT_COLUMNS = dg.TableSchema(columns=[
    dg.TableColumn("region", "string"), dg.TableColumn("topic", "string"), dg.TableColumn("partition", "int"),
    dg.TableColumn("start", "int", description="s: where the cut starts (the previous cut's e)"),
    dg.TableColumn("end", "int", description="e: the end offset asked before reading"),
    dg.TableColumn("records", "int", description="records the broker delivered in [s, e)"),
    dg.TableColumn("backlog", "int", description="offsets past e left for the next cut (a bounded cut)"),
    dg.TableColumn("skipped", "string", description="why the region was not read (then s = e)"),
])


def regions_answering(document: dict) -> dg.AssetCheckResult:
    """WARN once a region has been skipped by ``warn_after_skipped_cuts`` cuts in a row (``replica-lens watch``)."""
    skipped = document.get("skipped_regions") or {}
    limit = int((document.get("watch") or {}).get("warn_after_skipped_cuts", 1))
    long_silent = {region: entry for region, entry in skipped.items() if int(entry["skipped_cuts"]) >= limit}
    return dg.AssetCheckResult(
        asset_key="broker_cuts",
        check_name=REGIONS_ANSWERING,
        passed=not long_silent,
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"regions_skipped": len(skipped), "warn_after_skipped_cuts": limit,
                  "skipped_regions": dg.MetadataValue.json(skipped)},
        description=None if not long_silent else "; ".join(
            f"region {region} not read for {entry['skipped_cuts']} cut(s) in a row: {entry['reason']}"
            for region, entry in sorted(long_silent.items())),
    )


@dg.asset(
    name="broker_cuts",
    group_name=GROUP,
    kinds=KINDS,
    description="The cut of a snapshot read from Kafka brokers (SPEC 11), per region, topic and partition: the offsets "
    "read [start, end), the log start offset, records delivered, offsets that delivered none (gaps), the offsets left "
    "for the next cut, the topic's cleanup.policy, the isolation level and the time of the cut, and why a region was "
    "not read, from the snapshot's _cut.json; empty for files.",
    check_specs=[schema_check_spec("broker_cuts"),
                 dg.AssetCheckSpec(REGIONS_ANSWERING, asset="broker_cuts",
                                   description="Every region of a watched store answered its recent cuts: WARN after "
                                   "warn_after_skipped_cuts cuts in a row skipped one (its brokers did not answer).")],
    partitions_def=snapshot_partitions,
    tags={"stage": "raw"},
)
def broker_cuts(context: dg.AssetExecutionContext, spark: SparkResource, store: DeltaStore, landing: LandingZone):
    snapshot_id = context.partition_key
    cut_file = Location.of(landing.require_complete(snapshot_id)).child(CUT_FILE)
    text = cut_file.read_text() if cut_file.is_file() else None
    rows = cut_rows(text, snapshot_id) if text else []
    document = json.loads(text) if text else {}
    session = spark.spark_session
    tables = StepTables(session, store, snapshot_id, rows=len(rows))
    if rows:
        tables.stage(session.createDataFrame(rows, struct_for("broker_cuts")), "broker_cuts")
    else:
        tables.stage_empty("broker_cuts")
    records = [dg.TableRecord({"region": r["region"], "topic": r["topic"], "partition": r["partition"],
                               "start": r["start_offset"], "end": r["end_offset"], "records": r["records_delivered"],
                               "backlog": r["backlog_offsets"], "skipped": r["skipped_reason"] or ""})
               for r in rows[:500]]
    tables.add_metadata("broker_cuts", {
        "partitions": len(rows),
        "positions_not_delivered": sum(r["offsets_not_delivered"] for r in rows),
        "records_delivered": sum(r["records_delivered"] for r in rows),
        "backlog_offsets": sum(r["backlog_offsets"] for r in rows),
        "regions_skipped": len(document.get("skipped_regions") or {}),
        "skipped_regions": dg.MetadataValue.json(document.get("skipped_regions") or {}),
        "store": (document.get("watch") or {}).get("store") or "",
        "continues": document.get("continues") or "",
        "cut": dg.MetadataValue.table(records=records, schema=CUT_COLUMNS),
    })
    yield from tables.publish()
    yield regions_answering(document)
