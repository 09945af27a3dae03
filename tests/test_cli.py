"""The command line's contract: a usage error in one line (exit 2), a bug reported as a bug (exit 70), an audit ending."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import replica_lens.simulator as simulator
from replica_lens.cli import EXIT_DIVERGENCE, EXIT_INTERNAL, EXIT_USAGE, main


def test_a_setting_out_of_range_is_a_usage_error_in_one_line(tmp_path, capsys):
    # Catches: usage errors left to escape as a traceback, or reported with another exit code.
    assert main(["simulate", "--out", str(tmp_path), "--regions", "0"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("replica-lens: ") and "regions must be at least 1" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_an_existing_snapshot_and_an_unknown_benchmark_variant_are_usage_errors(tmp_path, capsys):
    # Catches: a usage error class that lost its UsageError base (it would then be reported as a bug).
    assert main(["simulate", "--out", str(tmp_path), "--snapshot-id", "s1", "--writes", "5"]) == 0
    capsys.readouterr()
    assert main(["simulate", "--out", str(tmp_path), "--snapshot-id", "s1", "--writes", "5"]) == EXIT_USAGE
    assert "already exists" in capsys.readouterr().err
    out = tmp_path / "bench.json"
    assert main(["benchmark", "--variants", "nope", "--json", str(out), "--process-runs", "0"]) == EXIT_USAGE
    assert "unknown variant(s) nope" in capsys.readouterr().err
    assert main(["benchmark", "--variants", "tiny", "--in-process-audits", "0", "--json", str(out), "--process-runs", "0"]) == EXIT_USAGE
    assert "in_process_audits must be at least 1" in capsys.readouterr().err


@pytest.mark.parametrize("verbose", [False, True])
def test_a_value_error_from_a_bug_is_reported_as_a_bug_not_as_a_usage_error(tmp_path, capsys, monkeypatch, verbose):
    # Catches: every ValueError taken for the user's mistake (exit 2, "fix your input"), and the
    # traceback printed without --verbose or withheld with it.
    def broken(*_args, **_kwargs):
        raise ValueError("cannot reshape array of size 3\nsecond line of detail")

    monkeypatch.setattr(simulator, "simulate", broken)
    argv = ["simulate", "--out", str(tmp_path)] + (["--verbose"] if verbose else [])
    assert main(argv) == EXIT_INTERNAL
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("replica-lens: internal error (ValueError: cannot reshape array of size 3)")
    assert "this is a bug" in last and "--verbose" in last
    assert ("Traceback" in err) is verbose
    if not verbose:
        assert len(err.strip().splitlines()) == 1


def test_simulate_reports_progress_per_topic_partition_on_stderr(tmp_path, capsys, monkeypatch):
    # Catches: no progress on large simulations (nothing moves for minutes), progress mixed
    # into stdout (which scripts parse), a wrong count of partitions or rows, or one line per
    # partition however fast they come (thousands of lines for a wide simulation).
    import replica_lens.cli as cli

    clock = iter(range(0, 1000, 1))  # one second per reading: every call is due
    monkeypatch.setattr(cli.time, "monotonic", lambda: next(clock))
    argv = ["simulate", "--out", str(tmp_path), "--snapshot-id", "s1", "--writes", "200", "--partitions", "3",
            "--topics", "2"]
    assert main(argv) == 0
    out = capsys.readouterr()
    progress = [line for line in out.err.splitlines() if "topic partition" in line]
    rows_total = int(next(line for line in out.out.splitlines() if "rows_total" in line).split(":")[1])
    assert [line.split(":")[0] for line in progress] == [f"simulated topic partition {i}/6" for i in (2, 4, 6)]
    assert progress[-1].split(": ")[1].startswith(f"{rows_total:,} rows")
    assert "topic partition" not in out.out

    # A fast simulation prints its last line only.
    monkeypatch.setattr(cli.time, "monotonic", lambda: 0.0)
    assert main([*argv[:4], "s2", *argv[5:]]) == 0
    progress = [line for line in capsys.readouterr().err.splitlines() if "topic partition" in line]
    assert [line.split(":")[0] for line in progress] == ["simulated topic partition 6/6"]


class _Terminal:
    """A stream that says it is a terminal and keeps what is written to it."""

    def __init__(self, tty: bool) -> None:
        self.tty, self.written = tty, []

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> None:
        self.written.append(text)

    def flush(self) -> None:
        pass


def test_the_status_line_moves_on_a_terminal_and_stays_off_pipes(spark):
    # Catches: a status line that never updates while a step runs, control characters
    # written into a pipe or a file, or a line left on the screen after the run.
    import time

    from replica_lens.console import status_line

    terminal = _Terminal(tty=True)
    with status_line(terminal, "auditing s1", every=0.05):
        spark.range(2_000_000).selectExpr("sum(id * id)").collect()
        time.sleep(0.3)
    updates = [w for w in terminal.written if "auditing s1: 0m" in w]
    assert len(updates) >= 3 and all(w.startswith("\r\x1b[K") for w in updates)
    assert terminal.written[-1] == "\r\x1b[K"  # erased at the end

    pipe = _Terminal(tty=False)
    with status_line(pipe, "auditing s1", every=0.05):
        time.sleep(0.2)
    assert pipe.written == []
    quiet = _Terminal(tty=True)
    with status_line(quiet, "auditing s1", every=0.05, enabled=False):
        time.sleep(0.2)
    assert quiet.written == []


def test_vacuum_prints_a_line_per_table_and_a_dry_run_changes_nothing(tmp_path, capsys):
    # Catches: the command not wired (or not reaching DeltaStore.vacuum), --dry-run or
    # --retention-hours ignored, a summary without the per-table files and bytes, or a
    # warehouse path typo taken for an empty warehouse instead of a usage error.
    import os
    import time

    import pyarrow as pa
    from deltalake import write_deltalake

    warehouse = tmp_path / "warehouse"
    for table in ("alpha", "beta"):
        write_deltalake(str(warehouse / table), pa.table({"offset": [1], "snapshot_id": ["s1"]}),
                        partition_by=["snapshot_id"])
    orphan = warehouse / "alpha" / "write-crashed" / "part-0.parquet"
    orphan.parent.mkdir()
    orphan.write_bytes(b"x" * 1234)
    old = time.time() - 8 * 24 * 3600
    os.utime(orphan, (old, old))

    assert main(["vacuum", "--warehouse", str(warehouse), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "retention 168 h; dry run" in out[0]
    assert [line.split()[:3] for line in out[2:4]] == [["alpha", "1", "1,234"], ["beta", "0", "0"]]
    assert out[-1] == "would remove 1 files, 1,234 bytes in 2 tables" and orphan.exists()

    assert main(["vacuum", "--warehouse", str(warehouse), "--retention-hours", "240"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("removed 0 files") and orphan.exists()
    assert main(["vacuum", "--warehouse", str(warehouse), "--compact"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "removed 1 files, 1,234 bytes in 2 tables"
    assert not orphan.parent.exists()

    assert main(["vacuum", "--warehouse", str(tmp_path / "nope")]) == EXIT_USAGE
    assert "no warehouse at" in capsys.readouterr().err
    assert main(["vacuum", "--warehouse", str(warehouse), "--retention-hours", "-1"]) == EXIT_USAGE
    assert "retention_hours must be" in capsys.readouterr().err


def test_the_summary_names_stream_anomalies_by_kind_and_ends_no_line_with_a_blank():
    # Bug caught: the anomalies line printed with a trailing blank when there were none (an
    # operator's grep for "anomalies: 0$" missed it), or the counts by kind left out.
    from replica_lens.audit import SnapshotAudit, summary_lines

    clean = SnapshotAudit("s1", True, "run-0001", {"stream_anomalies": {"dagster/row_count": 0, "by_anomaly": ""}})
    assert "  stream anomalies: 0" in summary_lines(clean)
    found = SnapshotAudit("s1", True, "run-0001", {"stream_anomalies": {"dagster/row_count": 2, "by_anomaly": "REWIND 2"}})
    assert "  stream anomalies: 2 REWIND 2" in summary_lines(found)
    assert not any(line.endswith(" ") for line in summary_lines(clean) + summary_lines(found))


# A child process: the audit command's handler replaced by one that prints (block-buffered: stdout is a pipe),
# registers an exit handler, and returns DIVERGENCE's code; the command then ends as ``ending`` ends it.
_ENDING_CHILD = """
import atexit, sys
import replica_lens.cli as cli

def audit(args):
    print("audit output", flush=False)
    atexit.register(lambda: print("exit handler ran", file=sys.stderr))
    return cli.EXIT_DIVERGENCE

cli._audit = audit
argv = ["audit", "--landing", "landing", "--warehouse", "warehouse"]
{ending}
"""


def test_the_command_ends_an_audit_at_once_with_its_output_its_exit_handlers_and_its_code():
    # Catches: the audit's ending losing what is still buffered on stdout, its exit code, or the exit handlers
    # (PySpark's stops the JVM) once the interpreter's teardown is skipped; and ``main``, which tests and scripts
    # call in their own process, ending that process instead of returning the code.
    # Buffered, as a user's pipe is (some environments set PYTHONUNBUFFERED).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    child = _ENDING_CHILD.format(ending="cli.run(argv)")
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == EXIT_DIVERGENCE, done.stderr
    assert done.stdout == "audit output\n"
    assert done.stderr.strip().endswith("exit handler ran"), done.stderr
    # Through main (tests, scripts): the code is returned, the process is not ended.
    child = _ENDING_CHILD.format(ending="print('returned', cli.main(argv))")
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0 and done.stdout == f"audit output\nreturned {EXIT_DIVERGENCE}\n", done
