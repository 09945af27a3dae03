#!/usr/bin/env bash
# Set up the environment and run the whole test suite. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# Debian's Chromium for the browser test (skipped, with the reason, where it cannot be installed).
./scripts/setup-browser.sh
# Two workers (pytest-xdist), each test file whole on one of them: its module fixtures are
# built once. The tests are CPU-bound: on 2 cores three workers took 1454 s where two took
# 1175 s (at e698bbc, one run each, one morning). Files go out in the order tests/conftest.py
# gives them (the longest first), not
# xdist's (the most tests first); the files of a group there (FILE_GROUPS: files sharing a costly session fixture,
# such as the Kafka brokers) go to one worker together. `./scripts/test.sh -n 0` runs everything in this one process.
# The 15 slowest tests are listed at the end of every run, so that a test that grows slow shows.
# A test that takes its worker down (a crash in a native library) fails the run at once: xdist would otherwise start
# a new worker and hand it the crashed file again, up to eight times, and a whole suite run so did not end at all
# (tests/test_suite_runner.py).
exec .venv/bin/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder --max-worker-restart=0 --durations=15 "$@"
