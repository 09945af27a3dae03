"""The essential pass and the audit, each as a whole process: timed from start to exit, alternated, compared."""
from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from replica_lens.benchmark.essential import ESSENTIAL_MARKER, raw_message_schema
from replica_lens.benchmark.figures import VariantFigures
from replica_lens.benchmark.proc import ProcessSampler, _cores
from replica_lens.benchmark.variants import PROCESS_RATIO_TARGETS


def _parquet_rows(folder: Path) -> int:
    """Rows of the Parquet files in ``folder``, from their footers (no data read)."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in folder.glob("*.parquet"))


@dataclass
class ProcessRun:
    """One whole process: wall seconds from start to exit, exit code, peak memory."""

    seconds: float
    exit_code: int
    peak_python_mib: float
    peak_jvm_mib: float
    detail: dict[str, Any] = field(default_factory=dict)
    # CPU seconds of the process's JVM from its start to the last sample before it exited:
    # in all, in its JIT compilers, in its garbage collector.
    jvm_cpu_seconds: float = 0.0
    jit_cpu_seconds: float = 0.0
    gc_cpu_seconds: float = 0.0
    # CPU seconds of the Python process (and of descendants it waited for), from the kernel's
    # accounting once it was reaped; cpu_seconds = python_cpu_seconds + jvm_cpu_seconds.
    python_cpu_seconds: float = 0.0
    cpu_seconds: float = 0.0


def _child_env() -> dict[str, str]:
    """This environment minus what would make a child differ from the in-process run.

    No DAGSTER_HOME: the audit records its run in an ephemeral instance, as in-process (and
    writes nothing into a shared one). The Spark master and the Delta jars are passed as
    arguments instead of read from the environment.
    """
    env = dict(os.environ)
    for name in ("DAGSTER_HOME", "REPLICA_LENS_SPARK_MASTER", "REPLICA_LENS_DELTA_JARS"):
        env.pop(name, None)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    return env


def _time_process(command: list[str]) -> tuple[ProcessRun, str, str]:
    """Run ``command`` to its exit; wall time includes the exit of its JVM (the pipes close then)."""
    reaped_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_child_env())
    with ProcessSampler(pid=child.pid) as sampler:
        stdout, stderr = child.communicate()
    seconds = time.perf_counter() - start
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    # The JVM is not among the reaped children (the Python process does not wait for it): its CPU is sampled.
    python_cpu = (reaped.ru_utime + reaped.ru_stime) - (reaped_before.ru_utime + reaped_before.ru_stime)
    peak_py, peak_jvm = sampler.peak_bytes()
    jvm = sampler.last_cpu().rounded()
    run = ProcessRun(
        round(seconds, 2), child.returncode, round(peak_py, 1), round(peak_jvm, 1), **jvm,
        python_cpu_seconds=round(python_cpu, 2), cpu_seconds=round(python_cpu + jvm["jvm_cpu_seconds"], 2),
    )
    return run, stdout, stderr


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_essential_process(snapshot: Path, out: Path, spark_conf: dict[str, str]) -> ProcessRun:
    command = [
        sys.executable, "-m", "replica_lens.benchmark", "essential",
        "--snapshot", str(snapshot), "--out", str(out),
        "--spark-conf", json.dumps(spark_conf), "--schema", raw_message_schema().json(),
    ]
    run, stdout, stderr = _time_process(command)
    if run.exit_code != 0:
        run.detail["stderr_tail"] = _tail(stderr)
        return run
    own = [line[len(ESSENTIAL_MARKER):] for line in stdout.splitlines() if line.startswith(ESSENTIAL_MARKER)]
    run.detail.update(json.loads(own[-1]) if own else {})
    run.detail["rows_written"] = _parquet_rows(out)
    return run


def audit_command() -> list[str]:
    """``replica-lens`` next to this interpreter (the console script users run), else the module."""
    script = Path(sys.executable).with_name("replica-lens")
    return [str(script)] if script.exists() else [sys.executable, "-m", "replica_lens.cli"]


def run_audit_process(
    landing: Path, warehouse: Path, snapshot_id: str, spark_master: str, shuffle_partitions: int,
    delta_engine: str = "embedded", delta_jars_dir: Optional[str] = None,
) -> ProcessRun:
    command = audit_command() + [
        "audit", "--landing", str(landing), "--warehouse", str(warehouse), "--snapshot-id", snapshot_id,
        "--spark-master", spark_master, "--shuffle-partitions", str(shuffle_partitions),
        "--delta-engine", delta_engine, "--delta-jars", delta_jars_dir or "",
    ]
    run, stdout, stderr = _time_process(command)
    if run.exit_code != 0:
        run.detail["stderr_tail"] = _tail(stderr)
        run.detail["stdout_tail"] = _tail(stdout)
    return run


def a_key(warehouse: Path, snapshot_id: str) -> tuple[str, int, str]:
    """(topic, partition, key) of one key the audited snapshot holds: what the explain timing explains."""
    import pyarrow.dataset as ds

    from resources.delta_reader import TableReader

    reader = TableReader(str(warehouse))
    first = reader.read("partition_watermarks", snapshot_id, columns=["topic", "partition"]).to_pylist()[0]
    where = (ds.field("topic") == first["topic"]) & (ds.field("partition") == first["partition"])
    keys = reader.read("reconstructed_watermarks", snapshot_id, where, ["key"]).column("key")
    return first["topic"], first["partition"], keys[len(keys) // 2].as_py()


def run_explain_process(warehouse: Path, snapshot_id: str) -> ProcessRun:
    """``replica-lens explain`` of one key of the audited snapshot, as a whole process (what an operator waits for)."""
    topic, partition, key = a_key(warehouse, snapshot_id)
    command = audit_command() + [
        "explain", "--warehouse", str(warehouse), "--snapshot-id", snapshot_id, "--topic", topic,
        "--partition", str(partition), "--key", key, "--json", "-",
    ]
    run, stdout, stderr = _time_process(command)
    run.detail["key"] = {"topic": topic, "partition": partition, "key": key}
    if run.exit_code != 0:
        run.detail["stderr_tail"] = _tail(stderr)
    return run


def _median(values: list[float]) -> Optional[float]:
    return round(statistics.median(values), 2) if values else None


def _measure_processes(figures: VariantFigures, workdir: Path, landing: Path, snapshot_id: str, settings: dict, runs: int, keep: bool) -> None:
    """Essential pass and audit process, ``runs`` times each, alternating (so that load drifts hit both)."""
    from resources.session import spark_config

    conf = spark_config(master=settings["spark_master"], shuffle_partitions=settings["shuffle_partitions"])
    for i in range(runs):
        out = workdir / f"essential-{figures.variant}-{i}"
        essential = run_essential_process(landing / snapshot_id, out, conf)
        figures.essential_pass_runs.append(asdict(essential))
        warehouse = workdir / f"process-warehouse-{figures.variant}-{i}"
        audit = run_audit_process(landing, warehouse, snapshot_id, settings["spark_master"], settings["shuffle_partitions"],
                                  settings.get("delta_engine", "embedded"), settings.get("delta_jars_dir"))
        figures.audit_process_runs.append(asdict(audit))
        if audit.exit_code == 0:  # the audited warehouse is there: explain one of its keys
            figures.explain_process_runs.append(asdict(run_explain_process(warehouse, snapshot_id)))
        if not keep:
            shutil.rmtree(out, ignore_errors=True)
            shutil.rmtree(warehouse, ignore_errors=True)
        if essential.exit_code != 0 or audit.exit_code != 0:
            figures.success = False
            break
    if figures.success:
        figures.essential_pass_seconds = _median([r["seconds"] for r in figures.essential_pass_runs])
        figures.audit_process_seconds = _median([r["seconds"] for r in figures.audit_process_runs])
        figures.explain_key_seconds = _median([r["seconds"] for r in figures.explain_process_runs if r["exit_code"] == 0])
        figures.audit_process_to_essential_pass = round(figures.audit_process_seconds / figures.essential_pass_seconds, 2)
        figures.pair_ratios = [
            round(audit["seconds"] / essential["seconds"], 2)
            for essential, audit in zip(figures.essential_pass_runs, figures.audit_process_runs)
        ]
        essential_cpu = _median([r["cpu_seconds"] for r in figures.essential_pass_runs])
        if essential_cpu:
            figures.cpu_ratio = round(_median([r["cpu_seconds"] for r in figures.audit_process_runs]) / essential_cpu, 2)
    figures.process_ratio_target = PROCESS_RATIO_TARGETS.get(figures.variant)
    if figures.process_ratio_target and figures.essential_pass_seconds:
        figures.target_cpu_budget_seconds = round(
            figures.process_ratio_target * figures.essential_pass_seconds * _cores(), 2
        )
