"""Raw Venice records of a simulation (``--format venice-kafka``, docs/venice-input.md): the
Parquet schema of Spark's Kafka source, how simulated keys, values and regions look in the
records, the version's push settings, and ``_VeniceSink``, which writes one replica
partition's records (encoded by ``pipelines/venice/decoder.py``)."""
from __future__ import annotations

import base64
import hashlib
import string
from collections import Counter
from typing import Optional

from replica_lens.simulator.config import BASE_MS, SimulationConfig
from replica_lens.simulator.sinks import _ArrowSink, _ParquetSink

# Raw Venice records (--format venice-kafka): upstream Kafka cluster id of region i is i, and a
# PUT's value is written under this value schema id.
VENICE_VALUE_SCHEMA_ID = 1


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
    from pipelines.venice import values as venice_values

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
    """Raw Venice records of one replica's version-topic partition (``pipelines/venice/decoder.py`` encodes them,
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
        from pipelines.venice import decoder as venice, values as venice_values

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
