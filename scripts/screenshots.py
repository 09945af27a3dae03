"""Regenerates the README's screenshots: docs/asset-graph.png and docs/divergence-reports.png.

    .venv/bin/python scripts/screenshots.py [--out docs] [--keep]

Starts `dagster dev` of this code location on loopback in a temporary folder (its own instance,
landing and warehouse), drops a simulated snapshot into its landing folder, waits for the landing
sensor's audit run to succeed, then drives headless Chromium through the lineage and the
divergence_reports page with the same code and checks as tests/test_ui_browser.py
(tests/ui_driver.py). The two images are copied to --out only once every check has passed.
Takes 2-5 minutes (a Spark JVM and a full audit). Needs /usr/bin/chromium and playwright.
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from tests import ui_driver as ui  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=PROJECT / "docs", help="folder for the two PNGs (default: docs/)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (log, instance, raw screenshots)")
    args = parser.parse_args(argv)

    reason = ui.chromium_missing_reason()
    if reason:
        print(f"screenshots: {reason}", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="replica-lens-screenshots-"))
    ok = False
    try:
        with ui.dagster_dev(work / "dev") as dev:
            print(f"screenshots: dagster dev at {dev.base_url}; dropping snapshot {ui.SNAPSHOT} into {dev.landing}")
            ui.drop_snapshot(dev, ui.SNAPSHOT)
            run = ui.wait_for_sensor_run(dev, ui.SNAPSHOT)
            print(f"screenshots: the landing sensor launched run {run['runId']}; waiting for it to succeed")
            ui.wait_for_success(dev, run["runId"])
            run_id, partition, metadata = ui.materialization_metadata(dev, "divergence_reports")
            if (run_id, partition) != (run["runId"], ui.SNAPSHOT):
                raise ui.UiCheckFailed(f"divergence_reports was last materialized by {run_id} for {partition}")
            shots = ui.capture_ui(dev, run_id, ui.SNAPSHOT, metadata, work / "screenshots")
        args.out.mkdir(parents=True, exist_ok=True)
        for png in shots:
            shutil.copyfile(png, args.out / png.name)
            print(f"screenshots: wrote {args.out / png.name}")
        ok = True
    except AssertionError as failure:  # UiCheckFailed, or a Playwright expectation on the page
        print(f"screenshots: {failure}", file=sys.stderr)
        return 1
    finally:
        if not ok:
            print(f"screenshots: nothing written to {args.out}; the work folder is kept: {work}", file=sys.stderr)
        elif args.keep:
            print(f"screenshots: work folder kept: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
