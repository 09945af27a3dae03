"""Build small frames shaped like the project's tables from plain Python dicts."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Iterable

from pyspark.sql import DataFrame, SparkSession

from schemas.raw import RawTopicSnapshots


def raw_frame(spark: SparkSession, rows: Iterable[dict[str, Any]], snapshot_id: str = "t") -> DataFrame:
    """A ``raw_topic_snapshots``-shaped frame; fields a row leaves out are null, but ``value_hash`` and ``value_bytes``,
    computed from the value as the ingestion does (in plain Python)."""
    struct = RawTopicSnapshots.to_structtype()
    defaults = {"snapshot_id": snapshot_id, "copies": 1, "source_file": "test.jsonl"}
    records = [tuple({**defaults, "value_hash": value_hash(row), "value_bytes": value_bytes(row), **row}.get(f.name)
                     for f in struct.fields) for row in rows]
    return spark.createDataFrame(records, struct)


def value_hash(row: dict[str, Any]) -> str | None:
    """The token of a row's value: TOMBSTONE for a DELETE, else the sha256 hex of its value (None without one)."""
    if row.get("kind") == "DELETE":
        return "TOMBSTONE"
    return None if row.get("value") is None else hashlib.sha256(row["value"].encode("utf-8")).hexdigest()


def value_bytes(row: dict[str, Any]) -> int | None:
    return None if row.get("value") is None else len(row["value"].encode("utf-8"))


# Fixtures that ship with the repository: a two-region snapshot with injected faults
# (two lost writes, one corrupted value) and the divergence reports it implies.
EXAMPLES = Path(__file__).resolve().parent / "data"


# Every table written per snapshot (the README's tables but the cross-snapshot audit_trend).
PER_SNAPSHOT_TABLES = (
    "raw_topic_snapshots",
    "raw_topic_quarantine",
    "raw_topic_skipped",
    "broker_cuts",
    "heartbeat_segments",
    "heartbeat_segment_summary",
    "reconstructed_watermarks",
    "partition_watermarks",
    "divergence_reports",
    "divergence_summary",
    "replica_state",
    "stream_anomalies",
    "heartbeat_lag",
    "replication_lag",
    "exporter_positions",
    "exporter_regressions",
    "compaction_bounds",
)
# The tables an audit of scope "divergence" (replica_lens/scopes.py) does not compute.
OPERATIONS_TABLES = frozenset(("heartbeat_lag", "replication_lag", "exporter_positions", "exporter_regressions",
                               "compaction_bounds"))


def plain(value: Any) -> Any:
    """A collected cell as a hashable, order-free value (maps as sorted item tuples), to compare tables as multisets."""
    if isinstance(value, dict):
        return tuple(sorted((k, plain(v)) for k, v in value.items()))
    if isinstance(value, list):
        return tuple(plain(v) for v in value)
    return value
