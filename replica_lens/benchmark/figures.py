"""What the report holds per variant and per step of its in-process audit (the JSON's fields)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class StepFigures:
    step: str
    seconds: float
    rows_in: Optional[int]
    rows_out: dict[str, int]
    peak_python_mib: float
    peak_jvm_mib: float
    # Per table the step wrote: its TABLE_TIMINGS, e.g. seconds to compute and write it and to validate it.
    tables: dict[str, dict[str, float]] = field(default_factory=dict)
    # Jobs and stages submitted while the step ran, with their shuffle and spill bytes.
    spark_jobs: int = 0
    spark_stages: int = 0
    shuffle_read_bytes: int = 0
    shuffle_write_bytes: int = 0
    disk_spill_bytes: int = 0
    # CPU seconds the driver JVM used during the step (sampled from /proc every 100 ms): in all,
    # in its JIT compilers, in its garbage collector.
    jvm_cpu_seconds: float = 0.0
    jit_cpu_seconds: float = 0.0
    gc_cpu_seconds: float = 0.0


@dataclass
class VariantFigures:
    variant: str
    version_topic_rows: int
    floor_seconds: float
    parse_floor_seconds: float
    audit_seconds: float  # the in-process audit (warm JVM, no start-up): the per-step run
    ratio_to_floor: float
    ratio_to_parse_floor: float
    steps: list[StepFigures] = field(default_factory=list)
    peak_jvm_mib: float = 0.0
    success: bool = True
    requested_rows: int = 0
    bad_lines: int = 0  # lines added for the ingestion to quarantine (the dirty variant), among version_topic_rows
    # Whole processes, start to exit (medians over --process-runs; None when not run).
    essential_pass_seconds: Optional[float] = None
    audit_process_seconds: Optional[float] = None
    audit_process_to_essential_pass: Optional[float] = None  # the headline ratio
    # Audit process / essential pass of each alternated pair, in run order: the headline's spread.
    # On a noisy machine the median ratio moves with either side's median; the pairs show by how much.
    pair_ratios: list[float] = field(default_factory=list)
    # The same ratio in CPU seconds (medians of each process's Python and JVM CPU): what both sides
    # computed, which a busy host's stolen time does not inflate the way it does wall time.
    cpu_ratio: Optional[float] = None
    process_ratio_target: Optional[float] = None
    # The most CPU an audit process within its target could use: target x the essential pass's
    # seconds x the machine's cores, every core busy all along. A repeated audit (a JVM that has
    # loaded and compiled everything, --in-process-audits 2) that uses about as much shows that
    # the target needs less work, not faster work (docs/performance.md, "Where it stands").
    target_cpu_budget_seconds: Optional[float] = None
    essential_pass_runs: list[dict] = field(default_factory=list)
    audit_process_runs: list[dict] = field(default_factory=list)
    # `replica-lens explain` of one key of each audit process's warehouse, as a whole process (delta-rs, no JVM):
    # the median seconds, and each run (its key in ``detail``).
    explain_key_seconds: Optional[float] = None
    explain_process_runs: list[dict] = field(default_factory=list)
    # Spark over the whole in-process audit (steps and Dagster's work between them);
    # complete is False when the status store had dropped some of its jobs.
    spark: dict[str, Any] = field(default_factory=dict)
    # Calls from Python to the JVM (py4j commands, from every thread) during the in-process audit: the fixed
    # cost of building plans, in a count that hardly moves with the machine's load (benchmark/jvm_calls.py).
    jvm_calls: int = 0
    # The driver JVM's CPU seconds over the whole in-process audit (jvm_cpu_seconds,
    # jit_cpu_seconds, gc_cpu_seconds).
    cpu: dict[str, float] = field(default_factory=dict)
    # The same audit again in the same JVM (--in-process-audits), each into a fresh warehouse:
    # seconds, success and the JVM's CPU (what the audit costs once its code is compiled).
    repeated_audits: list[dict] = field(default_factory=list)
    # Per per-row table (OUTPUT_FLOOR_TABLES): its rows read alone and read and written again
    # as Parquet in this JVM after the audit (``output_floor``), and the write's share.
    output_floor: dict[str, dict[str, Any]] = field(default_factory=dict)
    output_write_seconds: Optional[float] = None  # the writes' sum: what the tables cost to write at least
    # The essential pass and the writes of the per-row tables it does not write (segments, watermarks, state), and
    # the audit process against that: how far the audit is from what writing the SPEC's tables costs at least.
    output_floor_seconds: Optional[float] = None
    audit_process_to_output_floor: Optional[float] = None
