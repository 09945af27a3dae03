"""Venice version-topic records on the wire -> SPEC 1 rows (issue 18, foundation).

Pure functions; ingestion reaches them through pipelines/venice/frame.py, which decodes the
Kafka-source Parquet files that pipelines/ingest/reading.py finds on the executors.

Wire format (verified in linkedin/venice at 77ea837f, files under internal/venice-common/src/main/):

- Key (``serialization/KafkaKeySerializer.java``, ``message/KafkaKey.java``): one key header
  byte, then the key bytes. Header bytes (``kafka/protocol/enums/MessageType.java``,
  ``MessageType.Constants``): 0 = PUT *and* DELETE (the header does not tell them apart;
  the envelope's messageType does), 2 = CONTROL_MESSAGE, 4 = UPDATE, 8 = GLOBAL_RT_DIV.
  Difference from the issue's wording: the header is not "the message type" (PUT and DELETE
  share 0; UPDATE is 4 while its messageType is 3).
- Heartbeat key (``KafkaKey.HEART_BEAT``): header 2, then 24 bytes = the 16-byte GUID of
  ``guid/HeartbeatGuidV3Generator.java`` (``UUID.nameUUIDFromBytes("heartbeatControlMessage")``,
  most then least significant bits, big endian) + int32 segment 0 + int32 sequence 0.
  ``KafkaKey.DOL_STAMP`` (Declaration of Leadership) is another fixed control key: skipped.
- Value (``serialization/avro/InternalAvroSpecificSerializer.java``,
  ``AvroProtocolDefinition.KAFKA_MESSAGE_ENVELOPE(23, 14, ...)``): magic byte 23, one
  protocol-version byte, then the Avro binary KafkaMessageEnvelope written with that
  version's schema.
- Supported protocol versions: 10 to 14 (every one Venice has published since 10), their
  envelope schemas written in this project (``pipelines/venice/protocol.py``, which lists what
  each version changed). v10's LeaderMetadata has hostName, upstreamOffset,
  upstreamKafkaClusterId; v12 adds upstreamPubSubPosition and termId; v14 adds
  upstreamMessageTimestamp. Any other version byte -> quarantined UNKNOWN_PROTOCOL_VERSION.
- messageType (envelope): 0 PUT, 1 DELETE, 2 CONTROL_MESSAGE, 3 UPDATE (MessageType.java);
  controlMessageType: 0 START_OF_PUSH, 2 START_OF_SEGMENT, others (END_OF_PUSH, segments,
  TOPIC_SWITCH, VERSION_SWAP...) -> skipped (ControlMessageType.java).
- A heartbeat is a START_OF_SEGMENT control message under the heartbeat key (matches the
  issue). A START_OF_SEGMENT under any other key is an ordinary DIV segment start: skipped.

Mapping to SPEC 1 (``decode_record``):

- replica/topic/partition/offset: from the Kafka record (replica = the region whose version
  topic was read, the Parquet ``region`` column).
- key: base64 (standard, padded) of the key bytes after the header byte (Venice keys are
  serialized Avro, so not text). value of a PUT: ``f"{schemaId}:{base64(putValue)}"``.
- source_region: ``cluster_regions[leaderMetadataFooter.upstreamKafkaClusterId]``; an id
  missing from the map raises ``UnknownClusterId`` naming the ids the map knows and the id seen.
  source_offset: ``leaderMetadataFooter.upstreamOffset``. A PUT/DELETE/heartbeat with no
  footer or upstreamOffset -1 -> quarantined NO_UPSTREAM_POSITION.
- write_ts (PUT and DELETE): from the record's replication metadata (RMD), never from
  ``producerMetadata.logicalTimestamp`` (a leader or push job writes the sentinel -2 there, a
  client that sets none -1: ``VeniceWriter.APP_DEFAULT_LOGICAL_TS`` / ``VENICE_DEFAULT_LOGICAL_TS``).
  ``replicationMetadataPayload`` with ``replicationMetadataVersionId`` 1 is the raw Avro RMD
  record (``RmdSchemaGeneratorV1``; the leader writes ``RmdSerDe.serializeRmdRecord`` bytes, no
  schema-id prefix) whose first field ``timestamp`` (``RmdConstants.TIMESTAMP_FIELD_POS`` 0) is
  the union [long value-level timestamp, per-field record]. Only the branch index and the long
  are read (``rmd_write_ts``), so no store value schema is needed. The value-level timestamp is
  Venice's write time in ms (the writer's logicalTimestamp when >= 0, else its messageTimestamp:
  ``ActiveActiveStoreIngestionTask.getWriteTimestampFromKME``); write_ts = ``ms << 18``, the
  SPEC's hybrid logical clock with a logical counter of 0 (Venice keeps none; ordering and
  equality of Venice's stamps are kept exactly). Null when there is no RMD (version id not 1,
  e.g. -1 in batch records, or an empty payload), when the timestamp is per-field, when it is
  <= 0 (0 is ``RmdConstants.BATCH_RMD_SENTINEL_TIMESTAMP``, not a clock) or too large for
  ``ms << 18`` to fit an int64 (>= 2**45 ms, year 3084). RMD bytes that are not such a union
  (a branch index other than 0/1, a truncated varint) -> quarantined MALFORMED_RECORD.
  leader_epoch: ``termId`` (v12 and later) when not -1, else null (v10/v11 have none).
- HEARTBEAT: origin_ts = messageTimestamp +- clock_uncertainty_ms; applied_ts = Kafka record
  timestamp +- clock_uncertainty_ms; hb_vector null (one component, which is
  ``{source_region: source_offset}`` already; the contract treats it so).
- START_OF_PUSH: only replica/topic/partition/offset/kind; what it declares about the version's
  values (chunking, compression, dictionary) is read by ``start_of_push_settings`` and given to
  every record of the topic as ``push`` (``pipelines/venice/values.py`` has the facts).
- UPDATE (partial update) -> quarantined UPDATE_NOT_APPLIED.
- Compression: a PUT's value is decompressed with ``push`` (UNDECOMPRESSABLE_VALUE when it does not
  decompress, COMPRESSED_VALUE for a strategy Venice does not have), a piece at a time and never past
  ``limits.max_value_bytes`` (VALUE_TOO_LARGE: a decompression bomb costs the limit, not what it expands to).
- Chunking (``push.chunked``): a data key's ``02 00`` suffix is stripped (MALFORMED_RECORD without
  it); a chunk (PUT, schemaId -10) is skipped VALUE_CHUNK, its key and bytes kept for its manifest;
  a manifest (PUT, schemaId -20) comes out as outcome "manifest", finished by
  ``assemble_manifest`` once its chunks are found (MISSING_CHUNKS when some are not in the dump).
  Without chunking declared, a negative schemaId -> quarantined CHUNKED_VALUE. A chunk-cleanup
  DELETE (schemaId -10) is skipped CHUNK_CLEANUP whatever is declared: it is never a user delete.
- A leadership stamp (START_OF_SEGMENT under ``KafkaKey.DOL_STAMP``) is skipped with control_message
  DOL_STAMP. Unparseable bytes -> MALFORMED_RECORD.

``encode_record`` returns ``KafkaRecord(key, value, timestamp_ms)``: the Kafka timestamp is
needed to carry a heartbeat's applied time. Like a leader, it writes logicalTimestamp -2 on data
records and a write_ts as a value-level RMD timestamp of ``write_ts >> 18`` ms (RMD version 1,
empty checkpoint vector): Venice stamps are whole milliseconds, so a write_ts's 18 logical bits
do not survive (a write_ts whose ms is 0 decodes to null). It cannot encode EXPORTER_POSITION (no Venice
record) nor a heartbeat's hb_vector (a Venice heartbeat carries one component).

Outcome: ``{"outcome": "row"|"skipped"|"quarantined", "reason": str|None, "row": dict|None}``. ``row`` is
the SPEC 1 row; for a skipped record, its position (replica/topic/partition/offset) and ``control_message``,
the control message's type name (END_OF_PUSH, START_OF_SEGMENT, ...): the position was read (SPEC 3a).
"""
from __future__ import annotations

import base64
import hashlib
import io
import uuid
from typing import NamedTuple

import fastavro

import pipelines.venice.values as values
from pipelines.venice.protocol import SUPPORTED_VERSIONS, envelope_schema_dict
from pipelines.venice.values import NOT_DECLARED, PushSettings

MAGIC_BYTE = 23
CURRENT_PROTOCOL_VERSION = 14
KEY_HEADER_PUT = 0  # PUT and DELETE
KEY_HEADER_CONTROL = 2
KEY_HEADER_UPDATE = 4
KEY_HEADER_GLOBAL_RT_DIV = 8
APP_DEFAULT_LOGICAL_TS = -2  # VeniceWriter: what leaders and push jobs write as logicalTimestamp
RMD_VERSION_ID = 1  # the only replication-metadata protocol Venice has (RmdSchemaGenerator)
HLC_LOGICAL_BITS = 18  # SPEC write_ts = physical_ms << 18 | logical
_MAX_RMD_MS = (1 << (63 - HLC_LOGICAL_BITS)) - 1  # ms << 18 must stay a non-negative int64
MT_PUT, MT_DELETE, MT_CONTROL, MT_UPDATE = 0, 1, 2, 3
CM_START_OF_PUSH, CM_START_OF_SEGMENT = 0, 2
# ControlMessageType names by number (ControlMessageType.java; the branch order of controlMessageUnion).
CONTROL_MESSAGE_TYPES = ("START_OF_PUSH", "END_OF_PUSH", "START_OF_SEGMENT", "END_OF_SEGMENT", "START_OF_BUFFER_REPLAY",
                         "START_OF_INCREMENTAL_PUSH", "END_OF_INCREMENTAL_PUSH", "TOPIC_SWITCH", "VERSION_SWAP")

# Java UUID.nameUUIDFromBytes: MD5 of the name with the version-3 and IETF variant bits set.
HEARTBEAT_GUID = uuid.UUID(bytes=hashlib.md5(b"heartbeatControlMessage").digest(), version=3).bytes
HEARTBEAT_KEY_BYTES = HEARTBEAT_GUID + (0).to_bytes(4, "big") + (0).to_bytes(4, "big")
# KafkaKey.DOL_STAMP: a new leader's declaration of leadership (DoLStampGuidGenerator), a START_OF_SEGMENT.
DOL_STAMP_GUID = uuid.UUID(bytes=hashlib.md5(b"declarationOfLeadershipControlMessage").digest(), version=3).bytes
DOL_STAMP_KEY_BYTES = DOL_STAMP_GUID + bytes(8)

class UnknownClusterId(KeyError):
    """An upstreamKafkaClusterId that the cluster -> region map does not name."""


class KafkaRecord(NamedTuple):
    key: bytes
    value: bytes
    timestamp_ms: int


# Parsed once per process. A plain dict, not functools.lru_cache: Spark ships this module to
# the executors by value (pipelines/venice/frame.py), and an lru_cache wrapper would be
# pickled by reference, i.e. need the project importable there.
_PARSED: dict[int, dict] = {}


def envelope_schema(version: int) -> dict:
    """The parsed (fastavro) KafkaMessageEnvelope schema of a supported protocol version."""
    if version not in _PARSED:
        _PARSED[version] = fastavro.parse_schema(envelope_schema_dict(version))
    return _PARSED[version]


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _out(outcome: str, reason: str | None = None, row: dict | None = None) -> dict:
    return {"outcome": outcome, "reason": reason, "row": row}


def _zigzag(n: int) -> bytes:
    """Avro binary long: zigzag, then base-128 varint, low groups first."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _read_long(b: bytes, i: int) -> tuple[int, int]:
    """The Avro long at b[i:] and the index after it; ValueError when truncated or over 10 bytes."""
    result = shift = 0
    while True:
        if i >= len(b) or shift > 63:
            raise ValueError("not an Avro long")
        byte = b[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), i
        shift += 7


def rmd_write_ts(version_id: int, payload: bytes) -> int | None:
    """SPEC write_ts (``ms << 18``) of a PUT or DELETE from its replication metadata, or None.

    Reads only the RMD record's first field, ``timestamp``: union branch 0 (a long, the
    value-level timestamp in ms) or 1 (per-field timestamps: None, as there is no one time of
    the value). None also without RMD (version id not 1, empty payload) and for a timestamp
    that is no clock (<= 0; 0 is Venice's batch sentinel) or does not fit ``ms << 18``.
    ValueError when the payload does not start with such a union."""
    payload = bytes(payload or b"")
    if version_id != RMD_VERSION_ID or not payload:
        return None
    branch, i = _read_long(payload, 0)
    if branch == 1:
        return None
    if branch != 0:
        raise ValueError(f"RMD timestamp union has no branch {branch}")
    ms, _ = _read_long(payload, i)
    if ms <= 0 or ms > _MAX_RMD_MS:
        return None
    return ms << HLC_LOGICAL_BITS


def rmd_payload(write_ts: int | None) -> tuple[int, bytes]:
    """(replicationMetadataVersionId, replicationMetadataPayload) a leader writes for write_ts: a
    value-level timestamp of ``write_ts >> 18`` ms and an empty checkpoint vector; (-1, b"") for None."""
    if write_ts is None:
        return -1, b""
    return RMD_VERSION_ID, b"\x00" + _zigzag(write_ts >> HLC_LOGICAL_BITS) + b"\x00"


def control_message_name(control_message_type: int) -> str:
    """Venice's name of a controlMessageType (``CONTROL_MESSAGE_TYPES``), or ``TYPE_<n>`` for one it does not name."""
    if 0 <= control_message_type < len(CONTROL_MESSAGE_TYPES):
        return CONTROL_MESSAGE_TYPES[control_message_type]
    return f"TYPE_{control_message_type}"


def decode_record(
    key: bytes,
    value: bytes,
    *,
    replica: str,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int,
    cluster_regions: dict[int, str],
    clock_uncertainty_ms: int = 0,
    push: PushSettings = NOT_DECLARED,
    limits: values.Limits = values.Limits(),
) -> dict:
    """One Kafka record of a version topic -> its outcome (see the module's docstring). ``push`` is what
    the version topic's START_OF_PUSH declares (compression, chunking); ``limits`` bound what one value may
    make the decoder hold (VALUE_TOO_LARGE past them)."""
    key, value = bytes(key or b""), bytes(value or b"")
    if len(key) < 1 or len(value) < 2:
        return _out("quarantined", "MALFORMED_RECORD")
    if value[0] != MAGIC_BYTE:
        return _out("quarantined", "MALFORMED_RECORD")
    version = value[1]
    if version not in SUPPORTED_VERSIONS:
        return _out("quarantined", "UNKNOWN_PROTOCOL_VERSION")
    buf = io.BytesIO(value[2:])
    try:
        env = fastavro.schemaless_reader(buf, envelope_schema(version), None, return_record_name=True)
    except Exception:
        return _out("quarantined", "MALFORMED_RECORD")
    if buf.tell() != len(value) - 2:
        return _out("quarantined", "MALFORMED_RECORD")
    header, key_bytes = key[0], key[1:]
    mt = env["messageType"]
    pname, payload = env["payloadUnion"]
    pname = _short(pname)
    pm = env["producerMetadata"]
    base = {"replica": replica, "topic": topic, "partition": int(partition), "offset": int(offset)}
    expected = {MT_PUT: ("Put", KEY_HEADER_PUT), MT_DELETE: ("Delete", KEY_HEADER_PUT),
                MT_CONTROL: ("ControlMessage", KEY_HEADER_CONTROL), MT_UPDATE: ("Update", KEY_HEADER_UPDATE)}
    if mt not in expected or expected[mt] != (pname, header):
        return _out("quarantined", "MALFORMED_RECORD")
    if mt == MT_UPDATE:
        return _out("quarantined", "UPDATE_NOT_APPLIED")
    if mt == MT_CONTROL:
        cmt = payload["controlMessageType"]
        if cmt == CM_START_OF_PUSH:
            return _out("row", None, {**base, "kind": "START_OF_PUSH"})
        if not (cmt == CM_START_OF_SEGMENT and key_bytes == HEARTBEAT_KEY_BYTES):
            name = "DOL_STAMP" if key_bytes == DOL_STAMP_KEY_BYTES else control_message_name(cmt)
            return _out("skipped", "CONTROL_MESSAGE", {**base, "control_message": name})
    manifest = rmd_chunks = None
    if mt == MT_DELETE and payload["schemaId"] == values.CHUNK_SCHEMA_ID:
        # A leader deleting the chunks of the value it just replaced or deleted: not a user delete.
        return _out("skipped", "CHUNK_CLEANUP", base)
    if mt == MT_PUT and payload["schemaId"] < 0:
        if not push.chunked or payload["schemaId"] not in (values.CHUNK_SCHEMA_ID, values.MANIFEST_SCHEMA_ID):
            return _out("quarantined", "CHUNKED_VALUE")
        if payload["schemaId"] == values.CHUNK_SCHEMA_ID:
            # Read here, reassembled under its manifest (value bytes in putValue, RMD bytes in the RMD payload).
            return _out("skipped", "VALUE_CHUNK", {
                **base, "chunk_key": key_bytes,
                "chunk_bytes": bytes(payload["putValue"]) + bytes(payload["replicationMetadataPayload"])})
        try:
            manifest = values.decode_manifest(bytes(payload["putValue"]))
        except ValueError:
            return _out("quarantined", "MALFORMED_RECORD")
        try:
            values.check_manifest(manifest, limits)
        except values.ValueTooLarge:
            return _out("quarantined", "VALUE_TOO_LARGE")
    if push.chunked and mt in (MT_PUT, MT_DELETE):
        if not key_bytes.endswith(values.NON_CHUNK_SUFFIX):
            return _out("quarantined", "MALFORMED_RECORD")
        key_bytes = key_bytes[: -len(values.NON_CHUNK_SUFFIX)]
    write_ts = None
    if mt in (MT_PUT, MT_DELETE):
        rmd = bytes(payload["replicationMetadataPayload"])
        if manifest is not None:
            rmd_chunks = values.rmd_manifest(rmd, key_bytes)
            if rmd_chunks is not None:
                try:
                    values.check_manifest(rmd_chunks, limits)
                except values.ValueTooLarge:
                    return _out("quarantined", "VALUE_TOO_LARGE")
        if rmd_chunks is None:
            try:
                write_ts = rmd_write_ts(payload["replicationMetadataVersionId"], rmd)
            except ValueError:
                return _out("quarantined", "MALFORMED_RECORD")
    put_value = None
    if mt == MT_PUT and manifest is None:
        put_value, refused = _decompressed(push, bytes(payload["putValue"]), limits)
        if refused:
            return _out("quarantined", refused)
    footer = env.get("leaderMetadataFooter")
    if isinstance(footer, tuple):
        footer = footer[1]
    if footer is None or footer["upstreamOffset"] < 0:
        return _out("quarantined", "NO_UPSTREAM_POSITION")
    cid = footer["upstreamKafkaClusterId"]
    if cid not in cluster_regions:
        raise UnknownClusterId(
            f"upstreamKafkaClusterId {cid} is not in the cluster -> region map (known ids: {sorted(cluster_regions)})"
        )
    term = footer.get("termId", -1)
    row = {
        **base,
        "source_region": cluster_regions[cid],
        "source_offset": footer["upstreamOffset"],
        "leader_epoch": term if term is not None and term != -1 else None,
    }
    u = int(clock_uncertainty_ms)
    if mt == MT_CONTROL:
        ts = pm["messageTimestamp"]
        row.update(kind="HEARTBEAT", origin_ts_min_ms=ts - u, origin_ts_max_ms=ts + u,
                   applied_ts_min_ms=int(timestamp_ms) - u, applied_ts_max_ms=int(timestamp_ms) + u)
        return _out("row", None, row)
    row.update(kind="PUT" if mt == MT_PUT else "DELETE", key=_b64(key_bytes), write_ts=write_ts)
    if manifest is not None:
        # Its value (and maybe its write time) is in chunks: ``assemble_manifest`` finishes the row.
        row.update(manifest=manifest, rmd_manifest=rmd_chunks, rmd_version_id=payload["replicationMetadataVersionId"])
        return _out("manifest", None, row)
    if mt == MT_PUT:
        row["value"] = f"{payload['schemaId']}:{_b64(put_value)}"
    return _out("row", None, row)


def _decompressed(push: PushSettings, data: bytes, limits: values.Limits) -> tuple[bytes | None, str | None]:
    """(the value as written, None), or (None, the quarantine reason when it cannot be decompressed within the limit)."""
    try:
        return values.decompress(push, data, limits.max_value_bytes), None
    except values.UnsupportedCompression:
        return None, "COMPRESSED_VALUE"
    except values.ValueTooLarge:
        return None, "VALUE_TOO_LARGE"
    except values.CorruptValue:
        return None, "UNDECOMPRESSABLE_VALUE"


def assemble_manifest(
    decoded: dict, chunks: dict[bytes, bytes], push: PushSettings, limits: values.Limits = values.Limits()
) -> dict:
    """A manifest's outcome (``decode_record``'s "manifest") with its chunks (chunk key -> bytes, those of
    the dump under the manifest's keys) -> the logical PUT at the manifest's position: the reassembled,
    then decompressed value with the manifest's schema id, and the write time of the RMD (reassembled
    too when RMD chunking is on). Quarantined MISSING_CHUNKS when a chunk is not in the dump (``missing``
    names the indexes), UNDECOMPRESSABLE_VALUE / COMPRESSED_VALUE as a PUT's value, MALFORMED_RECORD
    when the reassembled RMD is not one."""
    row = {k: v for k, v in decoded["row"].items() if k not in ("manifest", "rmd_manifest", "rmd_version_id")}
    manifest, rmd_chunks = decoded["row"]["manifest"], decoded["row"]["rmd_manifest"]
    data, missing = values.assemble(manifest, chunks)
    rmd_missing: list[int] = []
    rmd = None
    if rmd_chunks is not None:
        rmd, rmd_missing = values.assemble(rmd_chunks, chunks)
    if missing or rmd_missing:
        described = [f"value chunk {i}" if i >= 0 else "value size" for i in missing]
        described += [f"RMD chunk {i}" if i >= 0 else "RMD size" for i in rmd_missing]
        out = _out("quarantined", "MISSING_CHUNKS")
        out["missing"] = (f"{len(manifest['keys'])} value chunks, {len(described)} not in the dump: "
                          + ", ".join(described))
        return out
    value, refused = _decompressed(push, data, limits)
    if refused:
        return _out("quarantined", refused)
    if rmd is not None:
        try:
            row["write_ts"] = rmd_write_ts(decoded["row"]["rmd_version_id"], rmd)
        except ValueError:
            return _out("quarantined", "MALFORMED_RECORD")
    row["value"] = f"{manifest['schema_id']}:{_b64(value)}"
    return _out("row", None, row)


def start_of_push_settings(key: bytes, value: bytes) -> PushSettings | None:
    """What a START_OF_PUSH record declares (chunking, compression, dictionary); None for any other record."""
    key, value = bytes(key or b""), bytes(value or b"")
    if not key or key[0] != KEY_HEADER_CONTROL or len(value) < 2 or value[0] != MAGIC_BYTE:
        return None
    if value[1] not in SUPPORTED_VERSIONS:
        return None
    try:
        env = fastavro.schemaless_reader(io.BytesIO(value[2:]), envelope_schema(value[1]), None)
    except Exception:
        return None
    payload = env["payloadUnion"]
    if env["messageType"] != MT_CONTROL or payload.get("controlMessageType") != CM_START_OF_PUSH:
        return None
    sop = payload["controlMessageUnion"]
    dictionary = sop.get("compressionDictionary")
    return PushSettings(bool(sop["chunked"]), int(sop["compressionStrategy"]),
                        None if dictionary is None else bytes(dictionary))


def is_value_chunk(value: bytes) -> bool:
    """Whether a record's value is one chunk of a chunked value (a PUT with schemaId -10): its manifest comes
    after it. A cut that ends among a value's chunks would split the value between two snapshots."""
    value = bytes(value or b"")
    if len(value) < 2 or value[0] != MAGIC_BYTE or value[1] not in SUPPORTED_VERSIONS:
        return False
    try:
        env = fastavro.schemaless_reader(io.BytesIO(value[2:]), envelope_schema(value[1]), None,
                                         return_record_name=True)
    except Exception:  # noqa: BLE001 - a malformed record is the decoder's to quarantine, not a chunk
        return False
    name, payload = env["payloadUnion"]
    return env["messageType"] == MT_PUT and _short(name) == "Put" and payload["schemaId"] == values.CHUNK_SCHEMA_ID


def upstream_cluster_id(value: bytes) -> int | None:
    """The leader footer's ``upstreamKafkaClusterId`` of a record's value; None when it has no footer
    or is not a supported Venice envelope. For naming every cluster id a snapshot holds."""
    value = bytes(value or b"")
    if len(value) < 2 or value[0] != MAGIC_BYTE or value[1] not in SUPPORTED_VERSIONS:
        return None
    try:
        env = fastavro.schemaless_reader(io.BytesIO(value[2:]), envelope_schema(value[1]), None)
    except Exception:
        return None
    footer = env.get("leaderMetadataFooter")
    if isinstance(footer, tuple):
        footer = footer[1]
    return None if footer is None else footer["upstreamKafkaClusterId"]


def _zero(t, named: dict):
    """A valid default datum for Avro type t (field defaults where the schema gives them)."""
    if isinstance(t, list):
        return None if "null" in t else _zero(t[0], named)
    if isinstance(t, str):
        if t in named:
            return _zero(named[t], named)
        return {"null": None, "boolean": False, "int": 0, "long": 0, "float": 0.0, "double": 0.0,
                "bytes": b"", "string": ""}[t]
    kind = t["type"]
    if kind == "record":
        named[t["name"]] = t
        return {f["name"]: (f["default"] if "default" in f and not isinstance(f["default"], (dict, list))
                            and _type_name(f["type"]) in ("int", "long", "string", "boolean", "null")
                            else _zero(f["type"], named)) for f in t["fields"]}
    if kind == "fixed":
        return bytes(t["size"])
    if kind == "enum":
        return t["symbols"][0]
    if kind == "array":
        return []
    if kind == "map":
        return {}
    return _zero(kind, named)


def _type_name(t):
    if isinstance(t, list):
        return _type_name(t[0])
    return t if isinstance(t, str) else t.get("type")


def _find(t, name):
    if isinstance(t, dict):
        if t.get("name") == name and t.get("type") == "record":
            return t
        for v in t.values():
            r = _find(v, name)
            if r is not None:
                return r
    elif isinstance(t, list):
        for v in t:
            r = _find(v, name)
            if r is not None:
                return r
    return None


_DEFAULTS: dict[tuple[int, str], dict] = {}


def _default(version: int, name: str) -> dict:
    """A fresh default datum of record ``name`` (a shallow copy: callers set top-level fields only)."""
    if (version, name) not in _DEFAULTS:
        _DEFAULTS[(version, name)] = _zero(_find(envelope_schema_dict(version), name), {})
    return dict(_DEFAULTS[(version, name)])


def encode_record(
    row: dict,
    *,
    region_clusters: dict[str, int],
    clock_uncertainty_ms: int = 0,
    version: int = CURRENT_PROTOCOL_VERSION,
    producer_guid: bytes = b"\x01" * 16,
    push: PushSettings = NOT_DECLARED,
) -> KafkaRecord:
    """A SPEC 1 row -> (key, value, Kafka timestamp), the inverse of ``decode_record``.

    For tests and the simulator. A heartbeat's messageTimestamp and Kafka timestamp are the
    midpoints of its origin and applied intervals (their half-widths must equal
    clock_uncertainty_ms for the round trip to hold). ``push`` is the version's settings: a
    START_OF_PUSH declares them, a PUT's value is compressed with them, and a data key carries the
    non-chunk suffix when the version is chunked (``encode_chunked_put`` writes a large value)."""
    kind = row["kind"]
    pm = _default(version, "ProducerMetadata")
    pm["producerGUID"] = producer_guid
    rmd_version, rmd = rmd_payload(row.get("write_ts"))
    suffix = values.NON_CHUNK_SUFFIX if push.chunked else b""
    footer = None
    ts = 0
    if kind == "START_OF_PUSH":
        key = bytes([KEY_HEADER_CONTROL]) + producer_guid + bytes(8)
        sop = _default(version, "StartOfPush")
        sop.update(chunked=push.chunked, compressionStrategy=push.compression, compressionDictionary=push.dictionary)
        mt, payload = MT_CONTROL, _control(version, CM_START_OF_PUSH, "StartOfPush", sop)
    else:
        footer = _footer(row, version, region_clusters)
        if kind == "HEARTBEAT":
            key = bytes([KEY_HEADER_CONTROL]) + HEARTBEAT_KEY_BYTES
            pm["messageTimestamp"] = (row["origin_ts_min_ms"] + row["origin_ts_max_ms"]) // 2
            ts = (row["applied_ts_min_ms"] + row["applied_ts_max_ms"]) // 2
            mt, payload = MT_CONTROL, _control(version, CM_START_OF_SEGMENT, "StartOfSegment")
        elif kind == "PUT":
            key = bytes([KEY_HEADER_PUT]) + base64.b64decode(row["key"]) + suffix
            sid, b64 = row["value"].split(":", 1)
            put = _default(version, "Put")
            put.update(schemaId=int(sid), putValue=values.compress(push, base64.b64decode(b64)),
                       replicationMetadataVersionId=rmd_version, replicationMetadataPayload=rmd)
            pm["logicalTimestamp"] = APP_DEFAULT_LOGICAL_TS
            mt, payload = MT_PUT, (NS + "Put", put)
        elif kind == "DELETE":
            key = bytes([KEY_HEADER_PUT]) + base64.b64decode(row["key"]) + suffix
            delete = _default(version, "Delete")
            delete.update(replicationMetadataVersionId=rmd_version, replicationMetadataPayload=rmd)
            pm["logicalTimestamp"] = APP_DEFAULT_LOGICAL_TS
            mt, payload = MT_DELETE, (NS + "Delete", delete)
        else:
            raise ValueError(f"cannot encode kind {kind!r}")
    return KafkaRecord(key, _envelope(version, mt, pm, payload, footer), ts)


NS = "com.linkedin.venice.kafka.protocol."


def _control(version: int, control_type: int, body_name: str, body: dict | None = None) -> tuple[str, dict]:
    cm = _default(version, "ControlMessage")
    cm.update(controlMessageType=control_type,
              controlMessageUnion=(NS + body_name, _default(version, body_name) if body is None else body))
    return NS + "ControlMessage", cm


def _footer(row: dict, version: int, region_clusters: dict[str, int]) -> dict:
    footer = _default(version, "LeaderMetadata")
    footer.update(hostName="replica-lens", upstreamOffset=row["source_offset"],
                  upstreamKafkaClusterId=region_clusters[row["source_region"]])
    if version >= 11 and "termId" in footer:
        footer["termId"] = -1 if row.get("leader_epoch") is None else row["leader_epoch"]
    return footer


def _envelope(version: int, mt: int, pm: dict, payload: tuple[str, dict], footer: dict | None) -> bytes:
    env = _default(version, "KafkaMessageEnvelope")
    env.update(messageType=mt, producerMetadata=pm, payloadUnion=payload,
               leaderMetadataFooter=None if footer is None else (NS + "LeaderMetadata", footer))
    out = io.BytesIO()
    out.write(bytes([MAGIC_BYTE, version]))
    fastavro.schemaless_writer(out, envelope_schema(version), env)
    return out.getvalue()


def encode_control_message(
    control_type: int, *, version: int = CURRENT_PROTOCOL_VERSION, producer_guid: bytes = b"\x01" * 16,
    key_bytes: bytes | None = None, timestamp_ms: int = 0,
) -> KafkaRecord:
    """A control message with the default body of its type (END_OF_PUSH, END_OF_SEGMENT, ...), under the
    producer's segment key or ``key_bytes`` (DOL_STAMP_KEY_BYTES for a leadership stamp)."""
    body = CONTROL_MESSAGE_TYPES[control_type]
    name = "".join(w.capitalize() for w in body.split("_"))
    pm = _default(version, "ProducerMetadata")
    pm.update(producerGUID=producer_guid, messageTimestamp=timestamp_ms)
    key = bytes([KEY_HEADER_CONTROL]) + (producer_guid + bytes(8) if key_bytes is None else key_bytes)
    return KafkaRecord(key, _envelope(version, MT_CONTROL, pm, _control(version, control_type, name), None), timestamp_ms)


def encode_chunked_put(
    row: dict,
    *,
    region_clusters: dict[str, int],
    push: PushSettings,
    chunk_size: int,
    version: int = CURRENT_PROTOCOL_VERSION,
    producer_guid: bytes = b"\x01" * 16,
    segment: int = 0,
    sequence: int = 0,
    rmd_chunking: bool = False,
) -> tuple[list[KafkaRecord], list[bytes]]:
    """A PUT too large for one record, as a leader writes it (``VeniceWriter.putLargeValue``): the
    compressed value cut into chunks of ``chunk_size`` bytes (schema id -10, upstream offset -1), with
    ``rmd_chunking`` the RMD in chunks too (indexes continuing), then the manifest under the user
    key with the row's leader footer. Returns the records and the chunk keys (for a later cleanup)."""
    user_key = base64.b64decode(row["key"])
    sid, b64 = row["value"].split(":", 1)
    data = values.compress(push, base64.b64decode(b64))
    rmd_version, rmd = rmd_payload(row.get("write_ts"))
    chunk_footer = _default(version, "LeaderMetadata")
    chunk_footer.update(hostName="replica-lens", upstreamOffset=-1, upstreamKafkaClusterId=-1)
    records: list[KafkaRecord] = []
    keys: list[bytes] = []

    def cut(payload: bytes, start: int, in_rmd: bool) -> list[bytes]:
        made = []
        pieces = [payload[i:i + chunk_size] for i in range(0, len(payload), chunk_size)]
        for n, piece in enumerate(pieces):
            key = user_key + values.chunk_suffix(producer_guid, segment, sequence, start + n)
            put = _default(version, "Put")
            put.update(schemaId=values.CHUNK_SCHEMA_ID, putValue=b"" if in_rmd else piece,
                       replicationMetadataVersionId=RMD_VERSION_ID, replicationMetadataPayload=piece if in_rmd else b"")
            pm = _default(version, "ProducerMetadata")
            pm.update(producerGUID=producer_guid, segmentNumber=segment, messageSequenceNumber=sequence + len(records),
                      logicalTimestamp=-1)
            records.append(KafkaRecord(bytes([KEY_HEADER_PUT]) + key,
                                       _envelope(version, MT_PUT, pm, (NS + "Put", put), chunk_footer), 0))
            made.append(key)
        return made

    keys = cut(data, 0, False)
    rmd_keys = cut(rmd, len(keys), True) if rmd_chunking and rmd else []
    manifest = _default(version, "Put")
    manifest.update(schemaId=values.MANIFEST_SCHEMA_ID, putValue=values.encode_manifest(keys, int(sid), len(data)),
                    replicationMetadataVersionId=rmd_version,
                    replicationMetadataPayload=values.encode_manifest(rmd_keys, int(sid), len(rmd)) if rmd_keys else rmd)
    pm = _default(version, "ProducerMetadata")
    pm.update(producerGUID=producer_guid, segmentNumber=segment, messageSequenceNumber=sequence + len(records),
              logicalTimestamp=APP_DEFAULT_LOGICAL_TS)
    records.append(KafkaRecord(bytes([KEY_HEADER_PUT]) + user_key + values.NON_CHUNK_SUFFIX,
                               _envelope(version, MT_PUT, pm, (NS + "Put", manifest),
                                         _footer(row, version, region_clusters)), 0))
    return records, keys + rmd_keys


def encode_chunk_cleanup(
    chunk_keys: list[bytes], replacing: dict, *, region_clusters: dict[str, int],
    version: int = CURRENT_PROTOCOL_VERSION, producer_guid: bytes = b"\x01" * 16,
) -> list[KafkaRecord]:
    """The DELETEs (schema id -10) a leader writes on the chunk keys of a value it has just replaced or
    deleted, with the replacing write's leader footer (``VeniceWriter.deleteDeprecatedChunk``)."""
    out = []
    for key in chunk_keys:
        delete = _default(version, "Delete")
        delete.update(schemaId=values.CHUNK_SCHEMA_ID)
        pm = _default(version, "ProducerMetadata")
        pm.update(producerGUID=producer_guid, logicalTimestamp=APP_DEFAULT_LOGICAL_TS)
        out.append(KafkaRecord(bytes([KEY_HEADER_PUT]) + key,
                               _envelope(version, MT_DELETE, pm, (NS + "Delete", delete),
                                         _footer(replacing, version, region_clusters)), 0))
    return out
