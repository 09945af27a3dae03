"""``replica-lens benchmark``: where the time of an audit goes, against what any audit must pay.

For each variant (uniform keys; hot keys, where 1% of the keys take half of the writes;
tiny, a ~1,500-row snapshot for the fixed cost) it simulates a snapshot and measures:

1. **Floors**, in this process's JVM after one warm-up read (JVM warm, files in the page
   cache): the *floor*, Spark reading the landing files and counting their lines, and the
   *parse floor*, Spark parsing every line into the SPEC 1 fields once.
2. **The essential pass and the audit, each as a whole process** (``--process-runs``
   times, alternating): the *essential pass* (:func:`essential_pass`) is a fresh Python
   process that starts a Spark session with the audit's settings, reads the JSONL files
   with an explicit SPEC 1 schema, adds one window over (replica, topic, partition,
   source_region) ordered by offset (a running max of ``source_offset``) and writes every
   row once as Parquet: the least a program must do to read the snapshot, order each
   stream and write it down. The *audit process* is ``replica-lens audit --landing ...
   --warehouse ... --snapshot-id ...`` into a fresh warehouse. Both are timed from process
   start to exit (interpreter and JVM start-up, imports, the JVM's shutdown included), so
   both pay the same start-up. ``audit_process_to_essential_pass`` (audit process seconds
   / essential pass seconds) is the headline ratio.
3. **The audit in this process, per step**: the same audit run through Dagster in this
   process's (warm) JVM, whose step boundaries come from Dagster's step events. Per asset
   step: wall time, rows in and out, the Spark jobs and stages it ran, the shuffle bytes
   read and written and the bytes spilled to disk (from the JVM's status store, attributed
   to the step whose window holds their submission time), the peak resident memory of the
   Spark driver JVM and of this Python process, and per table it wrote the timings its
   materialization carries (``write_seconds``, ``check_seconds``, ``commit_seconds``:
   whichever the assets record).
4. **The output floor**, in this process's JVM after the in-process audit: each per-row
   table the audit wrote (the raw table, segments, watermarks, the carried state) read
   alone, then read and written again as Parquet with the audit's writer options
   (:func:`output_floor`). The difference is what writing that table costs by itself, so a
   step's ``write_seconds`` minus it is what computing the table costs; their sum,
   ``output_write_seconds``, is a floor under any audit that writes these tables.

This process's JVM serves the floors and the in-process audits of every variant, so its
resident memory only grows: a variant's ``peak_jvm_mib`` includes what earlier variants
left. The whole-process runs each report the peaks of their own interpreter and JVM.

The per-step figures come from a second, in-process run rather than from the audit
process because the audit process is left exactly as users run it (no instrumentation, no
extra output), while the in-process run can read the JVM's status store and sample the
JVM's memory between Dagster's step events. Its total (``audit_seconds``) is the audit
without start-up, in a JVM that has already run the floors.

Results are printed as tables and written as JSON so that runs can be compared. Timings
are noisy on a shared machine: compare the ratios within one run, not seconds across runs.

The parts, one module each: ``variants`` (the snapshots simulated, the targets, the ratios
between variants), ``proc`` (memory and CPU read from ``/proc``), ``spark_activity`` (jobs
and stages from the JVM's status store), ``floors`` (1 and 4), ``essential`` (the essential
pass, run by ``__main__`` as ``python -m replica_lens.benchmark essential``), ``processes``
(2), ``figures`` (what the report holds per variant and per step), ``measure`` (one variant:
its snapshot, then 1 to 4 in turn, 3 itself), ``run`` (:func:`benchmark`: every variant, the JSON) and ``report``
(:func:`print_report`). Every name other code uses is importable from this package.
"""
from __future__ import annotations

from replica_lens.benchmark.essential import ESSENTIAL_MARKER, essential_pass, raw_message_schema
from replica_lens.benchmark.figures import StepFigures, VariantFigures
from replica_lens.benchmark.floors import OUTPUT_FLOOR_TABLES, output_floor
from replica_lens.benchmark.measure import QUIET_LOG_LEVEL, SERIAL, TABLE_TIMINGS, run_variant
from replica_lens.benchmark.proc import CLOCK_TICKS, GC_THREADS, JIT_THREADS, JvmCpu, JvmThreads, ProcessSampler
from replica_lens.benchmark.processes import ProcessRun, audit_command, run_audit_process, run_essential_process
from replica_lens.benchmark.report import print_report
from replica_lens.benchmark.run import benchmark
from replica_lens.benchmark.spark_activity import SparkActivity, SparkFigures
from replica_lens.benchmark.variants import (
    BAD_LINE_KINDS,
    HOT_TO_UNIFORM_TARGET,
    LARGE_SCALE,
    LARGE_TO_TEN_UNIFORM_TARGET,
    PROCESS_RATIO_TARGETS,
    TINY_ROWS,
    VARIANTS,
    VariantSpec,
    add_bad_lines,
    scaling_ratios,
)
from replica_lens.steps import STEP_INPUTS

__all__ = [
    "BAD_LINE_KINDS",
    "CLOCK_TICKS",
    "ESSENTIAL_MARKER",
    "GC_THREADS",
    "HOT_TO_UNIFORM_TARGET",
    "JIT_THREADS",
    "LARGE_SCALE",
    "LARGE_TO_TEN_UNIFORM_TARGET",
    "OUTPUT_FLOOR_TABLES",
    "PROCESS_RATIO_TARGETS",
    "QUIET_LOG_LEVEL",
    "SERIAL",
    "STEP_INPUTS",
    "TABLE_TIMINGS",
    "TINY_ROWS",
    "VARIANTS",
    "JvmCpu",
    "JvmThreads",
    "ProcessRun",
    "ProcessSampler",
    "SparkActivity",
    "SparkFigures",
    "StepFigures",
    "VariantFigures",
    "VariantSpec",
    "add_bad_lines",
    "audit_command",
    "benchmark",
    "essential_pass",
    "output_floor",
    "print_report",
    "raw_message_schema",
    "run_audit_process",
    "run_essential_process",
    "run_variant",
    "scaling_ratios",
]
