"""Reading what explaining keys needs from the published tables of an audited snapshot (no Spark, no audit).

Per (topic, partition): its replica partitions (``partition_watermarks``, a few rows), the
rows right after a gap in each (``heartbeat_segments`` filtered on ``gap_before > 0``, read only
when a dump has gaps), the keys' versions (``reconstructed_watermarks`` filtered on the keys) and
their report rows (``divergence_reports``). Each read opens one snapshot's files and only the
columns it needs, with the filter pushed into the Parquet scan.
"""
from __future__ import annotations

import base64
from typing import Iterable, Optional

import pyarrow.dataset as ds

from explain.document import ReplicaInput, explain
from resources.delta_reader import TableReader
from resources.errors import UsageError

VERSION_COLUMNS = ("replica", "topic", "partition", "offset", "key", "kind", "value", "value_hash", "source_region",
                   "source_offset", "write_ts", "touch_bound", "reach", "applied_lower_bound", "missing_before")
GAP_COLUMNS = ("replica", "offset", "gap_before", "missing_before", "applied_lower_bound")
HEARTBEAT_COLUMNS = ("replica", "offset", "source_region", "applied_ts_min_ms", "applied_ts_max_ms", "hb_vector")
REPORT_COLUMNS = ("replica_a", "replica_b", "key", "verdict", "missing_in", "witness_offset_a", "witness_offset_b")
MAX_LISTED = 20


class KeyNotFound(UsageError):
    """The snapshot does not hold the key in that topic partition (the message names what exists)."""


class NotAudited(UsageError):
    """The warehouse holds no audit of the snapshot (or not of that topic partition)."""


def key_of(key: Optional[str], key_text: Optional[str]) -> str:
    """The key as the tables hold it: ``key`` itself, or the base64 of ``key_text``'s UTF-8 bytes (raw Venice records)."""
    if (key is None) == (key_text is None):
        raise UsageError("give exactly one of the key (as the tables hold it) and the key's text (Venice keys)")
    return key if key is not None else base64.b64encode(key_text.encode("utf-8")).decode("ascii")


def _partition_filter(topic: str, partition: int):
    return (ds.field("topic") == topic) & (ds.field("partition") == partition)


class SnapshotTables:
    """The published tables of one audited snapshot, as ``explain`` reads them."""

    def __init__(self, warehouse: str, snapshot_id: str):
        self.reader = TableReader(warehouse)
        self.warehouse = warehouse
        self.snapshot_id = snapshot_id

    def _read(self, table: str, where=None, columns=None):
        found = self.reader.read(table, self.snapshot_id, where, columns)
        if found is None:
            raise NotAudited(
                f"the warehouse {self.warehouse} has no table {table}: audit the snapshot first "
                f"(replica-lens audit --snapshot-id {self.snapshot_id})"
            )
        return found

    def replica_partitions(self, topic: str, partition: int) -> list[dict]:
        rows = self._read("partition_watermarks", _partition_filter(topic, partition)).to_pylist()
        if rows:
            return rows
        everything = self._read("partition_watermarks", columns=["topic", "partition"]).to_pylist()
        if not everything:
            raise NotAudited(
                f"snapshot {self.snapshot_id} is not audited in {self.warehouse}: run replica-lens audit "
                f"--snapshot-id {self.snapshot_id} first"
            )
        held = sorted({(r["topic"], r["partition"]) for r in everything})
        listed = ", ".join(f"{t} partition {p}" for t, p in held[:MAX_LISTED])
        raise KeyNotFound(
            f"snapshot {self.snapshot_id} holds no topic {topic!r} partition {partition}; it holds {len(held)} "
            f"topic partition(s): {listed}{' ...' if len(held) > MAX_LISTED else ''}"
        )

    def gap_rows(self, topic: str, partition: int, replicas: list[dict]) -> dict[str, list[dict]]:
        gapped = [r["replica"] for r in replicas if r["gaps"]]
        if not gapped:
            return {}
        where = _partition_filter(topic, partition) & (ds.field("gap_before") > 0) & ds.field("replica").isin(gapped)
        out: dict[str, list[dict]] = {}
        for row in self._read("heartbeat_segments", where, GAP_COLUMNS).to_pylist():
            out.setdefault(row["replica"], []).append(row)
        return out

    def heartbeats(self, topic: str, partition: int) -> dict[str, list[dict]]:
        """Every heartbeat of the topic partition, per replica, in offset order."""
        where = _partition_filter(topic, partition) & (ds.field("kind") == "HEARTBEAT")
        out: dict[str, list[dict]] = {}
        table = self._read("heartbeat_segments", where, HEARTBEAT_COLUMNS).sort_by("offset")
        for row in table.to_pylist():
            out.setdefault(row.pop("replica"), []).append(row)
        return out

    def versions(self, topic: str, partition: int, keys: Iterable[str]) -> list[dict]:
        keys = list(keys)
        where = _partition_filter(topic, partition) & ds.field("key").isin(keys)
        return self._read("reconstructed_watermarks", where, VERSION_COLUMNS).to_pylist()

    def reports(self, topic: str, partition: int, keys: Iterable[str]) -> list[dict]:
        where = _partition_filter(topic, partition) & ds.field("key").isin(list(keys))
        found = self.reader.read("divergence_reports", self.snapshot_id, where, REPORT_COLUMNS)
        return [] if found is None else found.to_pylist()

    def carried_from(self, topic: str, partition: int) -> dict[str, str]:
        """Per replica whose dump continues an earlier snapshot's state (docs/incremental.md): that snapshot."""
        where = _partition_filter(topic, partition) & (ds.field("row_kind") == "CONTEXT")
        found = self.reader.read("replica_state", self.snapshot_id, where, ["replica", "previous_snapshot_id"])
        rows = [] if found is None else found.to_pylist()
        return {r["replica"]: r["previous_snapshot_id"] for r in rows if r["previous_snapshot_id"] is not None}

    def is_venice(self) -> Optional[bool]:
        """True when raw Venice records were read (records skipped by rule: control messages, chunks); None when the
        snapshot skipped none, and each key's own values tell (``document.looks_like_venice``)."""
        found = self.reader.read("raw_topic_skipped", self.snapshot_id, columns=["replica"])
        return True if found is not None and found.num_rows > 0 else None

    def key_examples(self, topic: str, partition: int, near: str, limit: int = 5) -> list[str]:
        """A few keys the topic partition holds, the ones sorting nearest to ``near`` first."""
        keys = self._read("reconstructed_watermarks", _partition_filter(topic, partition), ["key"]).column("key")
        distinct = sorted(set(keys.to_pylist()))
        after = [k for k in distinct if k >= near][:limit]
        return after or distinct[:limit]


def explain_keys(
    tables: SnapshotTables, topic: str, partition: int, keys: list[str], venice: Optional[bool] = None,
    heartbeats: bool = True,
) -> dict[str, dict]:
    """The explanation document of each of ``keys`` (one read per table for all of them).

    ``heartbeats``: mark each replica's heartbeats between the key's first version and the
    last row its bounds rest on (for the pictures); a page of thousands of keys leaves them out.
    """
    replicas = tables.replica_partitions(topic, partition)
    gaps = tables.gap_rows(topic, partition, replicas)
    beats = tables.heartbeats(topic, partition) if heartbeats else {}
    carried = tables.carried_from(topic, partition)
    rows_by_key: dict[str, dict[str, list[dict]]] = {}
    for row in tables.versions(topic, partition, keys):
        rows_by_key.setdefault(row["key"], {}).setdefault(row["replica"], []).append(row)
    reports_by_key: dict[str, list[dict]] = {}
    for report in tables.reports(topic, partition, keys):
        reports_by_key.setdefault(report["key"], []).append(report)
    venice = tables.is_venice() if venice is None else venice
    return {
        key: explain(
            tables.snapshot_id, topic, partition, key,
            [ReplicaInput(r["replica"], r, rows_by_key.get(key, {}).get(r["replica"], []), gaps.get(r["replica"], []),
                          carried.get(r["replica"])) for r in replicas],
            reports_by_key.get(key, []), venice=venice, heartbeats=beats if heartbeats else None,
        )
        for key in keys
    }


def explain_key(warehouse: str, snapshot_id: str, topic: str, partition: int, key: str) -> dict:
    """The explanation of one key; ``KeyNotFound`` (naming what exists) when the partition never holds it."""
    tables = SnapshotTables(warehouse, snapshot_id)
    doc = explain_keys(tables, topic, partition, [key])[key]
    held = any(v["offset"] is not None for r in doc["replicas"] for v in r["versions"])
    if not held and all(p["verdict"] == "CONSISTENT" for p in doc["pairs"]):
        examples = tables.key_examples(topic, partition, key)
        raise KeyNotFound(
            f"snapshot {snapshot_id} holds no key {key!r} in topic {topic!r} partition {partition} (no replica wrote "
            f"it); keys it holds there include: {', '.join(repr(k) for k in examples)}"
        )
    return doc
