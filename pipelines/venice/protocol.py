"""Venice's KafkaMessageEnvelope wire schemas (protocol versions 10 to 14), written here.

A Venice version-topic value is the magic byte 23, one protocol-version byte, then an Avro
binary KafkaMessageEnvelope of that version. Avro binary data carries no field names or
tags: a reader decodes it only with the writer's exact structure (record and field order,
types, union branch order, fixed sizes). This module states that structure for every
version Replica Lens reads (all those Venice has published since 10), as plain Python dicts that ``fastavro.parse_schema`` accepts.

It is written in this project from Venice's published protocol: names, order and types are
the protocol's, so the bytes match; the comments are ours and only say what a field is for
where it matters to Replica Lens. Defaults are given where the protocol declares them (Avro
uses them when a reader's schema has a field that a writer's lacks; the encoder in
``pipelines.venice.decoder`` fills unset fields from them).

What differs between the versions (each adds to the one before):

- v10: ProducerMetadata carries an ``upstreamOffset`` of its own (later moved to the leader
  footer), the envelope has ``targetVersion``, LeaderMetadata is (hostName, upstreamOffset,
  upstreamKafkaClusterId).
- v11: no ``targetVersion`` nor producer ``upstreamOffset``; the control-message union gains
  VersionSwap (old/new serving version topic, localHighWatermarks, isRepush,
  isLastVersionSwapMessageFromRealTimeTopic).
- v12: LeaderMetadata adds upstreamPubSubPosition (bytes) and termId (the leader's epoch);
  VersionSwap adds localHighWatermarkPubSubPositions.
- v13: VersionSwap adds sourceRegion, destinationRegion, generationId.
- v14 (current): LeaderMetadata adds upstreamMessageTimestamp.

``tests/test_venice_decoder.py`` pins every schema by its Avro fingerprint and decodes
envelopes spelled out byte by byte, so a wrong order or type here fails a test.
"""
from __future__ import annotations

NAMESPACE = "com.linkedin.venice.kafka.protocol"
SUPPORTED_VERSIONS = (10, 11, 12, 13, 14)

def _field(name: str, typ, *default) -> dict:
    """A record field; ``default`` (at most one) only where the protocol declares one."""
    f = {"name": name, "type": typ}
    if default:
        (f["default"],) = default
    return f


def _record(name: str, *fields: dict) -> dict:
    return {"name": name, "type": "record", "fields": list(fields)}


def _array(items) -> dict:
    return {"type": "array", "items": items}


def _producer_metadata(version: int) -> dict:
    # Who wrote the record and where it sits in that producer's segment (Venice's data
    # integrity validation). logicalTimestamp is the write time a client may set; -1 = unset.
    fields = [
        _field("producerGUID", {"name": "GUID", "type": "fixed", "size": 16}),
        _field("segmentNumber", "int"),
        _field("messageSequenceNumber", "int"),
        _field("messageTimestamp", "long"),  # producer's clock, ms since the epoch
    ]
    if version == 10:
        fields.append(_field("upstreamOffset", "long", -1))  # superseded by the leader footer
    fields.append(_field("logicalTimestamp", "long", -1))
    return _record("ProducerMetadata", *fields)


def _put() -> dict:
    # putValue is the value serialized with value schema schemaId; negative ids mark chunks.
    return _record(
        "Put",
        _field("putValue", "bytes"),
        _field("schemaId", "int"),
        _field("replicationMetadataVersionId", "int", -1),
        _field("replicationMetadataPayload", "bytes", ""),
    )


def _update() -> dict:
    # A partial update (write compute); Replica Lens does not apply these.
    return _record(
        "Update",
        _field("schemaId", "int"),
        _field("updateSchemaId", "int"),
        _field("updateValue", "bytes"),
    )


def _delete() -> dict:
    return _record(
        "Delete",
        _field("schemaId", "int", -1),
        _field("replicationMetadataVersionId", "int", -1),
        _field("replicationMetadataPayload", "bytes", ""),
    )


def _control_bodies(version: int) -> list[dict]:
    # Branch order of controlMessageUnion; controlMessageType says which one is meant.
    bodies = [
        _record(
            "StartOfPush",  # type 0: a version topic starts here
            _field("sorted", "boolean", False),
            _field("chunked", "boolean", False),
            _field("compressionStrategy", "int", 0),  # per version, not per record
            _field("compressionDictionary", ["null", "bytes"], None),
            _field("timestampPolicy", "int", 0),
        ),
        _record("EndOfPush"),
        _record(
            "StartOfSegment",  # type 2; a heartbeat when under the fixed heartbeat key
            _field("checksumType", "int"),
            _field("upcomingAggregates", _array("string")),
        ),
        _record(
            "EndOfSegment",
            _field("checksumValue", "bytes"),
            _field("computedAggregates", _array("long")),
            _field("finalSegment", "boolean"),
        ),
        _record(
            "StartOfBufferReplay",
            _field("sourceOffsets", _array("long")),
            _field("sourceKafkaCluster", "string"),
            _field("sourceTopicName", "string"),
        ),
        _record("StartOfIncrementalPush", _field("version", "string")),
        _record("EndOfIncrementalPush", _field("version", "string")),
        _record(
            "TopicSwitch",
            _field("sourceKafkaServers", _array("string")),
            _field("sourceTopicName", "string"),
            _field("rewindStartTimestamp", "long"),
        ),
    ]
    if version >= 11:
        swap = [
            _field("oldServingVersionTopic", "string"),
            _field("newServingVersionTopic", "string"),
            _field("localHighWatermarks", ["null", _array("long")], None),
        ]
        if version >= 12:
            swap.append(_field("localHighWatermarkPubSubPositions", _array("bytes"), []))
        swap += [
            _field("isRepush", "boolean", False),
            _field("isLastVersionSwapMessageFromRealTimeTopic", "boolean", False),
        ]
        if version >= 13:
            swap += [
                _field("sourceRegion", "string", ""),
                _field("destinationRegion", "string", ""),
                _field("generationId", "long", -1),
            ]
        bodies.append(_record("VersionSwap", *swap))
    return bodies


def _control_message(version: int) -> dict:
    return _record(
        "ControlMessage",
        _field("controlMessageType", "int"),
        _field("debugInfo", {"type": "map", "values": "string"}),
        _field("controlMessageUnion", _control_bodies(version)),
    )


def _leader_metadata(version: int) -> dict:
    # Written by the leader replica: which real-time topic position (cluster id, offset) the
    # record was replicated from. This is Replica Lens's source_region / source_offset.
    fields = [
        _field("hostName", "string"),
        _field("upstreamOffset", "long", -1),
        _field("upstreamKafkaClusterId", "int", -1),
    ]
    if version >= 12:
        fields += [
            _field("upstreamPubSubPosition", "bytes", ""),
            _field("termId", "long", -1),  # leader epoch
        ]
    if version >= 14:
        fields.append(_field("upstreamMessageTimestamp", "long", -1))
    return _record("LeaderMetadata", *fields)


def envelope_schema_dict(version: int) -> dict:
    """The KafkaMessageEnvelope of protocol ``version`` (10 to 14), a fresh dict each call."""
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"protocol version {version} is not supported (supported: {SUPPORTED_VERSIONS})")
    fields = [
        _field("messageType", "int"),  # 0 PUT, 1 DELETE, 2 CONTROL_MESSAGE, 3 UPDATE
        _field("producerMetadata", _producer_metadata(version)),
    ]
    if version == 10:
        fields.append(_field("targetVersion", "int", -1))
    fields += [
        # Branch order matters: Avro writes the branch index.
        _field("payloadUnion", [_put(), _update(), _delete(), _control_message(version)]),
        _field("leaderMetadataFooter", ["null", _leader_metadata(version)], None),
    ]
    return {"name": "KafkaMessageEnvelope", "namespace": NAMESPACE, "type": "record", "fields": fields}
