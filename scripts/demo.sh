#!/usr/bin/env bash
# Set up, simulate a snapshot with injected faults, audit it on the embedded default
# (local Spark + delta-rs) and print the summary. Tables land under ./warehouse.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
snapshot_id="${SNAPSHOT_ID:-demo-$(date +%Y%m%d-%H%M%S)}"
.venv/bin/replica-lens simulate --out landing --snapshot-id "$snapshot_id" \
  --regions 3 --partitions 2 --keys 2000 --writes 50000 \
  --lost-writes 3 --corrupted-values 2 --duplicate-deliveries 5 --conflicting-writes 5
exec .venv/bin/replica-lens audit --landing landing --warehouse warehouse --snapshot-id "$snapshot_id"
