#!/usr/bin/env bash
# Set up the environment and run the whole test suite. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# Debian's Chromium for the browser test (skipped, with the reason, where it cannot be installed).
./scripts/setup-browser.sh
# The 15 slowest tests are listed at the end of every run, so that a test that grows slow shows.
exec .venv/bin/python -m pytest --durations=15 "$@"
