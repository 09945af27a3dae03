"""End to end through the Dagster UI: `dagster dev` on the real code location, the landing
sensor audits a simulated snapshot, and headless Chromium (driven by Playwright) must show
the asset lineage and the divergence_reports materialization with its metadata.

Needs Debian's Chromium at /usr/bin/chromium (scripts/setup-browser.sh installs it) and the
`playwright` package; the test is skipped, with the reason, when either is missing.
Playwright only drives that browser: it never downloads one.

Screenshots land in test-artifacts/ui/ with the `dagster dev` log; the two README
screenshots are copied to docs/ once every assertion about them has passed.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import yaml

from assets.partitions import SNAPSHOTS
from replica_lens.jobs import AUDIT_JOB
from replica_lens.simulator import SimulationConfig, simulate

pytestmark = [pytest.mark.slow, pytest.mark.browser]

PROJECT = Path(__file__).resolve().parents[1]
ARTIFACTS = PROJECT / "test-artifacts" / "ui"
DOCS = PROJECT / "docs"
CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags Chromium keeps dialling Google's hosts, which this
# kind of closed network refuses; the user data folder is a fresh one per run.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SNAPSHOT = "ui-snap"
SNAPSHOT_CONFIG = SimulationConfig(
    seed=5, regions=2, partitions=1, keys=40, writes=600, lost_writes=1, corrupted_values=1
)
GRAPH_ASSETS = ("raw_topic_snapshots", "heartbeat_segments", "divergence_reports")

SERVER_TIMEOUT_S = 120
LOCATION_TIMEOUT_S = 180
# The landing sensor ticks every 30 s; past this the test registers and launches the run itself.
SENSOR_GRACE_S = 90
# One audit starts a Spark JVM and runs every stage: 1-3 minutes on a small shared machine.
RUN_TIMEOUT_S = 360
UI_TIMEOUT_MS = 60_000


@dataclass
class DagsterDev:
    base_url: str
    location: str
    log_path: Path
    expected_divergent_keys: int

    def graphql(self, query: str, variables: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.base_url}/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            body = json.load(response)
        assert not body.get("errors"), f"GraphQL errors: {body['errors']}"
        return body["data"]

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@pytest.fixture(scope="module")
def sync_playwright():
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} is missing: run scripts/setup-browser.sh (as root, with apt-get) to install Debian's chromium")
    module = pytest.importorskip(
        "playwright.sync_api", reason="the playwright package is missing: pip install -e '.[test]'"
    )
    return module.sync_playwright


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _workspace_for(project: Path, out: Path) -> tuple[Path, str]:
    """The project's workspace.yaml, made loadable from another folder: `dagster dev` lets the
    `.env` of its working folder override the environment, so it must not run in the project
    folder, whose `.env` points at the project's own landing/ and warehouse/."""
    workspace = yaml.safe_load((project / "workspace.yaml").read_text(encoding="utf-8"))
    entries = workspace["load_from"]
    assert len(entries) == 1 and "python_module" in entries[0], f"unexpected workspace.yaml: {workspace}"
    module = entries[0]["python_module"]
    module["working_directory"] = str(project)
    out.write_text(yaml.safe_dump(workspace), encoding="utf-8")
    return out, module["location_name"]


def _default_stop_signals() -> None:
    """A shell's background job ignores SIGINT (and may ignore SIGTERM); exec keeps that, and
    `dagster dev` would then outlive the TERM sent to its group."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _signal_group(pgid: int, sig: int) -> bool:
    """Sends sig to the group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def _stop(process: subprocess.Popen) -> None:
    """TERM the whole process group (webserver, daemon, code servers, run workers, Spark), give it
    a few seconds, then KILL whatever is left, even when `dagster dev` itself is already gone."""
    pgid = process.pid
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while _signal_group(pgid, 0) and time.monotonic() < deadline:
        process.poll()  # reaps the leader so that an empty group reads as gone
        time.sleep(0.5)
    _signal_group(pgid, signal.SIGKILL)
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def dagster_dev(sync_playwright, tmp_path_factory) -> Iterator[DagsterDev]:
    dagster_bin = Path(sys.executable).parent / "dagster"
    assert dagster_bin.exists(), f"no dagster executable next to {sys.executable}"
    root = tmp_path_factory.mktemp("ui")
    landing, warehouse, home, cwd = (root / name for name in ("landing", "warehouse", "dagster_home", "cwd"))
    for folder in (landing, warehouse, home, cwd):
        folder.mkdir()
    written = simulate(landing, SNAPSHOT, SNAPSHOT_CONFIG)
    # Runs use Dagster's defaults (queued by the daemon, one subprocess each); this only turns off
    # telemetry and the community pop-up that would cover the page on localhost.
    (home / "dagster.yaml").write_text(
        "telemetry:\n  enabled: false\nnux:\n  enabled: false\n", encoding="utf-8"
    )
    workspace, location = _workspace_for(PROJECT, cwd / "workspace.yaml")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log_path = ARTIFACTS / "dagster-dev.log"
    port = _free_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "REPLICA_LENS_LANDING": str(landing),
        "REPLICA_LENS_WAREHOUSE": str(warehouse),
        "REPLICA_LENS_SPARK_MASTER": "local[2]",
        "REPLICA_LENS_DELTA_JARS": "",
        "PYSPARK_PYTHON": sys.executable,
    }
    with log_path.open("w", encoding="utf-8") as log:
        process = subprocess.Popen(
            [str(dagster_bin), "dev", "-w", str(workspace), "-h", "127.0.0.1", "-p", str(port)],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_default_stop_signals,
        )
    dev = DagsterDev(f"http://127.0.0.1:{port}", location, log_path, written["expected_divergent_keys"])
    try:
        deadline = time.monotonic() + SERVER_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(f"dagster dev exited with {process.returncode}:\n{dev.log_tail()}")
            try:
                with urllib.request.urlopen(f"{dev.base_url}/server_info", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"dagster dev did not answer /server_info within {SERVER_TIMEOUT_S} s:\n{dev.log_tail()}")
            time.sleep(2)
        yield dev
    finally:
        _stop(process)


def _wait_for_location(dev: DagsterDev) -> None:
    """Until the code location has loaded; a load error fails the test with Dagster's message."""
    query = """{ workspaceOrError { __typename ... on Workspace { locationEntries {
        name loadStatus locationOrLoadError { __typename ... on PythonError { message stack } } } } } }"""
    deadline = time.monotonic() + LOCATION_TIMEOUT_S
    while True:
        workspace = dev.graphql(query)["workspaceOrError"]
        entries = {e["name"]: e for e in workspace.get("locationEntries", [])}
        entry = entries.get(dev.location)
        if entry and entry["loadStatus"] == "LOADED":
            loaded = entry["locationOrLoadError"] or {}
            if loaded.get("__typename") == "PythonError":
                pytest.fail(
                    f"code location {dev.location} failed to load: {loaded['message']}\n{''.join(loaded['stack'][-6:])}"
                )
            return
        if time.monotonic() > deadline:
            pytest.fail(f"code location {dev.location} not loaded after {LOCATION_TIMEOUT_S} s: {entry}")
        time.sleep(2)


RUNS_QUERY = """query($filter: RunsFilter) { runsOrError(filter: $filter) {
    __typename ... on Runs { results { runId status tags { key value } } } ... on PythonError { message } } }"""


def _audit_runs(dev: DagsterDev) -> list[dict[str, Any]]:
    runs = dev.graphql(
        RUNS_QUERY,
        {"filter": {"pipelineName": AUDIT_JOB, "tags": [{"key": "dagster/partition", "value": SNAPSHOT}]}},
    )["runsOrError"]
    assert runs["__typename"] == "Runs", runs
    return runs["results"]


def _launch_audit(dev: DagsterDev) -> str:
    """What a user does when the sensor is slow: register the partition, launch the job for it."""
    repository = {"repositoryName": "__repository__", "repositoryLocationName": dev.location}
    added = dev.graphql(
        """mutation($r: RepositorySelector!, $p: String!, $k: String!) {
            addDynamicPartition(repositorySelector: $r, partitionsDefName: $p, partitionKey: $k) {
                __typename ... on PythonError { message } ... on UnauthorizedError { message } } }""",
        {"r": repository, "p": SNAPSHOTS, "k": SNAPSHOT},
    )["addDynamicPartition"]
    assert added["__typename"] in ("AddDynamicPartitionSuccess", "DuplicateDynamicPartitionError"), added
    launched = dev.graphql(
        """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
            __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message }
            ... on RunConfigValidationInvalid { errors { message } } ... on InvalidSubsetError { message } } }""",
        {
            "p": {
                "selector": {**repository, "jobName": AUDIT_JOB},
                "runConfigData": {},
                "executionMetadata": {"tags": [{"key": "dagster/partition", "value": SNAPSHOT}]},
            }
        },
    )["launchRun"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def _failure_messages(dev: DagsterDev, run_id: str) -> str:
    logs = dev.graphql(
        """query($id: ID!) { logsForRun(runId: $id) { __typename ... on EventConnection { events {
            __typename ... on MessageEvent { message level } ... on ExecutionStepFailureEvent { stepKey error { message } }
            ... on RunFailureEvent { message } } } } }""",
        {"id": run_id},
    )["logsForRun"]
    lines = []
    for event in logs.get("events", []):
        if event["__typename"] == "ExecutionStepFailureEvent":
            lines.append(f"step {event['stepKey']} failed: {(event.get('error') or {}).get('message', '').strip()}")
        elif event["__typename"] in ("RunFailureEvent", "EngineEvent") and event.get("level") == "ERROR":
            lines.append(event["message"])
    return "\n".join(lines[-10:])


def _audited_by_the_sensor_or_by_hand(dev: DagsterDev) -> tuple[str, str]:
    """Waits for the audit run of SNAPSHOT to succeed; returns (run id, what launched it)."""
    started = time.monotonic()
    while not _audit_runs(dev):
        if time.monotonic() - started > SENSOR_GRACE_S:
            _launch_audit(dev)
            break
        time.sleep(3)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        runs = _audit_runs(dev)
        done = [r for r in runs if r["status"] == "SUCCESS"]
        if done:
            tags = {t["key"]: t["value"] for t in done[0]["tags"]}
            return done[0]["runId"], tags.get("dagster/sensor_name", "launchRun mutation (no sensor run in time)")
        failed = [r for r in runs if r["status"] in ("FAILURE", "CANCELED")]
        if failed and len(failed) == len(runs):
            run_id = failed[0]["runId"]
            pytest.fail(f"audit run {run_id} ended {failed[0]['status']}:\n{_failure_messages(dev, run_id)}")
        if time.monotonic() > deadline:
            pytest.fail(f"no successful {AUDIT_JOB} run for {SNAPSHOT} within {RUN_TIMEOUT_S} s: {runs}\n{dev.log_tail()}")
        time.sleep(5)


def _materialization_metadata(dev: DagsterDev, asset: str) -> tuple[str, dict[str, str]]:
    """The partition and the metadata of the asset's latest materialization, as the event log holds them."""
    data = dev.graphql(
        """query($key: AssetKeyInput!) { assetOrError(assetKey: $key) { __typename ... on Asset {
            assetMaterializations(limit: 1) { partition metadataEntries { label
                ... on IntMetadataEntry { intValue } ... on FloatMetadataEntry { floatValue }
                ... on TextMetadataEntry { text } } } } } }""",
        {"key": {"path": [asset]}},
    )["assetOrError"]
    assert data["__typename"] == "Asset", data
    materializations = data["assetMaterializations"]
    assert materializations, f"{asset} has no materialization in the event log"
    latest = materializations[0]
    values = {}
    for entry in latest["metadataEntries"]:
        value = next((entry[k] for k in ("intValue", "floatValue", "text") if entry.get(k) is not None), None)
        values[entry["label"]] = value
    return latest["partition"], values


def test_dagster_ui_shows_the_lineage_and_the_audited_divergence_reports(sync_playwright, dagster_dev, tmp_path):
    dev = dagster_dev
    _wait_for_location(dev)
    run_id, launched_by = _audited_by_the_sensor_or_by_hand(dev)
    print(f"audit run {run_id} of {SNAPSHOT} succeeded; launched by {launched_by}")

    partition, metadata = _materialization_metadata(dev, "divergence_reports")
    assert partition == SNAPSHOT
    for key in ("dagster/row_count", "keys_compared", "keys_divergent", "keys_missing"):
        assert key in metadata, f"divergence_reports metadata lacks {key}: {sorted(metadata)}"
    if dev.expected_divergent_keys:
        # A lost write and a corrupted value were injected: the report cannot be all clean.
        assert int(metadata["keys_divergent"]) + int(metadata["keys_missing"]) >= 1, metadata

    graph_png, reports_png = check_ui(sync_playwright, dev.base_url, run_id, metadata, tmp_path / "chromium-profile")
    DOCS.mkdir(exist_ok=True)
    shutil.copyfile(graph_png, DOCS / "asset-graph.png")
    shutil.copyfile(reports_png, DOCS / "divergence-reports.png")


def _number(value: Any) -> re.Pattern:
    """The UI prints an integer plainly or with thousands separators; nothing else may share the cell."""
    n = int(value)
    return re.compile(rf"^\s*({n}|{n:,})\s*$")


def check_ui(sync_playwright, base_url: str, run_id: str, metadata: dict[str, Any], profile: Path) -> tuple[Path, Path]:
    """Drives Chromium through the lineage and the divergence_reports page; returns the two screenshots."""
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    graph_png = ARTIFACTS / "asset-graph.png"
    reports_png = ARTIFACTS / "divergence-reports.png"
    for stale in (graph_png, reports_png, *ARTIFACTS.glob("failure-*.png")):
        stale.unlink(missing_ok=True)
    with sync_playwright() as playwright:
        # The lineage is zoomed to fit its width: a tall window keeps the zoom above Dagster's
        # threshold for drawing full asset nodes (below it, names are middle-truncated).
        context = playwright.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1920, "height": 2400},
        )
        context.set_default_timeout(UI_TIMEOUT_MS)
        page = context.new_page()
        step = "asset-graph"
        try:
            # The global lineage (Lineage in the navigation) starts with every group collapsed;
            # Alt+E is the explorer's "Expand all groups" and records the open groups in the URL.
            page.goto(f"{base_url}/asset-groups")
            expect(page.get_by_text("Global asset lineage").first).to_be_visible()
            graph = page.locator("svg foreignObject")
            expect(graph.first).to_be_visible()
            page.keyboard.press("Alt+e")
            page.wait_for_url("**expanded=*")
            # Loading the expanded URL afresh lays the whole graph out, zoomed to fit.
            page.goto(page.url)
            for asset in GRAPH_ASSETS:
                expect(graph.get_by_text(asset, exact=True)).to_be_visible()
            expect(graph.get_by_text("Loading...")).to_have_count(0)
            boxes = [b for b in (node.bounding_box() for node in graph.all()) if b]
            left, top = min(b["x"] for b in boxes) - 24, min(b["y"] for b in boxes) - 24
            right = max(b["x"] + b["width"] for b in boxes) + 24
            bottom = max(b["y"] + b["height"] for b in boxes) + 24
            page.screenshot(
                path=str(graph_png),
                clip={"x": max(left, 0), "y": max(top, 0), "width": right - max(left, 0), "height": bottom - max(top, 0)},
            )

            step = "divergence-reports"
            page.set_viewport_size({"width": 1600, "height": 1050})
            page.goto(f"{base_url}/assets/divergence_reports")
            status = page.get_by_text("Latest materialization", exact=True)
            expect(status).to_be_visible()
            # The latest materialization is this snapshot's, made by the audit run we waited for.
            expect(page.locator(f'a[href*="/runs/{run_id}"]').first).to_be_visible()
            expect(page.get_by_text(SNAPSHOT, exact=True).first).to_be_visible()
            row_count = page.get_by_text("Row count", exact=True).locator("xpath=..")
            expect(row_count).to_have_text(re.compile(rf"^\s*Row count\s*({int(metadata['dagster/row_count'])}|{int(metadata['dagster/row_count']):,})\s*$"))
            # Folding the column list brings the metadata table up into the screenshot.
            page.get_by_text("Columns", exact=True).click()
            for key in ("keys_compared", "keys_divergent", "keys_missing"):
                # The metadata table's rows are: key, time of the event, value.
                row = page.locator("tr", has=page.get_by_text(key, exact=True)).first
                expect(row).to_be_visible()
                expect(row.locator("td").last).to_have_text(_number(metadata[key]))
            page.screenshot(path=str(reports_png))
        except BaseException:
            page.screenshot(path=str(ARTIFACTS / f"failure-{step}.png"))
            raise
        finally:
            context.close()
    return graph_png, reports_png
