"""Drives a `dagster dev` of this code location and its UI in headless Chromium (Playwright).

Shared by the browser test (tests/test_ui_browser.py), which asserts what the UI shows, and by
scripts/screenshots.py, which writes the README's screenshots to docs/. Nothing here writes
into the project: `dagster dev`, its instance, landing and warehouse, its log and every
screenshot live under the folders the caller passes.

Failures raise UiCheckFailed (an AssertionError) with what was seen and the tail of the
`dagster dev` log, so that pytest and the script report them alike.
"""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import yaml

from replica_lens.jobs import AUDIT_JOB
from replica_lens.simulator import SimulationConfig, simulate

PROJECT = Path(__file__).resolve().parents[1]
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
LANDING_SENSOR = "landing_sensor"
SNAPSHOT = "ui-snap"
# Small, with a lost write and a corrupted value that stay in the final states (with fewer keys
# later writes overwrite them): the divergence report has proven keys to show.
SNAPSHOT_CONFIG = SimulationConfig(
    seed=6, regions=2, partitions=1, keys=400, writes=600, lost_writes=1, corrupted_values=1
)
GRAPH_ASSETS = ("raw_topic_snapshots", "heartbeat_segments", "divergence_reports")
REPORT_METADATA = ("dagster/row_count", "keys_compared", "keys_divergent", "keys_missing", "key_pairs_compared")
# The names the UI shows that the docs (README, docs/operations.md, docs/explain.md) tell an operator to click, as
# Dagster 1.13 spells them: the driver clicks each, so a rename fails here and the docs get fixed.
NAV_LINEAGE, NAV_JOBS, LAUNCHPAD_TAB = "Lineage", "Jobs", "Launchpad"
EXPLAIN_JOB = "explain_key"

SERVER_TIMEOUT_S = 120
LOCATION_TIMEOUT_S = 180
# The server's landing sensor looks every few seconds (REPLICA_LENS_LANDING_SENSOR_INTERVAL_S), not
# every 30 s as by default.
SENSOR_INTERVAL_S = 3
# The daemon may need a while to load the code location on a busy machine before the sensor's
# first tick. Past this, the sensor is taken to be broken.
SENSOR_TIMEOUT_S = 240
# One audit starts a Spark JVM and runs every stage: 1-3 minutes on a small shared machine, more when busy.
RUN_TIMEOUT_S = 600
UI_TIMEOUT_MS = 60_000


class UiCheckFailed(AssertionError):
    pass


def chromium_missing_reason() -> Optional[str]:
    """Why the UI cannot be driven here, or None."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"{CHROMIUM} is missing: run scripts/setup-browser.sh (as root, with apt-get) to install Debian's chromium"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the playwright package is missing: pip install -e '.[test]'"
    return None


@dataclass
class DagsterDev:
    base_url: str
    location: str
    log_path: Path
    landing: Path
    warehouse: Path
    process: subprocess.Popen = field(repr=False)

    def graphql(self, query: str, variables: Optional[dict[str, Any]] = None) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.base_url}/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            body = json.load(response)
        if body.get("errors"):
            raise UiCheckFailed(f"GraphQL errors: {body['errors']}")
        return body["data"]

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(encoding="utf-8", errors="replace") if self.log_path.exists() else ""
        return f"--- last lines of {self.log_path} ---\n" + "\n".join(text.splitlines()[-lines:])

    def fail(self, message: str) -> UiCheckFailed:
        return UiCheckFailed(f"{message}\n{self.log_tail()}")

    @property
    def repository(self) -> dict[str, str]:
        return {"repositoryName": "__repository__", "repositoryLocationName": self.location}


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
    if len(entries) != 1 or "python_module" not in entries[0]:
        raise UiCheckFailed(f"unexpected workspace.yaml: {workspace}")
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


@contextmanager
def dagster_dev(root: Path) -> Iterator[DagsterDev]:
    """`dagster dev` of the project's code location on a free loopback port, with an empty landing
    folder, a warehouse and an instance of its own, all under root (its log: root/dagster-dev.log).
    The sensors and schedule keep their default status: the landing sensor is on."""
    dagster_bin = Path(sys.executable).parent / "dagster"
    if not dagster_bin.exists():
        raise UiCheckFailed(f"no dagster executable next to {sys.executable}")
    landing, warehouse, home, cwd = (root / name for name in ("landing", "warehouse", "dagster_home", "cwd"))
    for folder in (landing, warehouse, home, cwd):
        folder.mkdir(parents=True)
    # Runs use Dagster's defaults (queued by the daemon, one subprocess each); this only turns off
    # telemetry and the community pop-up that would cover the page on localhost.
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\nnux:\n  enabled: false\n", encoding="utf-8")
    workspace, location = _workspace_for(PROJECT, cwd / "workspace.yaml")
    log_path = root / "dagster-dev.log"
    port = _free_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "REPLICA_LENS_LANDING": str(landing),
        "REPLICA_LENS_WAREHOUSE": str(warehouse),
        "REPLICA_LENS_SPARK_MASTER": "local[2]",
        "REPLICA_LENS_DELTA_JARS": "",
        "PYSPARK_PYTHON": sys.executable,
        # The sensor looks every few seconds instead of every 30: the snapshot dropped is picked up soon.
        "REPLICA_LENS_LANDING_SENSOR_INTERVAL_S": str(SENSOR_INTERVAL_S),
        # The report page's pictures, which the suite's other audits leave out (tests/conftest.py), as by default.
        "REPLICA_LENS_REPORT_PICTURES": "10",
        "REPLICA_LENS_REPORT_UI_PICTURES": "3",
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
    dev = DagsterDev(f"http://127.0.0.1:{port}", location, log_path, landing, warehouse, process)
    try:
        deadline = time.monotonic() + SERVER_TIMEOUT_S
        while True:
            if process.poll() is not None:
                raise dev.fail(f"dagster dev exited with {process.returncode}")
            try:
                with urllib.request.urlopen(f"{dev.base_url}/server_info", timeout=5) as response:
                    if response.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                raise dev.fail(f"dagster dev did not answer /server_info within {SERVER_TIMEOUT_S} s")
            time.sleep(2)
        wait_for_location(dev)
        yield dev
    finally:
        _stop(process)


def wait_for_location(dev: DagsterDev) -> None:
    """Until the code location has loaded; a load error fails with Dagster's message."""
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
                raise dev.fail(
                    f"code location {dev.location} failed to load: {loaded['message']}\n{''.join(loaded['stack'][-6:])}"
                )
            return
        if time.monotonic() > deadline:
            raise dev.fail(f"code location {dev.location} not loaded after {LOCATION_TIMEOUT_S} s: {entry}")
        time.sleep(2)


def drop_snapshot(dev: DagsterDev, snapshot_id: str = SNAPSHOT, config: SimulationConfig = SNAPSHOT_CONFIG) -> dict:
    """Simulates a snapshot into the landing folder, as an upstream dump would arrive: data files
    first, `_SUCCESS` last. Returns the simulator's summary."""
    return simulate(dev.landing, snapshot_id, config)


RUNS_QUERY = """query($filter: RunsFilter) { runsOrError(filter: $filter) {
    __typename ... on Runs { results { runId status tags { key value } } } ... on PythonError { message } } }"""


def audit_runs(dev: DagsterDev, snapshot_id: str) -> list[dict[str, Any]]:
    """Every run of the audit job for the snapshot's partition, newest first, tags as a dict."""
    runs = dev.graphql(
        RUNS_QUERY,
        {"filter": {"pipelineName": AUDIT_JOB, "tags": [{"key": "dagster/partition", "value": snapshot_id}]}},
    )["runsOrError"]
    if runs["__typename"] != "Runs":
        raise UiCheckFailed(f"runs query failed: {runs}")
    return [{**run, "tags": {t["key"]: t["value"] for t in run["tags"]}} for run in runs["results"]]


SENSOR_TICKS_QUERY = """query($s: SensorSelector!) { sensorOrError(sensorSelector: $s) {
    __typename ... on Sensor { minIntervalSeconds sensorState { status ticks(limit: 20) {
        status timestamp runIds runKeys skipReason error { message } } } }
    ... on SensorNotFoundError { message } ... on PythonError { message } } }"""


def sensor_state(dev: DagsterDev, sensor: str = LANDING_SENSOR) -> dict[str, Any]:
    """The sensor's status (RUNNING/STOPPED), its latest ticks as the daemon recorded them, and its
    interval (``minIntervalSeconds``) as the code location defines it."""
    found = dev.graphql(SENSOR_TICKS_QUERY, {"s": {**dev.repository, "sensorName": sensor}})["sensorOrError"]
    if found["__typename"] != "Sensor":
        raise UiCheckFailed(f"sensor {sensor} not found: {found}")
    return {**found["sensorState"], "minIntervalSeconds": found["minIntervalSeconds"]}


def _describe_ticks(state: dict[str, Any]) -> str:
    ticks = state["ticks"]
    if not ticks:
        return f"sensor status {state['status']}, no tick recorded (is the daemon running?)"
    lines = [f"sensor status {state['status']}, latest ticks:"]
    for tick in ticks[:8]:
        detail = (tick.get("error") or {}).get("message") or tick.get("skipReason") or f"runs {tick['runIds']}"
        lines.append(f"  {time.strftime('%H:%M:%S', time.gmtime(tick['timestamp']))} {tick['status']}: {detail.strip()}")
    return "\n".join(lines)


def wait_for_sensor_run(dev: DagsterDev, snapshot_id: str = SNAPSHOT, timeout_s: float = SENSOR_TIMEOUT_S) -> dict[str, Any]:
    """The audit run the landing sensor launched for the snapshot. Nothing else launches one:
    when the sensor does not within timeout_s, this fails with the sensor's ticks."""
    deadline = time.monotonic() + timeout_s
    while True:
        sensor_runs = [r for r in audit_runs(dev, snapshot_id) if r["tags"].get("dagster/sensor_name") == LANDING_SENSOR]
        if sensor_runs:
            return sensor_runs[-1]  # the oldest: the first tick that saw the snapshot
        if time.monotonic() > deadline:
            raise dev.fail(
                f"the landing sensor launched no {AUDIT_JOB} run for snapshot {snapshot_id} within {timeout_s:.0f} s "
                f"of its _SUCCESS appearing in {dev.landing}; runs of the job for it: "
                f"{audit_runs(dev, snapshot_id)}\n{_describe_ticks(sensor_state(dev))}"
            )
        time.sleep(1)


def sensor_tick_of(dev: DagsterDev, run_id: str, timeout_s: float = 60) -> Optional[dict[str, Any]]:
    """The landing sensor's tick that requested the run, from the daemon's tick history (None when
    no tick lists it within timeout_s: the daemon records a tick's runs once the tick ends, which
    may be after the run has been created)."""
    deadline = time.monotonic() + timeout_s
    while True:
        tick = next((t for t in sensor_state(dev)["ticks"] if run_id in t["runIds"]), None)
        if tick is not None or time.monotonic() > deadline:
            return tick
        time.sleep(1)


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


def wait_for_success(dev: DagsterDev, run_id: str, timeout_s: float = RUN_TIMEOUT_S) -> None:
    query = """query($id: ID!) { runOrError(runId: $id) { __typename ... on Run { status } ... on PythonError { message } } }"""
    deadline = time.monotonic() + timeout_s
    while True:
        run = dev.graphql(query, {"id": run_id})["runOrError"]
        if run["__typename"] != "Run":
            raise UiCheckFailed(f"run {run_id}: {run}")
        if run["status"] == "SUCCESS":
            return
        if run["status"] in ("FAILURE", "CANCELED"):
            raise dev.fail(f"audit run {run_id} ended {run['status']}:\n{_failure_messages(dev, run_id)}")
        if time.monotonic() > deadline:
            raise dev.fail(f"audit run {run_id} still {run['status']} after {timeout_s:.0f} s")
        time.sleep(1)


def materialization_metadata(dev: DagsterDev, asset: str) -> tuple[str, str, dict[str, Any]]:
    """(run id, partition, metadata) of the asset's latest materialization, as the event log holds them."""
    data = dev.graphql(
        """query($key: AssetKeyInput!) { assetOrError(assetKey: $key) { __typename ... on Asset {
            assetMaterializations(limit: 1) { runId partition metadataEntries { label
                ... on IntMetadataEntry { intValue } ... on FloatMetadataEntry { floatValue }
                ... on TextMetadataEntry { text } ... on PathMetadataEntry { path }
                ... on MarkdownMetadataEntry { mdStr } } } } } }""",
        {"key": {"path": [asset]}},
    )["assetOrError"]
    if data["__typename"] != "Asset" or not data["assetMaterializations"]:
        raise UiCheckFailed(f"{asset} has no materialization in the event log: {data}")
    latest = data["assetMaterializations"][0]
    values = {}
    for entry in latest["metadataEntries"]:
        values[entry["label"]] = next(
            (entry[k] for k in ("intValue", "floatValue", "text", "path", "mdStr") if entry.get(k) is not None), None
        )
    return latest["runId"], latest["partition"], values


def _number(value: Any) -> re.Pattern:
    """The UI prints an integer plainly or with thousands separators; nothing else may share the cell."""
    n = int(value)
    return re.compile(rf"^\s*({n}|{n:,})\s*$")


def follow(page: Any, link: Any, url_glob: str, attempts: int = 3) -> None:
    """Clicks ``link`` until the page's URL matches ``url_glob``.

    On a loaded machine Dagster's UI may still be routing its home page (its own redirect) when the
    first click lands: the click's navigation is then replaced and never reaches the URL waited for
    (CI saw a 60 s timeout on the left menu's "Lineage"). A click on a menu link is idempotent, so it
    is repeated; a link that never leads to ``url_glob`` still fails, after ``attempts`` clicks.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(1, attempts + 1):
        link.click()
        try:
            page.wait_for_url(url_glob, timeout=UI_TIMEOUT_MS // attempts)
            return
        except PlaywrightTimeout:
            if attempt == attempts:
                raise


def capture_ui(
    dev: DagsterDev, run_id: str, snapshot_id: str, metadata: dict[str, Any], out_dir: Path
) -> tuple[Path, Path]:
    """Drives Chromium through the global lineage and the divergence_reports page, checking what
    they show against the run and its metadata; writes out_dir/asset-graph.png and
    out_dir/divergence-reports.png (and failure-<page>.png when a check fails) and returns the two."""
    from playwright.sync_api import expect, sync_playwright

    # Assertions wait as long as actions do: a busy machine renders the lineage in tens of seconds.
    expect.set_options(timeout=UI_TIMEOUT_MS)
    out_dir.mkdir(parents=True, exist_ok=True)
    graph_png = out_dir / "asset-graph.png"
    reports_png = out_dir / "divergence-reports.png"
    with sync_playwright() as playwright:
        # The lineage is zoomed to fit its width: a tall window keeps the zoom above Dagster's
        # threshold for drawing full asset nodes (below it, names are middle-truncated).
        context = playwright.chromium.launch_persistent_context(
            str(out_dir / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1920, "height": 2400},
        )
        context.set_default_timeout(UI_TIMEOUT_MS)
        page = context.new_page()
        step = "asset-graph"
        try:
            # The global lineage: "Lineage" in the left menu (as the docs say), which starts with every group
            # collapsed; Alt+E is the explorer's "Expand all groups" and records the open groups in the URL.
            page.goto(dev.base_url)
            follow(page, page.locator('a[href="/asset-groups"]', has_text=NAV_LINEAGE).first, "**/asset-groups**")
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
            page.goto(f"{dev.base_url}/assets/divergence_reports")
            expect(page.get_by_text("Latest materialization", exact=True)).to_be_visible()
            # The latest materialization is this snapshot's, made by the audit run we waited for, or by
            # a re-audit of the same snapshot that the hourly schedule (on by default) started since: a
            # test that crosses the top of the hour sees that run's link instead.
            try:
                expect(page.locator(f'a[href*="/runs/{run_id}"]').first).to_be_visible()
            except AssertionError:
                reaudits = [r["runId"] for r in audit_runs(dev, snapshot_id)
                            if r["tags"].get("replica_lens/trigger") == "reaudit_schedule"]
                if not reaudits:
                    raise
                links = ", ".join(f'a[href*="/runs/{r}"]' for r in reaudits)
                expect(page.locator(links).first).to_be_visible()
            expect(page.get_by_text(snapshot_id, exact=True).first).to_be_visible()
            row_count = int(metadata["dagster/row_count"])
            expect(page.get_by_text("Row count", exact=True).locator("xpath=..")).to_have_text(
                re.compile(rf"^\s*Row count\s*({row_count}|{row_count:,})\s*$")
            )
            # Folding the column list brings the metadata table up into the screenshot.
            page.get_by_text("Columns", exact=True).click()
            for key in ("keys_compared", "keys_divergent", "keys_missing", "key_pairs_compared"):
                # The metadata table's rows are: key, time of the event, value.
                row = page.locator("tr", has=page.get_by_text(key, exact=True)).first
                expect(row).to_be_visible()
                expect(row.locator("td").last).to_have_text(_number(metadata[key]))
            page.screenshot(path=str(reports_png))
            step = "most-important-keys"
            check_markdown(page, metadata)
        except BaseException:
            page.screenshot(path=str(out_dir / f"failure-{step}.png"))
            raise
        finally:
            context.close()
    return graph_png, reports_png


def check_markdown(page, metadata: dict[str, Any]) -> None:
    """Opens ``most_important_keys`` ([Show Markdown]) and checks that it renders its data as itself: the first key's
    line reads ``VERDICT key in topic/partition``, and a report page path keeps its ``_reports`` (issue 71, item 3)."""
    from playwright.sync_api import expect

    row = page.locator("tr", has=page.get_by_text("most_important_keys", exact=True)).first
    row.get_by_text("[Show Markdown]").click()
    dialog = page.get_by_role("dialog")
    expect(dialog).to_be_visible()
    first = re.search(r"--topic (\S+) --partition (\d+) --key (\S+)", metadata["explain_first"])
    if first:
        topic, partition, key = first.groups()
        expect(dialog).to_contain_text(f"{key.strip(chr(39))} in {topic}/{partition}")
    if "more key(s) in the report page" in metadata["most_important_keys"]:
        expect(dialog).to_contain_text(f"/_reports/{SNAPSHOT}/divergence.html")
    page.keyboard.press("Escape")


def launch_explain_key(dev: DagsterDev, out_dir: Path) -> str:
    """Opens the explain_key job's Launchpad as the docs say (Jobs in the left menu, the job, its Launchpad tab),
    checks that its config shows every field an operator fills (key and key_text both), launches it as it opens (it
    explains the newest audited snapshot's most important key) and returns the run id (issue 71, items 5 and 7)."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=UI_TIMEOUT_MS)
    out_dir.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1600, "height": 1050})
        page.set_default_timeout(UI_TIMEOUT_MS)
        try:
            page.goto(dev.base_url)
            follow(page, page.locator('a[href="/jobs"]', has_text=NAV_JOBS).first, "**/jobs**")
            follow(page, page.get_by_text(EXPLAIN_JOB, exact=True).first, f"**/jobs/{EXPLAIN_JOB}**")
            page.get_by_text(LAUNCHPAD_TAB, exact=True).first.click()
            page.wait_for_url("**/playground**")
            editor = page.locator(".CodeMirror").first
            for name in ("snapshot_id:", "topic:", "partition:", "key:", "key_text:"):
                expect(editor).to_contain_text(name)
            page.screenshot(path=str(out_dir / "explain-key-launchpad.png"))
            before = {r["runId"] for r in job_runs(dev, EXPLAIN_JOB)}
            expect(page.get_by_text("No errors", exact=True)).to_be_visible()  # it opens launchable, as it is
            page.get_by_text("Launch Run", exact=True).last.click()
            deadline = time.monotonic() + 60
            while True:
                runs = [r for r in job_runs(dev, EXPLAIN_JOB) if r["runId"] not in before]
                if runs:
                    return runs[0]["runId"]
                if time.monotonic() > deadline:
                    raise dev.fail("the Launchpad's Launch Run started no explain_key run")
                time.sleep(1)
        except BaseException:
            page.screenshot(path=str(out_dir / "failure-explain-key.png"))
            raise
        finally:
            browser.close()


def job_runs(dev: DagsterDev, job: str) -> list[dict[str, Any]]:
    runs = dev.graphql(RUNS_QUERY, {"filter": {"pipelineName": job}})["runsOrError"]
    if runs["__typename"] != "Runs":
        raise UiCheckFailed(f"runs query failed: {runs}")
    return runs["results"]


def check_report_page(page_path: Path, replicas: int, out_dir: Path) -> Path:
    """Opens the audit's report page (a file, no server) in Chromium and checks that its first, open explanation
    draws one lane per replica and highlights the witness versions; writes out_dir/report-page.png."""
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=UI_TIMEOUT_MS)
    out_dir.mkdir(parents=True, exist_ok=True)
    shot = out_dir / "report-page.png"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1400})
            page.goto(page_path.resolve().as_uri())
            first = page.locator("details.key").first
            expect(first).to_have_attribute("open", "")
            expect(first).to_have_attribute("data-verdict", re.compile("DIVERGENT|MISSING"))
            picture = first.locator("svg").first
            expect(picture).to_be_visible()
            expect(picture.locator('[id^="key0-lane-"]')).to_have_count(replicas)
            assert picture.locator('[id^="key0-witness-"]').count() >= 2, "the witness versions v and w are not marked"
            page.screenshot(path=str(shot))
        finally:
            browser.close()
    return shot
