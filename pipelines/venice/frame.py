"""Spark side of the Venice decoder: ``decode_venice_frame`` runs ``pipelines.venice.decoder.decode_record``
on the executors (mapInArrow). Input: Spark Kafka source columns (key, value, topic, partition,
offset, timestamp) plus ``region`` (the region whose version topic was read -> ``replica``).
Output: the SPEC 1 message columns (schemas.raw.MESSAGE_FIELDS) plus ``outcome``
('row' | 'skipped' | 'quarantined'), ``reason`` and ``control_message`` (a skipped control
message's type name); one output row per input row. replica/topic/partition/offset are the
Kafka record's whatever the outcome.
An unknown upstream cluster id fails the job (UnknownClusterId, naming the ids).

``venice_lines`` is what ingestion uses (pipelines/ingest/reading.py): the decoded records as the
text rows every other format becomes, ``(source_file, raw, read_error, decoded_reason)``. A
decoded row's ``raw`` is its SPEC 1 message as JSON, so it is judged (types, required fields,
conflicting positions, duplicates) exactly like a JSONL line; a record the decoder skipped or
quarantined carries the decoder's reason in ``decoded_reason`` and, as ``raw``, the Kafka
record as JSON (key and value in base64), for the quarantine.

``venice_skipped_positions`` gives the positions of the records skipped by rule (read, though
they hold no row: SPEC 3a), decoding only the control records, the only ones that can be."""
from __future__ import annotations

import json
import pickle
import re
import sys
from typing import Callable, Iterable, Iterator, NamedTuple, Sequence

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

import pipelines.venice.decoder as venice
import pipelines.venice.protocol as venice_protocol
import pipelines.venice.values as venice_values
from pipelines.venice.values import NOT_DECLARED, Limits, PushSettings
from schemas.raw import MESSAGE_FIELDS

# What decoding adds to the SPEC 1 columns. A chunk carries its key (with the chunking suffix) and bytes; a
# manifest (outcome "manifest", only in a chunked version) the keys of its chunks and, pickled, the rest
# ``venice.assemble_manifest`` needs; a quarantined manifest the chunks it misses (``missing``); a START_OF_PUSH
# what it declares (``push_settings``, JSON as one entry of the push settings file), which its row keeps in
# ``extra_fields`` as ``venice_push_settings`` for the snapshots that continue the stream.
_EXTRA = [("outcome", T.StringType(), pa.string()), ("reason", T.StringType(), pa.string()),
          ("control_message", T.StringType(), pa.string()), ("chunk_key", T.BinaryType(), pa.binary()),
          ("chunk_bytes", T.BinaryType(), pa.binary()), ("manifest_keys", T.ArrayType(T.BinaryType()), pa.list_(pa.binary())),
          ("manifest", T.BinaryType(), pa.binary()), ("missing", T.StringType(), pa.string()),
          ("push_settings", T.StringType(), pa.string())]
OUTPUT_SCHEMA = T.StructType(
    [T.StructField(n, t, True) for n, t in MESSAGE_FIELDS.items()] + [T.StructField(n, t, True) for n, t, _ in _EXTRA]
)
_ARROW_SCHEMA = pa.schema(
    [(n, pa.map_(pa.string(), pa.int64()) if n == "hb_vector" else
      {T.StringType: pa.string(), T.IntegerType: pa.int32(), T.LongType: pa.int64()}[type(t)])
     for n, t in MESSAGE_FIELDS.items()] + [(n, a) for n, _, a in _EXTRA]
)


# The quarantine reason of every record of a version topic whose push settings are not known (``resolve_push_settings``).
UNKNOWN_PUSH_SETTINGS = "UNKNOWN_PUSH_SETTINGS"

# Shipped by value: the executors need not have the project installed (as pipelines/leapfrog.py).
cloudpickle.register_pickle_by_value(venice_protocol)
cloudpickle.register_pickle_by_value(venice_values)
cloudpickle.register_pickle_by_value(venice)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


_UNKNOWN_CLUSTER = re.compile(r"upstreamKafkaClusterId -?\d+ is not in the cluster -> region map \(known ids: \[[^\]]*\]\)")


def unknown_cluster_id_in(exc: BaseException) -> str | None:
    """The decoder's UnknownClusterId message inside a failed Spark job's error (it arrives as text), or None."""
    seen = _UNKNOWN_CLUSTER.search(str(exc))
    return seen.group(0) if seen else None


def _timestamp_ms(ts) -> int:
    # Spark's Kafka source gives a TimestampType; Arrow hands it over as datetime (UTC).
    if ts is None:
        return 0
    if isinstance(ts, int):
        return ts
    return int(round(ts.timestamp() * 1000))


def _columns(outcome: dict, record: dict, keep: list[str]) -> dict:
    row = outcome["row"] or {"replica": record["region"], "topic": record["topic"], "partition": record["partition"],
                             "offset": record["offset"]}
    out = {n: row.get(n) for n in MESSAGE_FIELDS}
    out.update(outcome=outcome["outcome"], reason=outcome["reason"], control_message=row.get("control_message"),
               chunk_key=row.get("chunk_key"), chunk_bytes=row.get("chunk_bytes"), missing=outcome.get("missing"),
               manifest_keys=None, manifest=None, push_settings=outcome.get("push_settings"))
    if outcome["outcome"] == "manifest":
        rmd = row["rmd_manifest"]
        out["manifest_keys"] = row["manifest"]["keys"] + (rmd["keys"] if rmd else [])
        out["manifest"] = pickle.dumps(outcome)
    out.update({n: record[n] for n in keep})
    return out


def _batch(rows: list[dict], schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=schema)


# Decoded rows go back to Spark in batches of at most about this many value bytes: a batch of records whose
# values expand (decompressed, or reassembled from chunks) must not be held whole, in the worker or the JVM.
OUTPUT_BATCH_BYTES = 8 * 1024 * 1024


def _bounded_batches(rows: Iterable[dict], schema: pa.Schema, text: Sequence[str] = ()) -> Iterator[pa.RecordBatch]:
    """``rows`` as Arrow batches, each cut once its values, chunks and ``text`` columns pass ``OUTPUT_BATCH_BYTES``."""
    pending, held = [], 0
    sized = ("value", "chunk_bytes", *text)
    for row in rows:
        pending.append(row)
        held += sum(len(row[n] or "") for n in sized)
        if held >= OUTPUT_BATCH_BYTES:
            yield _batch(pending, schema)
            pending, held = [], 0
    if pending:
        yield _batch(pending, schema)


def decode_venice_frame(
    df: DataFrame, cluster_regions: dict[int, str], clock_uncertainty_ms: int, passthrough: tuple[str, ...] = (),
    push_settings: dict[str, PushSettings] | None = None, limits: Limits = Limits(),
    refused_topics: frozenset[str] = frozenset(),
) -> DataFrame:
    """Decode every Kafka record of ``df``; ``passthrough`` names string columns copied to the output as they are.
    ``push_settings``: per version topic, what its START_OF_PUSH declares (``resolve_push_settings``);
    ``limits``: the largest value and chunk count a record may make the decoder hold; ``refused_topics``: topics
    whose settings are not known, whose records are quarantined UNKNOWN_PUSH_SETTINGS without being decoded."""
    keep = list(passthrough)
    refused = frozenset(refused_topics)
    regions = dict(cluster_regions)
    push = dict(push_settings or {})
    u = int(clock_uncertainty_ms)
    arrow_schema = pa.schema(list(_ARROW_SCHEMA) + [(n, pa.string()) for n in keep])

    def decoded(batches):
        for batch in batches:
            for r in batch.to_pylist():
                if r["topic"] in refused:
                    yield _columns({"outcome": "quarantined", "reason": UNKNOWN_PUSH_SETTINGS, "row": None}, r, keep)
                    continue
                got = venice.decode_record(
                    r["key"], r["value"], replica=r["region"], topic=r["topic"], partition=r["partition"],
                    offset=r["offset"], timestamp_ms=_timestamp_ms(r["timestamp"]), cluster_regions=regions,
                    clock_uncertainty_ms=u, push=push.get(r["topic"], NOT_DECLARED), limits=limits,
                )
                if got["row"] is not None and got["row"].get("kind") == "START_OF_PUSH":
                    declared = venice.start_of_push_settings(r["key"], r["value"])
                    got["push_settings"] = None if declared is None else json.dumps(declared.as_entry(), sort_keys=True)
                yield _columns(got, r, keep)

    def run(batches):
        return _bounded_batches(decoded(batches), arrow_schema, keep)

    inp = df.select("key", "value", "topic", F.col("partition").cast("int"), F.col("offset").cast("long"), "timestamp",
                    "region", *[F.col(n).cast("string") for n in keep])
    out_schema = T.StructType(OUTPUT_SCHEMA.fields + [T.StructField(n, T.StringType(), True) for n in keep])
    return inp.mapInArrow(run, out_schema)


def reassemble_chunks(decoded: DataFrame, push_settings: dict[str, PushSettings], limits: Limits = Limits()) -> DataFrame:
    """Decoded records of chunked versions -> the same, each manifest replaced by the logical PUT it stands for
    (at the manifest's position) or quarantined MISSING_CHUNKS; chunks stay as they are (skipped VALUE_CHUNK).

    The chunks a manifest names are found by a join on (replica, topic, partition, chunk key): chunk keys
    hold the producer's GUID, segment and sequence, so they are unique to one write. A chunk written
    twice (a retried produce) is the same bytes under the same key. ``decoded`` is read three times (the
    rest, the manifests, the chunks): a chunked version's records are decoded more than once."""
    push = dict(push_settings)
    where = ["replica", "topic", "partition"]
    manifests = decoded.where(F.col("outcome") == F.lit("manifest"))
    wanted = manifests.select(*where, F.col("offset").alias("_manifest_offset"),
                              F.explode("manifest_keys").alias("chunk_key"))
    chunks = decoded.where(F.col("reason") == F.lit("VALUE_CHUNK")).select(*where, "chunk_key", "chunk_bytes")
    found = (
        wanted.join(chunks, where + ["chunk_key"])
        .groupBy(*where, "_manifest_offset")
        .agg(F.collect_list(F.struct("chunk_key", "chunk_bytes")).alias("_chunks"))
        .withColumnRenamed("_manifest_offset", "offset")
    )
    keep = [f.name for f in decoded.schema.fields if f.name not in OUTPUT_SCHEMA.fieldNames()]
    arrow_schema = pa.schema(list(_ARROW_SCHEMA) + [(n, pa.string()) for n in keep])

    def assembled_rows(batches):
        for batch in batches:
            for r in batch.to_pylist():
                decoded_manifest = pickle.loads(r["manifest"])
                got = venice.assemble_manifest(
                    decoded_manifest, {c["chunk_key"]: c["chunk_bytes"] for c in r["_chunks"] or []},
                    push.get(r["topic"], NOT_DECLARED), limits,
                )
                yield _columns(got, {**r, "region": r["replica"]}, keep)

    def run(batches):
        return _bounded_batches(assembled_rows(batches), arrow_schema, keep)

    assembled = manifests.join(found, where + ["offset"], "left").mapInArrow(run, decoded.schema)
    return decoded.where(F.col("outcome") != F.lit("manifest")).unionByName(assembled)


def push_settings_in(records: DataFrame) -> tuple[dict[str, set[PushSettings]], set[str]]:
    """What the START_OF_PUSH records of ``records`` declare, per version topic, and the topics that hold data
    records (PUT, DELETE, UPDATE). One Spark job: only control records are decoded, on the executors."""
    header = F.substring("key", 1, 1)
    schema = pa.schema([("topic", pa.string()), ("chunked", pa.bool_()), ("compression", pa.int32()),
                        ("dictionary", pa.binary())])

    def run(batches):
        for batch in batches:
            rows = []
            for r in batch.to_pylist():
                settings = venice.start_of_push_settings(r["key"], r["value"])
                if settings is not None:
                    rows.append({"topic": r["topic"], "chunked": settings.chunked, "compression": settings.compression,
                                 "dictionary": settings.dictionary})
            yield _batch(rows, schema)

    control = (records.where(header == F.lit(bytearray([venice.KEY_HEADER_CONTROL])))
               .select("key", "value", "topic").mapInArrow(run, "topic string, chunked boolean, compression int, "
                                                           "dictionary binary")
               .withColumn("data", F.lit(False)))
    data = (records.where(header.isin(bytearray([venice.KEY_HEADER_PUT]), bytearray([venice.KEY_HEADER_UPDATE])))
            .select("topic").distinct()
            .select("topic", *[F.lit(None).cast(t).alias(n) for n, t in
                               (("chunked", "boolean"), ("compression", "int"), ("dictionary", "binary"))],
                    F.lit(True).alias("data")))
    declared: dict[str, set[PushSettings]] = {}
    with_data: set[str] = set()
    for r in control.unionByName(data).distinct().collect():
        if r["data"]:
            with_data.add(r["topic"])
        else:
            declared.setdefault(r["topic"], set()).add(
                PushSettings(r["chunked"], r["compression"], None if r["dictionary"] is None else bytes(r["dictionary"])))
    return declared, with_data


class PushResolution(NamedTuple):
    """Per version topic of a snapshot: its settings and where they come from, the topics refused (with why), and
    where the sources disagree (the one that wins is named)."""

    settings: dict[str, PushSettings]
    refused: dict[str, str]
    sources: dict[str, str]  # topic -> "START_OF_PUSH", "settings file" or "carried from <snapshot ids>"
    disagreements: dict[str, str]  # topic -> what disagrees with what, and which was used


# Earlier snapshots' START_OF_PUSH of the topics asked for: topic -> {settings: [snapshot ids declaring them]}.
CarriedSettings = Callable[[Sequence[str]], dict[str, dict[PushSettings, list[str]]]]


def resolve_push_settings(
    records: DataFrame, configured: dict[str, PushSettings] | None = None, carried: CarriedSettings | None = None,
) -> PushResolution:
    """Per version topic of ``records``: its settings as its START_OF_PUSH records in the snapshot declare them (any
    partition's, any replica's: one version topic has one), else as ``configured`` (the settings file), else as the
    START_OF_PUSH of earlier snapshots of the stream declared them (``carried``: a continuing dump). The topics
    refused, with why: those that hold data but none of the three, those whose START_OF_PUSH records disagree (in the
    snapshot, or among the earlier snapshots when they are the source). A refused topic is not decoded: its records
    are quarantined UNKNOWN_PUSH_SETTINGS, bytes kept (``decode_venice_frame``), and every other topic is audited as
    usual. Where the snapshot, the file and the earlier snapshots disagree, the first of them wins and the
    disagreement is reported."""
    configured = dict(configured or {})
    declared, with_data = push_settings_in(records)
    topics = sorted(set(with_data) | set(declared))
    earlier = carried(topics) if carried is not None and topics else {}
    settings: dict[str, PushSettings] = {}
    refused: dict[str, str] = {}
    sources: dict[str, str] = {}
    disagreements: dict[str, str] = {}

    def described(found: dict[PushSettings, list[str]]) -> str:
        return "; ".join(f"{x.describe()} (snapshot {', '.join(sorted(ids))})" for x, ids in sorted(
            found.items(), key=lambda item: item[0].describe()))

    for t in topics:
        own = declared.get(t, set())
        if len(own) > 1:
            refused[t] = "its START_OF_PUSH records declare different settings: " + ", ".join(sorted(x.describe() for x in own))
            continue
        before = earlier.get(t, {})
        if own:
            settings[t], sources[t] = next(iter(own)), "START_OF_PUSH"
        elif t in configured:
            settings[t], sources[t] = configured[t], "settings file"
        elif len(before) == 1:
            (found, ids), = before.items()
            settings[t], sources[t] = found, f"carried from {', '.join(sorted(ids))}"
            continue
        elif before:
            refused[t] = ("it holds no START_OF_PUSH in the snapshot, no push settings file names it, and earlier "
                          f"snapshots' START_OF_PUSH records declare different settings: {described(before)}")
            continue
        elif t in with_data:
            refused[t] = "it holds data records but no START_OF_PUSH in the snapshot, and no push settings file names it"
            continue
        else:
            continue
        others = []
        if sources[t] == "START_OF_PUSH" and t in configured and configured[t] != settings[t]:
            others.append(f"the settings file says {configured[t].describe()}")
        differing = {x: ids for x, ids in before.items() if x != settings[t]}
        if differing:
            others.append(f"earlier snapshots' START_OF_PUSH declared {described(differing)}")
        if others:
            disagreements[t] = f"used {settings[t].describe()} ({sources[t]}); " + "; ".join(others)
    return PushResolution(settings, refused, sources, disagreements)


def cluster_ids_in(records: DataFrame) -> list[int]:
    """Every upstream cluster id the records' leader footers name, sorted (one Spark job; decoding on the
    executors). For the error of an audit whose cluster map misses some: it names them all."""

    def run(batches):
        for batch in batches:
            ids = {venice.upstream_cluster_id(v) for v in batch.column("value").to_pylist()}
            ids.discard(None)
            yield pa.RecordBatch.from_pydict({"cluster_id": sorted(ids)}, schema=pa.schema([("cluster_id", pa.int32())]))

    found = records.select("value").mapInArrow(run, "cluster_id int").distinct().collect()
    return sorted(r["cluster_id"] for r in found)


def unknown_cluster_ids_message(seen: list[int], known: dict[int, str]) -> str:
    """The error of a snapshot whose upstream cluster ids are not all in the cluster -> region map."""
    unknown = [i for i in seen if i not in known]
    return (
        f"upstreamKafkaClusterIds {unknown} are not in the cluster -> region map (known ids: {sorted(known)}; "
        f"ids in the snapshot: {seen})"
    )


# What ``decoded_reason`` says, for a quarantined record's ``detail``.
REASON_DETAIL = {
    "MALFORMED_RECORD": "not a Venice record: bad magic byte, unparseable, short or trailing bytes, "
    "a key header that does not match the message type, a key without the chunking suffix in a chunked version, "
    "or replication metadata or a chunk manifest that does not parse",
    "UNKNOWN_PROTOCOL_VERSION": "KafkaMessageEnvelope protocol version not supported (supported: 10 to 14)",
    "UPDATE_NOT_APPLIED": "a partial update (UPDATE): its result is not known from the record alone",
    "CHUNKED_VALUE": "a chunk or chunk manifest (negative schema id) in a version whose START_OF_PUSH does not "
    "declare chunking, or a system schema id Replica Lens does not know",
    "COMPRESSED_VALUE": "the version declares a compression strategy Replica Lens does not know",
    "UNDECOMPRESSABLE_VALUE": "the value does not decompress with the version's compression strategy (and dictionary)",
    "MISSING_CHUNKS": "a chunked value's manifest whose chunks are not all in the dump (raw.missing names them)",
    UNKNOWN_PUSH_SETTINGS: "the version topic's compression and chunking are not known (no START_OF_PUSH in the "
    "snapshot and none named by --venice-push-settings, or START_OF_PUSH records that disagree): its records are "
    "kept, not decoded; audit the snapshot again with the settings",
    "VALUE_TOO_LARGE": "the value, decompressed or reassembled from its chunks, is larger than the limit "
    "(REPLICA_LENS_MAX_VALUE_BYTES, default 16 MiB, at most about 96 MiB), or its manifest names more "
    "chunks than REPLICA_LENS_MAX_CHUNKS (default 10000): decoding stopped there",
    "NO_UPSTREAM_POSITION": "no leader metadata footer or no upstream offset: no source position",
}


def venice_lines(
    records: DataFrame, cluster_regions: dict[int, str], clock_uncertainty_ms: int,
    push_settings: dict[str, PushSettings] | None = None, limits: Limits = Limits(),
    refused_topics: frozenset[str] = frozenset(),
) -> DataFrame:
    """Kafka records (with ``source_file``) -> ``(source_file, raw, read_error, decoded_reason)``, one row each.
    ``push_settings`` (``resolve_push_settings``): per version topic, its compression and chunking; when one is
    chunked, chunks are reassembled under their manifests (``reassemble_chunks``). ``limits``: the largest value
    and chunk count one record may make the decoder hold."""
    push = dict(push_settings or {})
    with_text = records.select(
        "*",
        F.to_json(
            F.struct(
                F.col("region").alias("replica"), "topic", "partition", "offset",
                F.col("timestamp").cast("string").alias("timestamp"),
                F.base64("key").alias("key_base64"), F.base64("value").alias("value_base64"),
            )
        ).alias("record_json"),
    )
    decoded = decode_venice_frame(with_text, cluster_regions, clock_uncertainty_ms,
                                  passthrough=("source_file", "record_json"), push_settings=push, limits=limits,
                                  refused_topics=refused_topics)
    if any(p.chunked for p in push.values()):
        decoded = reassemble_chunks(decoded, push, limits)
    fields = F.to_json(F.struct(*[F.col(n) for n in MESSAGE_FIELDS]), {"ignoreNullFields": "true"})
    decoded = decoded.withColumn("_fields", fields)
    # A START_OF_PUSH keeps what it declares, as an extra field of its row (``extra_fields``).
    message = F.when(F.col("push_settings").isNull(), F.col("_fields")).otherwise(
        F.concat(F.expr("substring(_fields, 1, length(_fields) - 1)"), F.lit(',"venice_push_settings":'),
                 F.col("push_settings"), F.lit("}")))
    is_row = F.col("outcome") == F.lit("row")
    # A manifest quarantined for missing chunks: the Kafka record, and which chunks the dump lacks.
    with_missing = F.concat(F.expr("substring(record_json, 1, length(record_json) - 1)"), F.lit(","),
                            F.expr("substring(to_json(named_struct('missing', missing)), 2)"))
    return decoded.select(
        "source_file",
        F.when(is_row, message).when(F.col("missing").isNotNull(), with_missing).otherwise(F.col("record_json")).alias("raw"),
        F.lit(None).cast(T.StringType()).alias("read_error"),
        F.when(is_row, F.lit(None).cast(T.StringType())).otherwise(F.col("reason")).alias("decoded_reason"),
    )


def venice_skipped_positions(
    records: DataFrame, cluster_regions: dict[int, str], clock_uncertainty_ms: int,
    push_settings: dict[str, PushSettings] | None = None, refused_topics: frozenset[str] = frozenset(),
) -> DataFrame:
    """Kafka records (with ``source_file``) -> those the decoder skips by rule, as positions:
    ``(source_file, replica, topic, partition, offset, reason, control_message)``.

    Only three shapes can be skipped: control records (key header byte CONTROL_MESSAGE;
    ``decode_record`` quarantines any other record whose envelope is a control message), chunks
    and chunk-cleanup DELETEs, whose keys end with a chunk's ChunkedKeySuffix, i.e. the byte 01
    (a whole value's key in a chunked version ends with 02 00). So only records with such key
    bytes are decoded (few of a version topic's records), on the key's first and last bytes,
    which Spark reads from the Parquet files without Python.
    """
    first, last = F.substring("key", 1, 1), F.substring("key", -1, 1)
    maybe = (first == F.lit(bytearray([venice.KEY_HEADER_CONTROL]))) | (
        (first == F.lit(bytearray([venice.KEY_HEADER_PUT]))) & (last == F.lit(bytearray([1])))
    )
    decoded = decode_venice_frame(records.where(maybe), cluster_regions, clock_uncertainty_ms,
                                  passthrough=("source_file",), push_settings=push_settings,
                                  refused_topics=refused_topics)  # a refused topic's records are all quarantined
    return decoded.where(F.col("outcome") == F.lit("skipped")).select(
        "source_file", "replica", "topic", "partition", "offset", "reason", "control_message"
    )
