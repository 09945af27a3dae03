"""The suite's own runner (scripts/test.sh): what CI does when a test takes its worker down."""
from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent


def _runner_options() -> list[str]:
    """The pytest options of scripts/test.sh's command (``exec .venv/bin/python -m pytest ... "$@"``)."""
    (line,) = [line for line in (PROJECT / "scripts" / "test.sh").read_text().splitlines()
               if line.startswith("exec ") and " -m pytest " in line]
    return [word for word in shlex.split(line.split(" -m pytest ", 1)[1]) if word != "$@"]


def test_a_test_that_crashes_its_worker_fails_the_run_at_once(tmp_path):
    """A test that takes its worker process down (a segmentation fault in a native library, as fastparquet's page
    header reader did now and then) with the options of scripts/test.sh and the suite's scheduler (tests/conftest.py:
    whole files per worker). Catches a runner that replaces the crashed worker and hands it the crashed file again:
    here the crash is run nine times; in a whole suite run (a crash in tests/test_parquet_pages.py) and in a run of
    three files with the crash among them, the run never ended (CI waits out its timeout and nothing lands)."""
    shutil.copy(PROJECT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_crashes.py").write_text(
        "import os, signal\n\ndef test_before():\n    pass\n\n"
        "def test_crashes():\n    os.kill(os.getpid(), signal.SIGSEGV)\n\ndef test_after():\n    pass\n"
    )
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")
    command = [sys.executable, "-m", "pytest", *_runner_options(), "-p", "no:cacheprovider", "-q", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(PROJECT)}
    process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        output = process.communicate(timeout=120)[0].decode(errors="replace")
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        raise AssertionError(f"the run did not end after its worker crashed: {process.communicate()[0][-2000:]!r}")
    assert process.returncode == 1, output[-2000:]
    assert "1 failed" in output and "test_crashes" in output, output[-2000:]
