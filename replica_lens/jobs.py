"""Jobs, sensors and schedules of the code location."""

import dagster as dg

from assets.partitions import SNAPSHOTS, snapshot_partitions
from resources.landing import LandingZone

AUDIT_JOB = "audit_snapshot"

# Every per-snapshot asset, run in one process so that Spark starts once per run.
audit_snapshot = dg.define_asset_job(
    AUDIT_JOB,
    selection=dg.AssetSelection.groups("ingest", "watermarks", "divergence", "operations"),
    partitions_def=snapshot_partitions,
    executor_def=dg.in_process_executor,
    description="Audit one raw topic snapshot: ingest, segments, watermarks, divergence and operational tables.",
)


@dg.sensor(
    job_name=AUDIT_JOB,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Registers every complete snapshot folder (with _SUCCESS) in the landing zone and audits it.",
)
def landing_sensor(context: dg.SensorEvaluationContext, landing: LandingZone) -> dg.SensorResult:
    scan = landing.scan()
    known = set(context.instance.get_dynamic_partitions(SNAPSHOTS))
    new = [snapshot_id for snapshot_id in scan.complete if snapshot_id not in known]
    for name in scan.refused:
        context.log.warning(f"ignoring landing folder {name!r}: not a safe snapshot id")
    if not new:
        waiting = f"; {len(scan.incomplete)} still being written" if scan.incomplete else ""
        return dg.SensorResult(skip_reason=f"no new complete snapshot in {landing.root}{waiting}")
    return dg.SensorResult(
        run_requests=[dg.RunRequest(partition_key=snapshot_id, run_key=snapshot_id) for snapshot_id in new],
        dynamic_partitions_requests=[snapshot_partitions.build_add_request(new)],
    )


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
