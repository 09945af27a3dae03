"""``replica-lens benchmark``: where the time of an audit goes, against this machine's floor.

For each variant (uniform keys, and hot keys where 1% of keys take half of the writes)
it simulates a snapshot, measures the floor (Spark reading the landing files once and
counting them, in the same JVM and run), then runs the full audit through Dagster and
reports per asset step: wall time, rows in, rows out, and the peak resident memory of
the Spark driver (the JVM) and of this Python process while the step ran. Results are
printed and written as JSON so that runs can be compared. Timings are noisy on a shared
machine: compare the ratios within one run, not seconds across runs.
"""
from __future__ import annotations

import json
import os
import platform
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from resources.tuning import DEFAULT_SHUFFLE_PARTITIONS

STEP_INPUTS = {
    "raw_topic_snapshots": None,
    "heartbeat_segments": "raw_topic_snapshots",
    "reconstructed_watermarks": "heartbeat_segments",
    "divergence_reports": "reconstructed_watermarks",
    "stream_anomalies": "raw_topic_snapshots",
    "replication_lag": "raw_topic_snapshots",
    "exporter_tables": "raw_topic_snapshots",
}


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _jvm_pid() -> Optional[int]:
    """The Spark driver JVM started by this process (a child: PySpark launches it)."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == me:
                with open(f"/proc/{entry}/cmdline", "rb") as cmd:
                    if b"java" in cmd.read():
                        return int(entry)
        except (OSError, IndexError, ValueError):
            continue
    return None


class MemorySampler:
    """Samples the resident memory of this process and the JVM every few milliseconds."""

    def __init__(self, interval_s: float = 0.1):
        self.interval_s = interval_s
        self.samples: list[tuple[float, int, int]] = []  # (time, python KiB, jvm KiB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._jvm: Optional[int] = None

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._jvm is None:
                self._jvm = _jvm_pid()
            jvm = _rss_kib(self._jvm) if self._jvm else 0
            self.samples.append((time.time(), _rss_kib(os.getpid()), jvm))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "MemorySampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def peak_mib(self, start: float, end: float) -> tuple[float, float]:
        window = [s for s in self.samples if start <= s[0] <= end] or self.samples[-1:]
        return (max(s[1] for s in window) / 1024, max(s[2] for s in window) / 1024) if window else (0.0, 0.0)


@dataclass
class StepFigures:
    step: str
    seconds: float
    rows_in: Optional[int]
    rows_out: dict[str, int]
    peak_python_mib: float
    peak_jvm_mib: float
    # Per table the step wrote: seconds to compute and write it, and to read it back and validate it.
    tables: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class VariantFigures:
    variant: str
    version_topic_rows: int
    floor_seconds: float
    parse_floor_seconds: float
    audit_seconds: float
    ratio_to_floor: float
    ratio_to_parse_floor: float
    steps: list[StepFigures] = field(default_factory=list)
    peak_jvm_mib: float = 0.0
    success: bool = True


def _floor_seconds(spark, folder: str) -> tuple[float, int]:
    """Spark reading the snapshot's files once and counting them: the least any audit must do."""
    files = [str(p) for p in Path(folder).iterdir() if p.name.endswith((".jsonl", ".jsonl.gz", ".parquet"))]
    start = time.perf_counter()
    text = [f for f in files if not f.endswith(".parquet")]
    parquet = [f for f in files if f.endswith(".parquet")]
    rows = 0
    if text:
        rows += spark.read.text(text).count()
    if parquet:
        rows += spark.read.parquet(*parquet).count()
    return time.perf_counter() - start, rows


def _parse_floor_seconds(spark, folder: str) -> float:
    """Spark parsing every JSON line once into the SPEC 1 fields (no checks, nothing written).

    Not the issue's floor (that one only counts lines), but what any audit must at least
    pay to read the messages: it separates the cost of JSON parsing from our own.
    """
    from pyspark.sql import types as T

    from schemas.raw import MESSAGE_FIELDS

    files = [str(p) for p in Path(folder).iterdir() if p.name.endswith((".jsonl", ".jsonl.gz"))]
    if not files:
        return 0.0
    schema = T.StructType([T.StructField(name, t) for name, t in MESSAGE_FIELDS.items()])
    start = time.perf_counter()
    spark.read.schema(schema).json(files).write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start


def run_variant(name: str, workdir: Path, sim_config, spark, settings: dict, sampler: MemorySampler) -> VariantFigures:
    import dagster as dg

    from replica_lens.audit import run_audit
    from replica_lens.simulator import simulate

    landing = workdir / "landing"
    warehouse = workdir / f"warehouse-{name}"
    snapshot_id = f"bench-{name}"
    simulate(str(landing), snapshot_id, sim_config)
    # Once to warm the JVM and the page cache, once measured: the floor is the least any run can do.
    _floor_seconds(spark, str(landing / snapshot_id))
    floor, rows = _floor_seconds(spark, str(landing / snapshot_id))
    parse_floor = _parse_floor_seconds(spark, str(landing / snapshot_id))

    instance = dg.DagsterInstance.ephemeral()
    start = time.perf_counter()
    audit = run_audit(snapshot_id, str(landing), str(warehouse), instance=instance, **settings)
    total = time.perf_counter() - start

    figures = VariantFigures(
        variant=name,
        version_topic_rows=rows,
        floor_seconds=round(floor, 2),
        parse_floor_seconds=round(parse_floor, 2),
        audit_seconds=round(total, 2),
        ratio_to_floor=round(total / floor, 2) if floor else float("nan"),
        ratio_to_parse_floor=round(total / parse_floor, 2) if parse_floor else float("nan"),
        success=audit.success,
    )
    for stats in instance.get_run_step_stats(audit.run_id):
        if stats.start_time is None or stats.end_time is None:
            continue
        base = stats.step_key
        written = {asset: meta for asset, meta in audit.metadata.items() if _step_of(asset) == base}
        outputs = {asset: int(meta.get("dagster/row_count", 0)) for asset, meta in written.items()}
        upstream = STEP_INPUTS.get(base)
        rows_in = rows if upstream is None else int(audit.value(upstream, "dagster/row_count", 0) or 0)
        tables = {
            asset: {"write_seconds": meta["write_seconds"], "check_seconds": meta["check_seconds"]}
            for asset, meta in written.items()
            if "write_seconds" in meta
        }
        peak_py, peak_jvm = sampler.peak_mib(stats.start_time, stats.end_time)
        figures.steps.append(
            StepFigures(
                step=base,
                seconds=round(stats.end_time - stats.start_time, 2),
                rows_in=rows_in,
                rows_out=outputs,
                peak_python_mib=round(peak_py, 1),
                peak_jvm_mib=round(peak_jvm, 1),
                tables=tables,
            )
        )
    figures.peak_jvm_mib = max((s.peak_jvm_mib for s in figures.steps), default=0.0)
    return figures


def _step_of(asset: str) -> str:
    companions = {
        "raw_topic_quarantine": "raw_topic_snapshots",
        "heartbeat_segment_summary": "heartbeat_segments",
        "partition_watermarks": "reconstructed_watermarks",
        "divergence_summary": "divergence_reports",
        "replica_state": "divergence_reports",
        "heartbeat_lag": "replication_lag",
        "exporter_positions": "exporter_tables",
        "exporter_regressions": "exporter_tables",
        "compaction_bounds": "exporter_tables",
    }
    return companions.get(asset, asset)


def benchmark(
    rows: int = 2_000_000,
    variants: tuple[str, ...] = ("uniform", "hot"),
    out: Optional[str] = None,
    workdir: Optional[str] = None,
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS,
    keep: bool = False,
) -> dict:
    from replica_lens.simulator import SimulationConfig
    from resources.spark import build_spark_session

    # The JVM starts once, before any measurement; every variant reuses it.
    spark = build_spark_session(master="local[*]", shuffle_partitions=shuffle_partitions)
    base = Path(workdir or tempfile.mkdtemp(prefix="replica-lens-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    settings = {"spark_master": "local[*]", "delta_jars_dir": None, "shuffle_partitions": shuffle_partitions}
    results = []
    with MemorySampler() as sampler:
        for variant in variants:
            config = SimulationConfig(
                seed=11,
                regions=3,
                partitions=4,
                keys=100_000,
                writes=_writes_for_rows(rows, regions=3),
                hot_key_fraction=0.01 if variant == "hot" else 0.0,
                hot_write_share=0.5,
                file_format="jsonl",
            )
            results.append(run_variant(variant, base, config, spark, settings, sampler))
    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "spark": spark.version},
        "requested_rows": rows,
        "variants": [asdict(r) for r in results],
    }
    if len(results) == 2 and results[0].audit_seconds:
        report["hot_to_uniform"] = round(results[1].audit_seconds / results[0].audit_seconds, 2)
    if out:
        Path(out).write_text(json.dumps(report, indent=2))
    if not keep:
        shutil.rmtree(base, ignore_errors=True)
    return report


def _writes_for_rows(rows: int, regions: int) -> int:
    """Every upstream write lands once in each region's version topic (plus heartbeats)."""
    return max(1, int(rows / regions * 0.97))


def print_report(report: dict) -> None:
    for variant in report["variants"]:
        print(
            f"{variant['variant']}: {variant['version_topic_rows']} rows, floor {variant['floor_seconds']} s, "
            f"parse floor {variant['parse_floor_seconds']} s, audit {variant['audit_seconds']} s "
            f"({variant['ratio_to_floor']}x floor, {variant['ratio_to_parse_floor']}x parse floor), "
            f"peak JVM {variant['peak_jvm_mib']} MiB{'' if variant['success'] else ', RUN FAILED'}"
        )
        for step in variant["steps"]:
            print(
                f"  {step['step']:<26} {step['seconds']:>8} s  in {step['rows_in']!s:>10}  "
                f"out {sum(step['rows_out'].values()):>10}  jvm {step['peak_jvm_mib']:>7} MiB  "
                f"py {step['peak_python_mib']:>6} MiB"
            )
            for table, times in sorted(step.get("tables", {}).items()):
                print(f"      {table:<28} compute+write {times['write_seconds']!s:>7} s  read+validate {times['check_seconds']!s:>6} s")
    if "hot_to_uniform" in report:
        print(f"hot-key / uniform: {report['hot_to_uniform']}x")
