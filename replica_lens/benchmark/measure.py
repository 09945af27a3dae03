"""One variant measured: its snapshot, the floors, the whole processes, then the audit in this process's JVM step by step."""
from __future__ import annotations

import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from replica_lens.benchmark.figures import StepFigures, VariantFigures
from replica_lens.benchmark.jvm_calls import counting_jvm_calls
from replica_lens.benchmark.floors import _floor_seconds, _parse_floor_seconds, output_floor
from replica_lens.benchmark.proc import ProcessSampler
from replica_lens.benchmark.processes import _measure_processes
from replica_lens.benchmark.spark_activity import SparkActivity
from replica_lens.benchmark.variants import add_bad_lines
from replica_lens.steps import STEP_INPUTS  # the table each asset step reads its rows from (None: the landing files)

# Per-table timings a materialization may carry (what each covers is said where it is
# measured, assets/tables.py); the benchmark copies those present.
TABLE_TIMINGS = ("write_seconds", "check_seconds", "commit_seconds")

# The in-process audits run their steps one at a time, so that each step's window (Dagster's step
# events) holds only its own Spark jobs and CPU; the audit processes run them as users do.
SERIAL = 1
QUIET_LOG_LEVEL = "WARNING"  # Dagster's console log during the in-process audits


def run_variant(
    name: str,
    workdir: Path,
    sim_config,
    spark,
    settings: dict,
    sampler: ProcessSampler,
    process_runs: int = 1,
    requested_rows: int = 0,
    keep: bool = False,
    in_process_audits: int = 1,
    bad_lines_per_file: int = 0,
) -> VariantFigures:
    from replica_lens.audit import audit_instance, run_audit
    from replica_lens.simulator import simulate

    landing = workdir / "landing"
    warehouse = workdir / f"warehouse-{name}"
    snapshot_id = f"bench-{name}"
    simulate(str(landing), snapshot_id, sim_config)
    bad_lines = add_bad_lines(landing / snapshot_id, bad_lines_per_file) if bad_lines_per_file else 0
    # Once to warm the JVM and the page cache, once measured: the floor is the least any run can do.
    _floor_seconds(spark, str(landing / snapshot_id))
    floor, rows = _floor_seconds(spark, str(landing / snapshot_id))
    parse_floor = _parse_floor_seconds(spark, str(landing / snapshot_id))

    figures = VariantFigures(
        variant=name,
        version_topic_rows=rows,
        floor_seconds=round(floor, 2),
        parse_floor_seconds=round(parse_floor, 2),
        audit_seconds=0.0,
        ratio_to_floor=float("nan"),
        ratio_to_parse_floor=float("nan"),
        requested_rows=requested_rows,
        bad_lines=bad_lines,
    )
    if process_runs > 0:
        _measure_processes(figures, workdir, landing, snapshot_id, settings, process_runs, keep)

    # The per-step run, in this process's JVM.
    jobs_before = SparkActivity.read(spark).max_job_id()
    wall_start = time.time()
    start = time.perf_counter()
    # Dagster's console log shows warnings only (its event log, which the step figures come from, keeps everything).
    # One step at a time (the process runs use the default): a step's window then holds its own Spark jobs only.
    with audit_instance() as instance, counting_jvm_calls() as calls:
        audit = run_audit(
            snapshot_id, str(landing), str(warehouse), instance=instance, log_level=QUIET_LOG_LEVEL,
            concurrent_steps=SERIAL, **settings,
        )
        total = time.perf_counter() - start
        wall_end = time.time()
        step_stats = instance.get_run_step_stats(audit.run_id)
    activity = SparkActivity.read(spark)

    figures.audit_seconds = round(total, 2)
    figures.jvm_calls = calls.calls
    figures.ratio_to_floor = round(total / floor, 2) if floor else float("nan")
    figures.ratio_to_parse_floor = round(total / parse_floor, 2) if parse_floor else float("nan")
    figures.success = figures.success and audit.success
    figures.spark = {**asdict(activity.between(wall_start, wall_end)), "complete": activity.complete_after(jobs_before)}
    figures.cpu = sampler.cpu_between(wall_start, wall_end).rounded()
    for stats in step_stats:
        if stats.start_time is None or stats.end_time is None:
            continue
        base = stats.step_key
        written = {asset: meta for asset, meta in audit.metadata.items() if _step_of(asset) == base}
        outputs = {asset: int(meta.get("dagster/row_count", 0)) for asset, meta in written.items()}
        rows_in = _rows_in(base, rows, audit.metadata)
        tables = {
            asset: {key: meta[key] for key in TABLE_TIMINGS if key in meta}
            for asset, meta in written.items()
            if any(key in meta for key in TABLE_TIMINGS)
        }
        peak_py, peak_jvm = sampler.peak_bytes(stats.start_time, stats.end_time)
        figures.steps.append(
            StepFigures(
                step=base,
                seconds=round(stats.end_time - stats.start_time, 2),
                rows_in=rows_in,
                rows_out=outputs,
                peak_python_mib=round(peak_py, 1),
                peak_jvm_mib=round(peak_jvm, 1),
                tables=tables,
                **{f"spark_{k}" if k in ("jobs", "stages") else k: v
                   for k, v in asdict(activity.between(stats.start_time, stats.end_time)).items()},
                **sampler.cpu_between(stats.start_time, stats.end_time).rounded(),
            )
        )
    figures.peak_jvm_mib = max((s.peak_jvm_mib for s in figures.steps), default=0.0)
    if audit.success:
        figures.output_floor = output_floor(spark, warehouse, snapshot_id, workdir)
        figures.output_write_seconds = round(sum(t["write_seconds"] for t in figures.output_floor.values()), 2)
        figures.output_floor_seconds, figures.audit_process_to_output_floor = output_floor_ratio(figures)
    for i in range(1, in_process_audits):
        again = workdir / f"warehouse-{name}-again-{i}"
        start, wall_start = time.perf_counter(), time.time()
        repeated = run_audit(
            snapshot_id, str(landing), str(again), log_level=QUIET_LOG_LEVEL,
            concurrent_steps=SERIAL, **settings,
        )
        figures.repeated_audits.append(
            {
                "seconds": round(time.perf_counter() - start, 2),
                "success": repeated.success,
                **sampler.cpu_between(wall_start, time.time()).rounded(),
            }
        )
        figures.success = figures.success and repeated.success
        if not keep:
            shutil.rmtree(again, ignore_errors=True)
    return figures


def _rows_in(step: str, landing_rows: int, metadata: dict[str, dict]) -> Optional[int]:
    """Rows the step reads: the landing rows, its upstream table's, or for a check step
    (``<asset>_<check>``) the checked table's; None when not known."""
    if step in STEP_INPUTS:
        upstream = STEP_INPUTS[step]
        return landing_rows if upstream is None else int(metadata.get(upstream, {}).get("dagster/row_count", 0) or 0)
    checked = [asset for asset in metadata if step.startswith(asset + "_")]
    if checked:
        return int(metadata[max(checked, key=len)].get("dagster/row_count", 0) or 0)
    return None


def output_floor_ratio(figures: VariantFigures) -> tuple[Optional[float], Optional[float]]:
    """The essential pass plus writing the per-row tables it does not write, and the audit process against it.

    The essential pass writes every row once (what ``raw_topic_snapshots`` costs); an audit that
    writes the SPEC's tables writes ``heartbeat_segments``, ``reconstructed_watermarks`` and
    ``replica_state`` as well (their ``write_seconds``). None without process runs or output floor.
    """
    if figures.essential_pass_seconds is None or figures.audit_process_seconds is None or not figures.output_floor:
        return None, None
    others = sum(t["write_seconds"] for table, t in figures.output_floor.items() if table != "raw_topic_snapshots")
    floor = round(figures.essential_pass_seconds + others, 2)
    return floor, round(figures.audit_process_seconds / floor, 2)


def _step_of(asset: str) -> str:
    companions = {
        "raw_topic_quarantine": "raw_topic_snapshots",
        "raw_topic_skipped": "raw_topic_snapshots",
        "heartbeat_segments": "stream_pass",
        "heartbeat_segment_summary": "stream_pass",
        "reconstructed_watermarks": "stream_pass",
        "partition_watermarks": "stream_pass",
        "stream_anomalies": "stream_pass",
        "divergence_summary": "divergence_reports",
        "replica_state": "divergence_reports",
        "heartbeat_lag": "replication_lag",
        "exporter_positions": "exporter_tables",
        "exporter_regressions": "exporter_tables",
        "compaction_bounds": "exporter_tables",
    }
    return companions.get(asset, asset)
