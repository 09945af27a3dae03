"""Seeded simulator of an active/active replicated store, behind ``replica-lens simulate``.

It writes a raw topic snapshot (SPEC section 1 rows, or with ``--format venice-kafka`` the same
history as raw Venice records: ``_VeniceSink``, docs/venice-input.md) plus a ground-truth file
listing every injected fault and stream anomaly at the exact position where an audit must find it.

Model (SPEC sections 1, 3-7):

- ``regions`` regions each own a real-time topic (RT) per (topic, partition). A region's
  client writes go to its RT with increasing offsets (``source_offset``) and a hybrid logical
  clock ``write_ts = physical_ms << 18 | logical``. Every ``heartbeat_every`` of its own writes,
  and once at the end, the region's leader puts a heartbeat into its RT.
- Every region's leader consumes every RT. A message reaches a leader after a replication
  delay (small for its own RT); the leader applies messages in arrival order, which keeps each
  RT's order but interleaves the RTs differently in every region. Data messages are resolved
  last-writer-wins on ``(write_ts, source_region)``: a loser is not written to the version topic
  (VT), but the applied watermark still advances. A heartbeat from region X becomes a HEARTBEAT
  row in the VT carrying the leader's whole applied watermark as ``hb_vector`` (with
  ``heartbeat_vector="own"``, as Venice's heartbeats: only X's own component, no ``hb_vector``).
- Healthy replicas therefore end in the same state whatever their interleaving; every
  difference comes from an injected fault and is listed in the ground truth.

Only per-RT cursors, the in-flight messages of each leader and per-key conflict metadata are
held in memory; rows stream to files in chunks, so tens of millions of rows are fine.
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import gzip
import hashlib
import heapq
import json
import os
import random
import shutil
import string
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from resources.errors import InvalidSetting, UsageError
from resources.push_settings import push_settings_document
from resources.snapshots import SUCCESS_MARKER, check_snapshot_id

__all__ = [
    "SimulationConfig",
    "SnapshotExistsError",
    "add_arguments",
    "config_from_args",
    "region_names",
    "simulate",
    "topic_names",
]

FILE_FORMATS = ("jsonl", "jsonl.gz", "parquet", "venice-kafka")
HEARTBEAT_VECTORS = ("full", "own")
VENICE_COMPRESSIONS = ("gzip", "zstd-dict")
# Raw Venice records (--format venice-kafka): upstream Kafka cluster id of region i is i, and a
# PUT's value is written under this value schema id.
VENICE_VALUE_SCHEMA_ID = 1

# Physical clock origin of the simulation (ms since the epoch, 2023-11-14).
BASE_MS = 1_700_000_000_000
LOGICAL_BITS = 18

# Message kinds inside the simulation; a FAILOVER placeholder becomes a PUT or DELETE.
PUT, DELETE, HEARTBEAT, FAILOVER = 0, 1, 2, 3
_KIND_NAMES = ("PUT", "DELETE", "HEARTBEAT")
_INF = float("inf")

_TOPIC_STEMS = ("store", "orders", "users", "events", "carts", "payments", "sessions", "profiles")


def _opt(default: Any, help: str, **kwargs: Any) -> Any:
    return field(default=default, metadata={"help": help, **kwargs})


@dataclass
class SimulationConfig:
    """Every knob of a simulated snapshot. All faults and anomalies default to off."""

    seed: int = _opt(7, "random seed; the same seed and options give byte-identical files")
    regions: int = _opt(3, "number of regions (named dc-a, dc-b, ...)")
    topics: int = _opt(1, "number of version topics (named store_v1, orders_v1, ...)")
    partitions: int = _opt(2, "partitions per topic")
    keys: int = _opt(1000, "distinct keys per topic (key i lives in partition i % partitions)")
    writes: int = _opt(20000, "upstream client writes in total, across topics, partitions and regions")
    hot_key_fraction: float = _opt(0.0, "fraction of keys that are hot (0 = uniform key choice)")
    hot_write_share: float = _opt(0.5, "share of writes that go to the hot keys when hot_key_fraction > 0")
    delete_fraction: float = _opt(0.1, "share of writes that are DELETEs")
    heartbeat_every: int = _opt(50, "each region's leader emits a heartbeat into its RT every N own writes, and at the end")
    heartbeat_vector: Optional[str] = _opt(
        None,
        "what a HEARTBEAT row carries: full = the leader's whole applied watermark as hb_vector (the VIP-2 "
        "proposal), own = only its own (source_region, source_offset), as Venice's heartbeats do today "
        "(default: own for venice-kafka, else full)",
        type=str,
        choices=HEARTBEAT_VECTORS,
    )
    write_interval_ms: float = _opt(5.0, "mean time between two writes of one region to one partition")
    replication_delay_ms: float = _opt(50.0, "mean cross-region replication delay")
    clock_uncertainty_ms: int = _opt(3, "half-width of every clock interval [t - d, t + d]")
    exporters: int = _opt(2, "exporters (change-capture consumers) reporting positions per replica partition")
    exporter_report_every: int = _opt(500, "each exporter reports its position every N version-topic rows")
    file_format: str = _opt(
        "jsonl",
        "file format: jsonl, jsonl.gz, parquet (SPEC rows) or venice-kafka (raw Venice records as Spark's Kafka "
        "source writes them, plus a SPEC Parquet file of exporter positions)",
        flag="--format",
        choices=FILE_FORMATS,
    )
    rows_per_file: int = _opt(1_000_000, "rows per data file before starting the next one")
    mid_stream_from: Optional[int] = _opt(
        None, "drop the rows below this offset from every version topic (a mid-stream dump)", type=int
    )
    # Faults: they make replicas differ.
    lost_writes: int = _opt(0, "upstream messages that one replica skips (its watermark still advances)")
    corrupted_values: int = _opt(0, "messages that one replica writes with a different value")
    duplicate_deliveries: int = _opt(0, "messages that one replica writes twice (adjacent or a few rows later)")
    lagging_replica: Optional[str] = _opt(None, "region whose leader stops before the last lag_messages messages", type=str)
    lag_messages: int = _opt(100, "upstream messages per partition the lagging replica never applies")
    conflicting_writes: int = _opt(0, "pairs of concurrent writes of one key from two regions with close clocks")
    # Stream anomalies (SPEC sections 5-7), each listed at its exact position.
    failover_clock_behind: int = _opt(0, "leader fail-overs whose new leader's clock starts behind (WRITE_TS_REGRESSION)")
    failover_behind_ms: int = _opt(1000, "how far behind the new leader's clock starts")
    heartbeat_under_report: int = _opt(0, "heartbeats with an hb_vector component below an earlier one (HEARTBEAT_REGRESSION)")
    rewind: int = _opt(0, "re-applications of a span of already applied messages (DUPLICATE_OR_REWIND)")
    rewind_span: int = _opt(3, "rows re-applied by each rewind")
    stalled_heartbeat: int = _opt(0, "leader stalls making a long applied-time gap between two heartbeats (HEARTBEAT_GAP)")
    stall_ms: int = _opt(60_000, "length of each stall")
    wide_clock_interval: int = _opt(0, "heartbeats with a wide applied clock interval (CLOCK_UNCERTAINTY)")
    wide_clock_ms: int = _opt(500, "half-width of a wide clock interval")
    exporter_regression: int = _opt(0, "exporter reports lower than the same exporter's earlier report")
    # Damage to the dump (SPEC section 3a), applied to each replica partition once its history is complete.
    compact_below: Optional[float] = _opt(
        None,
        "Kafka log compaction of each replica partition below this fraction of its offsets: there only the newest "
        "record of each Kafka key stays (a data key's newest PUT or DELETE anywhere in the partition; all heartbeats "
        "share one key; START_OF_PUSH is kept); offsets are not renumbered",
        type=float,
    )
    lose_records: Optional[float] = _opt(
        None,
        "drop each version-topic record but START_OF_PUSH from the dump with this probability (seeded; after "
        "--compact-below when both are given)",
        type=float,
    )
    # Store-version settings of raw Venice records (--format venice-kafka only; docs/venice-input.md).
    compression: Optional[str] = _opt(
        None,
        "venice-kafka: the version's compression, declared in every START_OF_PUSH: gzip, or zstd-dict (a "
        "dictionary trained on the values, carried in START_OF_PUSH) (default: none)",
        type=str,
        choices=VENICE_COMPRESSIONS,
    )
    chunk_above: Optional[int] = _opt(
        None,
        "venice-kafka: a chunked version: a value whose stored (compressed) bytes exceed this many is written as "
        "chunks of this size then a manifest, and replacing or deleting it is followed by chunk-cleanup DELETEs; "
        "a quarter of the values (chosen by their hash) are made 2-3 times this size",
        type=int,
    )
    push_control_messages: bool = _opt(
        False,
        "venice-kafka: write what a leader writes around a push after START_OF_PUSH (a producer's "
        "START_OF_SEGMENT, END_OF_PUSH, TOPIC_SWITCH, a leadership DOL_STAMP) and an END_OF_SEGMENT at the end",
        type=bool,
    )

    def __post_init__(self) -> None:
        for name in ("regions", "topics", "partitions", "keys", "heartbeat_every", "rows_per_file"):
            if getattr(self, name) < 1:
                raise InvalidSetting(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.regions > 26 * 27:
            raise InvalidSetting(f"regions must be at most {26 * 27}")
        for name in (
            "writes", "exporters", "lost_writes", "corrupted_values", "duplicate_deliveries", "lag_messages",
            "conflicting_writes", "failover_clock_behind", "failover_behind_ms", "heartbeat_under_report", "rewind",
            "stalled_heartbeat", "stall_ms", "wide_clock_interval", "wide_clock_ms", "exporter_regression",
            "clock_uncertainty_ms",
        ):
            if getattr(self, name) < 0:
                raise InvalidSetting(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("hot_key_fraction", "hot_write_share", "delete_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise InvalidSetting(f"{name} must be within [0, 1], got {getattr(self, name)}")
        if self.write_interval_ms <= 0 or self.replication_delay_ms < 0:
            raise InvalidSetting("write_interval_ms must be positive and replication_delay_ms not negative")
        if self.exporter_report_every < 1:
            raise InvalidSetting("exporter_report_every must be at least 1")
        if self.rewind_span < 1:
            raise InvalidSetting("rewind_span must be at least 1")
        if self.file_format not in FILE_FORMATS:
            raise InvalidSetting(f"file_format must be one of {', '.join(FILE_FORMATS)}, got {self.file_format!r}")
        if self.mid_stream_from is not None and self.mid_stream_from < 0:
            raise InvalidSetting("mid_stream_from must not be negative")
        if self.lagging_replica is not None and self.lagging_replica not in region_names(self.regions):
            raise InvalidSetting(
                f"lagging_replica {self.lagging_replica!r} is not one of {', '.join(region_names(self.regions))}"
            )
        if self.conflicting_writes and self.regions < 2:
            raise InvalidSetting("conflicting_writes needs at least two regions")
        if self.failover_clock_behind and self.failover_behind_ms < 1:
            raise InvalidSetting("failover_behind_ms must be at least 1 for failover_clock_behind")
        if self.wide_clock_interval and self.wide_clock_ms <= self.clock_uncertainty_ms:
            raise InvalidSetting("wide_clock_ms must exceed clock_uncertainty_ms for wide_clock_interval")
        if self.stalled_heartbeat and self.stall_ms < 1:
            raise InvalidSetting("stall_ms must be at least 1 for stalled_heartbeat")
        if self.exporter_regression and not self.exporters:
            raise InvalidSetting("exporter_regression needs at least one exporter")
        if self.heartbeat_vector is not None and self.heartbeat_vector not in HEARTBEAT_VECTORS:
            raise InvalidSetting(
                f"heartbeat_vector must be one of {', '.join(HEARTBEAT_VECTORS)}, got {self.heartbeat_vector!r}"
            )
        if self.file_format == "venice-kafka":
            if self.heartbeat_vector == "full":
                raise InvalidSetting("venice-kafka heartbeats carry one component: heartbeat_vector must be own")
            if self.wide_clock_interval:
                raise InvalidSetting(
                    "venice-kafka heartbeats carry time points, widened by one uncertainty at audit time: "
                    "wide_clock_interval cannot be written"
                )
        if self.compact_below is not None and not 0.0 <= self.compact_below <= 1.0:
            raise InvalidSetting(f"compact_below must be within [0, 1], got {self.compact_below}")
        if self.lose_records is not None and not 0.0 <= self.lose_records < 1.0:
            raise InvalidSetting(f"lose_records must be within [0, 1), got {self.lose_records}")
        if self.compression is not None and self.compression not in VENICE_COMPRESSIONS:
            raise InvalidSetting(f"compression must be one of {', '.join(VENICE_COMPRESSIONS)}, got {self.compression!r}")
        if self.chunk_above is not None and self.chunk_above < 16:
            raise InvalidSetting(f"chunk_above must be at least 16 bytes, got {self.chunk_above}")
        if self.file_format != "venice-kafka":
            for name in ("compression", "chunk_above"):
                if getattr(self, name) is not None:
                    raise InvalidSetting(f"{name} describes raw Venice records: it needs --format venice-kafka")
            if self.push_control_messages:
                raise InvalidSetting("push_control_messages describes raw Venice records: it needs --format venice-kafka")
        if self.damaged and (self.chunk_above is not None or self.push_control_messages):
            raise InvalidSetting(
                "compact_below and lose_records cannot yet be combined with chunk_above or push_control_messages "
                "(the ground truth's complete-topic proofs would take their records' positions for gaps)"
            )
        if self.heartbeat_under_report and not self.full_heartbeat_vectors:
            raise InvalidSetting("heartbeat_under_report lowers an hb_vector component: it needs heartbeat_vector full")

    @property
    def damaged(self) -> bool:
        """Whether the dump is damaged after the fact (``compact_below`` or ``lose_records`` given)."""
        return self.compact_below is not None or self.lose_records is not None

    def as_dict(self) -> dict:
        """The settings for the ground truth; the damage options only when given (older files stay the same)."""
        out = dataclasses.asdict(self)
        for name in ("compact_below", "lose_records", "compression", "chunk_above"):
            if out[name] is None:
                del out[name]
        if not out["push_control_messages"]:
            del out["push_control_messages"]
        return out

    @property
    def full_heartbeat_vectors(self) -> bool:
        """Whether HEARTBEAT rows carry the whole applied watermark (``heartbeat_vector``, resolved)."""
        if self.heartbeat_vector is None:
            return self.file_format != "venice-kafka"
        return self.heartbeat_vector == "full"


class SnapshotExistsError(UsageError, FileExistsError):
    """The snapshot folder is already there (pass overwrite=True to replace it)."""


def region_names(n: int) -> list[str]:
    letters = string.ascii_lowercase
    names = [f"dc-{c}" for c in letters] + [f"dc-{a}{b}" for a in letters for b in letters]
    return names[:n]


def topic_names(n: int) -> list[str]:
    return [_TOPIC_STEMS[i] + "_v1" if i < len(_TOPIC_STEMS) else f"topic{i}_v1" for i in range(n)]


# --------------------------------------------------------------------------- output files


class _Sink:
    """Rows of one (replica, topic, partition), streamed into rotating files under temporary names."""

    def __init__(self, folder: Path, replica: str, topic: str, partition: int, config: SimulationConfig):
        self.folder = folder
        self.replica, self.topic, self.partition = replica, topic, partition
        self.stem = f"{replica}.{topic}.p{partition}"
        self.rows_per_file = config.rows_per_file
        self.skip_below = config.mid_stream_from or 0
        self.counts = {"START_OF_PUSH": 0, "PUT": 0, "DELETE": 0, "HEARTBEAT": 0, "EXPORTER_POSITION": 0}
        # Records a sink writes beyond the rows (raw Venice records only): after START_OF_PUSH, and around
        # a data row (``reserve``). The leader leaves offsets for them.
        self.preamble = 0
        self.chunking = False
        self.files: list[str] = []
        self.in_file = 0
        self._tmp: Optional[Path] = None

    def _next_path(self, ext: str) -> Path:
        name = f"{self.stem}.{len(self.files):05d}.{ext}"
        self.files.append(name)
        self._tmp = self.folder / f".{name}.inprogress"
        return self._tmp

    def _publish(self) -> None:
        os.replace(self._tmp, self.folder / self.files[-1])
        self._tmp = None


class _JsonSink(_Sink):
    _CHUNK = 4096

    def __init__(self, folder, replica, topic, partition, config, gz: bool):
        super().__init__(folder, replica, topic, partition, config)
        self.gz = gz
        self.pre = '{"replica": %s, "topic": %s, "partition": %d' % (json.dumps(replica), json.dumps(topic), partition)
        self.pre_off = self.pre + ', "offset": '
        self.lines: list[str] = []
        self.fh = None
        self.raw = None
        self.puts = self.deletes = 0
        self.spill_at = min(self._CHUNK, self.rows_per_file)  # in_file count at which the buffer is written

    def _open(self) -> None:
        path = self._next_path("jsonl.gz" if self.gz else "jsonl")
        if self.gz:
            self.raw = open(path, "wb")
            # mtime=0 and no file name keep the gzip header, and so the file, byte-identical across runs.
            self.fh = gzip.GzipFile(filename="", mode="wb", fileobj=self.raw, compresslevel=6, mtime=0)
        else:
            self.fh = open(path, "w", encoding="utf-8", newline="\n")

    def _spill(self) -> None:
        if self.fh is None:
            self._open()
        if self.lines:
            text = "".join(self.lines)
            self.fh.write(text.encode("utf-8") if self.gz else text)
            self.lines = []
        if self.in_file >= self.rows_per_file:
            self.fh.close()
            if self.raw is not None:
                self.raw.close()
                self.raw = None
            self.fh = None
            self._publish()
            self.in_file = 0
        self.spill_at = min(self.in_file + self._CHUNK, self.rows_per_file)

    def _add(self, line: str) -> None:
        self.lines.append(line)
        self.in_file += 1
        if self.in_file >= self.spill_at:
            self._spill()

    def close(self) -> None:
        if self.lines:
            self._spill()
        if self.fh is not None:
            self.in_file = self.rows_per_file
            self._spill()
        self.counts["PUT"] += self.puts
        self.counts["DELETE"] += self.deletes
        self.puts = self.deletes = 0

    def start_of_push(self, off: int, epoch: int) -> None:
        if off < self.skip_below:
            return
        self.counts["START_OF_PUSH"] += 1
        self._add(f'{self.pre_off}{off}, "leader_epoch": {epoch}, "kind": "START_OF_PUSH"}}\n')

    def data(self, off, epoch, key, value, src, soff, wts) -> None:
        if off < self.skip_below:
            return
        # The hot path: one f-string per row, appended straight to the buffer.
        if value is None:
            self.deletes += 1
            self.lines.append(
                f'{self.pre_off}{off}, "leader_epoch": {epoch}, "kind": "DELETE", "key": "{key}", '
                f'"source_region": "{src}", "source_offset": {soff}, "write_ts": {wts}}}\n'
            )
        else:
            self.puts += 1
            self.lines.append(
                f'{self.pre_off}{off}, "leader_epoch": {epoch}, "kind": "PUT", "key": "{key}", "value": "{value}", '
                f'"source_region": "{src}", "source_offset": {soff}, "write_ts": {wts}}}\n'
            )
        self.in_file += 1
        if self.in_file >= self.spill_at:
            self._spill()

    def heartbeat(self, off, epoch, src, soff, vector, omin, omax, amin, amax) -> None:
        if off < self.skip_below:
            return
        self.counts["HEARTBEAT"] += 1
        vec = "" if vector is None else ', "hb_vector": {%s}' % ", ".join(f'"{r}": {o}' for r, o in vector)
        self._add(
            f'{self.pre_off}{off}, "leader_epoch": {epoch}, "kind": "HEARTBEAT", "source_region": "{src}", '
            f'"source_offset": {soff}{vec}, "origin_ts_min_ms": {omin}, '
            f'"origin_ts_max_ms": {omax}, "applied_ts_min_ms": {amin}, "applied_ts_max_ms": {amax}}}\n'
        )

    def exporter_position(self, exporter: str, exported: int, reported_at: int) -> None:
        self.counts["EXPORTER_POSITION"] += 1
        self._add(
            f'{self.pre}, "kind": "EXPORTER_POSITION", "exporter": "{exporter}", '
            f'"exported_offset": {exported}, "reported_at_ms": {reported_at}}}\n'
        )


def parquet_schema():
    """The Parquet schema of snapshot files: SPEC section 1 field names, hb_vector as map<string,int64>."""
    import pyarrow as pa

    return pa.schema(
        [
            ("replica", pa.string()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("kind", pa.string()),
            ("key", pa.string()),
            ("value", pa.string()),
            ("source_region", pa.string()),
            ("source_offset", pa.int64()),
            ("hb_vector", pa.map_(pa.string(), pa.int64())),
            ("origin_ts_min_ms", pa.int64()),
            ("origin_ts_max_ms", pa.int64()),
            ("applied_ts_min_ms", pa.int64()),
            ("applied_ts_max_ms", pa.int64()),
            ("write_ts", pa.int64()),
            ("leader_epoch", pa.int64()),
            ("exporter", pa.string()),
            ("exported_offset", pa.int64()),
            ("reported_at_ms", pa.int64()),
        ]
    )


class _ArrowSink(_Sink):
    """Rows buffered as tuples of the ``_VARYING`` columns, written in chunks to rotating Parquet files;
    the other columns of ``schema`` are constant within a sink (``constants``)."""

    _CHUNK = 32_768
    _VARYING: tuple[str, ...] = ()
    _EXT = "parquet"

    def __init__(self, folder, replica, topic, partition, config, schema, constants: dict):
        super().__init__(folder, replica, topic, partition, config)
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa, self.pq = pa, pq
        self.schema = schema
        self.constants = constants
        self.writer = None
        self.rows: list[tuple] = []

    def _flush(self) -> None:
        if not self.rows:
            return
        if self.writer is None:
            self.writer = self.pq.ParquetWriter(self._next_path(self._EXT), self.schema)
            self.in_file = 0
        n = len(self.rows)
        varying = dict(zip(self._VARYING, zip(*self.rows)))
        arrays = [
            self.pa.array(varying[f.name] if f.name in varying else [self.constants[f.name]] * n, f.type)
            for f in self.schema
        ]
        self.writer.write_table(self.pa.Table.from_arrays(arrays, schema=self.schema))
        self.in_file += n
        self.rows = []

    def _add(self, row: tuple) -> None:
        self.rows.append(row)
        if len(self.rows) >= self._CHUNK or self.in_file + len(self.rows) >= self.rows_per_file:
            self._flush()
            if self.in_file >= self.rows_per_file:
                self._close_file()

    def _close_file(self) -> None:
        self.writer.close()
        self.writer = None
        self._publish()

    def close(self) -> None:
        self._flush()
        if self.writer is not None:
            self._close_file()


class _ParquetSink(_ArrowSink):
    # Columns filled per row; replica, topic and partition are constant within a sink.
    _VARYING = (
        "offset", "kind", "key", "value", "source_region", "source_offset", "hb_vector", "origin_ts_min_ms",
        "origin_ts_max_ms", "applied_ts_min_ms", "applied_ts_max_ms", "write_ts", "leader_epoch", "exporter",
        "exported_offset", "reported_at_ms",
    )

    def __init__(self, folder, replica, topic, partition, config):
        constants = {"replica": replica, "topic": topic, "partition": partition}
        super().__init__(folder, replica, topic, partition, config, parquet_schema(), constants)

    def start_of_push(self, off, epoch) -> None:
        if off < self.skip_below:
            return
        self.counts["START_OF_PUSH"] += 1
        self._add((off, "START_OF_PUSH", None, None, None, None, None, None, None, None, None, None, epoch, None, None, None))

    def data(self, off, epoch, key, value, src, soff, wts) -> None:
        if off < self.skip_below:
            return
        kind = "DELETE" if value is None else "PUT"
        self.counts[kind] += 1
        self._add((off, kind, key, value, src, soff, None, None, None, None, None, wts, epoch, None, None, None))

    def heartbeat(self, off, epoch, src, soff, vector, omin, omax, amin, amax) -> None:
        if off < self.skip_below:
            return
        self.counts["HEARTBEAT"] += 1
        self._add((off, "HEARTBEAT", None, None, src, soff, vector, omin, omax, amin, amax, None, epoch, None, None, None))

    def exporter_position(self, exporter, exported, reported_at) -> None:
        self.counts["EXPORTER_POSITION"] += 1
        self._add((None, "EXPORTER_POSITION", None, None, None, None, None, None, None, None, None, None, None,
                   exporter, exported, reported_at))


def kafka_source_schema():
    """The Parquet schema of raw Venice records: the columns of Spark's Kafka source, plus ``region``."""
    import pyarrow as pa

    return pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.timestamp("ms", tz="UTC")),
            ("timestampType", pa.int32()),
            ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
            ("region", pa.string()),
        ]
    )


def venice_cluster_regions(regions: list[str]) -> str:
    """The ``--cluster-regions`` map of a venice-kafka simulation: region i has upstream cluster id i."""
    return ",".join(f"{i}={name}" for i, name in enumerate(regions))


def venice_key(key: str) -> str:
    """A simulated key as the audit of its venice-kafka records names it: base64 of its UTF-8 bytes."""
    return base64.b64encode(key.encode("utf-8")).decode("ascii")


def venice_value_bytes(value: str, chunk_above: Optional[int] = None) -> bytes:
    """The bytes a simulated PUT value is written as in venice-kafka records: its UTF-8 bytes; with
    ``chunk_above``, a quarter of the values (by their hash) are made 2-3 times that size with bytes no
    compression shrinks (a deterministic stream seeded by the value), so that they need chunks."""
    raw = value.encode("utf-8")
    if chunk_above is None:
        return raw
    h = hashlib.sha1(raw).digest()
    if h[0] >= 64:
        return raw
    size = 2 * chunk_above + int.from_bytes(h[1:3], "big") % chunk_above
    return raw + b"|" + hashlib.shake_128(raw).digest(max(0, size - len(raw) - 1))


def venice_value(value: str, chunk_above: Optional[int] = None) -> str:
    """A simulated PUT value as the audit of its venice-kafka records shows it: ``schemaId:base64(bytes)``
    (``venice_value_bytes``: the logical value, after reassembly and decompression)."""
    return f"{VENICE_VALUE_SCHEMA_ID}:{base64.b64encode(venice_value_bytes(value, chunk_above)).decode('ascii')}"


def venice_push_settings(config: SimulationConfig):
    """The PushSettings every START_OF_PUSH of a venice-kafka simulation declares. zstd-dict trains its
    dictionary on values shaped like the simulation's (deterministic: the same options give the same bytes)."""
    from pipelines import venice_values

    compression = {None: venice_values.NO_OP, "gzip": venice_values.GZIP,
                   "zstd-dict": venice_values.ZSTD_WITH_DICT}[config.compression]
    dictionary = None
    if compression == venice_values.ZSTD_WITH_DICT:
        import zstandard

        samples = [venice_value_bytes(f"v{letter}{n}", config.chunk_above)[:256]
                   for letter in string.ascii_uppercase[:8] for n in range(0, 4000, 7)]
        dictionary = zstandard.train_dictionary(4096, samples).as_bytes()
    return venice_values.PushSettings(config.chunk_above is not None, compression, dictionary)


class _VeniceSink(_ArrowSink):
    """Raw Venice records of one replica's version-topic partition (``pipelines/venice.py`` encodes them,
    protocol version 14): ``{stem}.NNNNN.kafka.parquet``. Exporter positions have no Venice record, so they
    go to SPEC Parquet files beside them (``{stem}.exporters.NNNNN.parquet``).

    Kafka timestamps: a heartbeat's is the midpoint of its applied interval (the decoder widens it back
    by the audit's clock uncertainty); other records carry the last heartbeat's, as nothing reads them.

    The version's settings (``venice_push_settings``): values compressed as START_OF_PUSH declares; in a
    chunked version (``chunk_above``) a large value takes the offsets before its manifest for its chunks,
    and a key whose previous value was chunked takes the offsets after its new row for the cleanup
    DELETEs of the old chunks (``reserve``, called by the leader when it picks the row's offset). Records
    that hold no row are counted in ``records`` by kind (as the audit's skipped counts name them)."""

    _VARYING = ("key", "value", "offset", "timestamp")
    _EXT = "kafka.parquet"
    # Written right after START_OF_PUSH with push_control_messages: a producer's segment start, the end of
    # the batch push, the switch to the real-time topic, and the new leader's declaration of leadership.
    _PREAMBLE = ("START_OF_SEGMENT", "END_OF_PUSH", "TOPIC_SWITCH", "DOL_STAMP")

    def __init__(self, folder, replica, topic, partition, config, regions: list[str], push):
        constants = {"topic": topic, "partition": partition, "timestampType": 0, "headers": [], "region": replica}
        super().__init__(folder, replica, topic, partition, config, kafka_source_schema(), constants)
        from pipelines import venice, venice_values

        self.venice, self.values = venice, venice_values
        self.clusters = {name: i for i, name in enumerate(regions)}
        self.uncertainty = config.clock_uncertainty_ms
        self.guid = hashlib.md5(f"replica-lens:{replica}".encode()).digest()
        self.ts = BASE_MS
        self.base = {"replica": replica, "topic": topic, "partition": partition}
        self.exporters = _ParquetSink(folder, replica, topic, partition, config)
        self.exporters.stem = f"{self.stem}.exporters"
        self.push = push
        self.chunk_above = config.chunk_above
        self.chunking = config.chunk_above is not None
        self.preamble = len(self._PREAMBLE) if config.push_control_messages else 0
        self.plans: dict[int, tuple[int, Optional[tuple[int, int]]]] = {}  # row offset -> (chunks, old chunks)
        self.chunked: dict[str, tuple[int, int]] = {}  # key -> (row offset, chunks) of its chunked value
        self.records: Counter = Counter()

    def _write(self, record, offset: int) -> None:
        if offset >= self.skip_below:
            self._add((record.key, record.value, offset, self.ts))

    def _record(self, row: dict) -> None:
        record = self.venice.encode_record(
            {**self.base, **row}, region_clusters=self.clusters, clock_uncertainty_ms=self.uncertainty,
            producer_guid=self.guid, push=self.push,
        )
        if row["kind"] == "HEARTBEAT":
            self.ts = record.timestamp_ms
        self.counts[row["kind"]] += 1
        self._add((record.key, record.value, row["offset"], self.ts))

    def start_of_push(self, off, epoch) -> None:
        if off >= self.skip_below:
            self._record({"offset": off, "kind": "START_OF_PUSH", "leader_epoch": epoch})
        for i, name in enumerate(self._PREAMBLE[: self.preamble]):
            key = self.venice.DOL_STAMP_KEY_BYTES if name == "DOL_STAMP" else None
            kind = self.venice.CONTROL_MESSAGE_TYPES.index("START_OF_SEGMENT" if name == "DOL_STAMP" else name)
            record = self.venice.encode_control_message(kind, producer_guid=self.guid, key_bytes=key, timestamp_ms=self.ts)
            if off + 1 + i >= self.skip_below:
                self.records[name] += 1
            self._write(record, off + 1 + i)

    def _chunks(self, value: str) -> int:
        stored = self.values.compress(self.push, venice_value_bytes(value, self.chunk_above))
        return 0 if len(stored) <= self.chunk_above else -(-len(stored) // self.chunk_above)

    def reserve(self, first: int, key: str, value: Optional[str]) -> tuple[int, int]:
        """The records a data row of ``key`` takes before it (its value's chunks) and after it (cleanup
        DELETEs of the key's old chunks) when it is written from offset ``first`` on."""
        n = 0 if value is None else self._chunks(value)
        row = first + n
        old = self.chunked.pop(key, None)
        if n:
            self.chunked[key] = (row, n)
        self.plans[row] = (n, old)
        return n, old[1] if old else 0

    def _chunk_keys(self, key: str, row: int, n: int) -> list[bytes]:
        user_key = key.encode("utf-8")
        return [user_key + self.values.chunk_suffix(self.guid, 0, row - n, i) for i in range(n)]

    def data(self, off, epoch, key, value, src, soff, wts) -> None:
        n, old = self.plans.pop(off, (0, None))
        row = {"offset": off, "kind": "DELETE" if value is None else "PUT", "key": venice_key(key),
               "source_region": src, "source_offset": soff, "write_ts": wts, "leader_epoch": epoch}
        if value is not None:
            row["value"] = venice_value(value, self.chunk_above)
        if n:
            records, _ = self.venice.encode_chunked_put(
                {**self.base, **row}, region_clusters=self.clusters, push=self.push, chunk_size=self.chunk_above,
                producer_guid=self.guid, segment=0, sequence=off - n,
            )
            for i, record in enumerate(records[:-1]):
                self.records["VALUE_CHUNK"] += off - n + i >= self.skip_below
                self._write(record, off - n + i)
            if off >= self.skip_below:
                self.counts["PUT"] += 1
            self._write(records[-1], off)
        elif off >= self.skip_below:
            self._record(row)
        if old:
            cleanups = self.venice.encode_chunk_cleanup(self._chunk_keys(key, *old), {**self.base, **row},
                                                        region_clusters=self.clusters, producer_guid=self.guid)
            for i, record in enumerate(cleanups):
                self.records["CHUNK_CLEANUP"] += off + 1 + i >= self.skip_below
                self._write(record, off + 1 + i)

    def heartbeat(self, off, epoch, src, soff, vector, omin, omax, amin, amax) -> None:
        if off >= self.skip_below:
            self._record({"offset": off, "kind": "HEARTBEAT", "source_region": src, "source_offset": soff,
                          "leader_epoch": epoch, "origin_ts_min_ms": omin, "origin_ts_max_ms": omax,
                          "applied_ts_min_ms": amin, "applied_ts_max_ms": amax})

    def exporter_position(self, exporter, exported, reported_at) -> None:
        self.exporters.exporter_position(exporter, exported, reported_at)

    def close(self) -> None:
        super().close()
        self.exporters.close()
        self.files.extend(self.exporters.files)
        self.counts["EXPORTER_POSITION"] += self.exporters.counts["EXPORTER_POSITION"]
        self.exporters.counts["EXPORTER_POSITION"] = 0


# --------------------------------------------------------------------------- damage (SPEC section 3a)

_SOP, _DATA, _HB, _EXP = 0, 1, 2, 3


class _DamagedSink:
    """Holds a replica partition's rows until its history is complete, then writes them to ``sink``
    with the damage asked for: Kafka log compaction below ``compact_below`` of the partition's
    offsets, then records lost at random (``lose_records``). Offsets are never renumbered.

    The complete rows stay in ``complete_rows`` (SPEC fields the reference reads) until the
    partition's complete-topic proofs are computed; ``damage`` counts what was removed."""

    def __init__(self, sink, config: SimulationConfig, seed_key: str):
        self.sink = sink
        self.config = config
        self.preamble, self.chunking = 0, False  # not combined with the sinks that write more (SimulationConfig)
        self.rng = random.Random(f"lose:{seed_key}:{sink.replica}")
        self.calls: list[tuple] = []
        self.complete_rows: list[dict] = []
        self.damage: dict = {}

    @property
    def counts(self) -> dict:
        return self.sink.counts

    @property
    def files(self) -> list[str]:
        return self.sink.files

    def start_of_push(self, off, epoch) -> None:
        self.calls.append((_SOP, off, epoch))

    def data(self, off, epoch, key, value, src, soff, wts) -> None:
        self.calls.append((_DATA, off, epoch, key, value, src, soff, wts))

    def heartbeat(self, off, epoch, src, soff, vector, omin, omax, amin, amax) -> None:
        self.calls.append((_HB, off, epoch, src, soff, vector, omin, omax, amin, amax))

    def exporter_position(self, exporter, exported, reported_at) -> None:
        self.calls.append((_EXP, exporter, exported, reported_at))

    def close(self) -> None:
        calls, self.calls = self.calls, []
        sink = self.sink
        base = {"replica": sink.replica, "topic": sink.topic, "partition": sink.partition}
        # The newest offset of each Kafka key: a data row's record key, one key for all heartbeats.
        newest: dict = {}
        offsets = 0
        for c in calls:
            if c[0] == _DATA:
                newest[c[3]] = c[1]
            elif c[0] == _HB:
                newest[None] = c[1]
            if c[0] != _EXP:
                offsets = max(offsets, c[1] + 1)
        cut = int(self.config.compact_below * offsets) if self.config.compact_below is not None else 0
        lose = self.config.lose_records or 0.0
        skip_below = sink.skip_below
        compacted = lost = 0
        for c in calls:
            what = c[0]
            if what == _EXP:
                sink.exporter_position(*c[1:])
                continue
            off = c[1]
            if what == _SOP:
                self.complete_rows.append({**base, "offset": off, "kind": "START_OF_PUSH"})
                sink.start_of_push(*c[1:])
                continue
            if what == _DATA:
                _, _, _, key, value, src, soff, _ = c
                row = {**base, "offset": off, "kind": "DELETE" if value is None else "PUT", "key": key,
                       "source_region": src, "source_offset": soff}
                if value is not None:
                    row["value"] = value
                kafka_key = key
            else:
                _, _, _, src, soff, vector, omin = c[:7]
                row = {**base, "offset": off, "kind": "HEARTBEAT", "source_region": src, "source_offset": soff,
                       "hb_vector": None if vector is None else dict(vector), "origin_ts_min_ms": omin}
                kafka_key = None
            self.complete_rows.append(row)
            if off < cut and newest[kafka_key] != off:
                compacted += off >= skip_below
                continue
            if off >= skip_below and lose and self.rng.random() < lose:
                lost += 1
                continue
            if what == _DATA:
                sink.data(*c[1:])
            else:
                sink.heartbeat(*c[1:])
        self.damage = {**base, "offsets": offsets, "compaction_cut": cut, "compacted": compacted, "lost": lost}
        sink.close()


# --------------------------------------------------------------------------- the simulation


class _Leader:
    """The leader of one region for one (topic, partition): applies messages and writes its VT."""

    def __init__(self, sim: "_PartitionSim", idx: int, limit: int, triggers: list[tuple[int, str]], sink):
        self.sim = sim
        self.idx = idx
        self.name = sim.regions[idx]
        self.limit = limit  # messages this leader applies (fewer than all for the lagging replica)
        self.sink = sink
        self.n = 0
        self.off = 0
        self.epoch = 1
        self.full_vectors = sim.config.full_heartbeat_vectors
        self.now = 0  # applied clock, microseconds since BASE_MS
        self.floor = 0  # a stalled leader applies nothing before this time
        self.win: dict[str, tuple] = {}  # key -> (write_ts, source idx, value or None, vt offset)
        self.wm = [-1] * len(sim.regions)  # applied high watermark per source region
        self.shadow: dict[str, Optional[tuple]] = {}  # fault keys: the state without the fault
        self.triggers = sorted(triggers, reverse=True)
        self.next_arm = self.triggers[-1][0] if self.triggers else _INF
        self.armed: list[str] = []  # faults waiting for an eligible data message
        self.slow = False
        self.dup: Optional[dict] = None  # pending duplicate delivery
        self.rewinds = 0
        self.recent: list[tuple] = []  # recent data rows, collected while a rewind is armed
        self.failover_soffs: set[int] = set()  # RT offsets of this region's pending fail-over retries
        # Heartbeat anomalies.
        self.wide = 0
        self.stalls = 0
        self.gap_open: Optional[dict] = None
        self.under = 0
        self.under_waited = 0
        self.seg: Optional[list[tuple]] = None  # data rows since the last heartbeat, while an under-report waits
        self.last_true_hb: Optional[list[int]] = None
        self.last_hb_amid: Optional[int] = None
        self.natural_max_gap_ms = 0
        # Exporters.
        self.exp_rng = random.Random(f"exporters:{sim.seed_key}:{self.name}")
        self.exp_max = [-1] * len(sim.exporters)
        self.exp_at = [0] * len(sim.exporters)
        self.exp_regress = 0
        self.every = sim.config.exporter_report_every
        self.next_report = self.every - 1
        sink.start_of_push(0, self.epoch)
        self.off = 1 + sink.preamble
        self.chunking = sink.chunking
        # Rows written so far plus one: the offset of the next row where every row takes one offset. What
        # waits for a number of rows (a duplicate delivery) counts these, so that records a sink writes
        # beside the rows (chunks, control messages) leave the history as it is.
        self.rows = 1

    # ---- the hot path

    def apply(self, msg: tuple, arrival: int) -> None:
        if self.n >= self.limit:
            return
        self.n += 1
        if self.n >= self.next_arm:
            self._arm()
        self.now = arrival if arrival > self.floor else self.floor
        x = msg[0]
        self.wm[x] = msg[1]
        if self.slow:
            self._apply_slow(msg)
            return
        if msg[2] == HEARTBEAT:
            self._heartbeat(x, msg[1], msg[6])
            return
        k = msg[3]
        wts = msg[5]
        cur = self.win.get(k)
        if cur is not None and (wts < cur[0] or (wts == cur[0] and x <= cur[1])):
            return  # loses last-writer-wins: nothing written, the watermark has advanced
        if self.chunking:
            off = self._take(k, msg[4])
        else:
            off = self.off
            self.off = off + 1
            self.rows += 1
        self.win[k] = (wts, x, msg[4], off)
        self.sink.data(off, self.epoch, k, msg[4], self.sim.regions[x], msg[1], wts)
        if off >= self.next_report:
            self._report()

    # ---- faults and anomalies

    def _arm(self) -> None:
        while self.triggers and self.triggers[-1][0] <= self.n:
            _, what = self.triggers.pop()
            if what == "rewind":
                self.rewinds += 1
                self.recent = []
            elif what == "heartbeat_under_report":
                self.under += 1
            elif what == "stalled_heartbeat":
                self.stalls += 1
            elif what == "wide_clock_interval":
                self.wide += 1
            elif what == "exporter_regression":
                self.exp_regress += 1
            else:
                self.armed.append(what)
        self.next_arm = self.triggers[-1][0] if self.triggers else _INF
        self._update_slow()

    def _update_slow(self) -> None:
        self.slow = bool(
            self.armed or self.shadow or self.dup or self.rewinds or self.under or self.failover_soffs
        )

    def _apply_slow(self, msg: tuple) -> None:
        x, soff, kind, k, val, wts, t = msg
        if kind == HEARTBEAT:
            self._heartbeat(x, soff, t)
            self._after_row(None)
            return
        if x == self.idx and soff in self.failover_soffs:
            self._failover_row(msg)
            return
        if k in self.shadow:
            s = self.shadow[k]
            if s is None or wts > s[0] or (wts == s[0] and x > s[1]):
                self.shadow[k] = (wts, x, val)
        cur = self.win.get(k)
        if cur is not None and (wts < cur[0] or (wts == cur[0] and x <= cur[1])):
            return
        fault = None
        if self.armed and k not in self.sim.used_keys:
            for i, what in enumerate(self.armed):
                if (what == "corrupted_value" and val is None) or (what == "duplicate_delivery" and self.dup):
                    continue
                fault = self.armed.pop(i)
                self.sim.used_keys.add(k)
                break
        region = self.sim.regions[x]
        if fault == "lost_write":
            self.shadow[k] = (wts, x, val)
            self.sim.record_fault(self, "lost_write", k, region, soff, None, write_ts=wts, value=val)
            self._update_slow()
            return
        stored = val
        if fault == "corrupted_value":
            stored = val + "-corrupt"
            self.shadow[k] = (wts, x, val)
        off = self._data_row(k, stored, region, soff, wts)
        self.win[k] = (wts, x, stored, off)
        if fault == "corrupted_value":
            self.sim.record_fault(self, "corrupted_value", k, region, soff, off, write_ts=wts, value=val,
                                  written_value=stored)
        elif fault == "duplicate_delivery":
            gap = self.sim.rng.randint(0, 3)
            self.dup = {"due": self.rows + gap, "row": (k, stored, region, soff, wts), "x": x, "original": off}
        self._after_row((k, stored, region, soff, wts))
        self._update_slow()

    def _data_row(self, k, val, region, soff, wts) -> int:
        """Write a data row (after a due or same-key pending duplicate) and return its offset."""
        if self.dup is not None and (self.dup["due"] <= self.rows or self.dup["row"][0] == k):
            self._flush_dup()
        off = self._take(k, val)
        self.sink.data(off, self.epoch, k, val, region, soff, wts)
        if self.seg is not None:
            self.seg.append((off, region, soff))
        if off >= self.next_report:
            self._report()
        return off

    def _take(self, k: str, val: Optional[str]) -> int:
        """The offset of the next data row, after the records the sink writes before it; the offsets of
        those it writes after it are taken too (chunks and chunk cleanups of raw Venice records)."""
        off = self.off
        self.rows += 1
        if self.chunking:
            before, after = self.sink.reserve(off, k, val)
            off += before
            self.off = off + 1 + after
        else:
            self.off = off + 1
        return off

    def _flush_dup(self) -> None:
        dup, self.dup = self.dup, None
        k, val, region, soff, wts = dup["row"]
        off = self._take(k, val)
        self.sink.data(off, self.epoch, k, val, region, soff, wts)
        if self.seg is not None:
            self.seg.append((off, region, soff))
        if off >= self.next_report:
            self._report()
        cur = self.win[k]
        self.win[k] = (cur[0], cur[1], cur[2], off)
        self.recent = []
        self.sim.record_fault(self, "duplicate_delivery", k, region, soff, off, write_ts=wts, value=val,
                              original_vt_offset=dup["original"])
        self._update_slow()

    def _after_row(self, data_row: Optional[tuple]) -> None:
        """Bookkeeping after a row in slow mode: a due duplicate, then a rewind once its span is ready."""
        if self.dup is not None and self.dup["due"] <= self.rows:
            self._flush_dup()
            return
        if not self.rewinds or self.dup is not None:
            return
        if data_row is None:
            self.recent = []
            return
        keys = [r[0] for r in self.recent]
        if data_row[0] in keys:
            self.recent = self.recent[keys.index(data_row[0]) + 1:]
        self.recent.append(data_row)
        if len(self.recent) >= self.sim.config.rewind_span:
            self._rewind()

    def _rewind(self) -> None:
        # The span is the latest rows and holds each key once, so re-applying it leaves every
        # key at its current value and write_ts: only DUPLICATE_OR_REWIND can flag it.
        span, self.recent = self.recent, []
        self.rewinds -= 1
        offsets = []
        for k, val, region, soff, wts in span:
            off = self._data_row(k, val, region, soff, wts)
            cur = self.win[k]
            self.win[k] = (cur[0], cur[1], cur[2], off)
            offsets.append(off)
        first = span[0]
        self.sim.record_anomaly(
            self, "DUPLICATE_OR_REWIND", "rewind", offsets[0], offsets=offsets, key=first[0],
            source_region=first[2], source_offset=first[3],
            rewound=[{"offset": o, "key": r[0], "source_region": r[2], "source_offset": r[3]} for o, r in zip(offsets, span)],
        )
        self._update_slow()

    def make_retry(self, msg: tuple) -> tuple:
        """Fill the fail-over placeholder of this region's RT: a client retry stamped by a clock behind."""
        best = None
        for k, cur in self.win.items():
            if cur[1] == self.idx and k not in self.sim.used_keys and (best is None or cur[3] > best[1][3]):
                best = (k, cur)
        x, soff, _, _, _, slot_wts, t = msg
        if best is None:
            self.sim.warnings.append(
                f"failover_clock_behind not injected in {self.name} {self.sim.topic}/{self.sim.partition}: "
                "no key written from this region yet"
            )
            k = self.sim.any_key()
            return (x, soff, PUT, k, f"v{self.sim.letters[x]}{soff}", slot_wts, t)
        k, cur = best
        self.sim.used_keys.add(k)
        behind = max(0, (cur[0] >> LOGICAL_BITS) - self.sim.config.failover_behind_ms) << LOGICAL_BITS
        self.failover_soffs.add(soff)
        self._update_slow()
        return (x, soff, PUT if cur[2] is not None else DELETE, k, cur[2], behind, t)

    def _failover_row(self, msg: tuple) -> None:
        x, soff, kind, k, _, wts, _ = msg
        self.failover_soffs.discard(soff)
        cur = self.win[k]
        # The new leader trusts its own clock and writes the retry without conflict resolution;
        # it re-writes the key's current value, and keeps the key's conflict metadata, so the
        # replicas still agree on values. Every other leader drops the message by LWW.
        self.epoch += 1
        off = self._data_row(k, cur[2], self.name, soff, wts)
        self.win[k] = (cur[0], cur[1], cur[2], off)
        self.sim.record_anomaly(
            self, "WRITE_TS_REGRESSION", "failover_clock_behind", off, key=k, source_region=self.name,
            source_offset=soff, write_ts=wts, previous_offset=cur[3], previous_write_ts=cur[0],
            leader_epoch=self.epoch, previous_leader_epoch=self.epoch - 1,
        )
        # The retry is not the key's current write, so no rewind may re-apply it.
        self._after_row(None)
        self._update_slow()

    # ---- heartbeats and exporter reports

    def _heartbeat(self, x: int, soff: int, t_origin: int) -> None:
        sim = self.sim
        if self.dup is not None and self.dup["due"] <= self.rows:
            self._flush_dup()
        off = self.off
        self.off = off + 1
        self.rows += 1
        d = sim.config.clock_uncertainty_ms
        amid = BASE_MS + self.now // 1000
        omid = BASE_MS + t_origin // 1000
        wm = self.wm
        regions = sim.regions
        # Own mode: the row carries no hb_vector, only (source_region, source_offset).
        vector = [(regions[i], wm[i]) for i in range(len(wm)) if wm[i] >= 0] if self.full_vectors else None
        anomalies = []
        if self.under:
            vector = self._under_report(off, x, vector, anomalies)
        if not anomalies:  # an under-reported vector is no baseline for the next one
            self.last_true_hb = list(wm)
        half = d
        if self.wide:
            self.wide -= 1
            half = sim.config.wide_clock_ms
            anomalies.append(("CLOCK_UNCERTAINTY", "wide_clock_interval",
                              {"interval": "applied", "width_ms": 2 * half}))
        self.sink.heartbeat(off, self.epoch, regions[x], soff, vector, omid - d, omid + d, amid - half, amid + half)
        if self.gap_open is not None:
            gap = self.gap_open
            self.gap_open = None
            anomalies.append(("HEARTBEAT_GAP", "stalled_heartbeat",
                              {"previous_offset": gap["offset"], "gap_ms": amid - gap["amid"]}))
        elif self.last_hb_amid is not None:
            self.natural_max_gap_ms = max(self.natural_max_gap_ms, amid - self.last_hb_amid)
        self.last_hb_amid = amid
        if self.stalls:
            self.stalls -= 1
            self.floor = self.now + sim.config.stall_ms * 1000
            self.gap_open = {"offset": off, "amid": amid}
        for anomaly, cause, extra in anomalies:
            sim.record_anomaly(self, anomaly, cause, off, source_region=regions[x], source_offset=soff, **extra)
        if off >= self.next_report:
            self._report()

    def _under_report(self, off: int, x: int, vector: list, anomalies: list) -> list:
        """Lower one hb_vector component below the previous heartbeat's, when a segment is tracked."""
        if self.seg is None or self.last_true_hb is None:
            self.seg = []  # track the coming segment so that its data rows beyond the heartbeat are known
            return vector
        seg, self.seg = self.seg, []
        prev = self.last_true_hb
        regions = self.sim.regions
        best = None
        for c in range(len(regions)):
            if c == x or prev[c] < 1:
                continue
            beyond = [r for r in seg if r[1] == regions[c] and r[2] > prev[c] - 1]
            if best is None or len(beyond) < len(best[1]):
                best = (c, beyond)
        self.under_waited += 1
        # Waiting a while for a segment with no rows from the lowered component keeps the
        # under-report from also putting data rows beyond it (listed exactly when it does).
        if best is None or (best[1] and self.under_waited < 50 and self.n < 0.9 * self.limit):
            return vector
        self.under_waited = 0
        c, beyond = best
        self.under -= 1
        if not self.under:
            self.seg = None
            self._update_slow()
        lowered = prev[c] - 1
        vector = [(r, lowered if r == regions[c] else o) for r, o in vector]
        anomalies.append(("HEARTBEAT_REGRESSION", "heartbeat_under_report",
                          {"component": regions[c], "reported": lowered, "earlier": prev[c]}))
        for row_off, region, soff in beyond:
            self.sim.record_anomaly(self, "DATA_BEYOND_HEARTBEAT", "heartbeat_under_report", row_off,
                                    source_region=region, source_offset=soff, heartbeat_offset=off)
        return vector

    def _report(self) -> None:
        self.next_report += self.every
        last = self.off - 1
        for e, name in enumerate(self.sim.exporters):
            lag = int(self.exp_rng.random() * self.every)
            position = min(last, max(self.exp_max[e], last - lag, 0))
            self._emit_report(e, name, position)
        if self.exp_regress:
            self._regress(self.exp_rng.randrange(len(self.sim.exporters)))

    def _regress(self, e: int) -> None:
        """One report of exporter e below its highest so far (needs a position of at least 1)."""
        if self.exp_max[e] < 1:
            return
        self.exp_regress -= 1
        position = int(self.exp_rng.random() * self.exp_max[e])
        earlier = self.exp_max[e]
        at = self._emit_report(e, self.sim.exporters[e], position)
        self.sim.record_anomaly(
            self, "EXPORTER_REGRESSION", "exporter_regression", None, exporter=self.sim.exporters[e],
            exported_offset=position, previous_exported_offset=earlier, reported_at_ms=at,
        )

    def _emit_report(self, e: int, name: str, position: int) -> int:
        at = max(self.exp_at[e] + 1, BASE_MS + self.now // 1000)
        self.exp_at[e] = at
        # A regression report stays below the maximum; later reports never go below it again.
        self.exp_max[e] = max(self.exp_max[e], position)
        self.sink.exporter_position(name, position, at)
        return at

    def finish(self) -> None:
        if self.dup is not None:
            self._flush_dup()
        last = self.off - 1
        # Regressions still armed when the stream ends (a short partition) go just before the
        # final reports, after a report high enough to regress from.
        while self.exp_regress and last >= 2:
            e = self.exp_rng.randrange(len(self.sim.exporters))
            if self.exp_max[e] < 1:
                self._emit_report(e, self.sim.exporters[e], max(1, last - int(self.exp_rng.random() * self.every)))
            self._regress(e)
        for e, name in enumerate(self.sim.exporters):
            lag = 0 if e == 0 else int(self.exp_rng.random() * self.every)
            self._emit_report(e, name, min(last, max(self.exp_max[e], last - lag, 0)))
        self.sink.close()


class _PartitionSim:
    """One (topic, partition): every region's RT, and every region's leader consuming them."""

    def __init__(self, plan: "_Plan", ti: int, partition: int, folder: Path):
        cfg = plan.config
        self.plan = plan
        self.config = cfg
        self.regions = plan.regions
        self.letters = [r[3:] for r in self.regions]
        self.exporters = plan.exporters
        self.topic = plan.topics[ti]
        self.partition = partition
        self.seed_key = f"{cfg.seed}:{self.topic}:{partition}"
        self.rng = random.Random(f"partition:{self.seed_key}")
        self.warnings = plan.warnings
        self.used_keys: set[str] = set()
        tp = (ti, partition)
        self.keys_hot, self.keys_cold = plan.partition_keys(partition)
        self.counts = [plan.rt_writes[(ti, partition, x)] for x in range(len(self.regions))]
        total = sum(n + _heartbeats(n, cfg.heartbeat_every) for n in self.counts)
        self.conflicts = plan.conflicts.get(tp, [])
        for c in self.conflicts:
            self.used_keys.add(c["key"])
        self.failovers = plan.failovers.get(tp, {})
        self.leaders = []
        for i, name in enumerate(self.regions):
            limit = total - cfg.lag_messages if name == cfg.lagging_replica else total
            limit = max(0, limit)
            triggers = [(max(1, int(f * limit)), what) for f, what in plan.triggers.get((ti, partition, i), [])]
            sink = plan.make_sink(folder, name, self.topic, partition)
            if cfg.damaged:
                sink = _DamagedSink(sink, cfg, self.seed_key)
            self.leaders.append(_Leader(self, i, limit, triggers, sink))
        self.total = total

    def any_key(self) -> str:
        keys = self.keys_cold or self.keys_hot
        return keys[self.rng.randrange(len(keys))]

    def record_fault(self, leader: _Leader, fault: str, key: str, region: str, soff: int, vt_offset, **extra) -> None:
        entry = {
            "fault": fault, "replica": leader.name, "topic": self.topic, "partition": self.partition, "key": key,
            "source_region": region, "source_offset": soff, "vt_offset": vt_offset, **extra,
        }
        if fault in ("lost_write", "corrupted_value"):
            entry["final_state_differs"] = None  # filled when the partition is done
        self.plan.faults.append(entry)
        if fault == "duplicate_delivery":
            self.record_anomaly(leader, "DUPLICATE_OR_REWIND", "duplicate_delivery", vt_offset, key=key,
                                source_region=region, source_offset=soff,
                                original_offset=extra["original_vt_offset"])

    def record_anomaly(self, leader: _Leader, anomaly: str, cause: str, offset, **extra) -> None:
        entry = {"anomaly": anomaly, "cause": cause, "replica": leader.name, "topic": self.topic,
                 "partition": self.partition, "offset": offset, **extra}
        if offset is not None:
            entry["in_dump"] = offset >= (self.config.mid_stream_from or 0)
        self.plan.anomalies.append(entry)

    def _rt(self, x: int):
        """The messages of region x's RT, in order: (x, source_offset, kind, key, value, write_ts, t_us)."""
        cfg = self.config
        rng = random.Random(f"rt:{self.seed_key}:{self.regions[x]}")
        n = self.counts[x]
        every = cfg.heartbeat_every
        mean_us = cfg.write_interval_ms * 1000.0
        span = max(1, int(2 * mean_us) - 1)
        hot, cold = self.keys_hot, self.keys_cold
        if not cold:
            hot, cold = [], hot
        n_hot, n_cold = len(hot), len(cold)
        hot_share = cfg.hot_write_share if n_hot else 0.0
        del_frac = cfg.delete_fraction
        letter = self.letters[x]
        conflicts = sorted((c["t_us"], c["id"], c) for c in self.conflicts if x in c["region_idx"])
        ci = 0
        next_conflict = conflicts[0][0] if conflicts else _INF
        failover_times = self.failovers.get(x, [])
        fi = 0
        failover_at = failover_times[0] if failover_times else _INF
        t = int(rng.random() * mean_us)
        soff = 0
        last_phys = -1
        logical = 0
        rand = rng.random
        for i in range(n):
            t += 1 + int(rand() * span)
            phys = BASE_MS + t // 1000
            if phys == last_phys:
                logical += 1
            else:
                last_phys = phys
                logical = 0
            wts = (phys << LOGICAL_BITS) | logical
            if t >= next_conflict:
                c = conflicts[ci][2]
                ci += 1
                next_conflict = conflicts[ci][0] if ci < len(conflicts) else _INF
                k, val = c["key"], f"c{c['id']}{letter}"
                c["writes"].append({"source_region": self.regions[x], "source_offset": soff, "write_ts": wts,
                                    "value": val})
                yield (x, soff, PUT, k, val, wts, t)
            elif t >= failover_at:
                fi += 1
                failover_at = failover_times[fi] if fi < len(failover_times) else _INF
                yield (x, soff, FAILOVER, None, None, wts, t)
            else:
                if n_hot and rand() < hot_share:
                    k = hot[int(rand() * n_hot)]
                else:
                    k = cold[int(rand() * n_cold)]
                if rand() < del_frac:
                    yield (x, soff, DELETE, k, None, wts, t)
                else:
                    yield (x, soff, PUT, k, f"v{letter}{soff}", wts, t)
            soff += 1
            if (i + 1) % every == 0:
                yield (x, soff, HEARTBEAT, None, None, None, t)
                soff += 1
        if n == 0 or n % every:
            yield (x, soff, HEARTBEAT, None, None, None, t)

    def run(self) -> None:
        cfg = self.config
        nreg = len(self.regions)
        leaders = self.leaders
        # Replication delay from RT x to leader L: a fixed base per link plus jitter per message.
        delay_rng = random.Random(f"links:{self.seed_key}")
        base = [[0] * nreg for _ in range(nreg)]
        for L in range(nreg):
            for x in range(nreg):
                if L != x:
                    base[L][x] = int(cfg.replication_delay_ms * 1000 * (0.5 + delay_rng.random()))
        jitter = [[random.Random(f"jitter:{self.seed_key}:{L}:{x}").random for x in range(nreg)] for L in range(nreg)]
        last_arrival = [[0] * nreg for _ in range(nreg)]
        inflight: list[list] = [[] for _ in range(nreg)]
        gens = [self._rt(x) for x in range(nreg)]
        heads = []
        for x, gen in enumerate(gens):
            first = next(gen, None)
            if first is not None:
                heads.append((first[6], x, first))
        heapq.heapify(heads)
        push, pop = heapq.heappush, heapq.heappop
        pairs = [(leaders[L], inflight[L], base[L], jitter[L], last_arrival[L]) for L in range(nreg)]
        while heads:
            t, x, msg = heads[0]
            nxt = next(gens[x], None)
            if nxt is None:
                pop(heads)
            else:
                heapq.heapreplace(heads, (nxt[6], x, nxt))
            if msg[2] == FAILOVER:
                msg = leaders[x].make_retry(msg)
            soff = msg[1]
            for leader, queue, lbase, ljit, larr in pairs:
                b = lbase[x]
                arrival = t + (b + int(ljit[x]() * b) if b else int(ljit[x]() * 1000))
                if arrival < larr[x]:
                    arrival = larr[x]
                larr[x] = arrival
                push(queue, (arrival, x, soff, msg))
                # No later message can arrive before t: everything that arrived earlier is applied now.
                while queue and queue[0][0] < t:
                    item = pop(queue)
                    leader.apply(item[3], item[0])
        for leader, queue, *_ in pairs:
            while queue:
                item = pop(queue)
                leader.apply(item[3], item[0])
        for leader in leaders:
            leader.finish()
        self._finalize()

    def _finalize(self) -> None:
        plan = self.plan
        for leader in self.leaders:
            if leader.failover_soffs:
                self.warnings.append(
                    f"failover_clock_behind in {leader.name} {self.topic}/{self.partition} fell after the applied range"
                )
            pending = Counter(leader.armed + [w for _, w in leader.triggers])
            pending.update({
                "rewind": leader.rewinds, "heartbeat_under_report": leader.under, "stalled_heartbeat": leader.stalls,
                "wide_clock_interval": leader.wide, "exporter_regression": leader.exp_regress,
            })
            for what, n in pending.items():
                if n:
                    self.warnings.append(f"{n} {what} not injected in {leader.name} {self.topic}/{self.partition}")
            plan.natural_max_gap_ms = max(plan.natural_max_gap_ms, leader.natural_max_gap_ms)
            for k, clean in leader.shadow.items():
                actual = leader.win.get(k)
                differs = _final(actual) != _final(clean)
                for fault in plan.faults:
                    if (fault.get("final_state_differs", False) is None and fault["replica"] == leader.name
                            and fault["topic"] == self.topic and fault["partition"] == self.partition
                            and fault["key"] == k):
                        fault["final_state_differs"] = differs
                if differs:
                    plan.divergent.append({"topic": self.topic, "partition": self.partition, "key": k,
                                           "replicas": [leader.name]})
            for kind, n in leader.sink.counts.items():
                plan.rows[leader.name][kind] += n
            for kind, n in getattr(leader.sink, "records", {}).items():
                plan.venice_records.setdefault(leader.name, Counter())[kind] += n
            plan.files.extend(leader.sink.files)
        if self.config.damaged:
            self._complete_topic_proofs()
        for c in self.conflicts:
            if len(c["writes"]) == 2:
                win = max(c["writes"], key=lambda w: (w["write_ts"], w["source_region"]))
                plan.conflict_entries.append({
                    "topic": self.topic, "partition": self.partition, "key": c["key"], "writes": c["writes"],
                    "winner": {"source_region": win["source_region"], "source_offset": win["source_offset"]},
                })
            else:
                self.warnings.append(f"conflicting write {c['id']} not injected: a region ran out of writes first")
        plan.upstream_messages += self.total
        plan.lagging.extend(
            {"replica": lead.name, "topic": self.topic, "partition": self.partition, "applied_messages": lead.n,
             "missing_messages": self.total - lead.n}
            for lead in self.leaders if lead.n < self.total
        )


    def _complete_topic_proofs(self) -> None:
        """What the complete (undamaged) topic proves, by the plain-Python reading of SPEC sections 3-4."""
        from replica_lens.reference import reference_verdicts

        rows = []
        for leader in self.leaders:
            self.plan.damage.append(leader.sink.damage)
            rows += leader.sink.complete_rows
            leader.sink.complete_rows = []
        for (topic, partition, a, b, key), finding in reference_verdicts(rows).items():
            if finding.verdict in ("DIVERGENT", "MISSING"):
                self.plan.complete_topic_proofs.append({
                    "topic": topic, "partition": partition, "replica_a": a, "replica_b": b, "key": key,
                    "verdict": finding.verdict, "missing_in": finding.missing_in,
                })


def _final(state: Optional[tuple]) -> tuple:
    if state is None:
        return ("ABSENT",)
    return ("TOMBSTONE",) if state[2] is None else ("VALUE", state[2])


def _heartbeats(n: int, every: int) -> int:
    return n // every + (0 if n and n % every == 0 else 1)


class _Plan:
    """Everything decided before the messages flow: counts per RT, and where each fault goes."""

    def __init__(self, config: SimulationConfig):
        self.config = config
        self.venice_push = None  # the PushSettings of venice-kafka records, made with the first sink
        self.venice_records: dict[str, Counter] = {}  # replica -> Venice records without a row, by kind
        self.regions = region_names(config.regions)
        self.topics = topic_names(config.topics)
        self.exporters = [f"exporter-{i}" for i in range(config.exporters)]
        rng = random.Random(f"plan:{config.seed}")
        nreg, ntop, npart = config.regions, config.topics, config.partitions
        cells = [(t, p, x) for t in range(ntop) for p in range(npart) for x in range(nreg)]
        base, extra = divmod(config.writes, len(cells))
        self.rt_writes = {cell: base + (1 if i < extra else 0) for i, cell in enumerate(cells)}
        self.key_width = max(4, len(str(config.keys - 1)))
        n_hot = 0
        if config.hot_key_fraction > 0:
            n_hot = max(1, round(config.keys * config.hot_key_fraction))
        self.n_hot = n_hot
        # Fault triggers: a fraction of the leader's applied messages after which the fault waits
        # for the first eligible message.
        self.triggers: dict[tuple[int, int, int], list[tuple[float, str]]] = {}
        tps = [(t, p) for t in range(ntop) for p in range(npart)]
        for what in ("lost_writes", "corrupted_values", "duplicate_deliveries", "rewind", "heartbeat_under_report",
                     "stalled_heartbeat", "wide_clock_interval", "exporter_regression"):
            name = {"lost_writes": "lost_write", "corrupted_values": "corrupted_value",
                    "duplicate_deliveries": "duplicate_delivery"}.get(what, what)
            for _ in range(getattr(config, what)):
                t, p = rng.choice(tps)
                x = rng.randrange(nreg)
                self.triggers.setdefault((t, p, x), []).append((rng.uniform(0.05, 0.8), name))
        self.conflicts: dict[tuple[int, int], list[dict]] = {}
        for cid in range(config.conflicting_writes):
            t, p = rng.choice(tps)
            a, b = rng.sample(range(nreg), 2)
            duration = min(self.rt_writes[(t, p, x)] for x in range(nreg)) * config.write_interval_ms * 1000
            hot, cold = self.partition_keys(p)
            keys = hot + cold
            taken = {c["key"] for c in self.conflicts.get((t, p), [])}
            free = [k for k in keys if k not in taken] or keys
            self.conflicts.setdefault((t, p), []).append({
                "id": cid, "key": rng.choice(free), "region_idx": (a, b), "t_us": int(rng.uniform(0.1, 0.8) * duration),
                "writes": [],
            })
        self.warnings: list[str] = []
        # Fail-overs go to distinct leaders first; a leader failing over twice does so at distinct times.
        self.failovers: dict[tuple[int, int], dict[int, list[int]]] = {}
        leaders = [(t, p, x) for t, p in tps for x in range(nreg)]
        for i in range(config.failover_clock_behind):
            if i % len(leaders) == 0:
                rng.shuffle(leaders)
            t, p, x = leaders[i % len(leaders)]
            duration = self.rt_writes[(t, p, x)] * config.write_interval_ms * 1000
            times = self.failovers.setdefault((t, p), {}).setdefault(x, [])
            times.append(int(rng.uniform(0.2, 0.7) * duration))
            times.sort()
        # Results, filled as partitions run.
        self.faults: list[dict] = []
        self.anomalies: list[dict] = []
        self.divergent: list[dict] = []
        self.conflict_entries: list[dict] = []
        self.lagging: list[dict] = []
        self.files: list[str] = []
        self.rows = {r: {"START_OF_PUSH": 0, "PUT": 0, "DELETE": 0, "HEARTBEAT": 0, "EXPORTER_POSITION": 0}
                     for r in self.regions}
        self.upstream_messages = 0
        self.natural_max_gap_ms = 0
        self.damage: list[dict] = []  # per replica partition, with compact_below / lose_records
        self.complete_topic_proofs: list[dict] = []

    def key_name(self, i: int) -> str:
        return f"k{i:0{self.key_width}d}"

    def partition_keys(self, partition: int) -> tuple[list[str], list[str]]:
        idx = range(partition, self.config.keys, self.config.partitions)
        return ([self.key_name(i) for i in idx if i < self.n_hot], [self.key_name(i) for i in idx if i >= self.n_hot])

    def make_sink(self, folder: Path, replica: str, topic: str, partition: int):
        fmt = self.config.file_format
        if fmt == "parquet":
            return _ParquetSink(folder, replica, topic, partition, self.config)
        if fmt == "venice-kafka":
            if self.venice_push is None:
                self.venice_push = venice_push_settings(self.config)
            return _VeniceSink(folder, replica, topic, partition, self.config, self.regions, self.venice_push)
        return _JsonSink(folder, replica, topic, partition, self.config, gz=(fmt == "jsonl.gz"))


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.inprogress")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def simulate(
    out_dir: str | Path,
    snapshot_id: str,
    config: SimulationConfig,
    *,
    overwrite: bool = False,
    progress: Optional[Callable[[int, int, int], None]] = None,
) -> dict:
    """Write ``<out_dir>/<snapshot_id>/`` (data files, then ``_SUCCESS``) and
    ``<out_dir>/<snapshot_id>.ground_truth.json``; return a summary of what was written.

    ``progress(done, total, rows)`` is called after each topic partition is written, with
    the partitions done, their total and the rows written so far."""
    check_snapshot_id(snapshot_id)
    if not isinstance(config, SimulationConfig):
        raise TypeError("config must be a SimulationConfig")
    config.__post_init__()  # fields may have been changed after construction
    out = Path(out_dir)
    folder = out / snapshot_id
    truth_path = out / f"{snapshot_id}.ground_truth.json"
    if folder.exists() or truth_path.exists():
        if not overwrite:
            raise SnapshotExistsError(f"snapshot {snapshot_id!r} already exists in {out}; refusing to overwrite it")
        # The marker goes first so that no reader takes the folder for complete while it is replaced.
        if (folder / SUCCESS_MARKER).exists():
            (folder / SUCCESS_MARKER).unlink()
        if folder.exists():
            shutil.rmtree(folder)
        if truth_path.exists():
            truth_path.unlink()
        (out / f"{snapshot_id}.venice_push_settings.json").unlink(missing_ok=True)
    folder.mkdir(parents=True)

    plan = _Plan(config)
    total = config.topics * config.partitions
    for ti in range(config.topics):
        for p in range(config.partitions):
            _PartitionSim(plan, ti, p, folder).run()
            if progress is not None:
                progress(ti * config.partitions + p + 1, total, sum(sum(k.values()) for k in plan.rows.values()))

    truth = {
        "snapshot_id": snapshot_id,
        "config": config.as_dict(),
        "regions": plan.regions,
        "topics": plan.topics,
        "partitions": config.partitions,
        "exporters": plan.exporters,
        "injected_faults": plan.faults,
        "anomalies": plan.anomalies,
        "expected_divergent_keys": sorted(plan.divergent, key=lambda d: (d["topic"], d["partition"], d["key"])),
        "conflicting_writes": plan.conflict_entries,
        "lagging": plan.lagging,
        "bounds": {
            "natural_max_heartbeat_gap_ms": plan.natural_max_gap_ms,
            "natural_clock_interval_width_ms": 2 * config.clock_uncertainty_ms,
        },
        "warnings": plan.warnings,
    }
    if config.damaged:
        truth["damage"] = {
            "compact_below": config.compact_below,
            "lose_records": config.lose_records,
            "compacted": sum(d["compacted"] for d in plan.damage),
            "lost": sum(d["lost"] for d in plan.damage),
            "partitions": plan.damage,
            # Every key the complete topic proves DIVERGENT or MISSING: a damaged dump may prove
            # fewer (SPEC section 3a), never others.
            "complete_topic_proofs": plan.complete_topic_proofs,
        }
    if config.file_format == "venice-kafka":
        # What an audit of these records needs (replica-lens audit --cluster-regions ... --venice-clock-uncertainty-ms ...).
        push = plan.venice_push or venice_push_settings(config)
        settings_path = out / f"{snapshot_id}.venice_push_settings.json"
        _atomic_write_text(settings_path, json.dumps(push_settings_document({t: push for t in plan.topics}), indent=1) + "\n")
        truth["venice"] = {
            "cluster_regions": venice_cluster_regions(plan.regions),
            "clock_uncertainty_ms": config.clock_uncertainty_ms,
            # Every START_OF_PUSH declares these; the file names them for an audit of a dump without one.
            "push_settings": push.describe(),
            "push_settings_file": settings_path.name,  # beside this file
            # Records that hold no row, per replica and kind: the audit's skipped counts.
            "records_without_rows": {r: dict(sorted(c.items())) for r, c in sorted(plan.venice_records.items())},
        }
    _atomic_write_text(truth_path, json.dumps(truth, indent=1) + "\n")
    _atomic_write_text(folder / SUCCESS_MARKER, "")

    rows_total = sum(sum(kinds.values()) for kinds in plan.rows.values())
    return {
        "snapshot_dir": str(folder),
        "ground_truth": str(truth_path),
        "files": len(plan.files),
        "rows_total": rows_total,
        "rows": {replica: dict(kinds) for replica, kinds in plan.rows.items()},
        "upstream_messages": plan.upstream_messages,
        "injected_faults": len(plan.faults),
        "anomalies": len(plan.anomalies),
        "expected_divergent_keys": len(plan.divergent),
        "warnings": plan.warnings,
        **({"damage": {"compacted": truth["damage"]["compacted"], "lost": truth["damage"]["lost"],
                       "complete_topic_proofs": len(plan.complete_topic_proofs)}} if config.damaged else {}),
        **({"audit_with": f"--cluster-regions {truth['venice']['cluster_regions']} --venice-clock-uncertainty-ms "
                          f"{config.clock_uncertainty_ms}"
                          + (f" --venice-push-settings {settings_path}" if config.mid_stream_from
                             else "")} if "venice" in truth else {}),
    }


# --------------------------------------------------------------------------- command line


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add one ``--flag`` per SimulationConfig field (defaults are the dataclass defaults)."""
    group = parser.add_argument_group("simulation")
    for f in dataclasses.fields(SimulationConfig):
        kind = f.metadata.get("type") or type(f.default)
        kwargs: dict[str, Any] = {"dest": f.name, "type": kind, "default": f.default,
                                  "help": f"{f.metadata['help']} (default: {f.default})".replace("%", "%%")}
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        if kind is bool:
            del kwargs["type"]
            kwargs["action"] = argparse.BooleanOptionalAction
        group.add_argument(_flag(f), **kwargs)
    return parser


def config_from_args(ns: argparse.Namespace) -> SimulationConfig:
    """The SimulationConfig of parsed arguments (fields missing from ``ns`` keep their defaults)."""
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(SimulationConfig) if hasattr(ns, f.name)}
    return SimulationConfig(**values)
