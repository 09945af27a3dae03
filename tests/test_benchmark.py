"""The benchmark command keeps working, and what it reports adds up.

One tiny run of the uniform variant (module fixture); each test checks one property of its report
that a bug in the benchmark would break: the JSON keeps its documented fields, every step of
the audit job is reported, the rows are accounted from what the simulator wrote through every
step, the floors are measured and the ratios follow from them, and the per-step and per-table
figures fit inside the run. Timings are never compared with a threshold (they belong in the
benchmark itself): only with each other.

To extend: a new field of the report goes into the *_FIELDS sets below (the tests ask for a
subset, so fields added to replica_lens/benchmark/ do not break them), and gets an assertion
that says how it must relate to the others.
"""
from __future__ import annotations

import json
import math
import os
import platform
import statistics
from itertools import combinations

import pytest
from dagster import AssetKey

import replica_lens.simulator as simulator
from pipelines.ingest import judge_rows, read_snapshot_lines
from replica_lens.benchmark import CLOCK_TICKS, LARGE_SCALE, OUTPUT_FLOOR_TABLES, STEP_INPUTS, VARIANTS as BENCH_VARIANTS, \
    JvmCpu, JvmThreads, ProcessSampler, add_bad_lines, benchmark, print_report, scaling_ratios
from replica_lens.definitions import defs
from replica_lens.jobs import AUDIT_JOB

pytestmark = pytest.mark.slow

ROWS = 3_000
# One variant: every variant runs the same measurement code on a differently simulated snapshot
# (VariantSpec), so a second one would repeat every assertion below. The ratios between variants
# are scaling_ratios' (its own test), and every variant's simulation settings are checked without
# running it (test_every_variant_simulates_a_valid_snapshot).
VARIANTS = ("uniform",)
# The fields docs/performance.md documents (a subset: the benchmark may add more).
REPORT_FIELDS = {"machine", "requested_rows", "variants"}
MACHINE_FIELDS = {"cpus", "python", "spark"}
VARIANT_FIELDS = {
    "variant", "version_topic_rows", "floor_seconds", "parse_floor_seconds", "audit_seconds",
    "ratio_to_floor", "ratio_to_parse_floor", "steps", "peak_jvm_mib", "success", "cpu", "repeated_audits",
    "output_floor", "output_write_seconds", "essential_pass_seconds", "audit_process_seconds",
    "audit_process_to_essential_pass", "pair_ratios", "cpu_ratio", "target_cpu_budget_seconds",
    "explain_key_seconds", "explain_process_runs", "jvm_calls", "output_floor_seconds", "audit_process_to_output_floor",
}
CPU_FIELDS = {"jvm_cpu_seconds", "jit_cpu_seconds", "gc_cpu_seconds"}
STEP_FIELDS = {"step", "seconds", "rows_in", "rows_out", "peak_python_mib", "peak_jvm_mib", "tables"} | CPU_FIELDS
TABLE_TIMING_FIELDS = {"write_seconds", "commit_seconds"}
ROUNDING_S = 0.005  # the benchmark rounds seconds to 10 ms


def _mem_total_mib() -> float:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no MemTotal in /proc/meminfo")


@pytest.fixture(scope="module")
def run(spark, tmp_path_factory):
    """(report, JSON text written, per variant what the simulator wrote and its ground truth)."""
    tmp = tmp_path_factory.mktemp("benchmark")
    simulated = []
    real_simulate = simulator.simulate

    def recording_simulate(*args, **kwargs):
        summary = real_simulate(*args, **kwargs)
        with open(summary["ground_truth"], encoding="utf-8") as truth:
            simulated.append((summary, json.load(truth)))  # read now: the work folder is removed after the run
        return summary

    out = tmp / "bench.json"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(simulator, "simulate", recording_simulate)
        report = benchmark(rows=ROWS, variants=VARIANTS, out=str(out), workdir=str(tmp / "work"), in_process_audits=2)
    assert len(simulated) == len(VARIANTS), "the benchmark should simulate one snapshot per variant"
    return report, out.read_text(encoding="utf-8"), dict(zip(VARIANTS, simulated))


def _steps(variant: dict) -> dict[str, dict]:
    steps = {step["step"]: step for step in variant["steps"]}
    assert len(steps) == len(variant["steps"]), f"a step is reported twice: {[s['step'] for s in variant['steps']]}"
    return steps


def _audit_job_layout() -> tuple[set[str], dict[str, set[str]]]:
    """The audit job's steps (ops), and per asset step the tables it writes, from the definitions."""
    job = defs.resolve_job_def(AUDIT_JOB)
    layer = job.asset_layer
    written: dict[str, set[str]] = {}
    for key in layer.selected_asset_keys:
        written.setdefault(layer.get_op_output_handle(key).node_handle.name, set()).add(key.to_user_string())
    return {node.name for node in job.graph.nodes}, written


def test_the_json_round_trips_with_the_documented_fields(run):
    report, text, _ = run
    assert json.loads(text) == json.loads(json.dumps(report))
    assert REPORT_FIELDS <= set(report), sorted(REPORT_FIELDS - set(report))
    assert MACHINE_FIELDS <= set(report["machine"])
    assert report["machine"]["cpus"] == os.cpu_count()
    assert report["machine"]["python"] == platform.python_version()
    assert report["requested_rows"] == ROWS
    assert [v["variant"] for v in report["variants"]] == list(VARIANTS)
    for variant in report["variants"]:
        assert VARIANT_FIELDS <= set(variant), (variant["variant"], sorted(VARIANT_FIELDS - set(variant)))
        assert variant["success"] is True, variant["variant"]
        for step in variant["steps"]:
            assert STEP_FIELDS <= set(step), (step["step"], sorted(STEP_FIELDS - set(step)))
            for table, timings in step["tables"].items():
                assert TABLE_TIMING_FIELDS <= set(timings), (step["step"], table)


def test_every_step_of_the_audit_job_is_reported_with_the_tables_it_wrote(run):
    report, _, _ = run
    steps_of_job, written_by = _audit_job_layout()
    # The benchmark's notion of which table each step reads: every asset step, and a table it does read.
    assert set(STEP_INPUTS) == set(written_by)
    graph = defs.resolve_asset_graph()
    for step, upstream in STEP_INPUTS.items():
        parents = {p.to_user_string() for table in written_by[step] for p in graph.get(AssetKey(table)).parent_keys}
        assert (upstream in parents) if upstream else not parents, (step, upstream, parents)
    for variant in report["variants"]:
        steps = _steps(variant)
        assert set(steps) == steps_of_job, (variant["variant"], sorted(set(steps) ^ steps_of_job))
        for name, step in steps.items():
            # Each table under the step that wrote it, nowhere else; checks write no table.
            assert set(step["rows_out"]) == written_by.get(name, set()), (variant["variant"], name)
            # Every table written has its two timings (and nothing else does).
            assert set(step["tables"]) == set(step["rows_out"]), (variant["variant"], name)


def test_rows_are_accounted_from_the_simulator_through_every_step(run):
    report, _, simulated = run
    for variant in report["variants"]:
        name = variant["variant"]
        summary, truth = simulated[name]
        steps = _steps(variant)
        kinds = {}
        for per_replica in summary["rows"].values():
            for kind, count in per_replica.items():
                kinds[kind] = kinds.get(kind, 0) + count
        assert sum(kinds.values()) == summary["rows_total"]
        # The floor counted every line the simulator wrote, and the size follows --rows.
        assert variant["version_topic_rows"] == summary["rows_total"], name
        assert abs(summary["rows_total"] - ROWS) <= 0.1 * ROWS, (name, summary["rows_total"])

        # Ingestion read every simulated row; the benchmark's snapshots hold no bad or duplicate rows.
        raw = steps["raw_topic_snapshots"]
        assert raw["rows_in"] == summary["rows_total"], name
        assert raw["rows_out"] == {
            "raw_topic_snapshots": summary["rows_total"], "raw_topic_quarantine": 0, "raw_topic_skipped": 0,
        }, name

        # Each asset step read what its upstream step wrote (rows in = that table's rows out).
        writer = {table: step for step in steps for table in steps[step]["rows_out"]}
        for step, upstream in STEP_INPUTS.items():
            if upstream is None:
                continue
            assert steps[step]["rows_in"] == steps[writer[upstream]]["rows_out"][upstream], (name, step, upstream)

        # Rows out are the tables' sizes: what the simulator's rows and topology make of them.
        replicas = len(truth["regions"])
        replica_partitions = replicas * len(truth["topics"]) * truth["partitions"]
        data_rows = kinds.get("PUT", 0) + kinds.get("DELETE", 0)
        assert steps["stream_pass"]["rows_out"]["heartbeat_segments"] == (
            summary["rows_total"] - kinds.get("EXPORTER_POSITION", 0)
        ), name  # one per version-topic row
        assert steps["stream_pass"]["rows_out"]["reconstructed_watermarks"] == data_rows, name
        assert steps["stream_pass"]["rows_out"]["partition_watermarks"] == replica_partitions, name
        assert steps["exporter_tables"]["rows_out"]["compaction_bounds"] == replica_partitions, name
        pairs = len(list(combinations(truth["regions"], 2)))
        assert steps["divergence_reports"]["rows_out"]["divergence_summary"] == (
            pairs * len(truth["topics"]) * truth["partitions"]
        ), name


def test_the_floors_are_measured_and_the_ratios_follow_from_them(run):
    report, _, _ = run
    for variant in report["variants"]:
        name, audit = variant["variant"], variant["audit_seconds"]
        for floor, ratio in (("floor_seconds", "ratio_to_floor"), ("parse_floor_seconds", "ratio_to_parse_floor")):
            # An unmeasured floor (0) gives a NaN ratio; a ratio against another figure does not match.
            assert math.isfinite(variant[ratio]) and variant[ratio] > 0, (name, ratio, variant[ratio])
            assert variant[floor] == pytest.approx(audit / variant[ratio], abs=2 * ROUNDING_S), (name, floor)
        # Whole processes: the headline from the medians, and each alternated pair's own ratio (its spread).
        essential, audit_process = variant["essential_pass_runs"], variant["audit_process_runs"]
        assert len(essential) == len(audit_process) == report["process_runs"] >= 1, name
        assert variant["audit_process_to_essential_pass"] == pytest.approx(
            variant["audit_process_seconds"] / variant["essential_pass_seconds"], abs=0.01
        ), name
        # The audit against the essential pass plus the writes of the per-row tables the essential pass does not
        # write (catches the raw table's write counted twice, or the ratio taken against another figure).
        others = sum(t["write_seconds"] for table, t in variant["output_floor"].items() if table != "raw_topic_snapshots")
        assert set(variant["output_floor"]) > {"raw_topic_snapshots"}, name
        assert variant["output_floor_seconds"] == pytest.approx(variant["essential_pass_seconds"] + others, abs=0.02)
        assert variant["audit_process_to_output_floor"] == pytest.approx(
            variant["audit_process_seconds"] / variant["output_floor_seconds"], abs=0.01
        ), name
        assert variant["pair_ratios"] == [
            pytest.approx(a["seconds"] / e["seconds"], abs=0.01) for e, a in zip(essential, audit_process)
        ], name
        # Explaining one key of each audit process's warehouse, as a process of its own, succeeded and is timed.
        explained = variant["explain_process_runs"]
        assert len(explained) == len(audit_process) and all(r["exit_code"] == 0 for r in explained), explained
        assert variant["explain_key_seconds"] == pytest.approx(
            statistics.median(r["seconds"] for r in explained), abs=ROUNDING_S), name
        # CPU: each process's Python side (reaped) plus its JVM (sampled); both sides start a JVM and
        # import PySpark, so neither part may be missing. The CPU ratio is of the medians.
        for r in essential + audit_process:
            assert r["python_cpu_seconds"] > 0 and r["jvm_cpu_seconds"] > 0, (name, r)
            assert r["cpu_seconds"] == pytest.approx(r["python_cpu_seconds"] + r["jvm_cpu_seconds"], abs=0.02), name
        # The audit's Python side (Dagster, the definitions, the steps' plans) outweighs the essential pass's.
        assert min(r["python_cpu_seconds"] for r in audit_process) > max(r["python_cpu_seconds"] for r in essential), name
        assert variant["cpu_ratio"] == pytest.approx(
            statistics.median(r["cpu_seconds"] for r in audit_process)
            / statistics.median(r["cpu_seconds"] for r in essential), abs=0.01
        ), name
        # The CPU a process within the target could use: target x the essential pass x every core.
        target = variant["process_ratio_target"]
        if target is None:
            assert variant["target_cpu_budget_seconds"] is None, name
        else:
            assert variant["target_cpu_budget_seconds"] == pytest.approx(
                target * variant["essential_pass_seconds"] * report["machine"]["cpus"], abs=0.01
            ), name
    # Ratios between variants need two of them: none with uniform alone (scaling_ratios).
    assert not {"hot_to_uniform", "large_to_ten_uniform", "dirty_to_uniform"} & report.keys()


def test_step_figures_fit_inside_the_run(run):
    report, _, _ = run
    memory = _mem_total_mib()
    for variant in report["variants"]:
        name, steps = variant["variant"], variant["steps"]
        # Steps run one after another in one process, within the audit's wall time.
        assert sum(step["seconds"] for step in steps) <= variant["audit_seconds"] + len(steps) * ROUNDING_S, name
        for step in steps:
            # Each table's compute+write and read+validate happen inside the step that wrote it.
            inside = sum(t["write_seconds"] + t["commit_seconds"] for t in step["tables"].values())
            assert inside <= step["seconds"] + 2 * len(step["tables"]) * ROUNDING_S + ROUNDING_S, (name, step["step"])
            # Resident memory in MiB of a live JVM and of this interpreter (0: the JVM was not found;
            # out of range: a unit slip). Spark's driver alone is well above 100 MiB.
            assert 100 < step["peak_jvm_mib"] < memory, (name, step["step"], step["peak_jvm_mib"])
            assert 30 < step["peak_python_mib"] < memory, (name, step["step"], step["peak_python_mib"])
        assert variant["peak_jvm_mib"] == max(step["peak_jvm_mib"] for step in steps), name


def _consistent_cpu(figures: dict, seconds: float, where) -> None:
    """CPU split fits: compilers and collector within the total, the total within the cores' time."""
    jvm, jit, gc = (figures[k] for k in ("jvm_cpu_seconds", "jit_cpu_seconds", "gc_cpu_seconds"))
    assert jvm >= 0 and jit >= 0 and gc >= 0, (where, figures)
    assert jit + gc <= jvm + 2 * ROUNDING_S, (where, figures)
    # Interpolated between samples 100 ms apart: at most one interval's worth of every core over.
    assert jvm <= (seconds + 0.2) * os.cpu_count(), (where, figures, seconds)


def test_the_jvm_cpu_is_split_into_compilers_and_collector_per_step_and_per_process(run):
    report, _, _ = run
    for variant in report["variants"]:
        name, audit = variant["variant"], variant["cpu"]
        _consistent_cpu(audit, variant["audit_seconds"], name)
        # The JIT compilers' threads were found: HotSpot compiles during any audit, even in a warm JVM.
        assert audit["jit_cpu_seconds"] > 0, (name, audit)
        steps = variant["steps"]
        for step in steps:
            _consistent_cpu(step, step["seconds"], (name, step["step"]))
        # Steps are disjoint windows inside the audit's.
        for key in CPU_FIELDS:
            assert sum(step[key] for step in steps) <= audit[key] + len(steps) * 2 * ROUNDING_S, (name, key)
        for kind in ("essential_pass_runs", "audit_process_runs"):
            for process in variant[kind]:
                _consistent_cpu(process, process["seconds"], (name, kind))
                # A fresh JVM compiles from its first second: no JIT time means its threads were not read.
                assert process["jit_cpu_seconds"] > 0 and process["jvm_cpu_seconds"] > process["jit_cpu_seconds"], (
                    name, kind, process)


def _fake_thread(root, tid: str, name: str, ticks: int) -> None:
    task = root / "task" / tid
    task.mkdir(parents=True, exist_ok=True)
    (task / "comm").write_text(name + "\n")
    # /proc/<pid>/task/<tid>/stat: utime and stime are the 14th and 15th fields (the name may hold spaces).
    (task / "stat").write_text(f"{tid} ({name}) S 1 1 1 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 1 0\n")


def test_jvm_threads_are_classified_by_name_and_an_ended_compiler_keeps_its_time(tmp_path):
    """Against a fake /proc: a misread stat field, a wrong thread name, or a compiler thread
    whose time vanishes when HotSpot retires it would each change the split."""
    root = tmp_path / "4242"
    (root / "task").mkdir(parents=True)
    (root / "stat").write_text(f"4242 (java) S 1 1 1 0 -1 0 0 0 0 0 {50 * CLOCK_TICKS} {10 * CLOCK_TICKS} 0 0 20 0 9 0\n")
    _fake_thread(root, "4243", "C2 CompilerThre", 7 * CLOCK_TICKS)
    _fake_thread(root, "4244", "C1 CompilerThre", 2 * CLOCK_TICKS)
    _fake_thread(root, "4245", "GC Thread#0", 3 * CLOCK_TICKS)
    _fake_thread(root, "4246", "Executor task l", 30 * CLOCK_TICKS)
    _fake_thread(root, "4247", "G1 Conc#0", 1 * CLOCK_TICKS)
    threads = JvmThreads(4242, proc=str(tmp_path))
    assert threads.read() == JvmCpu(total=60.0, jit=9.0, gc=4.0)
    # HotSpot retires an idle compiler thread: its 7 s were spent all the same.
    for entry in (root / "task" / "4243").iterdir():
        entry.unlink()
    (root / "task" / "4243").rmdir()
    _fake_thread(root, "4244", "C1 CompilerThre", 3 * CLOCK_TICKS)
    assert threads.read() == JvmCpu(total=60.0, jit=10.0, gc=4.0)
    # The JVM has exited: nothing to read.
    assert JvmThreads(9999, proc=str(tmp_path)).read() is None


def test_cpu_between_two_instants_interpolates_between_samples():
    sampler = ProcessSampler(pid=os.getpid())  # not started: samples set by hand
    sampler.cpu_samples = [(10.0, JvmCpu(1.0, 0.5, 0.0)), (11.0, JvmCpu(3.0, 1.5, 0.2)), (12.0, JvmCpu(4.0, 1.5, 0.2))]
    middle = sampler.cpu_between(10.5, 11.5)
    assert (middle.total, middle.jit, middle.gc) == pytest.approx((1.5, 0.5, 0.1))
    # Outside the samples: the nearest one (nothing measured before the first or after the last).
    assert sampler.cpu_between(0.0, 10.0) == JvmCpu(0.0, 0.0, 0.0)
    assert sampler.cpu_between(11.0, 99.0) == JvmCpu(1.0, 0.0, 0.0)
    assert sampler.last_cpu() == JvmCpu(4.0, 1.5, 0.2)


def test_the_audit_is_repeated_in_the_same_jvm_when_asked(run):
    """--in-process-audits 2: one more audit per variant, after the per-step one, with its own figures."""
    report, _, _ = run
    assert report["in_process_audits"] == 2
    for variant in report["variants"]:
        name, repeated = variant["variant"], variant["repeated_audits"]
        assert len(repeated) == 1, (name, repeated)
        again = repeated[0]
        assert again["success"] is True, (name, again)
        assert again["seconds"] > 0 and again["jvm_cpu_seconds"] > 0, (name, again)
        _consistent_cpu(again, again["seconds"], (name, "repeated"))


def test_the_report_prints_the_target_cpu_budget_beside_the_warm_audit_s_cpu(run, capsys):
    """The printed report puts a target's CPU budget next to what the audit costs in a warm JVM."""
    report, _, _ = run
    print_report(report)
    lines = [line.strip() for line in capsys.readouterr().out.splitlines() if "target could use" in line]
    budgeted = [v for v in report["variants"] if v["target_cpu_budget_seconds"]]
    assert budgeted and len(lines) == len(budgeted), (lines, [v["variant"] for v in budgeted])
    for line, variant in zip(lines, budgeted):
        warm = variant["repeated_audits"][0]["jvm_cpu_seconds"]
        budget = variant["target_cpu_budget_seconds"]
        assert line.startswith(f"CPU an audit process within the {variant['process_ratio_target']}x target could use: "
                               f"{budget} s"), line
        assert f"used {warm} s of JVM CPU ({round(100 * warm / budget)}% of it)" in line, line


def test_the_calls_to_the_jvm_are_counted_over_the_in_process_audit_and_only_there(spark, run):
    """Bug caught: the counter not wrapping the audit (zero, or the few calls of the floors), or left installed after it
    (every later call of the process counted, and slowed)."""
    from replica_lens.benchmark.jvm_calls import counting_jvm_calls

    report, _, _ = run
    for variant in report["variants"]:
        assert variant["jvm_calls"] > 1_000, f"{variant['jvm_calls']} calls: an audit builds thousands of plan parts"
    with counting_jvm_calls() as count:
        spark._jvm.java.lang.Math.abs(-1)
    assert count.calls >= 1
    after = count.calls
    spark._jvm.java.lang.Math.abs(-1)
    assert count.calls == after


def test_the_output_floor_rewrites_each_per_row_table_the_audit_wrote(run):
    """Each per-row table read back and written again: the rows the step wrote, and the write's share.

    Fails if a table is left out or another is measured, if the copy read another table or
    lost rows (its observed count differs from the step's), or if the write's share or the
    sum is not computed from the two timings.
    """
    report, _, _ = run
    for variant in report["variants"]:
        name, floor = variant["variant"], variant["output_floor"]
        assert list(floor) == list(OUTPUT_FLOOR_TABLES), name
        written = {table: rows for step in variant["steps"] for table, rows in step["rows_out"].items()}
        for table, costs in floor.items():
            assert costs["rows"] == written[table] > 0, (name, table, costs, written[table])
            assert costs["read_seconds"] > 0 and costs["copy_seconds"] > 0, (name, table, costs)
            assert costs["write_seconds"] == pytest.approx(costs["copy_seconds"] - costs["read_seconds"], abs=1e-9), (
                name, table, costs
            )
        assert variant["output_write_seconds"] == pytest.approx(
            sum(c["write_seconds"] for c in floor.values()), abs=len(floor) * ROUNDING_S
        ), name


def test_the_scaling_ratios_compare_each_variant_with_uniform_audits():
    """hot against one uniform audit, large against LARGE_SCALE of them; nothing without uniform.

    Fails if a ratio is inverted, if large is compared with one uniform audit instead of
    ten, or if a ratio is made up for a variant that did not run.
    """
    assert LARGE_SCALE == 10
    assert scaling_ratios({"uniform": 100.0, "hot": 130.0, "large": 1100.0, "tiny": 10.0, "dirty": 120.0}) == {
        "hot_to_uniform": 1.3,
        "large_to_ten_uniform": 1.1,
        "dirty_to_uniform": 1.2,
    }
    assert scaling_ratios({"uniform": 100.0, "tiny": 10.0}) == {}
    assert scaling_ratios({"hot": 130.0, "large": 1100.0}) == {}


def test_the_dirty_variant_adds_lines_the_ingestion_quarantines_for_each_part_of_the_quarantine(spark, tmp_path):
    """Every line ``add_bad_lines`` appends is quarantined, and they reach both parts of the quarantine's pass.

    Bugs caught: an injected line the ingestion accepts (the variant would not measure the
    quarantine), or one kind only (own problems without conflicts, or the reverse), so that
    one part of the quarantine's pass goes unmeasured.
    """
    folder = tmp_path / "landing" / "dirty"
    simulator.simulate(str(tmp_path / "landing"), "dirty", simulator.SimulationConfig(seed=3, regions=2, partitions=2, keys=20, writes=40))
    files = sorted(folder.glob("*.jsonl"))
    before = sum(1 for f in files for _ in f.open())
    per_file = BENCH_VARIANTS["dirty"].bad_lines_per_file
    assert add_bad_lines(folder, per_file) == per_file * len(files)
    judgement = judge_rows(read_snapshot_lines(spark, str(folder)), "dirty")
    # The good lines are all still accepted, but the row each conflicting copy sits beside.
    assert judgement.accepted.count() == before - len(files)
    reasons = sorted(r["reason"] for r in judgement.quarantine().collect())
    # Per file: one of each own problem, and the copied row with its original at one position.
    assert reasons == sorted(
        ["MALFORMED_JSON", "BAD_TYPE", "MISSING_FIELD", "CONFLICTING_POSITION", "CONFLICTING_POSITION"] * len(files)
    )


def test_every_variant_simulates_a_valid_snapshot():
    """Catches a variant whose simulation settings the simulator refuses (it would fail only in a real run)."""
    from replica_lens.benchmark.run import variant_config

    for name in BENCH_VARIANTS:
        config = variant_config(name, 3_000)
        assert config.writes > 0 and config.file_format == "jsonl", name
    assert variant_config("hot", 3_000).hot_key_fraction == 0.01
