"""The whole benchmark: every variant in one JVM, gathered into the report, written as JSON."""
from __future__ import annotations

import json
import platform
import shutil
import subprocess
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from replica_lens.benchmark.measure import run_variant
from replica_lens.benchmark.proc import ProcessSampler, _cores
from replica_lens.benchmark.variants import VARIANTS, _writes_for_rows, scaling_ratios
from resources.tuning import DEFAULT_SHUFFLE_PARTITIONS


def variant_config(variant: str, rows: int):
    """The SimulationConfig of a variant's snapshot for ``--rows`` rows (3 regions, 4 partitions, JSONL)."""
    from replica_lens.simulator import SimulationConfig

    spec = VARIANTS[variant]
    return SimulationConfig(
        seed=11,
        regions=3,
        partitions=4,
        keys=spec.keys,
        writes=_writes_for_rows(spec.rows or rows * spec.scale, regions=3),
        hot_key_fraction=spec.hot_key_fraction,
        hot_write_share=0.5,
        file_format="jsonl",
    )


def benchmark(
    rows: int = 2_000_000,
    variants: tuple[str, ...] = ("uniform", "hot"),
    out: Optional[str] = None,
    workdir: Optional[str] = None,
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS,
    keep: bool = False,
    process_runs: int = 1,
    in_process_audits: int = 1,
) -> dict:
    """Run every variant; return the report (and write it as JSON to ``out``).

    ``process_runs`` is how many times the essential pass and the audit process are run per
    variant (their medians are reported); 0 skips them (floors and per-step figures only).
    ``in_process_audits`` is how many times each variant is audited in this process's JVM: the
    first gives the per-step figures, each later one its seconds and CPU (``repeated_audits``).
    """
    from resources.errors import InvalidSetting
    from resources.session import STATUS_RETENTION, build_spark_session
    from resources.settings import delta_settings_from_environment

    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise InvalidSetting(f"unknown variant(s) {', '.join(unknown)}: choose from {', '.join(VARIANTS)}")
    if in_process_audits < 1:
        raise InvalidSetting(f"in_process_audits must be at least 1 (the audit that gives the per-step figures); got {in_process_audits}")
    # This process's JVM starts once, before any measurement; every variant reuses it. It keeps
    # every job and stage in its status store (STATUS_RETENTION); nothing else differs from the
    # audit's session. A session started earlier (the tests' one) keeps its own limits; then
    # ``spark.complete`` says whether any were dropped.
    # The Delta engine and its jars as an audit of this environment would choose them (resources/settings.py): the
    # audit processes are given them explicitly, and this JVM loads the jars the in-process audits need.
    delta = delta_settings_from_environment()
    spark = build_spark_session(master="local[*]", shuffle_partitions=shuffle_partitions, extra=STATUS_RETENTION,
                                delta_jars_dir=delta.jars_dir)
    base = Path(workdir or tempfile.mkdtemp(prefix="replica-lens-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    settings = {"spark_master": "local[*]", "delta_jars_dir": delta.jars_dir, "delta_engine": delta.engine,
                "shuffle_partitions": shuffle_partitions}
    results = []
    with ProcessSampler() as sampler:
        for variant in variants:
            spec = VARIANTS[variant]
            size = spec.rows or rows * spec.scale
            config = variant_config(variant, rows)
            results.append(
                run_variant(variant, base, config, spark, settings, sampler, process_runs=process_runs, requested_rows=size,
                            keep=keep, in_process_audits=in_process_audits, bad_lines_per_file=spec.bad_lines_per_file)
            )
    report = {
        "machine": {"cpus": _cores(), "python": platform.python_version(), "spark": spark.version},
        "commit": _commit(),
        "requested_rows": rows,
        "process_runs": process_runs,
        "in_process_audits": in_process_audits,
        "delta": {"engine": delta.engine, "jars_dir": delta.jars_dir},
        "variants": [asdict(r) for r in results],
    }
    report.update(scaling_ratios({r.variant: r.audit_seconds for r in results}))
    if out:
        Path(out).write_text(json.dumps(report, indent=2))
    if not keep:
        shutil.rmtree(base, ignore_errors=True)
    return report


def _commit() -> Optional[str]:
    """The checked-out commit of the code measured (``+dirty`` when tracked files differ from it)."""
    root = Path(__file__).resolve().parents[2]  # the checkout, above replica_lens/benchmark/
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")
