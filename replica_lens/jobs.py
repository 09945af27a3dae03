"""Jobs, sensors and schedules of the code location."""

import os
from typing import Optional

import dagster as dg
from pydantic import Field

from assets.partitions import SNAPSHOTS, snapshot_partitions
from resources.delta_store import DeltaStore
from resources.landing import LandingZone
from resources.reports import ReportSettings
from resources.spark import SparkResource
from replica_lens.executor import threaded_in_process_executor
from resources.errors import InvalidSetting, UsageError
from resources.tuning import DEFAULT_RETENTION_HOURS

AUDIT_JOB = "audit_snapshot"
LANDING_SENSOR_INTERVAL_ENV = "REPLICA_LENS_LANDING_SENSOR_INTERVAL_S"
DEFAULT_LANDING_SENSOR_INTERVAL_S = 30

# Every per-snapshot asset, run in one process so that Spark starts once per run, with
# independent steps side by side on threads (replica_lens/executor.py).
audit_snapshot = dg.define_asset_job(
    AUDIT_JOB,
    selection=dg.AssetSelection.groups("ingest", "watermarks", "divergence", "operations"),
    partitions_def=snapshot_partitions,
    executor_def=threaded_in_process_executor,
    description="Audit one raw topic snapshot: ingest, segments, watermarks, divergence and operational tables.",
)


def interval_setting(text: Optional[str], name: str, default: int) -> int:
    """A sensor's interval from the environment variable ``name`` (``text``): a whole number of seconds of at least
    1; unset or blank: ``default``."""
    if text is None or not text.strip():
        return default
    try:
        seconds = int(text.strip())
    except ValueError:
        seconds = 0
    if seconds < 1:
        raise InvalidSetting(f"{name} must be a whole number of seconds, at least 1; got {text!r}")
    return seconds


def landing_sensor_interval(text: Optional[str]) -> int:
    """Seconds between two looks of the landing sensor: ``text`` (the environment's
    ``REPLICA_LENS_LANDING_SENSOR_INTERVAL_S``), a whole number of at least 1, else 30."""
    return interval_setting(text, LANDING_SENSOR_INTERVAL_ENV, DEFAULT_LANDING_SENSOR_INTERVAL_S)


def build_landing_sensor(minimum_interval_seconds: int = DEFAULT_LANDING_SENSOR_INTERVAL_S) -> dg.SensorDefinition:
    """The landing sensor, looking at the landing zone at most every ``minimum_interval_seconds``."""

    @dg.sensor(
        name="landing_sensor",
        job_name=AUDIT_JOB,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Registers every complete snapshot folder (with _SUCCESS) in the landing zone and audits it.",
    )
    def landing_sensor(context: dg.SensorEvaluationContext, landing: LandingZone) -> dg.SensorResult:
        scan = landing.scan()
        known = set(context.instance.get_dynamic_partitions(SNAPSHOTS))
        new = [snapshot_id for snapshot_id in scan.complete
               if snapshot_id not in known and landing.watched_store(snapshot_id) is None]
        for name in scan.refused:
            context.log.warning(f"ignoring landing folder {name!r}: not a safe snapshot id")
        if not new:
            waiting = f"; {len(scan.incomplete)} still being written" if scan.incomplete else ""
            return dg.SensorResult(skip_reason=f"no new complete snapshot in {landing.root}{waiting}")
        return dg.SensorResult(
            run_requests=[dg.RunRequest(partition_key=snapshot_id, run_key=snapshot_id) for snapshot_id in new],
            dynamic_partitions_requests=[snapshot_partitions.build_add_request(new)],
        )

    return landing_sensor


TREND_JOB = "refresh_trend"

refresh_trend = dg.define_asset_job(
    TREND_JOB,
    selection=dg.AssetSelection.keys("audit_trend"),
    executor_def=dg.in_process_executor,
    description="Recompute the cross-snapshot trend table from every audited snapshot.",
)


@dg.schedule(
    job_name=AUDIT_JOB,
    cron_schedule="0 * * * *",
    default_status=dg.DefaultScheduleStatus.RUNNING,
    description="Every hour, re-audits the newest registered snapshot (the trend follows its success).",
)
def reaudit_newest_snapshot(context: dg.ScheduleEvaluationContext):
    snapshots = context.instance.get_dynamic_partitions(SNAPSHOTS)
    if not snapshots:
        return dg.SkipReason("no snapshot registered yet: the landing sensor adds them")
    # Dynamic partitions keep their insertion order: the last one was registered last.
    return dg.RunRequest(partition_key=snapshots[-1], tags={"replica_lens/trigger": "reaudit_schedule"})


@dg.run_status_sensor(
    run_status=dg.DagsterRunStatus.SUCCESS,
    monitored_jobs=[audit_snapshot],
    request_job=refresh_trend,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Refreshes the trend table after every successful snapshot audit.",
)
def trend_after_audit(context: dg.RunStatusSensorContext):
    return dg.RunRequest(run_key=f"trend-after-{context.dagster_run.run_id}")


TREND_CATCH_UP_INTERVAL_S = 60
_UNFINISHED = (dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
               dg.DagsterRunStatus.STARTED)


def newest_commit_ms(warehouse: str, table: str) -> Optional[int]:
    """When the newest live file of ``table`` was written (ms since the epoch, from its Delta log); None: no table."""
    import pyarrow as pa
    from deltalake import DeltaTable

    from resources.delta_reader import TableReader, table_uri
    from resources.filesystem import delta_storage_options

    if not TableReader(warehouse).exists(table):
        return None
    files = pa.table(DeltaTable(table_uri(warehouse, table), storage_options=delta_storage_options())
                     .get_add_actions(flatten=True)).to_pydict()
    stamps = [int(m.timestamp() * 1000) if hasattr(m, "timestamp") else int(m) for m in files.get("modification_time", [])
              if m is not None]
    return max(stamps, default=None)


@dg.sensor(
    name="trend_catch_up",
    job_name=TREND_JOB,
    minimum_interval_seconds=TREND_CATCH_UP_INTERVAL_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Refreshes the trend table when the warehouse holds an audit newer than it: audits run from the shell "
    "(replica-lens audit, with or without DAGSTER_HOME), and those done while no daemon ran, which "
    "trend_after_audit never sees.",
)
def trend_catch_up(context: dg.SensorEvaluationContext, store: DeltaStore) -> dg.SensorResult:
    warehouse = store.warehouse_root
    audited = newest_commit_ms(warehouse, "divergence_summary")
    if audited is None:
        return dg.SensorResult(skip_reason=f"no audit in the warehouse {warehouse} yet")
    trend = newest_commit_ms(warehouse, "audit_trend")
    if trend is not None and trend >= audited:
        return dg.SensorResult(skip_reason="the trend is newer than every audit in the warehouse")
    running = context.instance.get_runs(dg.RunsFilter(job_name=TREND_JOB, statuses=list(_UNFINISHED)), limit=1)
    if running:
        return dg.SensorResult(skip_reason=f"a {TREND_JOB} run is under way ({running[0].run_id})")
    # One run per audit commit seen: a later tick that sees the same newest audit requests nothing new.
    return dg.SensorResult(run_requests=[dg.RunRequest(run_key=f"trend-for-audit-{audited}")])


VACUUM_JOB = "vacuum_warehouse"


class VacuumConfig(dg.Config):
    retention_hours: int = Field(
        default=DEFAULT_RETENTION_HOURS,
        description="Files that no Delta version needs are removed once older than this (also the time-travel "
        "window); keep it well above the longest audit run, whose staged files only their age protects.",
    )
    dry_run: bool = Field(default=False, description="Report what would be removed (and compacted); change nothing.")
    compact: bool = Field(default=False, description="First compact the snapshots that hold several small files.")


_VACUUM_COLUMNS = dg.TableSchema(
    columns=[
        dg.TableColumn("table", "string"),
        dg.TableColumn("files_removed", "int"),
        dg.TableColumn("bytes_removed", "int"),
        dg.TableColumn("folders_removed", "int"),
        dg.TableColumn("snapshots_compacted", "int"),
        dg.TableColumn("files_compacted", "int"),
        dg.TableColumn("files_written", "int"),
        dg.TableColumn("note", "string"),
    ]
)


@dg.op(
    description="VACUUM every Delta table of the warehouse: remove the files no version needs, past the retention.",
    out=dg.Out(list, description="One row per table: files and bytes removed, compaction."),
)
def vacuum_tables(context: dg.OpExecutionContext, config: VacuumConfig, store: DeltaStore) -> dg.Output:
    results = store.vacuum(retention_hours=config.retention_hours, dry_run=config.dry_run, compact=config.compact)
    rows = [result.as_row() for result in results]
    verb = "would remove" if config.dry_run else "removed"
    for row in rows:
        context.log.info(f"{row['table']}: {verb} {row['files_removed']} files, {row['bytes_removed']} bytes")
    return dg.Output(
        rows,
        metadata={
            "dry_run": config.dry_run,
            "retention_hours": config.retention_hours,
            "tables": len(rows),
            "files_removed": sum(row["files_removed"] for row in rows),
            "bytes_removed": sum(row["bytes_removed"] for row in rows),
            "by_table": dg.MetadataValue.table(
                records=[dg.TableRecord(row) for row in rows], schema=_VACUUM_COLUMNS
            ),
        },
    )


@dg.job(
    name=VACUUM_JOB,
    executor_def=dg.in_process_executor,
    description="Housekeeping: VACUUM every Delta table of the warehouse (retention, dry run and compaction in run config).",
)
def vacuum_warehouse():
    vacuum_tables()


# Off until an operator turns it on: a vacuum bounds time travel, a choice to make knowingly.
vacuum_warehouse_daily = dg.ScheduleDefinition(
    name="vacuum_warehouse_daily",
    job=vacuum_warehouse,
    cron_schedule="30 3 * * *",
    execution_timezone="UTC",
    run_config={"ops": {"vacuum_tables": {"config": {"retention_hours": DEFAULT_RETENTION_HOURS}}}},
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Every day at 03:30 UTC, vacuums the warehouse with a 7-day retention (off by default: turn it on to opt in).",
)


EXPLAIN_JOB = "explain_key"


class ExplainKeyConfig(dg.Config):
    """Every field may be left null: the op then explains the most important key that is not CONSISTENT (the first
    key of the report page) of the newest audited snapshot, or of the snapshot, topic and partition given."""

    snapshot_id: Optional[str] = Field(
        default=None,
        description="An audited snapshot (a partition of `snapshots`). Null: the newest audited snapshot.",
    )
    topic: Optional[str] = Field(
        default=None, description="Version topic, e.g. store_v1. Null: the topic of the key explained by default."
    )
    partition: Optional[int] = Field(
        default=None, description="Topic partition. Null: the partition of the key explained by default."
    )
    key: Optional[str] = Field(
        default=None,
        description="The key as the tables hold it (raw Venice records: base64 of the key bytes). Give this or "
        "key_text, not both; neither: the snapshot's most important key that is not CONSISTENT.",
    )
    key_text: Optional[str] = Field(
        default=None,
        description="Raw Venice records: the key bytes as UTF-8 text, looked up as their base64. Give this or key, "
        "not both.",
    )


# The Launchpad opens with this config: every field an operator may fill, each null (what null does: the
# descriptions above). Launched as it is, the job explains the newest audited snapshot's most important key.
EXPLAIN_DEFAULT_CONFIG = {"ops": {"explain_key_op": {"config": {
    "snapshot_id": None, "topic": None, "partition": None, "key": None, "key_text": None,
}}}}


def resolve_explained_key(
    config: ExplainKeyConfig, warehouse: str, registered: list[str]
) -> tuple[str, str, int, str]:
    """(snapshot_id, topic, partition, key) to explain from the config, the nulls filled as its fields say.

    ``registered``: the instance's snapshot partitions in the order they were registered (the newest last): the
    newest of them with an audit in the warehouse is "the newest audited snapshot"; without any, the one whose audit
    was committed last. A config that cannot be carried out raises ``UsageError`` with one line that says why.
    """
    from explain.reading import audited_snapshots, first_reported_key, key_of

    if config.key is not None and config.key_text is not None:
        raise UsageError("give either key or key_text, not both (key_text is the key's text, looked up as its base64)")
    snapshot_id = config.snapshot_id
    if snapshot_id is None:
        audited = audited_snapshots(warehouse)
        ordered = [s for s in registered if s in set(audited)] or audited
        if not ordered:
            raise UsageError(f"no audited snapshot in the warehouse {warehouse}: audit one first (the landing sensor, "
                             "or replica-lens audit), or give snapshot_id")
        snapshot_id = ordered[-1]
    if config.key is not None or config.key_text is not None:
        if config.topic is None or config.partition is None:
            raise UsageError("give the topic and partition of the key (or leave key and key_text null to explain the "
                             "snapshot's most important key)")
        return snapshot_id, config.topic, config.partition, key_of(config.key, config.key_text)
    found = first_reported_key(warehouse, snapshot_id, config.topic, config.partition)
    if found is None:
        where = "" if config.topic is None else f" in topic {config.topic}" + (
            "" if config.partition is None else f" partition {config.partition}")
        raise UsageError(f"every key of snapshot {snapshot_id}{where} is CONSISTENT: give topic, partition and key "
                         "to explain one")
    return (snapshot_id, *found)


@dg.op(
    description="Explain one key of an audited snapshot, as `replica-lens explain` does: every replica's versions and "
    "every pair's verdict, with its timeline picture, recorded as this op's output metadata. Left null, the config "
    "explains the newest audited snapshot's most important key that is not CONSISTENT.",
    out=dg.Out(dict, description="The explanation document (docs/explain.md)."),
)
def explain_key_op(
    context: dg.OpExecutionContext, config: ExplainKeyConfig, store: DeltaStore, reports: ReportSettings
) -> dg.Output:
    from explain.document import redact, worst_verdict
    from explain.reading import explain_key
    from explain.report import key_markdown

    try:
        snapshot_id, topic, partition, key = resolve_explained_key(
            config, store.warehouse_root, list(context.instance.get_dynamic_partitions(SNAPSHOTS))
        )
        doc = explain_key(store.warehouse_root, snapshot_id, topic, partition, key)
    except UsageError as error:
        # One line, no traceback of ours: what to change in the config (Dagster shows the description as the error).
        raise dg.Failure(description=" ".join(str(error).split()), allow_retries=False) from None
    if reports.redacting():
        redact(doc)
    verdicts = {f"{p['replica_a']}~{p['replica_b']}": p["verdict"] for p in doc["pairs"]}
    context.log.info(f"{key} in {topic}/{partition} of {snapshot_id}: {worst_verdict(doc)} ({verdicts})")
    return dg.Output(
        doc,
        metadata={
            "snapshot_id": snapshot_id,
            "topic": topic,
            "partition": dg.MetadataValue.int(partition),
            "key": dg.MetadataValue.text(key),
            "verdict": worst_verdict(doc),
            "verdicts": dg.MetadataValue.json(verdicts),
            "odd_one_out": dg.MetadataValue.json(doc.get("odd_one_out") or []),
            "explanation": dg.MetadataValue.md(key_markdown(doc)),
            "document": dg.MetadataValue.json(doc),
        },
    )


@dg.job(
    name=EXPLAIN_JOB,
    executor_def=dg.in_process_executor,
    config=EXPLAIN_DEFAULT_CONFIG,
    description="Explain one key of an audited snapshot (snapshot, topic, partition, key or key_text in the "
    "Launchpad's config; left null, the newest audited snapshot's most important key); reads the published tables, "
    "never audits again, starts no Spark.",
)
def explain_key_job():
    explain_key_op()


WATCH_JOB = "watch_brokers"
_WATCH_COLUMNS = dg.TableSchema(columns=[
    dg.TableColumn("store", "string"), dg.TableColumn("region", "string"), dg.TableColumn("snapshot_id", "string"),
    dg.TableColumn("records", "int"), dg.TableColumn("offsets", "int"), dg.TableColumn("partitions", "int"),
    dg.TableColumn("backlog", "int", description="offsets left for the next cut"),
    dg.TableColumn("skipped", "string", description="why the region was not read"),
])


@dg.op(
    description="One tick of every store of the store file ($REPLICA_LENS_STORES): cut each region's version topics "
    "at its brokers, land the new offsets as a broker snapshot and audit it incrementally (replica_lens/watch.py).",
    out=dg.Out(list, description="Per store: what the tick did."),
)
def watch_tick(context: dg.OpExecutionContext, spark: SparkResource, store: DeltaStore, landing: LandingZone):
    from replica_lens.audit import run_audit
    from replica_lens.watch import STORES_ENV, load_stores, tick_lines, watch_once

    path = os.environ.get(STORES_ENV)
    if not path:
        raise dg.Failure(f"no store file: set {STORES_ENV} to the TOML file of the stores to watch (docs/operations.md)")
    config = load_stores(path)

    def audit(snapshot_id: str, scope: str):
        return run_audit(
            snapshot_id, landing.root, store.warehouse_root, instance=context.instance, log_level="ERROR", scope=scope,
            spark_master=spark.master, delta_jars_dir=spark.delta_jars_dir, delta_engine=store.engine,
            shuffle_partitions=spark.shuffle_partitions, cluster_regions=landing.cluster_regions,
            venice_clock_uncertainty_ms=landing.venice_clock_uncertainty_ms,
            venice_push_settings=landing.venice_push_settings,
        )

    def register(snapshot_id: str) -> None:
        if not context.instance.has_dynamic_partition(SNAPSHOTS, snapshot_id):
            context.instance.add_dynamic_partitions(SNAPSHOTS, [snapshot_id])

    results = watch_once(spark.spark_session, config, landing.root, audit, register)
    rows = []
    for result in results:
        for line in tick_lines(result):
            context.log.info(line)
        for region, r in sorted(result.regions.items()):
            rows.append({"store": result.store, "region": region, "snapshot_id": result.snapshot_id or "",
                         "records": r["records"], "offsets": r["offsets"], "partitions": r["partitions"],
                         "backlog": r["backlog"], "skipped": r["skipped"] or ""})
    freshness = [r.seconds_cut_to_audited for r in results if r.seconds_cut_to_audited is not None]
    metadata = {
        "stores": len(results),
        "snapshots_audited": sum(1 for r in results if r.action in ("audited", "resumed")),
        "records_read": sum(r["records"] for r in rows),
        "backlog_offsets": sum(r["backlog"] for r in rows),
        "regions_skipped": sum(1 for r in rows if r["skipped"]),
        # Freshness: from the cut (the end offsets asked) to the end of its audit; what was written before the cut
        # is judged that much later at most.
        **({"seconds_cut_to_audited": max(freshness)} if freshness else {}),
        "by_region": dg.MetadataValue.table(records=[dg.TableRecord(r) for r in rows], schema=_WATCH_COLUMNS),
    }
    for result in results:
        if result.seconds_cut_to_audited is not None:
            # On the asset, per snapshot: the Plots tab of divergence_reports draws the freshness of every audit.
            yield dg.AssetObservation(
                asset_key="divergence_reports", partition=result.snapshot_id,
                metadata={"seconds_cut_to_audited": result.seconds_cut_to_audited, "store": result.store},
            )
    failed = [r for r in results if r.failed]
    if failed:
        raise dg.Failure(
            "; ".join(f"store {r.store}: {r.error}" for r in failed) + " (retried on the next tick)",
            metadata=metadata,
        )
    yield dg.Output([r.__dict__ for r in results], metadata=metadata)


@dg.job(
    name=WATCH_JOB,
    executor_def=dg.in_process_executor,
    description="Cut, land and audit every watched store once (the broker_watch sensor starts it every interval).",
)
def watch_brokers():
    watch_tick()


def build_broker_watch_sensor(minimum_interval_seconds: int) -> dg.SensorDefinition:
    """The broker watch: every interval, a ``watch_brokers`` run, unless one is under way; its cursor shows each
    store's last published snapshot and ends (``<landing>/_watch/<store>.json`` is where they live)."""

    @dg.sensor(
        name="broker_watch",
        job=watch_brokers,
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Every interval, cuts the watched stores' version topics at their brokers, lands and audits the new "
        "offsets (job watch_brokers; the stores: $REPLICA_LENS_STORES).",
    )
    def broker_watch(context: dg.SensorEvaluationContext, landing: LandingZone) -> dg.SensorResult:
        import json

        from replica_lens.watch import STORES_ENV, load_stores, read_cursor

        path = os.environ.get(STORES_ENV)
        if not path:
            return dg.SensorResult(skip_reason=f"no store to watch: {STORES_ENV} names no store file")
        config = load_stores(path)
        cursors = {s.name: read_cursor(landing.root, s.name) for s in config.stores}
        cursor = json.dumps({name: {"published": c.published, "pending": c.pending,
                                    "ends": {f"{r}/{t}/{p}": v["end"] for (r, t, p), v in sorted(c.partitions.items())}}
                             for name, c in cursors.items()}, sort_keys=True)
        running = context.instance.get_runs(dg.RunsFilter(job_name=WATCH_JOB, statuses=list(_UNFINISHED)), limit=1)
        if running:
            return dg.SensorResult(skip_reason=f"a {WATCH_JOB} run is under way ({running[0].run_id})", cursor=cursor)
        return dg.SensorResult(run_requests=[dg.RunRequest()], cursor=cursor)

    return broker_watch


def watch_interval(text: Optional[str]) -> int:
    """Seconds between two ticks of the broker watch (``REPLICA_LENS_WATCH_INTERVAL_S``), at least 1, else 60."""
    from replica_lens.watch import DEFAULT_INTERVAL_S, WATCH_INTERVAL_ENV

    return interval_setting(text, WATCH_INTERVAL_ENV, DEFAULT_INTERVAL_S)
