"""The same audit on a Spark standalone cluster as in ``local[*]``: every table equal, row for row.

A master and one worker are started from the installed pyspark (``bin/spark-class``) on
loopback, with free ports and their own work, local and log folders, and stopped at the
end. The snapshot is gzip JSONL with injected faults and one truncated file, so that the
salvage of a broken file and the quarantine take part; the cluster's audit runs every pass
over Arrow batches in Spark's Python workers on the executor (``REPLICA_LENS_DRIVER_MAX_ROWS=0``):
the stream pass, writing the staged files of two tables from there, and the proof search. Landing and warehouse are given as ``file://`` URIs, as on
a cluster where they would be shared storage. The cluster's audit runs as its own
``replica-lens audit`` process, as an operator runs it; the local reference is the same
audit in the suite's own ``local[2]`` session.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import deltalake
import pytest

import pyspark
from replica_lens.audit import run_audit
from resources.tuning import DRIVER_MAX_ROWS_ENV
from tests.test_audit_e2e import SETTINGS

pytestmark = pytest.mark.slow

SPARK_HOME = os.path.dirname(pyspark.__file__)
TABLES = (
    "raw_topic_snapshots", "raw_topic_quarantine", "raw_topic_skipped", "heartbeat_segments",
    "heartbeat_segment_summary", "reconstructed_watermarks", "partition_watermarks", "divergence_reports", "divergence_summary",
    "replica_state", "stream_anomalies", "heartbeat_lag", "replication_lag", "exporter_positions",
    "exporter_regressions", "compaction_bounds",
)


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: all held open while chosen, so the kernel cannot hand out one twice
    (a worker's UI on the master UI's port answered its JSON query with HTML, a flaky setup error)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _daemon(args: list[str], log: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [os.path.join(SPARK_HOME, "bin", "spark-class"), *args],
        stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def _alive_workers(web_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{web_port}/json/", timeout=2) as response:
            return int(json.load(response).get("aliveworkers", 0))
    except OSError:
        return 0


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory):
    """``spark://127.0.0.1:PORT`` of a master with one 2-core worker, both stopped afterwards."""
    base = tmp_path_factory.mktemp("cluster")
    for folder in ("work", "local", "logs"):
        (base / folder).mkdir()
    env = {
        **os.environ,
        "SPARK_HOME": SPARK_HOME,
        "SPARK_LOCAL_DIRS": str(base / "local"),
        "SPARK_LOG_DIR": str(base / "logs"),
        "SPARK_DAEMON_MEMORY": "512m",
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    port, web_port, worker_web_port = _free_ports(3)
    url = f"spark://127.0.0.1:{port}"
    master = _daemon(
        ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port), "--webui-port", str(web_port)],
        base / "logs" / "master.out", env,
    )
    worker = _daemon(
        ["org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1", "--webui-port", str(worker_web_port),
         "--work-dir", str(base / "work"), "--cores", "2", "--memory", "3g"],
        base / "logs" / "worker.out", env,
    )
    try:
        deadline = time.monotonic() + 120
        while _alive_workers(web_port) < 1:
            if time.monotonic() > deadline or master.poll() is not None or worker.poll() is not None:
                logs = "\n".join(p.read_text(errors="replace")[-2000:] for p in (base / "logs").glob("*.out"))
                pytest.fail(f"the standalone cluster did not come up:\n{logs}")
            time.sleep(1)
        yield url
    finally:
        _stop(worker)
        _stop(master)


@pytest.fixture(scope="module")
def broken_snapshot(tmp_path_factory) -> Path:
    from replica_lens.cli import main

    landing = tmp_path_factory.mktemp("landing")
    assert main([
        "simulate", "--out", str(landing), "--snapshot-id", "snap", "--seed", "5", "--keys", "200",
        "--writes", "400", "--format", "jsonl.gz", "--lost-writes", "2", "--corrupted-values", "2",
        "--exporters", "2",
    ]) == 0
    victim = sorted((landing / "snap").glob("*.jsonl.gz"))[-1]
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) * 2 // 3])  # its complete lines are kept, the rest quarantined
    return landing


def _audit(landing: Path, warehouse: Path, master: str) -> dict:
    document = warehouse.parent / f"{warehouse.name}.json"
    command = [
        sys.executable, "-m", "replica_lens.cli", "audit", "--landing", landing.as_uri(),
        "--warehouse", warehouse.as_uri(), "--snapshot-id", "snap", "--spark-master", master,
        "--quiet", "--json", str(document),
    ]
    # Every pass in the executor's Python workers, however few the rows (the local reference runs them on the driver).
    env = {**os.environ, DRIVER_MAX_ROWS_ENV: "0"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=1200, env=env)
    assert done.returncode == 0, f"{master}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(document.read_text())


def _rows(warehouse: Path, table: str) -> list[str]:
    """Every row of a table as canonical text (maps' entries sorted), sorted: order-free equality."""
    def plain(value):
        if isinstance(value, dict):
            return {k: plain(v) for k, v in sorted(value.items())}
        if isinstance(value, list):
            items = [plain(v) for v in value]
            # A map comes back from Arrow as a list of (key, value) pairs.
            return sorted(items, key=repr) if items and isinstance(value[0], tuple) else items
        return value

    rows = deltalake.DeltaTable(str(warehouse / table)).to_pyarrow_table().to_pylist()
    return sorted(json.dumps(plain(r), sort_keys=True, default=str) for r in rows)


def test_an_audit_on_a_standalone_cluster_writes_the_same_tables_as_local(
    spark, standalone_cluster, broken_snapshot, tmp_path
):
    """Catches work that only holds in one JVM: a Python function or module the executors cannot load,
    driver-local paths in what executors read or write (the stream pass's staged files), or results that depend
    on task placement or on the pass running on the driver or in workers."""
    on_cluster = _audit(broken_snapshot, tmp_path / "cluster", standalone_cluster)
    # The reference is the same audit in the suite's local session (this process): a second command
    # would only pay another JVM start to compute the same tables.
    local = run_audit("snap", str(broken_snapshot), str(tmp_path / "local"), **SETTINGS)
    assert local.success, local.error

    (snapshot,) = on_cluster["snapshots"]
    assert snapshot["rows"]["quarantined"] >= 1  # the truncated file's lost rest
    assert snapshot["rows"]["read"] == snapshot["rows"]["accepted"] + snapshot["rows"]["quarantined"]
    assert snapshot["verdicts"]["divergent"] + snapshot["verdicts"]["missing"] >= 1
    for table in TABLES:
        cluster_rows = _rows(tmp_path / "cluster", table)
        assert cluster_rows == _rows(tmp_path / "local", table), table
    assert _rows(tmp_path / "cluster", "divergence_reports")  # something was compared
