"""Snapshots are dynamic partitions: the landing sensor adds one per complete snapshot folder."""
import dagster as dg

SNAPSHOTS = "snapshots"
snapshot_partitions = dg.DynamicPartitionsDefinition(name=SNAPSHOTS)
