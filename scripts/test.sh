#!/usr/bin/env bash
# Set up the environment and run the whole test suite. CI runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/python -m pytest "$@"
