"""pipelines/venice/decoder.py: round trips (hypothesis), byte fixtures written without the encoder, and
envelopes spelled out byte by byte (Avro binary encoding by hand) so that the project's own
schemas (pipelines/venice/protocol.py) are checked against the wire, not against themselves."""
from __future__ import annotations

import base64
import io

import fastavro
import pytest
from fastavro.schema import fingerprint, to_parsing_canonical_form
from hypothesis import given, settings, strategies as st

from pipelines.venice.decoder import UnknownClusterId, decode_record, encode_record
from pipelines.venice.protocol import envelope_schema_dict
from pipelines.venice.values import PushSettings
from tests.examples import examples

NS = "com.linkedin.venice.kafka.protocol."
CLUSTERS = {0: "dc-a", 3: "dc-b", 7: "dc-c"}
REGIONS = {v: k for k, v in CLUSTERS.items()}
U = 25
# KafkaKey.HEART_BEAT: header 2, UUID.nameUUIDFromBytes("heartbeatControlMessage") = 81545f3c-bd09-3909-a467-a583ef39e468, 0, 0.
HB_KEY = bytes.fromhex("02" "81545f3cbd093909a467a583ef39e468" "00000000" "00000000")


def schema(v):
    return fastavro.parse_schema(envelope_schema_dict(v))


def wire(v, env):
    out = io.BytesIO()
    out.write(bytes([23, v]))
    fastavro.schemaless_writer(out, schema(v), env)
    return out.getvalue()


def pm(ts=1000, logical=-1):
    return {"producerGUID": b"\x07" * 16, "segmentNumber": 0, "messageSequenceNumber": 1,
            "messageTimestamp": ts, "logicalTimestamp": logical}


def footer(v, offset, cid, term=-1):
    f = {"hostName": "h1", "upstreamOffset": offset, "upstreamKafkaClusterId": cid}
    if v >= 12:
        f.update(upstreamPubSubPosition=b"", termId=term)
    if v >= 14:
        f["upstreamMessageTimestamp"] = -1
    return (NS + "LeaderMetadata", f)


def dec(key, value, ts=5000, **kw):
    return decode_record(key, value, replica="dc-a", topic="s_v3", partition=2, offset=11, timestamp_ms=ts,
                         cluster_regions=CLUSTERS, clock_uncertainty_ms=U, **kw)


BASE = {"replica": "dc-a", "topic": "s_v3", "partition": 2, "offset": 11}


# CRC-64-AVRO fingerprints of the parsing canonical form of Venice's published
# KafkaMessageEnvelope schemas, protocol versions 10 to 14 (computed once from them: the .avsc
# files under internal/venice-common/src/main/resources/avro/KafkaMessageEnvelope/v<N>/ of
# linkedin/venice at 77ea837f; the defaults there were compared field by field too).
PUBLISHED_FINGERPRINTS = {10: "d97b1ba72ba42723", 11: "8351dfe71de04587", 12: "40d261e4ff0748e8",
                          13: "c4105c9b415afd23", 14: "1f802fdd524ff24d"}


@pytest.mark.parametrize("v", sorted(PUBLISHED_FINGERPRINTS))
def test_schema_matches_published_protocol(v):
    # Catches any structural slip in pipelines/venice/protocol.py: a field out of order, a
    # wrong type or union branch order, a fixed size, a name (canonical form keeps all of them).
    canonical = to_parsing_canonical_form(schema(v))
    assert fingerprint(canonical, "CRC-64-AVRO") == PUBLISHED_FINGERPRINTS[v]


# A v10 heartbeat, every byte by hand (Avro binary: int/long = zigzag varint, string/bytes =
# length then bytes, union = branch index then value, fixed = raw bytes, empty map/array = 0).
V10_HEARTBEAT = bytes.fromhex(
    "17" "0a"                                # magic byte 23, protocol version 10
    "04"                                     # messageType 2 (CONTROL_MESSAGE)
    + "07" * 16                              # producerMetadata.producerGUID (fixed 16)
    + "00"                                   # segmentNumber 0
    "02"                                     # messageSequenceNumber 1
    "c03e"                                   # messageTimestamp 4000 (zigzag 8000)
    "03"                                     # upstreamOffset -2 (v10 only; zigzag 3)
    "05"                                     # logicalTimestamp -3 (zigzag 5)
    "01"                                     # targetVersion -1 (v10 only)
    "06"                                     # payloadUnion branch 3: ControlMessage
    "04"                                     # controlMessageType 2 (START_OF_SEGMENT)
    "00"                                     # debugInfo: empty map
    "04"                                     # controlMessageUnion branch 2: StartOfSegment
    "00"                                     # checksumType 0
    "00"                                     # upcomingAggregates: empty array
    "02"                                     # leaderMetadataFooter branch 1: LeaderMetadata
    "04" "6831"                              # hostName "h1"
    "e807"                                   # upstreamOffset 500 (zigzag 1000)
    "06"                                     # upstreamKafkaClusterId 3
)

# A v14 PUT with a termId: the footer's v14 fields sit after upstreamKafkaClusterId. It has a
# logicalTimestamp (77) but no replication metadata, so no write time.
V14_PUT = bytes.fromhex(
    "17" "0e"                                # magic byte 23, protocol version 14
    "00"                                     # messageType 0 (PUT)
    + "07" * 16                              # producerGUID
    + "00" "02"                              # segmentNumber 0, messageSequenceNumber 1
    "d00f"                                   # messageTimestamp 1000 (zigzag 2000)
    "9a01"                                   # logicalTimestamp 77 (zigzag 154); no upstreamOffset, no targetVersion in v14
    "00"                                     # payloadUnion branch 0: Put
    "06" "026869"                            # putValue b"\x02hi"
    "0a"                                     # schemaId 5
    "01"                                     # replicationMetadataVersionId -1
    "00"                                     # replicationMetadataPayload b""
    "02"                                     # leaderMetadataFooter branch 1
    "04" "6831"                              # hostName "h1"
    "54"                                     # upstreamOffset 42
    "0e"                                     # upstreamKafkaClusterId 7
    "00"                                     # upstreamPubSubPosition b""
    "12"                                     # termId 9
    "01"                                     # upstreamMessageTimestamp -1
)


def test_hand_encoded_v10_heartbeat():
    # Catches a decoder reading v10 with a wrong field order (e.g. without the producer's
    # upstreamOffset or targetVersion, every later byte would shift and the decode fail or differ).
    got = dec(HB_KEY, V10_HEARTBEAT)
    assert got["row"] == {**BASE, "kind": "HEARTBEAT", "source_region": "dc-b", "source_offset": 500,
                          "leader_epoch": None, "origin_ts_min_ms": 3975, "origin_ts_max_ms": 4025,
                          "applied_ts_min_ms": 4975, "applied_ts_max_ms": 5025}
    env = {"messageType": 2,
           "producerMetadata": {**pm(ts=4000, logical=-3), "upstreamOffset": -2},
           "targetVersion": -1,
           "payloadUnion": (NS + "ControlMessage", {"controlMessageType": 2, "debugInfo": {},
                                                     "controlMessageUnion": (NS + "StartOfSegment", SOS)}),
           "leaderMetadataFooter": (NS + "LeaderMetadata", {"hostName": "h1", "upstreamOffset": 500,
                                                            "upstreamKafkaClusterId": 3})}
    assert wire(10, env) == V10_HEARTBEAT  # the fixtures below are written with the same schema


def test_hand_encoded_v14_put():
    # Catches the v14 footer fields in the wrong order (termId would not read 9), a v14 schema
    # that kept v10's targetVersion / producer upstreamOffset (the bytes would not parse), or a
    # write_ts still taken from logicalTimestamp (it would be 77).
    got = dec(b"\x00\x06abc", V14_PUT)
    assert got["row"] == {**BASE, "kind": "PUT", "key": base64.b64encode(b"\x06abc").decode(),
                          "value": "5:" + base64.b64encode(b"\x02hi").decode(), "source_region": "dc-c",
                          "source_offset": 42, "write_ts": None, "leader_epoch": 9}


@pytest.mark.parametrize("v", [10, 11, 12, 13, 14])
def test_put_fixture(v):
    # RMD by hand: timestamp union branch 0 (long), 1000 ms (zigzag 2000 = d0 0f), empty checkpoint vector.
    env = {"messageType": 0, "producerMetadata": pm(logical=77), "targetVersion": -1,
           "payloadUnion": (NS + "Put", {"putValue": b"\x02hi", "schemaId": 5, "replicationMetadataVersionId": 1,
                                          "replicationMetadataPayload": bytes.fromhex("00d00f00")}),
           "leaderMetadataFooter": footer(v, 42, 3, term=9)}
    got = dec(b"\x00\x06abc", wire(v, env))
    assert got["outcome"] == "row"
    assert got["row"] == {**BASE, "kind": "PUT", "key": base64.b64encode(b"\x06abc").decode(),
                          "value": "5:" + base64.b64encode(b"\x02hi").decode(), "source_region": "dc-b",
                          "source_offset": 42, "write_ts": 1000 << 18, "leader_epoch": 9 if v >= 12 else None}


def test_delete_fixture():
    env = {"messageType": 1, "producerMetadata": pm(), "payloadUnion": (NS + "Delete", {"schemaId": -1, "replicationMetadataVersionId": -1, "replicationMetadataPayload": b""}),
           "leaderMetadataFooter": footer(14, 8, 7)}
    got = dec(b"\x00k", wire(14, env))
    assert got["row"] == {**BASE, "kind": "DELETE", "key": "aw==", "source_region": "dc-c", "source_offset": 8,
                          "write_ts": None, "leader_epoch": None}


def control(v, cm_type, branch, body, key, ft=None, ts=1000):
    env = {"messageType": 2, "producerMetadata": pm(ts=ts),
           "payloadUnion": (NS + "ControlMessage", {"controlMessageType": cm_type, "debugInfo": {},
                                                     "controlMessageUnion": (NS + branch, body)}),
           "leaderMetadataFooter": ft}
    return dec(key, wire(v, env))


SOS = {"checksumType": 0, "upcomingAggregates": []}


@pytest.mark.parametrize("v", [10, 11, 12, 13, 14])
def test_heartbeat_fixture(v):
    got = control(v, 2, "StartOfSegment", SOS, HB_KEY, footer(v, 500, 0), ts=4000)
    assert got["row"] == {**BASE, "kind": "HEARTBEAT", "source_region": "dc-a", "source_offset": 500,
                          "leader_epoch": None, "origin_ts_min_ms": 3975, "origin_ts_max_ms": 4025,
                          "applied_ts_min_ms": 4975, "applied_ts_max_ms": 5025}


def test_start_of_push_and_skips():
    sop = {"sorted": True, "chunked": False, "compressionStrategy": 0, "compressionDictionary": None,
           "timestampPolicy": 0, "isWriteComputeEnabled": False}
    got = control(14, 0, "StartOfPush", sop, b"\x02" + b"\x07" * 16 + bytes(8))
    assert got == {"outcome": "row", "reason": None, "row": {**BASE, "kind": "START_OF_PUSH"}}
    # START_OF_SEGMENT under a producer's own key is a DIV segment start, not a heartbeat.
    got = control(14, 2, "StartOfSegment", SOS, b"\x02" + b"\x07" * 16 + bytes(8), footer(14, 1, 0))
    assert (got["outcome"], got["reason"]) == ("skipped", "CONTROL_MESSAGE")
    assert got["row"] == {**BASE, "control_message": "START_OF_SEGMENT"}
    got = control(14, 1, "EndOfPush", {}, b"\x02" + b"\x07" * 16 + bytes(8))
    assert (got["outcome"], got["reason"]) == ("skipped", "CONTROL_MESSAGE")
    # A skipped record keeps its Kafka position (read, so not a gap: SPEC 3a) and says which control message it was.
    assert got["row"] == {**BASE, "control_message": "END_OF_PUSH"}


def test_quarantines_and_unknown_cluster():
    upd = {"messageType": 3, "producerMetadata": pm(),
           "payloadUnion": (NS + "Update", {"schemaId": 1, "updateSchemaId": 1, "updateValue": b""}),
           "leaderMetadataFooter": footer(14, 1, 0)}
    assert dec(b"\x04k", wire(14, upd))["reason"] == "UPDATE_NOT_APPLIED"
    chunk = {"messageType": 0, "producerMetadata": pm(),
             "payloadUnion": (NS + "Put", {"putValue": b"x", "schemaId": -10, "replicationMetadataVersionId": -1, "replicationMetadataPayload": b""}),
             "leaderMetadataFooter": footer(14, 1, 0)}
    assert dec(b"\x00k", wire(14, chunk))["reason"] == "CHUNKED_VALUE"
    # A chunk where START_OF_PUSH declares chunking is read (skipped), not quarantined: tests/test_venice_values.py.
    chunk["payloadUnion"][1]["schemaId"] = 1
    # A strategy Venice does not have (4): no guess at the bytes.
    assert dec(b"\x00k", wire(14, chunk), push=PushSettings(compression=4))["reason"] == "COMPRESSED_VALUE"
    # GZIP declared, b"x" is no gzip member.
    assert dec(b"\x00k", wire(14, chunk), push=PushSettings(compression=1))["reason"] == "UNDECOMPRESSABLE_VALUE"
    good = wire(14, chunk)
    # Catches a decoder that reads a version it has no schema for (9 and 15 bracket 10..14).
    for unknown in (9, 15):
        assert dec(b"\x00k", bytes([23, unknown]) + good[2:])["reason"] == "UNKNOWN_PROTOCOL_VERSION"
    assert dec(b"\x00k", bytes([22]) + good[1:])["reason"] == "MALFORMED_RECORD"
    assert dec(b"\x00k", good[:-3])["reason"] == "MALFORMED_RECORD"
    assert dec(b"\x00k", good + b"\x00")["reason"] == "MALFORMED_RECORD"
    assert dec(b"", good)["reason"] == "MALFORMED_RECORD"
    chunk["leaderMetadataFooter"] = footer(14, 1, 99)
    with pytest.raises(UnknownClusterId, match=r"99.*\[0, 3, 7\]"):
        dec(b"\x00k", wire(14, chunk))


b64 = st.binary(max_size=12).map(lambda b: base64.b64encode(b).decode())
nn = st.integers(0, 2**62)
opt = st.none() | st.integers(0, 2**62)
# A Venice write time survives as whole milliseconds (RMD): write_ts = ms << 18, ms in 1 .. 2**45 - 1.
hlc_ms = st.none() | st.integers(1, 2**45 - 1).map(lambda ms: ms << 18)


@st.composite
def rows(draw):
    kind = draw(st.sampled_from(["START_OF_PUSH", "PUT", "DELETE", "HEARTBEAT"]))
    v = draw(st.sampled_from([10, 11, 12, 13, 14]))
    row = {"replica": "dc-a", "topic": "s_v3", "partition": 2, "offset": 11, "kind": kind}
    if kind != "START_OF_PUSH":
        row.update(source_region=draw(st.sampled_from(sorted(REGIONS))), source_offset=draw(nn),
                   leader_epoch=draw(opt) if v >= 12 else None)
    if kind in ("PUT", "DELETE"):
        row.update(key=draw(b64), write_ts=draw(hlc_ms))
    if kind == "PUT":
        row["value"] = f"{draw(st.integers(1, 2**31 - 1))}:{draw(b64)}"
    if kind == "HEARTBEAT":
        o, a = draw(st.integers(U, 2**50)), draw(st.integers(U, 2**50))
        row.update(origin_ts_min_ms=o - U, origin_ts_max_ms=o + U, applied_ts_min_ms=a - U, applied_ts_max_ms=a + U)
    return v, row


@settings(max_examples=examples(300), deadline=None)
@given(rows())
def test_round_trip(vr):
    v, row = vr
    rec = encode_record(row, region_clusters=REGIONS, clock_uncertainty_ms=U, version=v)
    got = dec(rec.key, rec.value, ts=rec.timestamp_ms)
    assert got == {"outcome": "row", "reason": None, "row": row}


def test_decode_venice_frame_accounts_for_every_row(spark):
    import datetime as dt

    from pipelines.venice.frame import decode_venice_frame

    recs = []
    rows_in = [
        {"replica": "dc-a", "topic": "s_v3", "partition": 0, "offset": 0, "kind": "START_OF_PUSH"},
        {"replica": "dc-a", "topic": "s_v3", "partition": 0, "offset": 1, "kind": "PUT", "key": "aw==", "value": "1:eA==",
         "source_region": "dc-b", "source_offset": 4, "leader_epoch": 2, "write_ts": None},
        {"replica": "dc-a", "topic": "s_v3", "partition": 0, "offset": 2, "kind": "HEARTBEAT", "source_region": "dc-c",
         "source_offset": 9, "leader_epoch": None, "origin_ts_min_ms": 1000 - U, "origin_ts_max_ms": 1000 + U,
         "applied_ts_min_ms": 2000 - U, "applied_ts_max_ms": 2000 + U},
    ]
    for row in rows_in:
        rec = encode_record(row, region_clusters=REGIONS, clock_uncertainty_ms=U)
        recs.append((rec.key, rec.value, row["offset"], rec.timestamp_ms))
    good = recs[1][1]
    recs.append((b"\x00k", bytes([23, 15]) + good[2:], 3, 0))  # unknown version
    recs.append((b"\x00k", b"\x17", 4, 0))  # malformed
    recs.append((b"\x02" + b"\x07" * 16 + bytes(8),
                 wire(14, {"messageType": 2, "producerMetadata": pm(),
                           "payloadUnion": (NS + "ControlMessage", {"controlMessageType": 1, "debugInfo": {},
                                                                     "controlMessageUnion": (NS + "EndOfPush", {})}),
                           "leaderMetadataFooter": None}), 5, 0))
    df = spark.createDataFrame(
        [(k, v, "s_v3", 0, o, dt.datetime.fromtimestamp(t / 1000, dt.timezone.utc), "dc-a") for k, v, o, t in recs],
        "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, region string",
    )
    out = decode_venice_frame(df, CLUSTERS, U).orderBy("offset").collect()
    assert len(out) == len(recs)
    assert [r["outcome"] for r in out] == ["row", "row", "row", "quarantined", "quarantined", "skipped"]
    assert [r["reason"] for r in out][3:] == ["UNKNOWN_PROTOCOL_VERSION", "MALFORMED_RECORD", "CONTROL_MESSAGE"]
    assert [r["control_message"] for r in out] == [None] * 5 + ["END_OF_PUSH"]
    for got, want in zip(out[:3], rows_in):
        d = {k: v for k, v in got.asDict().items() if v is not None and k not in ("outcome", "reason", "push_settings")}
        assert d == {k: v for k, v in want.items() if v is not None}
        # A START_OF_PUSH keeps what it declared, for the snapshots that continue the stream; no other row has it.
        declared = '{"chunked": false, "compression": "NO_OP"}' if want["kind"] == "START_OF_PUSH" else None
        assert got["push_settings"] == declared, want
