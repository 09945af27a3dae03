"""Audit snapshots in-process through Dagster, the way ``replica-lens audit`` does."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any, Optional

import dagster as dg

from assets.partitions import SNAPSHOTS
from replica_lens.jobs import AUDIT_JOB
from resources.landing import LandingZone
from resources.tuning import DEFAULT_SHUFFLE_PARTITIONS


@dataclass
class SnapshotAudit:
    """What one snapshot's run produced, read from its materializations and checks."""

    snapshot_id: str
    success: bool
    run_id: str
    metadata: dict[str, dict[str, Any]] = field(default_factory=dict)  # asset -> metadata values
    failed_checks: list[str] = field(default_factory=list)
    error: Optional[str] = None

    def value(self, asset: str, key: str, default: Any = None) -> Any:
        return self.metadata.get(asset, {}).get(key, default)

    @property
    def proven_divergent(self) -> int:
        return int(self.value("divergence_reports", "keys_divergent", 0)) + int(
            self.value("divergence_reports", "keys_missing", 0)
        )


def _plain(value: Any) -> Any:
    return getattr(value, "value", value)


def run_audit(
    snapshot_id: str,
    landing: str,
    warehouse: str,
    instance: Optional[dg.DagsterInstance] = None,
    **settings: Any,
) -> SnapshotAudit:
    """Materialize every per-snapshot asset of ``snapshot_id`` in this process; never raises on run failure."""
    from replica_lens.definitions import build_definitions

    defs = build_definitions(landing_root=landing, warehouse_root=warehouse, **settings)
    job = defs.resolve_job_def(AUDIT_JOB)
    instance = instance or dg.DagsterInstance.ephemeral()
    if not instance.has_dynamic_partition(SNAPSHOTS, snapshot_id):
        instance.add_dynamic_partitions(SNAPSHOTS, [snapshot_id])
    result = job.execute_in_process(partition_key=snapshot_id, instance=instance, raise_on_error=False)
    audit = SnapshotAudit(snapshot_id=snapshot_id, success=result.success, run_id=result.run_id)
    for event in result.get_asset_materialization_events():
        materialization = event.event_specific_data.materialization
        audit.metadata[materialization.asset_key.to_user_string()] = {
            k: _plain(v) for k, v in materialization.metadata.items()
        }
    for evaluation in result.get_asset_check_evaluations():
        if not evaluation.passed:
            audit.failed_checks.append(f"{evaluation.asset_key.to_user_string()}:{evaluation.check_name}")
    if not result.success:
        failures = [e for e in result.all_events if e.is_step_failure]
        if failures:
            error = failures[0].step_failure_data.error
            audit.error = f"{failures[0].step_key}: {error.message.strip() if error else 'failed'}"
        else:
            audit.error = "run failed"
    return audit


def summary_lines(audit: SnapshotAudit) -> list[str]:
    status = "succeeded" if audit.success else "FAILED"
    lines = [f"snapshot {audit.snapshot_id}: run {audit.run_id[:8]} {status}"]
    if audit.error:
        lines.append(f"  error: {audit.error}")
    raw = audit.metadata.get("raw_topic_snapshots")
    if raw:
        lines.append(
            f"  rows read {raw.get('rows_read')} = accepted {raw.get('rows_accepted')}"
            f" + quarantined {raw.get('rows_quarantined')}"
            f" (exact duplicates collapsed: {raw.get('duplicates_collapsed')})"
        )
        for replica, counts in sorted((raw.get("by_replica") or {}).items()):
            lines.append(
                f"    {replica:<12} read {counts.get('read')}  accepted {counts.get('accepted')}"
                f"  quarantined {counts.get('quarantined')}"
            )
    div = audit.metadata.get("divergence_reports")
    if div:
        lines.append(
            "  keys compared {c}: consistent {ok}, DIVERGENT {d}, MISSING {m}, IN_FLIGHT {f}".format(
                c=div.get("keys_compared"),
                ok=div.get("keys_consistent"),
                d=div.get("keys_divergent"),
                m=div.get("keys_missing"),
                f=div.get("keys_in_flight"),
            )
        )
    anomalies = audit.metadata.get("stream_anomalies")
    if anomalies:
        lines.append(f"  stream anomalies: {anomalies.get('dagster/row_count')} {anomalies.get('by_anomaly') or ''}")
    lag = audit.metadata.get("replication_lag")
    if lag:
        lines.append(f"  replication lag rows: {lag.get('dagster/row_count')}")
    if audit.failed_checks:
        lines.append(f"  failed checks: {', '.join(audit.failed_checks)}")
    written = [a for a in audit.metadata if "dagster/uri" in audit.metadata[a]]
    if written:
        lines.append(f"  Delta tables written: {len(written)} ({', '.join(sorted(written))})")
    return lines


def audit_snapshots(
    landing: str,
    warehouse: str,
    snapshot_id: Optional[str] = None,
    fail_on_divergence: bool = False,
    spark_master: str = "local[*]",
    delta_jars_dir: Optional[str] = None,
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS,
) -> int:
    """Audit the named snapshot, or every complete one; print a summary; return the exit code."""
    zone = LandingZone(root=landing)
    if snapshot_id is not None:
        zone.require_complete(snapshot_id)
        snapshot_ids = [snapshot_id]
    else:
        scan = zone.scan()
        for name in scan.refused:
            print(f"ignoring landing folder {name!r}: not a safe snapshot id", file=sys.stderr)
        for name in scan.incomplete:
            print(f"skipping snapshot {name!r}: no _SUCCESS yet", file=sys.stderr)
        snapshot_ids = scan.complete
        if not snapshot_ids:
            print(f"no complete snapshot in {landing}", file=sys.stderr)
            return 0
    instance = dg.DagsterInstance.get() if _has_dagster_home() else dg.DagsterInstance.ephemeral()
    exit_code = 0
    for sid in snapshot_ids:
        audit = run_audit(
            sid,
            landing,
            warehouse,
            instance=instance,
            spark_master=spark_master,
            delta_jars_dir=delta_jars_dir,
            shuffle_partitions=shuffle_partitions,
        )
        print("\n".join(summary_lines(audit)), flush=True)
        if not audit.success:
            exit_code = 1
        elif fail_on_divergence and audit.proven_divergent and exit_code == 0:
            exit_code = 3
    return exit_code


def _has_dagster_home() -> bool:
    import os

    return bool(os.environ.get("DAGSTER_HOME"))
