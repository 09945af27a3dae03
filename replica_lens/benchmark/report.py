"""The readable report: the benchmark's results printed as tables."""
from __future__ import annotations

from replica_lens.benchmark.variants import HOT_TO_UNIFORM_TARGET, LARGE_SCALE, LARGE_TO_TEN_UNIFORM_TARGET


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def print_report(report: dict) -> None:
    print(f"commit {report.get('commit')}, {report['machine']['cpus']} cpus, Spark {report['machine']['spark']}")
    processes = [v for v in report["variants"] if v.get("audit_process_seconds") is not None]
    if processes:
        print()
        print("Whole processes, start to exit (median of %d run(s) each)" % report.get("process_runs", 1))
        print(
            f"  {'variant':<8} {'rows':>10} {'essential pass':>15} {'audit process':>14} {'ratio':>7} {'target':>7}"
            f" {'CPU ratio':>10}  each pair (in run order)"
        )
        for v in processes:
            target = v.get("process_ratio_target")
            pairs = ", ".join(f"{r}x" for r in v.get("pair_ratios", []))
            cpu = f"{v['cpu_ratio']}x" if v.get("cpu_ratio") is not None else "-"
            print(
                f"  {v['variant']:<8} {v['version_topic_rows']:>10} {v['essential_pass_seconds']:>13} s "
                f"{v['audit_process_seconds']:>12} s {v['audit_process_to_essential_pass']:>6}x "
                f"{'<= ' + str(target) if target else '':>7} {cpu:>10}  {pairs}"
            )
        for v in processes:
            if v.get("explain_key_seconds") is not None:
                runs = ", ".join(f"{r['seconds']} s" for r in v.get("explain_process_runs", []))
                print(f"  {v['variant']}: replica-lens explain of one key, median {v['explain_key_seconds']} s ({runs})")
    for variant in report["variants"]:
        print()
        print(
            f"{variant['variant']}: {variant['version_topic_rows']} rows, floor {variant['floor_seconds']} s, "
            f"parse floor {variant['parse_floor_seconds']} s, audit in-process {variant['audit_seconds']} s "
            f"({variant['ratio_to_floor']}x floor, {variant['ratio_to_parse_floor']}x parse floor), "
            f"peak JVM {variant['peak_jvm_mib']} MiB{'' if variant['success'] else ', RUN FAILED'}"
        )
        for kind, runs in (("essential pass", variant.get("essential_pass_runs", [])), ("audit process", variant.get("audit_process_runs", []))):
            for run in runs:
                detail = run["detail"]
                inner = ""
                if "session_seconds" in detail:
                    inner = f" (session {detail['session_seconds']} s, pass {detail['pass_seconds']} s, {detail.get('rows_written')} rows written)"
                failed = "" if run["exit_code"] == 0 else f" EXIT {run['exit_code']}: {detail.get('stderr_tail', '')[-300:]}"
                cpu = (
                    f"  JVM CPU {run.get('jvm_cpu_seconds', 0)} s (JIT {run.get('jit_cpu_seconds', 0)} s, "
                    f"GC {run.get('gc_cpu_seconds', 0)} s), Python CPU {run.get('python_cpu_seconds', 0)} s"
                )
                print(f"  {kind:<15} {run['seconds']:>8} s  jvm {run['peak_jvm_mib']:>7} MiB  py {run['peak_python_mib']:>6} MiB{cpu}{inner}{failed}")
        width = max([26] + [len(step["step"]) for step in variant["steps"]])
        print(
            f"  {'step':<{width}} {'seconds':>8} {'jobs':>5} {'stages':>6} {'shuffle rd':>11} {'shuffle wr':>11} "
            f"{'spilled':>9} {'rows in':>10} {'rows out':>10} {'jvm MiB':>8} {'py MiB':>7} {'CPU s':>7} {'JIT s':>7} {'GC s':>6}"
        )
        for step in variant["steps"]:
            print(
                f"  {step['step']:<{width}} {step['seconds']:>8} {step['spark_jobs']:>5} {step['spark_stages']:>6} "
                f"{_bytes(step['shuffle_read_bytes']):>11} {_bytes(step['shuffle_write_bytes']):>11} {_bytes(step['disk_spill_bytes']):>9} "
                f"{step['rows_in']!s:>10} {sum(step['rows_out'].values()):>10} {step['peak_jvm_mib']:>8} {step['peak_python_mib']:>7} "
                f"{step.get('jvm_cpu_seconds', 0):>7} {step.get('jit_cpu_seconds', 0):>7} {step.get('gc_cpu_seconds', 0):>6}"
            )
            for table, times in sorted(step.get("tables", {}).items()):
                print(f"      {table:<{width - 4}} " + "  ".join(f"{key.replace('_seconds', '')} {value} s" for key, value in times.items()))
        spark = variant.get("spark") or {}
        if spark:
            steps = variant["steps"]
            print(
                f"  {'(between steps)':<{width}} {round(variant['audit_seconds'] - sum(s['seconds'] for s in steps), 2):>8} "
                f"{spark['jobs'] - sum(s['spark_jobs'] for s in steps):>5} {spark['stages'] - sum(s['spark_stages'] for s in steps):>6}"
            )
            print(
                f"  {'whole in-process audit':<{width}} {variant['audit_seconds']:>8} {spark['jobs']:>5} {spark['stages']:>6} "
                f"{_bytes(spark['shuffle_read_bytes']):>11} {_bytes(spark['shuffle_write_bytes']):>11} {_bytes(spark['disk_spill_bytes']):>9}"
                + ("" if spark.get("complete", True) else "  (status store dropped jobs: Spark figures incomplete)")
            )
        if variant.get("jvm_calls"):
            print(f"  calls from Python to the JVM during the in-process audit: {variant['jvm_calls']}")
        cpu = variant.get("cpu") or {}
        if cpu:
            print(
                f"  driver JVM CPU over the in-process audit: {cpu['jvm_cpu_seconds']} s, of which JIT compilers "
                f"{cpu['jit_cpu_seconds']} s, garbage collector {cpu['gc_cpu_seconds']} s"
            )
        for table, costs in variant.get("output_floor", {}).items():
            print(
                f"  output floor {table}: {costs['rows']} rows read {costs['read_seconds']} s, read and written "
                f"{costs['copy_seconds']} s: the write alone {costs['write_seconds']} s"
            )
        if variant.get("output_write_seconds") is not None:
            print(f"  output floor, the per-row tables' writes together: {variant['output_write_seconds']} s")
        if variant.get("audit_process_to_output_floor") is not None:
            print(f"  audit process / (essential pass + the other per-row tables' writes, "
                  f"{variant['output_floor_seconds']} s): {variant['audit_process_to_output_floor']}x")
        for again in variant.get("repeated_audits", []):
            print(
                f"  the same audit again in this JVM: {again['seconds']} s{'' if again['success'] else ' (RUN FAILED)'}, "
                f"JVM CPU {again['jvm_cpu_seconds']} s, of which JIT compilers {again['jit_cpu_seconds']} s, "
                f"garbage collector {again['gc_cpu_seconds']} s"
            )
        budget = variant.get("target_cpu_budget_seconds")
        if budget:
            warm = variant.get("repeated_audits") or []
            used = (f"; the same audit again in this JVM used {warm[0]['jvm_cpu_seconds']} s of JVM CPU "
                    f"({round(100 * warm[0]['jvm_cpu_seconds'] / budget)}% of it)") if warm else ""
            print(
                f"  CPU an audit process within the {variant['process_ratio_target']}x target could use: {budget} s "
                f"({variant['process_ratio_target']} x essential pass {variant['essential_pass_seconds']} s x "
                f"{report['machine']['cpus']} cores){used}"
            )
    if "hot_to_uniform" in report:
        print()
        print(f"hot-key / uniform (in-process audit): {report['hot_to_uniform']}x (target <= {HOT_TO_UNIFORM_TARGET})")
    if "large_to_ten_uniform" in report:
        print()
        print(
            f"large / {LARGE_SCALE} x uniform (in-process audit): {report['large_to_ten_uniform']}x "
            f"(target <= {LARGE_TO_TEN_UNIFORM_TARGET})"
        )
    if "dirty_to_uniform" in report:
        print()
        print(f"dirty / uniform (in-process audit, the quarantine's pass): {report['dirty_to_uniform']}x")
