"""Audit snapshots in-process through Dagster, the way ``replica-lens audit`` does."""
from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional, TextIO

import dagster as dg
from dagster._core.utils import make_new_run_id

from assets.partitions import SNAPSHOTS
from pipelines.venice.push_settings import parse_push_settings
from replica_lens.executor import execute_here
from replica_lens.jobs import AUDIT_JOB
from replica_lens.console import StepPrinter, plain, status_line
from replica_lens.scopes import ALL, audit_selection
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
    # asset:check -> the description of a check that did not pass (what the UI shows beside it)
    check_descriptions: dict[str, str] = field(default_factory=dict)
    error: Optional[str] = None
    scope: str = ALL  # which assets the run materialized (replica_lens/scopes.py)

    def value(self, asset: str, key: str, default: Any = None) -> Any:
        return self.metadata.get(asset, {}).get(key, default)

    @property
    def proven_divergent(self) -> int:
        return int(self.value("divergence_reports", "keys_divergent", 0)) + int(
            self.value("divergence_reports", "keys_missing", 0)
        )


@contextmanager
def audit_instance(
    instance: Optional[dg.DagsterInstance] = None, *, from_dagster_home: bool = False
) -> Iterator[dg.DagsterInstance]:
    """The Dagster instance audits record their runs in, disposed of on leaving, on this thread.

    ``instance`` when given (its owner disposes of it); else, with ``from_dagster_home`` (the
    CLI), the instance of ``DAGSTER_HOME`` when that is set, so that the runs show in the UI;
    else an ephemeral (in-memory) one (``run_audit`` and the benchmark's in-process audits,
    which must not fill an operator's instance).

    Why dispose of it here: an instance holds SQLite connections for its whole life. Left to
    the garbage collector, they are closed on whichever thread happens to collect them, under
    the threaded executor often a step thread of a later run. SQLite refuses a connection used
    outside the thread that opened it, and SQLAlchemy then prints a traceback ("SQLite objects
    created in a thread can only be used in that same thread") in the middle of the output of an
    audit that succeeded.
    """
    if instance is not None:
        yield instance
        return
    persistent = from_dagster_home and _has_dagster_home()
    with (dg.DagsterInstance.get() if persistent else dg.DagsterInstance.ephemeral()) as made:
        yield made


# Dagster's console log level per CLI verbosity: its event log (a line per step event) only with --verbose.
DAGSTER_LOG_LEVELS = {"quiet": "ERROR", "normal": "ERROR", "verbose": "DEBUG"}
SPARK_LOG_LEVELS = {"quiet": "ERROR", "normal": "ERROR", "verbose": "WARN"}


def run_audit(
    snapshot_id: str,
    landing: str,
    warehouse: str,
    instance: Optional[dg.DagsterInstance] = None,
    log_level: str = "DEBUG",
    watcher: Optional["StepPrinter"] = None,
    state_retention: Optional[int] = None,
    concurrent_steps: Optional[int] = None,
    scope: str = ALL,
    **settings: Any,
) -> SnapshotAudit:
    """Materialize every per-snapshot asset of ``snapshot_id`` in this process; never raises on run failure.

    ``log_level`` is the level of Dagster's console log (its event log is DEBUG). A
    ``watcher`` receives the run's events while it runs (``StepPrinter``).
    ``state_retention`` is the divergence step's run config (None: keep every state).
    ``concurrent_steps`` is the executor's ``max_concurrent`` (None: its default,
    ``replica_lens/executor.py``); the steps run in this process either way.
    ``scope``: which assets (``replica_lens/scopes.py``): ``all``, or ``divergence`` (no lag or
    exporter tables).
    """
    from replica_lens.definitions import build_definitions

    defs = build_definitions(landing_root=landing, warehouse_root=warehouse, **settings)
    job = defs.resolve_job_def(AUDIT_JOB)
    selection = audit_selection(job, scope)
    with audit_instance(instance) as instance:
        if not instance.has_dynamic_partition(SNAPSHOTS, snapshot_id):
            instance.add_dynamic_partitions(SNAPSHOTS, [snapshot_id])
        run_id = make_new_run_id()
        if watcher is not None:
            instance.watch_event_logs(run_id, None, watcher)
        try:
            result = execute_here(
                job,
                partition_key=snapshot_id,
                instance=instance,
                run_config={
                    "loggers": {"console": {"config": {"log_level": log_level}}},
                    **({"ops": {"divergence_reports": {"config": {"state_retention": state_retention}}}}
                       if state_retention is not None else {}),
                    **({"execution": {"config": {"max_concurrent": concurrent_steps}}} if concurrent_steps else {}),
                },
                run_id=run_id,
                asset_selection=selection,
            )
        finally:
            if watcher is not None:
                instance.end_watch_event_logs(run_id, watcher)
                watcher.finish(instance, run_id)
    # The result holds the run's events in memory: reading them needs no instance.
    audit = SnapshotAudit(snapshot_id=snapshot_id, success=result.success, run_id=result.run_id, scope=scope)
    for event in result.get_asset_materialization_events():
        materialization = event.event_specific_data.materialization
        audit.metadata[materialization.asset_key.to_user_string()] = {
            k: plain(v) for k, v in materialization.metadata.items()
        }
    for evaluation in result.get_asset_check_evaluations():
        if not evaluation.passed:
            name = f"{evaluation.asset_key.to_user_string()}:{evaluation.check_name}"
            audit.failed_checks.append(name)
            if evaluation.description:
                audit.check_descriptions[name] = evaluation.description
    if not result.success:
        failures = [e for e in result.all_events if e.is_step_failure]
        if failures:
            error = failures[0].step_failure_data.error
            audit.error = f"{failures[0].step_key}: {error.message.strip() if error else 'failed'}"
        else:
            # No step failed: the run itself did (interrupted by Ctrl-C or a terminate, say); Dagster says how.
            run_failure = next((e for e in result.all_events if e.event_type_value == "RUN_FAILURE"), None)
            audit.error = f"run failed: {run_failure.message}" if run_failure and run_failure.message else "run failed"
    return audit


def summary_lines(audit: SnapshotAudit) -> list[str]:
    status = "succeeded" if audit.success else "FAILED"
    scope = "" if audit.scope == ALL else f" (scope {audit.scope}: no lag or exporter tables)"
    lines = [f"snapshot {audit.snapshot_id}: run {audit.run_id[:8]} {status}{scope}"]
    if audit.error:
        lines.append(f"  error: {audit.error}")
    raw = audit.metadata.get("raw_topic_snapshots")
    if raw:
        lines.append(
            f"  rows read {raw.get('rows_read')} = accepted {raw.get('rows_accepted')}"
            f" + quarantined {raw.get('rows_quarantined')}"
            + (f" + skipped {raw.get('rows_skipped')} (by rule: {raw.get('skipped_by_reason')})"
               if raw.get("rows_skipped") else "")
            + f" (exact duplicates collapsed: {raw.get('rows_duplicates_collapsed')})"
        )
        for replica, counts in sorted((raw.get("by_replica") or {}).items()):
            kinds = (raw.get("skipped_by_kind") or {}).get(replica)
            lines.append(
                f"    {replica:<12} read {counts.get('read')}  accepted {counts.get('accepted')}"
                f"  quarantined {counts.get('quarantined')}"
                + (f"  skipped {counts.get('skipped')} ({', '.join(f'{k} {n}' for k, n in kinds.items())})" if kinds else "")
            )
    not_audited = audit.value("raw_topic_quarantine", "topics_not_audited", None) or {}
    if not_audited:
        lines.append(
            "  version topics not audited, their push settings unknown: "
            + ", ".join(f"{t} ({n} records kept in raw_topic_quarantine)" for t, n in sorted(not_audited.items()))
            + ": name them with --venice-push-settings FILE (or audit the snapshot holding their START_OF_PUSH first) "
            "and audit the snapshot again"
        )
    for topic, text in sorted((audit.value("raw_topic_quarantine", "why_not_audited", None) or {}).items()):
        lines.append(f"    {topic}: {text}")
    for topic, text in sorted((audit.value("raw_topic_quarantine", "push_settings_disagreements", None) or {}).items()):
        lines.append(f"  version topic {topic}: push settings disagree: {text}")
    lost = int(audit.value("raw_topic_quarantine", "quarantined_positions", 0) or 0)
    if lost:
        lines.append(f"  positions lost to quarantine: {lost}, each a gap of one position in its dump (raw_topic_quarantine)")
    div = audit.metadata.get("divergence_reports")
    if div:
        # Keys first (each once, under its worst verdict over its replica pairs), then key pairs (SPEC 10).
        for name, prefix in (("keys", "keys"), ("key pairs", "key_pairs")):
            if div.get(f"{prefix}_compared") is None:
                continue
            lines.append(
                "  {name} compared {c}: DIVERGENT {d}, MISSING {m}, IN_FLIGHT {f}, consistent {ok}".format(
                    name=name,
                    c=div.get(f"{prefix}_compared"),
                    ok=div.get(f"{prefix}_consistent"),
                    d=div.get(f"{prefix}_divergent"),
                    m=div.get(f"{prefix}_missing"),
                    f=div.get(f"{prefix}_in_flight"),
                )
            )
        if div.get("report_page"):
            lines.append(f"  report page: {div['report_page']} ({div.get('keys_explained')} key(s) explained, "
                         f"{div.get('keys_pictured')} with a picture)")
        if div.get("explain_first"):
            lines.append(f"  explain the first: {div['explain_first']}")
    lines.extend(gap_lines(audit))
    anomalies = audit.metadata.get("stream_anomalies")
    if anomalies:
        by_anomaly = anomalies.get("by_anomaly")
        lines.append(f"  stream anomalies: {anomalies.get('dagster/row_count')}" + (f" {by_anomaly}" if by_anomaly else ""))
    lag = audit.metadata.get("replication_lag")
    if lag:
        worst = lag.get("worst_lag") or None
        if worst:
            lines.append(
                f"  worst replication lag: {worst['replica']} applying {worst['origin_region']}'s writes:"
                f" p99 <= {worst['p99_upper_ms']:.0f} ms, max <= {worst['max_upper_ms']} ms,"
                f" staleness {worst['staleness_ms']} ms (replication_lag)"
            )
        else:
            lines.append("  replication lag: no heartbeat in this snapshot")
    if audit.failed_checks:
        lines.append(f"  failed checks: {', '.join(audit.failed_checks)}")
    written = [a for a in audit.metadata if "dagster/uri" in audit.metadata[a]]
    if written:
        lines.append(f"  Delta tables written: {len(written)} ({', '.join(sorted(written))})")
    lines.append("  " + look_at(audit))
    return lines


def gaps_of(audit: SnapshotAudit) -> dict[str, Any]:
    """The dumps with gaps in their offsets (SPEC 3a), from ``partition_watermarks``' materialization."""
    wm = audit.metadata.get("partition_watermarks", {})
    return {
        "dumps_with_gaps": int(wm.get("dumps_with_gaps") or 0),
        "gaps": int(wm.get("gaps") or 0),
        "positions_missing": int(wm.get("gap_positions") or 0),
        "dumps": list(wm.get("dumps_with_gaps_listed") or []),
    }


def gap_lines(audit: SnapshotAudit) -> list[str]:
    """Where proofs rest on a dump with gaps: a line, then one per dump (as many as the metadata lists)."""
    gaps = gaps_of(audit)
    if not gaps["dumps_with_gaps"]:
        return []
    lines = [
        f"  gaps: {gaps['dumps_with_gaps']} dump(s) miss {gaps['positions_missing']} position(s) in {gaps['gaps']} "
        "gap(s) (compaction, quarantined or lost records): their proofs are limited to what the dumps hold "
        "(partition_watermarks)"
    ]
    for dump in gaps["dumps"]:
        lines.append(
            f"    {dump['dump']:<24} {dump['gaps']} gap(s), {dump['gap_positions']} position(s) missing, "
            f"offsets {dump['first_gap_offset']}..{dump['last_gap_offset']}"
        )
    if len(gaps["dumps"]) < gaps["dumps_with_gaps"]:
        lines.append(f"    ... and {gaps['dumps_with_gaps'] - len(gaps['dumps'])} more")
    return lines


def look_at(audit: SnapshotAudit) -> str:
    """What an operator should open first, by urgency: one line."""
    if not audit.success:
        return f"look at: the failed step ({audit.error}); re-run with --verbose for Dagster's event log"
    todo = []
    if audit.proven_divergent:
        todo.append(f"divergence_reports: {audit.proven_divergent} key(s) proven DIVERGENT or MISSING, with witnesses")
    quarantined = int(audit.value("raw_topic_snapshots", "rows_quarantined", 0) or 0)
    if quarantined:
        todo.append(f"raw_topic_quarantine: {quarantined} row(s) not audited, with the reason")
    anomalies = int(audit.value("stream_anomalies", "dagster/row_count", 0) or 0)
    if anomalies:
        todo.append(f"stream_anomalies: {anomalies} row(s)")
    other = [c for c in audit.failed_checks if c != "divergence_reports:no_proven_divergence"]
    if other:
        todo.append(f"failed checks {', '.join(other)}")
    return "look at: " + "; ".join(todo) if todo else "nothing to look at: no divergence, quarantine or anomaly"


def audit_document(audit: SnapshotAudit) -> dict[str, Any]:
    """One snapshot's audit as plain JSON values: what ``--json`` writes (documented in docs/operations.md)."""
    raw = audit.metadata.get("raw_topic_snapshots", {})
    quarantine = audit.metadata.get("raw_topic_quarantine", {})
    divergence = audit.metadata.get("divergence_reports", {})
    anomalies = audit.metadata.get("stream_anomalies", {})
    lag = audit.metadata.get("replication_lag", {})
    return {
        "snapshot_id": audit.snapshot_id,
        "run_id": audit.run_id,
        "success": audit.success,
        "error": audit.error,
        "scope": audit.scope,
        "rows": {
            name: raw.get(f"rows_{name}") for name in ("read", "accepted", "quarantined", "skipped")
        } | {"duplicates_collapsed": raw.get("rows_duplicates_collapsed")},
        "quarantined_by_reason": quarantine.get("by_reason") or {},
        # Raw Venice records skipped by rule, per replica and kind (control message type or VALUE_CHUNK, CHUNK_CLEANUP).
        "skipped_by_kind": raw.get("skipped_by_kind") or {},
        "quarantined_positions": quarantine.get("quarantined_positions"),
        # Version topics whose push settings are unknown (topic -> records kept): not audited until given.
        "topics_not_audited": quarantine.get("topics_not_audited") or {},
        # Where each version topic's push settings came from (START_OF_PUSH, settings file, carried from snapshots),
        # and where those sources disagreed (the first one was used).
        "why_not_audited": quarantine.get("why_not_audited") or {},
        "push_settings_from": quarantine.get("push_settings_from") or {},
        "push_settings_disagreements": quarantine.get("push_settings_disagreements") or {},
        # Keys per verdict: each (topic, partition, key) once, under its worst verdict over its replica pairs.
        "verdicts": {
            name: divergence.get(f"keys_{name}") for name in ("compared", "consistent", "divergent", "missing", "in_flight")
        },
        # Key pairs per verdict: a key once per replica pair holding its partition (three replicas: three pairs).
        "key_pair_verdicts": {
            name: divergence.get(f"key_pairs_{name}")
            for name in ("compared", "consistent", "divergent", "missing", "in_flight")
        },
        # The page explaining every key that is not CONSISTENT, and the command explaining the most important one.
        "report_page": divergence.get("report_page"),
        "explain_first": divergence.get("explain_first"),
        "anomalies": {"total": anomalies.get("dagster/row_count"), "by_kind": anomalies.get("by_anomaly") or {}},
        # Dumps with gaps prove only what they hold (SPEC 3a): never more than the complete topic.
        "gaps": gaps_of(audit) | {"proofs_limited": bool(gaps_of(audit)["dumps_with_gaps"])},
        "worst_lag": lag.get("worst_lag") or None,
        "failed_checks": list(audit.failed_checks),
        "tables": {
            table: {"delta_version": values.get("delta_version"), "rows": values.get("dagster/row_count")}
            for table, values in sorted(audit.metadata.items())
            if "delta_version" in values
        },
    }


def audit_snapshots(
    landing: str,
    warehouse: str,
    snapshot_id: Optional[str] = None,
    fail_on_divergence: bool = False,
    spark_master: str = "local[*]",
    delta_jars_dir: Optional[str] = None,
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS,
    verbosity: str = "normal",
    delta_engine: Optional[str] = None,
    cluster_regions: Optional[str] = None,
    venice_clock_uncertainty_ms: Optional[int] = None,
    venice_push_settings: Optional[str] = None,
    json_path: Optional[str] = None,
    state_retention: Optional[int] = None,
    concurrent_steps: Optional[int] = None,
    scope: str = ALL,
) -> int:
    """Audit the named snapshot, or every complete one; print a summary; return the exit code.

    ``verbosity``: ``quiet`` prints the summaries and errors only; ``normal`` adds one line
    per step; ``verbose`` adds Dagster's event log and Spark's warnings. ``json_path``
    (``-`` for stdout, the human output then goes to stderr) receives one JSON document for
    the whole command (``audit_document`` per snapshot). ``state_retention``: see
    ``assets.divergence.DivergenceConfig`` (None: keep every state). ``concurrent_steps``:
    steps run at once (None: the executor's default, ``replica_lens/executor.py``). ``scope``:
    which assets each audit materializes (``run_audit``).
    """
    out: TextIO = sys.stderr if json_path == "-" else sys.stdout
    zone = LandingZone(
        root=landing, cluster_regions=cluster_regions, venice_clock_uncertainty_ms=venice_clock_uncertainty_ms,
        venice_push_settings=venice_push_settings,
    )
    zone.cluster_region_map()  # a malformed map (or uncertainty, or push settings file) is refused before any run
    zone.clock_uncertainty_ms()
    zone.limit_settings()
    zone.line_limit()
    parse_push_settings(zone.push_settings_file())
    skipped: list[dict[str, str]] = []
    if snapshot_id is not None:
        zone.require_complete(snapshot_id)
        snapshot_ids = [snapshot_id]
    else:
        scan = zone.scan()
        for name in scan.refused:
            print(f"ignoring landing folder {name!r}: not a safe snapshot id", file=sys.stderr)
            skipped.append({"snapshot_id": name, "reason": "not a safe snapshot id"})
        for name in scan.incomplete:
            print(f"skipping snapshot {name!r}: no _SUCCESS yet", file=sys.stderr)
            skipped.append({"snapshot_id": name, "reason": "no _SUCCESS yet"})
        snapshot_ids = scan.complete
        if not snapshot_ids:
            print(f"no complete snapshot in {landing}", file=sys.stderr)
    exit_code = 0
    documents = []
    with audit_instance(from_dagster_home=True) as instance:
        for sid in snapshot_ids:
            if verbosity != "quiet":
                print(f"auditing snapshot {sid} ...", file=out, flush=True)
            with status_line(out, f"auditing {sid}", enabled=verbosity == "normal"):
                audit = run_audit(
                    sid,
                    landing,
                    warehouse,
                    instance=instance,
                    log_level=DAGSTER_LOG_LEVELS[verbosity],
                    watcher=StepPrinter(out) if verbosity != "quiet" else None,
                    spark_master=spark_master,
                    delta_jars_dir=delta_jars_dir,
                    delta_engine=delta_engine,
                    shuffle_partitions=shuffle_partitions,
                    spark_log_level=SPARK_LOG_LEVELS[verbosity],
                    state_retention=state_retention,
                    concurrent_steps=concurrent_steps,
                    scope=scope,
                    cluster_regions=cluster_regions,
                    venice_clock_uncertainty_ms=venice_clock_uncertainty_ms,
                    venice_push_settings=venice_push_settings,
                )
            print("\n".join(summary_lines(audit)), file=out, flush=True)
            documents.append(audit_document(audit))
            if not audit.success:
                exit_code = 1
            elif fail_on_divergence and audit.proven_divergent and exit_code == 0:
                exit_code = 3
    if json_path is not None:
        document = {
            "landing": landing,
            "warehouse": warehouse,
            "exit_code": exit_code,
            "snapshots": documents,
            "skipped": skipped,
        }
        text = json.dumps(document, indent=2, sort_keys=False, default=str)
        if json_path == "-":
            print(text, flush=True)
        else:
            with open(json_path, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
    return exit_code


def _has_dagster_home() -> bool:
    import os

    return bool(os.environ.get("DAGSTER_HOME"))
