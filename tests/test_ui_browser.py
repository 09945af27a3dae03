"""End to end through the Dagster UI: `dagster dev` on the real code location, on loopback, with
its landing sensor on (its default). A simulated snapshot is dropped into the landing folder, and
the test passes only when the sensor itself launches the audit run for it (the test never launches
one), the run succeeds, and headless Chromium (driven by Playwright) shows the asset lineage and
the divergence_reports materialization with its metadata.

Needs Debian's Chromium at /usr/bin/chromium (scripts/setup-browser.sh installs it) and the
`playwright` package; the test is skipped, with the reason, when either is missing.
Playwright only drives that browser: it never downloads one.

Everything the test writes (instance, landing, warehouse, the `dagster dev` log, screenshots)
stays under pytest's tmp_path; the README's screenshots come from scripts/screenshots.py, which
shares the page-driving code in tests/ui_driver.py.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from tests import ui_driver as ui

pytestmark = [pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def dagster_dev(tmp_path_factory) -> Iterator[ui.DagsterDev]:
    reason = ui.chromium_missing_reason()
    if reason:
        pytest.skip(reason)
    with ui.dagster_dev(tmp_path_factory.mktemp("dagster-dev")) as dev:
        yield dev


def test_the_landing_sensor_audits_a_dropped_snapshot_and_the_ui_shows_it(dagster_dev, tmp_path):
    dev = dagster_dev
    assert not ui.audit_runs(dev, ui.SNAPSHOT), "an audit run exists before the snapshot was dropped"
    state = ui.sensor_state(dev)
    assert state["status"] == "RUNNING", f"the landing sensor should be on by default: {state['status']}"
    # Its interval comes from REPLICA_LENS_LANDING_SENSOR_INTERVAL_S in the server's environment.
    assert state["minIntervalSeconds"] == ui.SENSOR_INTERVAL_S, state["minIntervalSeconds"]

    written = ui.drop_snapshot(dev, ui.SNAPSHOT)
    run = ui.wait_for_sensor_run(dev, ui.SNAPSHOT)
    run_id = run["runId"]
    # What launched it: the landing sensor, for this snapshot's run key, on a tick the daemon recorded.
    assert run["tags"].get("dagster/sensor_name") == ui.LANDING_SENSOR, run["tags"]
    assert run["tags"].get("dagster/run_key") == ui.SNAPSHOT, run["tags"]
    tick = ui.sensor_tick_of(dev, run_id)
    assert tick is not None, f"no tick of {ui.LANDING_SENSOR} lists run {run_id}: {ui.sensor_state(dev)['ticks']}"
    assert tick["status"] == "SUCCESS" and ui.SNAPSHOT in tick["runKeys"], tick
    ui.wait_for_success(dev, run_id)
    # The sensor requested it once: later ticks saw the partition registered and skipped it.
    sensor_runs = [r for r in ui.audit_runs(dev, ui.SNAPSHOT) if r["tags"].get("dagster/sensor_name") == ui.LANDING_SENSOR]
    assert [r["runId"] for r in sensor_runs] == [run_id]

    materialized_by, partition, metadata = ui.materialization_metadata(dev, "divergence_reports")
    assert (materialized_by, partition) == (run_id, ui.SNAPSHOT)
    for key in ui.REPORT_METADATA:
        assert key in metadata, f"divergence_reports metadata lacks {key}: {sorted(metadata)}"
    # The simulated faults that stay in the final states are proven (the report is not all clean).
    assert written["keys_differing_at_end"] >= 1, f"the simulated snapshot should hold a visible fault: {written}"
    proven = int(metadata["keys_divergent"]) + int(metadata["keys_missing"])
    assert proven >= written["keys_differing_at_end"], (metadata, written)

    # The report page beside the tables, linked from the materialization with the first keys' pictures embedded.
    page = Path(metadata["report_page"])
    assert page.is_relative_to(dev.warehouse) and page.is_file(), metadata["report_page"]
    assert metadata["keys_explained"] == proven + int(metadata["keys_in_flight"]), metadata
    assert "data:image/png;base64," in metadata["most_important_keys"], metadata["most_important_keys"][:200]
    report_png = ui.check_report_page(page, ui.SNAPSHOT_CONFIG.regions, tmp_path / "screenshots")

    # Issue 71, items 3 and 7: the left menu's "Lineage" (as the docs name it) and the materialization's Markdown,
    # whose key and report path render as themselves.
    graph_png, reports_png = ui.capture_ui(dev, run_id, ui.SNAPSHOT, metadata, tmp_path / "screenshots")
    for png in (graph_png, reports_png, report_png):
        assert png.read_bytes().startswith(b"\x89PNG"), png
    # Issue 71, item 5: the explain_key Launchpad shows every field, and launched as it opens it explains a key.
    explained = ui.launch_explain_key(dev, tmp_path / "screenshots")
    ui.wait_for_success(dev, explained)
