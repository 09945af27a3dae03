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

import pyarrow.compute as pc
import pyarrow.dataset as ds

from explain.carried import absent_dump, continue_stream
from explain.document import ReplicaInput, explain
from resources.delta_reader import TableReader
from resources.errors import UsageError

VERSION_COLUMNS = ("replica", "topic", "partition", "offset", "key", "kind", "value_hash", "source_region",
                   "source_offset", "write_ts", "touch_bound", "reach", "applied_lower_bound", "missing_before")
VALUE_COLUMNS = ("replica", "offset", "key", "value")
Place = tuple[str, int]  # (topic, partition)
GAP_COLUMNS = ("replica", "offset", "gap_before", "missing_before", "applied_lower_bound")
GAP_BOUNDS = ("gap_start", "gap_end")  # read where the table has them (snapshots audited since they exist)
HEARTBEAT_COLUMNS = ("replica", "offset", "source_region", "applied_ts_min_ms", "applied_ts_max_ms", "hb_vector")
REPORT_COLUMNS = ("replica_a", "replica_b", "key", "verdict", "missing_in", "witness_offset_a", "witness_offset_b")
MAX_LISTED = 20


class KeyNotFound(UsageError):
    """The snapshot does not hold the key in that topic partition (the message names what exists)."""


class NotAudited(UsageError):
    """The warehouse holds no audit of the snapshot (or not of that topic partition)."""


class StateNotKept(UsageError):
    """The snapshot was compared with a carried state the warehouse no longer keeps (state retention)."""


def key_of(key: Optional[str], key_text: Optional[str]) -> str:
    """The key as the tables hold it: ``key`` itself, or the base64 of ``key_text``'s UTF-8 bytes (raw Venice records)."""
    if (key is None) == (key_text is None):
        raise UsageError("give exactly one of the key (as the tables hold it) and the key's text (Venice keys)")
    return key if key is not None else base64.b64encode(key_text.encode("utf-8")).decode("ascii")


def _partition_filter(topic: str, partition: int):
    return (ds.field("topic") == topic) & (ds.field("partition") == partition)


class SnapshotTables:
    """The published tables of one audited snapshot, as ``explain`` reads them."""

    def __init__(self, warehouse: str, snapshot_id: str, value_chars: Optional[int] = None):
        """``value_chars``: read at most this many characters of each value, and one more where it is longer (a
        page of every non-consistent key shows that much; None: values whole)."""
        self.reader = TableReader(warehouse)
        self.warehouse = warehouse
        self.snapshot_id = snapshot_id
        self.value_chars = value_chars

    def _read(self, table: str, where=None, columns=None, optional=()):
        found = self.reader.read(table, self.snapshot_id, where, columns, optional)
        if found is None:
            raise NotAudited(
                f"the warehouse {self.warehouse} has no table {table}: audit the snapshot first "
                f"(replica-lens audit --snapshot-id {self.snapshot_id})"
            )
        return found

    def replica_partitions(self, places: set[Place]) -> dict[Place, list[dict]]:
        """The ``partition_watermarks`` rows of each place; ``KeyNotFound`` naming what exists when one is not held."""
        held: dict[Place, list[dict]] = {}
        for row in self._read("partition_watermarks").to_pylist():
            held.setdefault((row["topic"], row["partition"]), []).append(row)
        if not held:
            raise NotAudited(
                f"snapshot {self.snapshot_id} is not audited in {self.warehouse}: run replica-lens audit "
                f"--snapshot-id {self.snapshot_id} first"
            )
        for topic, partition in sorted(places - held.keys()):
            listed = ", ".join(f"{t} partition {p}" for t, p in sorted(held)[:MAX_LISTED])
            raise KeyNotFound(
                f"snapshot {self.snapshot_id} holds no topic {topic!r} partition {partition}; it holds {len(held)} "
                f"topic partition(s): {listed}{' ...' if len(held) > MAX_LISTED else ''}"
            )
        return {place: held[place] for place in places}

    def _rows_of(self, table: str, places: set[Place], where, columns, optional=()) -> dict[Place, list[dict]]:
        """``table``'s rows matching ``where`` in ``places``, one read for all of them, grouped by place."""
        topics, partitions = sorted({t for t, _ in places}), sorted({p for _, p in places})
        narrowed = ds.field("topic").isin(topics) & ds.field("partition").isin(partitions) & where
        out: dict[Place, list[dict]] = {}
        for row in self._read(table, narrowed, ["topic", "partition", *columns], optional).to_pylist():
            place = (row.pop("topic"), row.pop("partition"))
            if place in places:
                out.setdefault(place, []).append(row)
        return out

    def gap_rows(self, places: set[Place]) -> dict[Place, list[dict]]:
        """The rows right after a gap (SPEC 3a) of the places' dumps (the caller skips this without gaps)."""
        return self._rows_of("heartbeat_segments", places, ds.field("gap_before") > 0, GAP_COLUMNS, GAP_BOUNDS)

    def heartbeats(self, places: set[Place]) -> dict[Place, list[dict]]:
        """Every heartbeat of the places, in offset order."""
        found = self._rows_of("heartbeat_segments", places, ds.field("kind") == "HEARTBEAT", HEARTBEAT_COLUMNS)
        return {place: sorted(rows, key=lambda r: r["offset"]) for place, rows in found.items()}

    def versions(self, places: set[Place], keys: Iterable[str]) -> dict[Place, list[dict]]:
        """The keys' rows of ``reconstructed_watermarks``, each PUT with its value from ``raw_topic_snapshots``."""
        keys = sorted(set(keys))
        # Snapshots audited while the watermarks kept the values have them there.
        found = self._rows_of("reconstructed_watermarks", places, ds.field("key").isin(keys), VERSION_COLUMNS, ("value",))
        unvalued = [row for rows in found.values() for row in rows if "value" not in row]
        if unvalued:
            values = self.values(self.snapshot_id, places, keys, {row["offset"] for row in unvalued})
            for place, rows in found.items():
                for row in rows:
                    if "value" not in row:
                        row["value"] = values.get((*place, row["replica"], row["offset"]))
        return found

    def values(
        self, snapshot_id: str, places: set[Place], keys: Iterable[str], offsets: Iterable[int]
    ) -> dict[tuple, Optional[str]]:
        """(topic, partition, replica, offset) -> the value of each PUT of ``keys`` at ``offsets`` in
        ``snapshot_id``'s raw rows. The offsets let the Parquet statistics skip row groups that cannot hold them
        (the judging leaves the raw rows sorted by offset within each of its tasks, so row groups cover ranges)."""
        topics, partitions = sorted({t for t, _ in places}), sorted({p for _, p in places})
        where = (ds.field("topic").isin(topics) & ds.field("partition").isin(partitions)
                 & ds.field("offset").isin(sorted(set(offsets)))
                 & ds.field("key").isin(sorted(set(keys))) & (ds.field("kind") == "PUT"))
        # Cut while it is read (batch by batch) where only part of each value is shown.
        cut = None if self.value_chars is None else {
            "value": pc.utf8_slice_codeunits(ds.field("value"), 0, self.value_chars + 1)
        }
        found = self.reader.read("raw_topic_snapshots", snapshot_id, where, ["topic", "partition", *VALUE_COLUMNS],
                                 sized_by="value_bytes", computed=cut)
        if found is None:
            return {}
        return {(r["topic"], r["partition"], r["replica"], r["offset"]): r["value"] for r in found.to_pylist()
                if (r["topic"], r["partition"]) in places}

    def reports(self, places: set[Place], keys: Iterable[str]) -> dict[Place, list[dict]]:
        if not self.reader.exists("divergence_reports"):
            return {}
        return self._rows_of("divergence_reports", places, ds.field("key").isin(sorted(set(keys))), REPORT_COLUMNS)

    def carried_from(self, places: set[Place]) -> dict[Place, dict[str, str]]:
        """Per place, the replicas whose dump continues an earlier snapshot's state (docs/incremental.md): that one."""
        if not self.reader.exists("replica_state"):
            return {}
        found = self._rows_of("replica_state", places, ds.field("row_kind") == "CONTEXT",
                              ["replica", "previous_snapshot_id"])
        return {place: {r["replica"]: r["previous_snapshot_id"] for r in rows if r["previous_snapshot_id"] is not None}
                for place, rows in found.items()}

    def absent_from(self, replicas: dict[Place, list[dict]]) -> dict[Place, dict[str, str]]:
        """Per place, the replicas compared on their carried state only (the broker cut lists them, the snapshot has
        no rows of them: ``pipelines/state/absent.py``): the snapshot whose state each continued.

        The audit wrote no context of them in this snapshot; the ones it compared are named in its
        ``divergence_summary``, and each continued the context with the greatest ``last_offset`` below the cut's ``s``
        among the other snapshots' (the predecessor rule). ``StateNotKept`` when that state is gone."""
        if not self.reader.exists("broker_cuts") or not self.reader.exists("divergence_summary"):
            return {}
        places = set(replicas)
        cuts = self._rows_of("broker_cuts", places, ds.field("start_offset") >= 0, ["region", "start_offset"])
        listed = {(place, c["region"]): c["start_offset"] for place, rows in cuts.items() for c in rows
                  if c["region"] not in {r["replica"] for r in replicas[place]}}
        if not listed:
            return {}
        pairs = self._rows_of("divergence_summary", places, ds.field("keys_compared") >= 0, ["replica_a", "replica_b"])
        compared = {(place, r[side]) for place, rows in pairs.items() for r in rows for side in ("replica_a", "replica_b")}
        wanted = {part: start for part, start in listed.items() if part in compared}
        if not wanted:
            return {}
        where = ((ds.field("row_kind") == "CONTEXT") & (ds.field("snapshot_id") != self.snapshot_id)
                 & ds.field("topic").isin(sorted({place[0] for place, _ in wanted})))
        found = self.reader.read("replica_state", None, where,
                                 ["snapshot_id", "replica", "topic", "partition", "last_offset"])
        contexts = [] if found is None else found.to_pylist()
        out: dict[Place, dict[str, str]] = {}
        for (place, replica), start in sorted(wanted.items()):
            below = [c for c in contexts if (c["topic"], c["partition"]) == place and c["replica"] == replica
                     and c["last_offset"] < start]
            best = max((c["last_offset"] for c in below), default=None)
            chosen = sorted({c["snapshot_id"] for c in below if c["last_offset"] == best})
            if len(chosen) != 1:
                raise StateNotKept(
                    f"snapshot {self.snapshot_id} compared {replica}/{place[0]}/{place[1]} (not read in its cut) on a "
                    f"carried state that the warehouse no longer tells apart ({len(chosen)} state(s) end last below "
                    f"offset {start}); its verdicts stand in divergence_reports, but the versions they compared "
                    "cannot be shown"
                )
            out.setdefault(place, {})[replica] = chosen[0]
        return out

    def carried_state(
        self, carried: dict[Place, dict[str, str]], keys: Iterable[str]
    ) -> tuple[dict[tuple, dict], dict[tuple, dict]]:
        """The states continued (``carried_from``): (replica, topic, partition) -> the predecessor's CONTEXT row, and
        (replica, topic, partition, key) -> the key's VERSION row there. One read of each predecessor's state."""
        contexts: dict[tuple, dict] = {}
        versions: dict[tuple, dict] = {}
        wanted = ds.field("key").isin(sorted(set(keys)))
        by_previous: dict[str, set[tuple]] = {}
        for (topic, partition), replicas in carried.items():
            for replica, previous in replicas.items():
                by_previous.setdefault(previous, set()).add((replica, topic, partition))
        for previous, parts in sorted(by_previous.items()):
            topics = sorted({t for _, t, _ in parts})
            where = ds.field("topic").isin(topics) & ((ds.field("row_kind") == "CONTEXT") | wanted)
            for row in self.reader.read("replica_state", previous, where).to_pylist():
                part = (row["replica"], row["topic"], row["partition"])
                if part not in parts:
                    continue
                if row["row_kind"] == "CONTEXT":
                    contexts[part] = row
                else:
                    versions[(*part, row["key"])] = row
        # A state keeps each version's token; its value is in the raw rows of the snapshot it was read from (states
        # written while they kept values have it already).
        unvalued: dict[str, list[dict]] = {}
        for row in versions.values():
            if row["value"] is None and row["kind"] == "PUT" and row["origin_snapshot_id"] is not None:
                unvalued.setdefault(row["origin_snapshot_id"], []).append(row)
        for origin, rows in sorted(unvalued.items()):
            values = self.values(origin, {(r["topic"], r["partition"]) for r in rows}, [r["key"] for r in rows],
                                 [r["offset"] for r in rows])
            for row in rows:
                row["value"] = values.get((row["topic"], row["partition"], row["replica"], row["offset"]))
        return contexts, versions

    def read_between(self, contexts: dict[tuple, dict], firsts: dict[tuple, int]) -> dict[tuple, int]:
        """Per continued replica partition, the positions between its state's last offset and this dump's first row
        that this snapshot or the predecessor read and skipped by rule (``raw_topic_skipped``): not gaps, as the
        audit counts them (``pipelines/state/carry.py``, ``read_between``)."""
        if not self.reader.exists("raw_topic_skipped"):
            return {}
        bounds = {part: (ctx["last_offset"], firsts[part]) for part, ctx in contexts.items() if part in firsts}
        found: dict[tuple, set[int]] = {}
        by_snapshot: dict[str, list[tuple]] = {self.snapshot_id: list(bounds)}
        for part in bounds:
            by_snapshot.setdefault(contexts[part]["snapshot_id"], []).append(part)
        for snapshot_id, parts in sorted(by_snapshot.items()):
            where = None
            for replica, topic, partition in parts:
                low, high = bounds[(replica, topic, partition)]
                one = ((ds.field("replica") == replica) & (ds.field("topic") == topic)
                       & (ds.field("partition") == partition) & (ds.field("offset") > low) & (ds.field("offset") < high))
                where = one if where is None else where | one
            rows = self.reader.read("raw_topic_skipped", snapshot_id, where, ["replica", "topic", "partition", "offset"])
            for row in ([] if rows is None else rows.to_pylist()):
                found.setdefault((row["replica"], row["topic"], row["partition"]), set()).add(row["offset"])
        return {part: len(offsets) for part, offsets in found.items()}

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


def explain_places(
    tables: SnapshotTables, wanted: dict[Place, list[str]], venice: Optional[bool] = None, heartbeats: bool = True,
) -> dict[Place, dict[str, dict]]:
    """The explanation document of every key of ``wanted`` (place -> keys), each table read once for all of them.

    ``heartbeats``: mark each replica's heartbeats between the key's first version and the
    last row its bounds rest on (for the pictures); a page of thousands of keys leaves them out.
    """
    places = set(wanted)
    if not places:
        return {}
    keys = [k for ks in wanted.values() for k in ks]
    replicas = tables.replica_partitions(places)
    gapped = {place for place, rows in replicas.items() if any(r["gaps"] for r in rows)}
    gaps = tables.gap_rows(gapped) if gapped else {}
    beats = tables.heartbeats(places) if heartbeats else {}
    carried = tables.carried_from(places)
    absent = tables.absent_from(replicas)  # compared on their carried state only: no rows in the snapshot
    for place, replicas_absent in absent.items():
        carried[place] = {**carried.get(place, {}), **replicas_absent}
    contexts, carried_versions = tables.carried_state(carried, keys) if carried else ({}, {})
    gone = sorted(f"{replica}/{topic}/{partition} (state of {previous})" for (topic, partition), replicas in carried.items()
                  for replica, previous in replicas.items() if (replica, topic, partition) not in contexts)
    if gone:
        raise StateNotKept(
            f"snapshot {tables.snapshot_id} was compared with carried state that the warehouse no longer keeps: "
            f"{', '.join(gone)} (dropped by state_retention, or removed); its verdicts stand in divergence_reports, "
            "but the versions they compared cannot be shown"
        )
    for place, replicas_absent in absent.items():  # as the audit made them, from the state each continued
        made = [absent_dump(contexts[(replica, *place)], tables.snapshot_id) for replica in replicas_absent]
        replicas[place] = sorted([*replicas[place], *made], key=lambda r: r["replica"])
    if contexts:
        firsts = {(r["replica"], *place): r["first_offset"] for place, rows in replicas.items() for r in rows}
        for part, count in tables.read_between(contexts, firsts).items():
            contexts[part] = {**contexts[part], "read_between": count}
    versions = tables.versions(places, keys)
    reports = tables.reports(places, keys)
    venice = tables.is_venice() if venice is None else venice
    out: dict[Place, dict[str, dict]] = {}
    for place, place_keys in wanted.items():
        rows_by_key: dict[str, dict[str, list[dict]]] = {}
        for row in versions.get(place, []):
            rows_by_key.setdefault(row["key"], {}).setdefault(row["replica"], []).append(row)
        gap_rows = _by_replica(gaps.get(place, []))
        beat_rows = _by_replica(beats.get(place, []))
        reports_by_key: dict[str, list[dict]] = {}
        for report in reports.get(place, []):
            reports_by_key.setdefault(report["key"], []).append(report)

        def replica_input(dump: dict, key: str) -> ReplicaInput:
            part = (dump["replica"], *place)
            return input_of(dump, rows_by_key.get(key, {}).get(dump["replica"], []), gap_rows.get(dump["replica"], []),
                            contexts.get(part), carried_versions.get((*part, key)))

        out[place] = {
            key: explain(
                tables.snapshot_id, place[0], place[1], key, [replica_input(r, key) for r in replicas[place]],
                reports_by_key.get(key, []), venice=venice, heartbeats=beat_rows if heartbeats else None,
            )
            for key in place_keys
        }
    return out


def input_of(
    dump: dict, rows: list[dict], gap_rows: list[dict], context: Optional[dict] = None, carried: Optional[dict] = None
) -> ReplicaInput:
    """One replica partition's input of ``explain``: its own rows, or, when its dump continues the state whose
    CONTEXT row is ``context`` (``carried`` the key's VERSION row there), the stream's (``explain/carried.py``)."""
    if context is None:  # a fresh stream: the snapshot's own rows are the stream's
        return ReplicaInput(dump["replica"], dump, rows, gap_rows)
    stream, rows = continue_stream(dump, context, carried, rows)
    if stream.start_gap:  # the positions between the state and this dump: a gap before its first row
        gap_rows = [{"offset": dump["first_offset"], "gap_before": stream.start_gap}, *gap_rows]
    return ReplicaInput(dump["replica"], dump, rows, gap_rows, stream)


def _by_replica(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for row in rows:
        out.setdefault(row["replica"], []).append(row)
    return out


def explain_keys(
    tables: SnapshotTables, topic: str, partition: int, keys: list[str], venice: Optional[bool] = None,
    heartbeats: bool = True,
) -> dict[str, dict]:
    """The explanation document of each of ``keys`` of one topic partition (``explain_places``)."""
    return explain_places(tables, {(topic, partition): keys}, venice, heartbeats)[(topic, partition)]


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


# ------------------------------------------------------------------ which key to explain when none is named
def audited_snapshots(warehouse: str) -> list[str]:
    """The snapshots the warehouse holds an audit of (a committed ``divergence_summary``), oldest commit first."""
    from deltalake import DeltaTable

    import pyarrow as pa

    from resources.delta_reader import table_uri
    from resources.filesystem import delta_storage_options

    reader = TableReader(warehouse)
    if not reader.exists("divergence_summary"):
        return []
    dt = DeltaTable(table_uri(warehouse, "divergence_summary"), storage_options=delta_storage_options())
    files = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
    newest: dict[str, int] = {}
    for snapshot_id, modified in zip(files.get("partition.snapshot_id", []), files.get("modification_time", [])):
        stamp = int(modified.timestamp() * 1000) if hasattr(modified, "timestamp") else int(modified or 0)
        newest[snapshot_id] = max(newest.get(snapshot_id, stamp), stamp)
    return sorted(newest, key=lambda s: (newest[s], s))


def first_reported_key(
    warehouse: str, snapshot_id: str, topic: Optional[str] = None, partition: Optional[int] = None
) -> Optional[tuple[str, int, str]]:
    """The most important key of the snapshot that is not CONSISTENT (``explain/report.py``'s order: the worst verdict
    first, then the keys with more non-consistent pairs, then topic, partition, key), within ``topic``/``partition``
    when given; None when every such key is CONSISTENT."""
    rank = {"DIVERGENT": 0, "MISSING": 1, "IN_FLIGHT": 2}
    rows = TableReader(warehouse).read("divergence_reports", snapshot_id, columns=["topic", "partition", "key", "verdict"])
    keys: dict[tuple[str, int, str], list[int]] = {}
    for row in ([] if rows is None else rows.to_pylist()):
        if (topic is None or row["topic"] == topic) and (partition is None or row["partition"] == partition):
            keys.setdefault((row["topic"], row["partition"], row["key"]), []).append(rank[row["verdict"]])
    if not keys:
        return None
    return min(keys, key=lambda k: (min(keys[k]), -len(keys[k]), k))
