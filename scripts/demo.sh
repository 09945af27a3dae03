#!/usr/bin/env bash
# Set up, simulate a snapshot with injected faults, audit it on the embedded default
# (local Spark + delta-rs), print the summary, and explain the most important key it found.
# Tables land under ./warehouse, the report page under ./warehouse/_reports/<snapshot>/.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
snapshot_id="${SNAPSHOT_ID:-demo-$(date +%Y%m%d-%H%M%S)}"
# The faults are overwritten later (the simulator prints keys_differing_at_end 0 and
# faults_overwritten_later): the replicas differed for a while, which the audit proves DIVERGENT.
.venv/bin/replica-lens simulate --out landing --snapshot-id "$snapshot_id" \
  --regions 3 --partitions 2 --keys 2000 --writes 50000 \
  --lost-writes 3 --corrupted-values 2 --duplicate-deliveries 5 --conflicting-writes 5
summary="landing/$snapshot_id.audit.json"
.venv/bin/replica-lens audit --landing landing --warehouse warehouse --snapshot-id "$snapshot_id" --json "$summary"
# The command the summary names ("explain the first"): why the most important key got its verdict.
first=$(.venv/bin/python -c 'import json, sys; print(json.load(open(sys.argv[1]))["snapshots"][0]["explain_first"] or "")' "$summary")
if [ -n "$first" ]; then
  echo
  echo "\$ $first"
  eval ".venv/bin/$first"
fi
