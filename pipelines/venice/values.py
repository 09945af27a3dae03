"""How a Venice store version writes its values: compression, chunking and the push settings that say which.

Pure functions, used by the decoder (``pipelines.venice.decoder``) on the executors and by the encoder
(tests, simulator). Facts from linkedin/venice at 77ea837f (``internal/venice-common`` and
``internal/venice-client-common``):

- Push settings. Every partition's START_OF_PUSH declares ``chunked``, ``compressionStrategy``
  (``CompressionStrategy.java``: 0 NO_OP, 1 GZIP, 2 ZSTD (deprecated), 3 ZSTD_WITH_DICT) and
  ``compressionDictionary``. They hold for the whole version topic.
- Compression. Only a PUT's value is compressed (deletes, control messages, chunk manifests and
  replication metadata are not). GZIP is one standard gzip member (``GzipCompressor``); ZSTD and
  ZSTD_WITH_DICT are standard zstd frames, the latter made with the START_OF_PUSH dictionary
  (``ZstdWithDictCompressor``). A value is compressed first, then chunked.
- Chunking (``WriterChunkingHelper``, ``VeniceWriter.putLargeValue``, ``ChunkedKeySuffix.avsc``,
  ``ChunkedValueManifest.avsc``). In a chunked version every data key is the user key followed by
  an Avro ``ChunkedKeySuffix`` {chunkId: union[ChunkId, null], isChunk: boolean}: a whole value
  (or manifest) ends with ``02 00`` (branch 1 = null, false); a chunk ends with ``00``, the
  ChunkId (producer GUID, segment, sequence of the first chunk, chunk index) and ``01``. A large
  value is written as chunk PUTs (schema id -10, the bytes in ``putValue``, or in the
  replication-metadata payload for RMD chunks, whose indexes continue after the value's) then its
  manifest: a PUT with schema id -20 whose value is a raw Avro ``ChunkedValueManifest``
  {keysWithChunkIdSuffix, schemaId (the real value schema), size}. With RMD chunking on, the
  manifest's replication-metadata payload is itself such a manifest, of the RMD chunks. Replacing
  or deleting a chunked value is followed by DELETEs with schema id -10 of the old chunk keys.
"""
from __future__ import annotations

import base64
import gzip
import io
import zlib
from typing import NamedTuple

import fastavro

from resources.errors import InvalidSetting

# CompressionStrategy.java
NO_OP, GZIP, ZSTD, ZSTD_WITH_DICT = 0, 1, 2, 3
COMPRESSION_NAMES = {NO_OP: "NO_OP", GZIP: "GZIP", ZSTD: "ZSTD", ZSTD_WITH_DICT: "ZSTD_WITH_DICT"}
CHUNK_SCHEMA_ID = -10  # AvroProtocolDefinition.CHUNK
MANIFEST_SCHEMA_ID = -20  # AvroProtocolDefinition.CHUNKED_VALUE_MANIFEST
NON_CHUNK_SUFFIX = b"\x02\x00"  # ChunkedKeySuffix{chunkId: null, isChunk: false}

_MANIFEST_SCHEMA = fastavro.parse_schema({
    "name": "ChunkedValueManifest", "namespace": "com.linkedin.venice.storage.protocol", "type": "record",
    "fields": [
        {"name": "keysWithChunkIdSuffix", "type": {"type": "array", "items": "bytes"}},
        {"name": "schemaId", "type": "int"},
        {"name": "size", "type": "int"},
    ],
})
_CHUNK_ID_SCHEMA = fastavro.parse_schema({
    "name": "ChunkId", "namespace": "com.linkedin.venice.storage.protocol", "type": "record",
    "fields": [
        {"name": "producerGUID", "type": {"name": "GUID", "type": "fixed", "size": 16}},
        {"name": "segmentNumber", "type": "int"},
        {"name": "messageSequenceNumber", "type": "int"},
        {"name": "chunkIndex", "type": "int"},
    ],
})


class PushSettings(NamedTuple):
    """What a version topic's START_OF_PUSH declares about its values."""

    chunked: bool = False
    compression: int = NO_OP
    dictionary: bytes | None = None

    def describe(self) -> str:
        name = COMPRESSION_NAMES.get(self.compression, f"strategy {self.compression}")
        return f"{name}{', chunked' if self.chunked else ''}"

    def as_entry(self) -> dict:
        """These settings as one topic's entry of the push settings file (``pipelines/venice/push_settings.py``)."""
        entry: dict = {"compression": COMPRESSION_NAMES.get(self.compression, str(self.compression)),
                       "chunked": self.chunked}
        if self.dictionary:
            entry["dictionary_base64"] = base64.b64encode(self.dictionary).decode("ascii")
        return entry


NOT_DECLARED = PushSettings()


# Limits on what one record may make the decoder hold (docs/venice-input.md, "Limits"), each a setting of the
# landing resource. Venice servers refuse records above ``default.max.record.size.bytes``, 100 MiB unless set
# otherwise (ConfigConstants.DEFAULT_MAX_RECORD_SIZE_BYTES_BACKFILL): no store with the defaults holds a larger
# value. Values are chunked into messages of at most 950 KiB of payload
# (VeniceWriter.DEFAULT_MAX_SIZE_FOR_USER_PAYLOAD_PER_MESSAGE_IN_BYTES): 100 MiB is 108 chunks, so a manifest
# listing ten thousand is no manifest Venice wrote, and each listed key is a row of the chunk join.
VENICE_MAX_RECORD_BYTES = 100 * 1024 * 1024
# Every decoded record is judged as one JSON object (pipelines/ingest/judging.py) whose fields pass through a Spark
# Variant, which holds at most 128 MiB (VariantUtil.SIZE_LIMIT); the value is base64 text there (4 characters per
# 3 bytes) beside the record's other fields. So the largest value a record carries whole is about 96 MiB: the
# limit is never set above it.
VARIANT_SIZE_LIMIT = 128 * 1024 * 1024
RECORD_FIELDS_ROOM = 64 * 1024  # the record's other fields, with room to spare
MAX_SUPPORTED_VALUE_BYTES = (VARIANT_SIZE_LIMIT - RECORD_FIELDS_ROOM) // 4 * 3
# A value is held as a row several times over on its way (the record's JSON, its parse, its Variant, the
# exchange by position, each row buffer doubled as it grows): measured, the default 3 GiB driver heap carries a
# 40 MiB value through the judging and runs out of memory at 48 MiB (docs/venice-input.md, "Limits"). The
# default stays well inside what the default heap carries; raise it with the heap (spark resource
# driver_memory), about 64 bytes of heap per byte of the largest value.
DEFAULT_MAX_VALUE_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_CHUNKS = 10_000
_READ_PIECE = 1024 * 1024  # decompressed bytes taken at a time: a value is held at most this much past the limit


class Limits(NamedTuple):
    """The largest value (decompressed and reassembled) and the most chunks one manifest may name."""

    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES
    max_chunks: int = DEFAULT_MAX_CHUNKS

    @classmethod
    def checked(cls, **settings: int) -> "Limits":
        """The limits ``settings`` set (the others default); ``InvalidSetting`` for a value limit no record can
        carry whole (above ``MAX_SUPPORTED_VALUE_BYTES``)."""
        limits = cls(**settings)
        if limits.max_value_bytes > MAX_SUPPORTED_VALUE_BYTES:
            raise InvalidSetting(
                f"the largest value (max_value_bytes, REPLICA_LENS_MAX_VALUE_BYTES) is at most "
                f"{MAX_SUPPORTED_VALUE_BYTES} bytes, got {limits.max_value_bytes}: a decoded record is judged as JSON "
                "through a Spark Variant, which holds 128 MiB, and the value is base64 there (docs/venice-input.md)"
            )
        return limits


class CorruptValue(ValueError):
    """A value that does not decompress with its version's strategy (or dictionary)."""


class ValueTooLarge(ValueError):
    """A value (or the one a manifest announces) larger than ``Limits.max_value_bytes``; nothing past it was held."""


class UnsupportedCompression(ValueError):
    """A compression strategy Replica Lens does not know."""


def decompress(settings: PushSettings, data: bytes, limit: int = DEFAULT_MAX_VALUE_BYTES) -> bytes:
    """A PUT's value bytes as the writer serialized them, before compression.

    Streamed in pieces and stopped past ``limit`` bytes (``ValueTooLarge``): a few kilobytes that
    expand to gigabytes (a decompression bomb, or a frame header that lies) cost at most ``limit``
    plus one piece of memory, never what they claim.
    """
    strategy = settings.compression
    if strategy == NO_OP:
        return _within(data, limit)
    if strategy == GZIP:
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as member:
                return _bounded_read(member, limit)
        except (OSError, EOFError, ValueError, zlib.error) as exc:  # a corrupt deflate stream raises zlib.error
            if isinstance(exc, ValueTooLarge):
                raise
            raise CorruptValue(f"not a gzip member: {exc}") from exc
    if strategy in (ZSTD, ZSTD_WITH_DICT):
        import zstandard

        if strategy == ZSTD_WITH_DICT and not settings.dictionary:
            raise CorruptValue("ZSTD_WITH_DICT declared without a dictionary")
        dctx = _zstd_decompressor(settings.dictionary if strategy == ZSTD_WITH_DICT else None)
        try:
            # A stream reader does not trust the frame's content size; one frame, as Venice writes.
            return _bounded_read(dctx.stream_reader(io.BytesIO(data)), limit)
        except zstandard.ZstdError as exc:
            raise CorruptValue(f"not a zstd frame of this dictionary: {exc}") from exc
    raise UnsupportedCompression(f"compression strategy {strategy}")


def _within(data: bytes, limit: int) -> bytes:
    if len(data) > limit:
        raise ValueTooLarge(f"the value is {len(data)} bytes, above the limit of {limit}")
    return data


def _bounded_read(stream, limit: int) -> bytes:
    """Everything ``stream`` yields, read a piece at a time; ``ValueTooLarge`` once past ``limit`` bytes."""
    pieces, held = [], 0
    while True:
        piece = stream.read(min(_READ_PIECE, limit + 1 - held))
        if not piece:
            return b"".join(pieces)
        pieces.append(piece)
        held += len(piece)
        if held > limit:
            raise ValueTooLarge(f"the value decompresses past the limit of {limit} bytes")


class _PerProcess(dict):
    """A cache that starts empty in every process: Spark ships this module to the executors by value
    (pipelines/venice/frame.py), and a decompressor, a C object, cannot be pickled with it."""

    def __reduce__(self):
        return (_PerProcess, ())


_ZSTD: dict[bytes | None, object] = _PerProcess()  # dictionary -> its decompressor, made once per process


def _zstd_decompressor(dictionary: bytes | None):
    import zstandard

    if dictionary not in _ZSTD:
        zdict = zstandard.ZstdCompressionDict(dictionary) if dictionary else None
        _ZSTD[dictionary] = zstandard.ZstdDecompressor(dict_data=zdict)
    return _ZSTD[dictionary]


def compress(settings: PushSettings, data: bytes) -> bytes:
    """The inverse of ``decompress`` (deterministic: gzip with mtime 0), for the encoder."""
    if settings.compression == NO_OP:
        return data
    if settings.compression == GZIP:
        return gzip.compress(data, mtime=0)
    import zstandard

    zdict = zstandard.ZstdCompressionDict(settings.dictionary) if settings.compression == ZSTD_WITH_DICT else None
    return zstandard.ZstdCompressor(dict_data=zdict, write_content_size=True).compress(data)


def chunk_suffix(guid: bytes, segment: int, sequence: int, index: int) -> bytes:
    """The ChunkedKeySuffix of a chunk: branch 0, the ChunkId, isChunk true."""
    out = io.BytesIO()
    fastavro.schemaless_writer(out, _CHUNK_ID_SCHEMA, {"producerGUID": guid, "segmentNumber": segment,
                                                       "messageSequenceNumber": sequence, "chunkIndex": index})
    return b"\x00" + out.getvalue() + b"\x01"


def is_chunk_key(key: bytes, user_key: bytes) -> bool:
    """Whether ``key`` is ``user_key`` followed by a chunk's ChunkedKeySuffix (exactly)."""
    if not key.startswith(user_key) or len(key) < len(user_key) + 18:
        return False
    rest = key[len(user_key):]
    if rest[0] != 0 or rest[-1] != 1:
        return False
    buf = io.BytesIO(rest[1:-1])
    try:
        fastavro.schemaless_reader(buf, _CHUNK_ID_SCHEMA, None)
    except Exception:
        return False
    return buf.tell() == len(rest) - 2


def encode_manifest(keys: list[bytes], schema_id: int, size: int) -> bytes:
    out = io.BytesIO()
    fastavro.schemaless_writer(out, _MANIFEST_SCHEMA, {"keysWithChunkIdSuffix": keys, "schemaId": schema_id, "size": size})
    return out.getvalue()


def decode_manifest(data: bytes) -> dict:
    """A raw Avro ChunkedValueManifest -> {keys, schema_id, size}; ValueError when it is not exactly one."""
    buf = io.BytesIO(data)
    try:
        m = fastavro.schemaless_reader(buf, _MANIFEST_SCHEMA, None)
    except Exception as exc:
        raise ValueError(f"not a ChunkedValueManifest: {exc}") from exc
    if buf.tell() != len(data) or m["size"] < 0:
        raise ValueError("not a ChunkedValueManifest: trailing bytes or a negative size")
    return {"keys": [bytes(k) for k in m["keysWithChunkIdSuffix"]], "schema_id": m["schemaId"], "size": m["size"]}


def rmd_manifest(data: bytes, user_key: bytes) -> dict | None:
    """The RMD manifest a chunked value's manifest carries as replication metadata when RMD chunking is
    on, or None when the payload is the RMD itself. A payload is taken for a manifest only when it
    parses exactly as one whose keys (at least one) are all chunk keys of ``user_key``: a value-level
    RMD (``00``, a timestamp, an offset vector) never is."""
    if not data:
        return None
    try:
        m = decode_manifest(data)
    except ValueError:
        return None
    if not m["keys"] or not all(is_chunk_key(k, user_key) for k in m["keys"]):
        return None
    return m


def check_manifest(manifest: dict, limits: Limits) -> None:
    """``ValueTooLarge`` when a manifest announces a value above the limit or names more chunks than allowed:
    checked before any chunk is looked for, so that neither the chunk join nor the reassembly holds it."""
    if len(manifest["keys"]) > limits.max_chunks:
        raise ValueTooLarge(f"the manifest names {len(manifest['keys'])} chunks, above the limit of {limits.max_chunks}")
    if manifest["size"] > limits.max_value_bytes:
        raise ValueTooLarge(f"the manifest announces {manifest['size']} bytes, above the limit of {limits.max_value_bytes}")


def assemble(manifest: dict, chunks: dict[bytes, bytes]) -> tuple[bytes | None, list[int]]:
    """The bytes a manifest names, from ``chunks`` (chunk key -> bytes): (bytes, []) or (None, the
    indexes within the manifest of the chunks that are missing). A size that does not add up is a
    missing chunk too (of index -1), found before the bytes are joined (the manifest's size was
    checked against the limit by ``check_manifest``)."""
    missing = [i for i, k in enumerate(manifest["keys"]) if k not in chunks]
    if missing:
        return None, missing
    if sum(len(chunks[k]) for k in manifest["keys"]) != manifest["size"]:
        return None, [-1]
    return b"".join(chunks[k] for k in manifest["keys"]), []
