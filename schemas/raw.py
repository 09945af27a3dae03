"""Schemas of the raw stage: accepted snapshot rows and quarantined rows (SPEC section 1)."""
from __future__ import annotations

import pandera.pyspark as pa
from pyspark.sql import types as T

KINDS = ("START_OF_PUSH", "PUT", "DELETE", "HEARTBEAT", "EXPORTER_POSITION")
DATA_KINDS = ("PUT", "DELETE")

VECTOR = T.MapType(T.StringType(), T.LongType())
# What names a stream (one replica's dump of one topic partition), within a snapshot.
STREAM_COLUMNS = ("replica", "topic", "partition")

# The message fields of SPEC section 1, in the order the table stores them,
# with the Spark type each must parse as.
MESSAGE_FIELDS: dict[str, T.DataType] = {
    "replica": T.StringType(),
    "topic": T.StringType(),
    "partition": T.IntegerType(),
    "offset": T.LongType(),
    "kind": T.StringType(),
    "key": T.StringType(),
    "value": T.StringType(),
    "source_region": T.StringType(),
    "source_offset": T.LongType(),
    "hb_vector": VECTOR,
    "origin_ts_min_ms": T.LongType(),
    "origin_ts_max_ms": T.LongType(),
    "applied_ts_min_ms": T.LongType(),
    "applied_ts_max_ms": T.LongType(),
    "write_ts": T.LongType(),
    "leader_epoch": T.LongType(),
    "exporter": T.StringType(),
    "exported_offset": T.LongType(),
    "reported_at_ms": T.LongType(),
}

# Required fields per kind, beyond replica/topic/partition/kind which every row needs.
REQUIRED_BY_KIND: dict[str, tuple[str, ...]] = {
    "START_OF_PUSH": ("offset",),
    "PUT": ("offset", "key", "value", "source_region", "source_offset"),
    "DELETE": ("offset", "key", "source_region", "source_offset"),
    "HEARTBEAT": (
        "offset",
        "source_region",
        "source_offset",
        "origin_ts_min_ms",
        "origin_ts_max_ms",
        "applied_ts_min_ms",
        "applied_ts_max_ms",
    ),
    "EXPORTER_POSITION": ("exporter", "exported_offset", "reported_at_ms"),
}
REQUIRED_ALWAYS = ("replica", "topic", "partition", "kind")

# Fields that must not be negative when present (hb_vector components are checked too).
NON_NEGATIVE = ("partition", "offset", "source_offset", "exported_offset")

# Fields a kind must not carry. A DELETE has no value (SPEC 1). An EXPORTER_POSITION is a
# report about a partition, not a message of it: an offset on it would put it into the
# partition's offset order, so after ingestion offset is null exactly for EXPORTER_POSITION.
FORBIDDEN_BY_KIND: dict[str, tuple[str, ...]] = {
    "DELETE": ("value",),
    "EXPORTER_POSITION": ("offset",),
}

# Why a row was quarantined. When a row has several problems, ``reason`` is the first
# of these that applies and ``detail`` lists every problem found.
QUARANTINE_REASONS = (
    "UNREADABLE_FILE",
    # A JSONL line longer than the line limit (pipelines/ingest/long_lines.py): raw keeps its first bytes only.
    "LINE_TOO_LONG",
    # A SPEC Parquet row in a row group holding a page over the line limit (pipelines/ingest/parquet_pages.py).
    "PAGE_TOO_LARGE",
    "MALFORMED_JSON",
    "MISSING_FIELD",
    "BAD_TYPE",
    "UNKNOWN_KIND",
    "NEGATIVE_VALUE",
    "UNEXPECTED_FIELD",
    "CONFLICTING_POSITION",
    # Raw Venice records the decoder cannot use (pipelines/venice/decoder.py, docs/venice-input.md).
    "MALFORMED_RECORD",
    "UNKNOWN_PROTOCOL_VERSION",
    "UPDATE_NOT_APPLIED",
    "CHUNKED_VALUE",
    "COMPRESSED_VALUE",
    "NO_UPSTREAM_POSITION",
    "VALUE_TOO_LARGE",
    "UNKNOWN_PUSH_SETTINGS",
    # A chunked value's manifest whose chunks the dump does not hold (before a broker's log start, compacted
    # away): found by the first audit of a compacted broker dump (tests/test_kafka_brokers.py).
    "MISSING_CHUNKS",
    # A value its declared compression cannot decompress (pipelines/venice/values.py), listed in docs/tables.md.
    "UNDECOMPRESSABLE_VALUE",
)

# Why a raw Venice record is skipped by rule: it is not a message of SPEC 1 (a control message
# other than START_OF_PUSH and heartbeats). Skipped rows are not judged; their positions are
# kept (``RawTopicSkipped``): rows read = accepted + quarantined + skipped.
SKIP_REASONS = ("CONTROL_MESSAGE", "VALUE_CHUNK", "CHUNK_CLEANUP")


class RawTopicSnapshots(pa.DataFrameModel):
    """Accepted rows of a raw topic snapshot, one row per message (exact duplicates stored once)."""

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    replica: T.StringType() = pa.Field(nullable=False)
    topic: T.StringType() = pa.Field(nullable=False)
    partition: T.IntegerType() = pa.Field(nullable=False, ge=0)
    offset: T.LongType() = pa.Field(nullable=True, ge=0)
    kind: T.StringType() = pa.Field(nullable=False, isin=list(KINDS))
    key: T.StringType() = pa.Field(nullable=True)
    value: T.StringType() = pa.Field(nullable=True)
    value_hash: T.StringType() = pa.Field(
        nullable=True,
        description="sha256 hex of the value, TOMBSTONE for a DELETE, null without a value: what every later "
        "stage carries instead of the value",
    )
    value_bytes: T.LongType() = pa.Field(
        nullable=True, ge=0,
        description="Bytes of the value (UTF-8), null without one: the Delta log's largest tells a reader how large "
        "the snapshot's values are without reading them",
    )
    source_region: T.StringType() = pa.Field(nullable=True)
    source_offset: T.LongType() = pa.Field(nullable=True, ge=0)
    hb_vector: VECTOR = pa.Field(nullable=True)
    origin_ts_min_ms: T.LongType() = pa.Field(nullable=True)
    origin_ts_max_ms: T.LongType() = pa.Field(nullable=True)
    applied_ts_min_ms: T.LongType() = pa.Field(nullable=True)
    applied_ts_max_ms: T.LongType() = pa.Field(nullable=True)
    write_ts: T.LongType() = pa.Field(nullable=True)
    leader_epoch: T.LongType() = pa.Field(nullable=True)
    exporter: T.StringType() = pa.Field(nullable=True)
    exported_offset: T.LongType() = pa.Field(nullable=True, ge=0)
    reported_at_ms: T.LongType() = pa.Field(nullable=True)
    # Unknown extra fields are kept, as their JSON text.
    extra_fields: T.MapType(T.StringType(), T.StringType()) = pa.Field(nullable=True)
    # How many identical copies of this message the snapshot held (1 when unique).
    copies: T.IntegerType() = pa.Field(nullable=False, ge=1)
    source_file: T.StringType() = pa.Field(nullable=False)

    class Config:
        name = "raw_topic_snapshots"
        strict = True


class RawTopicQuarantine(pa.DataFrameModel):
    """Rows that break SPEC section 1, kept with the reason and the file they came from."""

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    source_file: T.StringType() = pa.Field(nullable=False)
    # The row's "replica" when it is a JSON string (so quarantine can be counted per
    # replica); null when the row has none or the file could not be read.
    replica: T.StringType() = pa.Field(nullable=True)
    # Its position, each field as "replica" is: when the row has it with its JSON type (and,
    # for partition and offset, not negative); null otherwise. A raw Venice record the decoder
    # quarantined has its Kafka record's. With replica, a known position: a gap of one
    # position in the dump (SPEC 3a).
    topic: T.StringType() = pa.Field(nullable=True)
    partition: T.IntegerType() = pa.Field(nullable=True, ge=0)
    offset: T.LongType() = pa.Field(nullable=True, ge=0)
    # The row as read (a JSON line, or a Parquet row rendered as JSON); null when the
    # file itself could not be read past some point (reason UNREADABLE_FILE).
    raw: T.StringType() = pa.Field(nullable=True)
    reason: T.StringType() = pa.Field(nullable=False, isin=list(QUARANTINE_REASONS))
    detail: T.StringType() = pa.Field(nullable=True)

    class Config:
        name = "raw_topic_quarantine"
        strict = True


class RawTopicSkipped(pa.DataFrameModel):
    """Positions of the raw Venice records skipped by rule: read, so not gaps (SPEC 3a), though they hold no row."""

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    source_file: T.StringType() = pa.Field(nullable=False)
    # The Kafka record's position: the region whose version topic was read, topic, partition, offset.
    replica: T.StringType() = pa.Field(nullable=False)
    topic: T.StringType() = pa.Field(nullable=False)
    partition: T.IntegerType() = pa.Field(nullable=False, ge=0)
    offset: T.LongType() = pa.Field(nullable=False, ge=0)
    reason: T.StringType() = pa.Field(nullable=False, isin=list(SKIP_REASONS))
    # Venice's ControlMessageType name (END_OF_PUSH, START_OF_SEGMENT, ...) of a skipped control message.
    control_message: T.StringType() = pa.Field(nullable=True)

    class Config:
        name = "raw_topic_skipped"
        strict = True
