"""Snapshots are dynamic partitions: the landing sensor adds one per complete snapshot folder."""
import dagster as dg

SNAPSHOTS = "snapshots"
snapshot_partitions = dg.DynamicPartitionsDefinition(name=SNAPSHOTS)

# Op tags of the steps on the audit's longest chain (segments -> watermarks -> divergence): with
# steps side by side (replica_lens/executor.py), a ready step of that chain starts before the others.
CRITICAL_PATH = {"dagster/priority": "1"}
