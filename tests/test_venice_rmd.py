"""Venice envelopes of protocol versions 11, 12 and 13 and write timestamps from replication
metadata (issue 43 items 3 and 4), decoded from bytes built here by hand: Avro binary written
field by field with this module's own varint code, not with fastavro nor the project's encoder.

Facts they encode (linkedin/venice at 77ea837f): the KafkaMessageEnvelope v11..v13 .avsc files
(v11 drops v10's producer upstreamOffset and targetVersion and adds VersionSwap; v12 adds
LeaderMetadata upstreamPubSubPosition + termId and VersionSwap localHighWatermarkPubSubPositions;
v13 adds VersionSwap sourceRegion, destinationRegion, generationId); the RMD record of
RmdSchemaGeneratorV1 (field 0 ``timestamp`` = union [long, per-field record], field 1
``replication_checkpoint_vector`` = array of long); VeniceWriter.APP_DEFAULT_LOGICAL_TS = -2."""
from __future__ import annotations

import base64

import pytest

from pipelines.venice.decoder import decode_record, encode_record, rmd_write_ts

CLUSTERS = {0: "dc-a", 3: "dc-b", 7: "dc-c"}
BASE = {"replica": "dc-a", "topic": "s_v3", "partition": 2, "offset": 11}
U = 25
GUID = b"\x07" * 16
HB_KEY = bytes.fromhex("02" "81545f3cbd093909a467a583ef39e468" "00000000" "00000000")
PRODUCER_KEY = b"\x02" + GUID + bytes(8)  # a control message under its producer's own key
MS = 1_764_201_600_123  # 2025-11-27, a realistic write time: its varint takes 6 bytes


def zz(n: int) -> bytes:
    """Avro int/long by hand: zigzag (0, -1, 1, -2 ... -> 0, 1, 2, 3 ...), then 7-bit groups, low
    group first, high bit set on every byte but the last."""
    u = 2 * n if n >= 0 else -2 * n - 1
    out = bytearray()
    while u >= 0x80:
        out.append(0x80 | (u & 0x7F))
        u //= 128
    out.append(u)
    return bytes(out)


def blob(b: bytes) -> bytes:
    """Avro bytes/string: length, then the bytes."""
    return zz(len(b)) + b


def envelope(v: int, message_type: int, payload: bytes, footer: bytes | None, logical: int = -2,
             seq: int = 1, ts: int = 4000) -> bytes:
    out = bytes([23, v]) + zz(message_type)
    out += GUID + zz(0) + zz(seq) + zz(ts)  # producerGUID, segmentNumber, messageSequenceNumber, messageTimestamp
    if v == 10:
        out += zz(-1)  # producer upstreamOffset (v10 only)
    out += zz(logical)  # logicalTimestamp
    if v == 10:
        out += zz(-1)  # targetVersion (v10 only)
    return out + payload + (zz(0) if footer is None else zz(1) + footer)  # leaderMetadataFooter union


def leader(v: int, offset: int, cluster: int, term: int = -1, host: bytes = b"h1", position: bytes = b"\x00\x01") -> bytes:
    out = blob(host) + zz(offset) + zz(cluster)  # hostName, upstreamOffset, upstreamKafkaClusterId
    if v >= 12:
        out += blob(position) + zz(term)  # upstreamPubSubPosition, termId
    if v >= 14:
        out += zz(-1)  # upstreamMessageTimestamp
    return out


def put(value: bytes, schema_id: int, rmd_version: int = -1, rmd: bytes = b"") -> bytes:
    return zz(0) + blob(value) + zz(schema_id) + zz(rmd_version) + blob(rmd)  # payloadUnion branch 0: Put


def delete(schema_id: int, rmd_version: int = -1, rmd: bytes = b"") -> bytes:
    return zz(2) + zz(schema_id) + zz(rmd_version) + blob(rmd)  # payloadUnion branch 2: Delete


def control(cm_type: int, branch: int, body: bytes) -> bytes:
    # payloadUnion branch 3: ControlMessage; debugInfo an empty map; controlMessageUnion branch.
    return zz(3) + zz(cm_type) + zz(0) + zz(branch) + body


START_OF_PUSH = control(0, 0, b"\x00\x00" + zz(0) + zz(0) + zz(0))  # sorted, chunked, strategy, dictionary null, policy
START_OF_SEGMENT = control(2, 2, zz(0) + zz(0))  # checksumType 0, upcomingAggregates []


def version_swap(v: int) -> bytes:
    body = blob(b"s_v2") + blob(b"s_v3") + zz(0)  # old/new serving version topic, localHighWatermarks null
    if v >= 12:
        body += zz(1) + blob(b"\x00\x05") + zz(0)  # localHighWatermarkPubSubPositions: one block of 1 item
    body += b"\x01\x00"  # isRepush true, isLastVersionSwapMessageFromRealTimeTopic false
    if v >= 13:
        body += blob(b"dc-a") + blob(b"dc-b") + zz(77)  # sourceRegion, destinationRegion, generationId
    return control(8, 8, body)


def rmd_value_level(ms: int) -> bytes:
    return zz(0) + zz(ms) + zz(0)  # timestamp: union branch 0 (long); replication_checkpoint_vector []


def rmd_per_field(*field_ms: int) -> bytes:
    # timestamp: union branch 1, a record with one long per value field; then a checkpoint vector [5].
    return zz(1) + b"".join(zz(t) for t in field_ms) + zz(1) + zz(5) + zz(0)


def dec(key: bytes, value: bytes) -> dict:
    return decode_record(key, value, replica="dc-a", topic="s_v3", partition=2, offset=11, timestamp_ms=5000,
                         cluster_regions=CLUSTERS, clock_uncertainty_ms=U)


# A v12 PUT spelled out byte by byte; the helpers above must build the same bytes.
V12_PUT = bytes.fromhex(
    "17" "0c"                                # magic byte 23, protocol version 12
    "00"                                     # messageType 0 (PUT)
    + "07" * 16                              # producerGUID
    + "00" "02"                              # segmentNumber 0, messageSequenceNumber 1
    "c03e"                                   # messageTimestamp 4000; no producer upstreamOffset since v11
    "03"                                     # logicalTimestamp -2 (leader's sentinel); no targetVersion since v11
    "00"                                     # payloadUnion branch 0: Put
    "06" "026869"                            # putValue b"\x02hi"
    "0a"                                     # schemaId 5
    "02"                                     # replicationMetadataVersionId 1
    "08" "00" "d00f" "00"                    # RMD, 4 bytes: timestamp branch 0 (long) 1000 ms, checkpoint vector []
    "02"                                     # leaderMetadataFooter branch 1: LeaderMetadata
    "04" "6831"                              # hostName "h1"
    "54"                                     # upstreamOffset 42
    "0e"                                     # upstreamKafkaClusterId 7
    "04" "0001"                              # upstreamPubSubPosition b"\x00\x01" (v12)
    "12"                                     # termId 9 (v12); no upstreamMessageTimestamp before v14
)


def test_hand_spelled_v12_put():
    # Catches a v12 schema without termId (trailing bytes: MALFORMED_RECORD), with v14's
    # upstreamMessageTimestamp (runs out of bytes), or with v10's producer fields; and a write_ts
    # not taken from the RMD (would be None or -2) or not shifted by 18 bits (would be 1000).
    assert envelope(12, 0, put(b"\x02hi", 5, 1, rmd_value_level(1000)), leader(12, 42, 7, term=9)) == V12_PUT
    assert dec(b"\x00\x06abc", V12_PUT) == {"outcome": "row", "reason": None, "row": {
        **BASE, "kind": "PUT", "key": base64.b64encode(b"\x06abc").decode(), "value": "5:Amhp",
        "source_region": "dc-c", "source_offset": 42, "write_ts": 1000 << 18, "leader_epoch": 9}}


@pytest.mark.parametrize("v", [11, 12, 13])
def test_put_and_delete_of_every_new_version(v):
    # Catches a version read with another's layout (v11 with v10's producer upstreamOffset and
    # targetVersion, v11 with v12's termId, v12/v13 without it: the bytes then do not parse or
    # leave bytes over), termId not mapped to leader_epoch (v12+), and DELETE's RMD not read.
    epoch = 9 if v >= 12 else None
    got = dec(b"\x00k", envelope(v, 0, put(b"val", 3, 1, rmd_value_level(MS)), leader(v, 300, 3, term=9)))
    assert got == {"outcome": "row", "reason": None, "row": {
        **BASE, "kind": "PUT", "key": "aw==", "value": "3:dmFs", "source_region": "dc-b", "source_offset": 300,
        "write_ts": MS << 18, "leader_epoch": epoch}}
    got = dec(b"\x00k", envelope(v, 1, delete(3, 1, rmd_value_level(MS + 1)), leader(v, 301, 0, term=9)))
    assert got == {"outcome": "row", "reason": None, "row": {
        **BASE, "kind": "DELETE", "key": "aw==", "source_region": "dc-a", "source_offset": 301,
        "write_ts": (MS + 1) << 18, "leader_epoch": epoch}}


@pytest.mark.parametrize("v", [11, 12, 13])
def test_control_messages_of_every_new_version(v):
    # Catches a heartbeat or START_OF_PUSH misread in the new versions, and a VersionSwap body of
    # the wrong version (v13 without sourceRegion/destinationRegion/generationId, v12 without
    # localHighWatermarkPubSubPositions: the bytes would be MALFORMED_RECORD, not skipped).
    got = dec(HB_KEY, envelope(v, 2, START_OF_SEGMENT, leader(v, 500, 7, term=4)))
    assert got == {"outcome": "row", "reason": None, "row": {
        **BASE, "kind": "HEARTBEAT", "source_region": "dc-c", "source_offset": 500,
        "leader_epoch": 4 if v >= 12 else None, "origin_ts_min_ms": 4000 - U, "origin_ts_max_ms": 4000 + U,
        "applied_ts_min_ms": 5000 - U, "applied_ts_max_ms": 5000 + U}}
    got = dec(PRODUCER_KEY, envelope(v, 2, START_OF_PUSH, None))
    assert got == {"outcome": "row", "reason": None, "row": {**BASE, "kind": "START_OF_PUSH"}}
    got = dec(PRODUCER_KEY, envelope(v, 2, version_swap(v), leader(v, 1, 0)))
    assert (got["outcome"], got["reason"]) == ("skipped", "CONTROL_MESSAGE")
    other = 12 if v != 12 else 13  # the VersionSwap of another version does not fit
    assert dec(PRODUCER_KEY, envelope(v, 2, version_swap(other), leader(v, 1, 0)))["reason"] == "MALFORMED_RECORD"


@pytest.mark.parametrize("v", [11, 12, 13, 14])
@pytest.mark.parametrize("logical", [-2, -1])
def test_sentinel_logical_timestamp_without_rmd_is_no_write_time(v, logical):
    # Catches a write_ts taken from logicalTimestamp: -2/-1 are Venice's "none" sentinels
    # (VeniceWriter.APP_DEFAULT_LOGICAL_TS / VENICE_DEFAULT_LOGICAL_TS), never a clock.
    for payload in (put(b"x", 1), delete(1), put(b"x", 1, 1, b""), delete(1, -1, rmd_value_level(MS))):
        got = dec(b"\x00k", envelope(v, 0 if payload[0] == 0 else 1, payload, leader(v, 5, 0), logical=logical))
        assert got["outcome"] == "row" and got["row"]["write_ts"] is None, (payload, got)
    # A client's own logicalTimestamp is no write time either without RMD (the RMD holds it).
    assert dec(b"\x00k", envelope(v, 0, put(b"x", 1), leader(v, 5, 0), logical=MS))["row"]["write_ts"] is None


@pytest.mark.parametrize("message_type,body", [(0, lambda rmd: put(b"x", 1, 1, rmd)), (1, lambda rmd: delete(1, 1, rmd))])
def test_rmd_timestamps(message_type, body):
    def write_ts(rmd):
        got = dec(b"\x00k", envelope(13, message_type, body(rmd), leader(13, 5, 0)))
        return got["row"]["write_ts"] if got["outcome"] == "row" else got["reason"]

    # Catches a reader that takes only the varint's first byte, or ms without the << 18.
    assert write_ts(rmd_value_level(MS)) == MS << 18
    # Catches per-field timestamps read as a value-level one (the first field's time, 1000).
    assert write_ts(rmd_per_field(1000, 2000)) is None
    # Catches Venice's batch sentinel 0 or a negative stamp taken as a clock.
    assert write_ts(rmd_value_level(0)) is None
    assert write_ts(rmd_value_level(-2)) is None
    # Catches an int64 overflow of ms << 18 (negative or wrapped write_ts).
    assert write_ts(rmd_value_level(2**45 - 1)) == (2**45 - 1) << 18
    assert write_ts(rmd_value_level(2**45)) is None
    # Catches RMD bytes that are not the union accepted as a time (branch 2, a truncated varint).
    assert write_ts(zz(2) + zz(MS)) == "MALFORMED_RECORD"
    assert write_ts(zz(0) + b"\x80") == "MALFORMED_RECORD"


def test_rmd_write_ts_needs_rmd_version_1():
    # Catches RMD of an unknown RMD protocol (or a stray payload with version id -1) read as version 1.
    assert rmd_write_ts(1, rmd_value_level(MS)) == MS << 18
    assert rmd_write_ts(-1, rmd_value_level(MS)) is None
    assert rmd_write_ts(2, rmd_value_level(MS)) is None
    assert rmd_write_ts(1, b"") is None


def test_encoder_writes_what_a_leader_writes():
    # Catches the encoder still putting write_ts into logicalTimestamp (byte after messageTimestamp
    # would not be -2) or into an RMD of another layout; and documents that the 18 logical bits
    # of a write_ts are not kept (Venice's stamps are whole milliseconds).
    row = {**BASE, "kind": "PUT", "key": "aw==", "value": "3:dmFs", "source_region": "dc-b", "source_offset": 300,
           "write_ts": (MS << 18) | 5, "leader_epoch": 9}
    rec = encode_record(row, region_clusters={"dc-a": 0, "dc-b": 3, "dc-c": 7}, version=12, producer_guid=GUID)
    assert rec.value == envelope(12, 0, put(b"val", 3, 1, rmd_value_level(MS)),
                                 leader(12, 300, 3, term=9, host=b"replica-lens", position=b""), seq=0, ts=0)
    assert dec(rec.key, rec.value)["row"] == {**row, "write_ts": MS << 18}
    none = encode_record({**row, "kind": "DELETE", "write_ts": None}, region_clusters={"dc-b": 3}, version=11)
    assert dec(none.key, none.value)["row"]["write_ts"] is None
