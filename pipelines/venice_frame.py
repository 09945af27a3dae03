"""Spark side of the Venice decoder: ``decode_venice_frame`` runs ``pipelines.venice.decode_record``
on the executors (mapInArrow). Input: Spark Kafka source columns (key, value, topic, partition,
offset, timestamp) plus ``region`` (the region whose version topic was read -> ``replica``).
Output: the SPEC 1 message columns (schemas.raw.MESSAGE_FIELDS) plus ``outcome``
('row' | 'skipped' | 'quarantined'), ``reason`` and ``control_message`` (a skipped control
message's type name); one output row per input row. replica/topic/partition/offset are the
Kafka record's whatever the outcome.
An unknown upstream cluster id fails the job (UnknownClusterId, naming the ids).

``venice_lines`` is what ingestion uses (pipelines/ingest.py): the decoded records as the
text rows every other format becomes, ``(source_file, raw, read_error, decoded_reason)``. A
decoded row's ``raw`` is its SPEC 1 message as JSON, so it is judged (types, required fields,
conflicting positions, duplicates) exactly like a JSONL line; a record the decoder skipped or
quarantined carries the decoder's reason in ``decoded_reason`` and, as ``raw``, the Kafka
record as JSON (key and value in base64), for the quarantine.

``venice_skipped_positions`` gives the positions of the records skipped by rule (read, though
they hold no row: SPEC 3a), decoding only the control records, the only ones that can be."""
from __future__ import annotations

import re
import sys

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

import pipelines.venice as venice
import pipelines.venice_protocol as venice_protocol
from schemas.raw import MESSAGE_FIELDS

OUTPUT_SCHEMA = T.StructType(
    [T.StructField(n, t, True) for n, t in MESSAGE_FIELDS.items()]
    + [T.StructField("outcome", T.StringType(), False), T.StructField("reason", T.StringType(), True),
       T.StructField("control_message", T.StringType(), True)]
)

# Shipped by value: the executors need not have the project installed (as pipelines/leapfrog.py).
cloudpickle.register_pickle_by_value(venice_protocol)
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


def decode_venice_frame(
    df: DataFrame, cluster_regions: dict[int, str], clock_uncertainty_ms: int, passthrough: tuple[str, ...] = ()
) -> DataFrame:
    """Decode every Kafka record of ``df``; ``passthrough`` names string columns copied to the output as they are."""
    keep = list(passthrough)
    regions = dict(cluster_regions)
    u = int(clock_uncertainty_ms)
    names = list(MESSAGE_FIELDS)
    arrow_schema = pa.schema(
        [(n, pa.map_(pa.string(), pa.int64()) if n == "hb_vector" else
          {T.StringType: pa.string(), T.IntegerType: pa.int32(), T.LongType: pa.int64()}[type(MESSAGE_FIELDS[n])])
         for n in names] + [("outcome", pa.string()), ("reason", pa.string()), ("control_message", pa.string())]
        + [(n, pa.string()) for n in keep]
    )

    def run(batches):
        for batch in batches:
            cols = {n: [] for n in names + ["outcome", "reason", "control_message"] + keep}
            for r in batch.to_pylist():
                got = venice.decode_record(
                    r["key"], r["value"], replica=r["region"], topic=r["topic"], partition=r["partition"],
                    offset=r["offset"], timestamp_ms=_timestamp_ms(r["timestamp"]), cluster_regions=regions,
                    clock_uncertainty_ms=u,
                )
                row = got["row"] or {"replica": r["region"], "topic": r["topic"], "partition": r["partition"],
                                     "offset": r["offset"]}
                for n in names:
                    cols[n].append(row.get(n))
                cols["outcome"].append(got["outcome"])
                cols["reason"].append(got["reason"])
                cols["control_message"].append(row.get("control_message"))
                for n in keep:
                    cols[n].append(r[n])
            yield pa.RecordBatch.from_pydict(cols, schema=arrow_schema)

    inp = df.select("key", "value", "topic", F.col("partition").cast("int"), F.col("offset").cast("long"), "timestamp",
                    "region", *[F.col(n).cast("string") for n in keep])
    out_schema = T.StructType(OUTPUT_SCHEMA.fields + [T.StructField(n, T.StringType(), True) for n in keep])
    return inp.mapInArrow(run, out_schema)


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
    "or a key header that does not match the message type",
    "UNKNOWN_PROTOCOL_VERSION": "KafkaMessageEnvelope protocol version not supported (supported: 10, 14)",
    "UPDATE_NOT_APPLIED": "a partial update (UPDATE): its result is not known from the record alone",
    "CHUNKED_VALUE": "a chunk or chunk manifest (negative schema id): chunked values are not reassembled",
    "COMPRESSED_VALUE": "the store version is compressed: values are not decompressed",
    "NO_UPSTREAM_POSITION": "no leader metadata footer or no upstream offset: no source position",
}


def venice_lines(
    records: DataFrame, cluster_regions: dict[int, str], clock_uncertainty_ms: int
) -> DataFrame:
    """Kafka records (with ``source_file``) -> ``(source_file, raw, read_error, decoded_reason)``, one row each."""
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
                                  passthrough=("source_file", "record_json"))
    message = F.to_json(F.struct(*[F.col(n) for n in MESSAGE_FIELDS]), {"ignoreNullFields": "true"})
    is_row = F.col("outcome") == F.lit("row")
    return decoded.select(
        "source_file",
        F.when(is_row, message).otherwise(F.col("record_json")).alias("raw"),
        F.lit(None).cast(T.StringType()).alias("read_error"),
        F.when(is_row, F.lit(None).cast(T.StringType())).otherwise(F.col("reason")).alias("decoded_reason"),
    )


def venice_skipped_positions(
    records: DataFrame, cluster_regions: dict[int, str], clock_uncertainty_ms: int
) -> DataFrame:
    """Kafka records (with ``source_file``) -> those the decoder skips by rule, as positions:
    ``(source_file, replica, topic, partition, offset, reason, control_message)``.

    Only a control record (key header byte CONTROL_MESSAGE) can be skipped: ``decode_record``
    quarantines any other record whose envelope is a control message. So only those are decoded
    (START_OF_PUSH, heartbeats and the skipped ones: a few of a version topic's records), on the
    key's first byte, which Spark reads from the Parquet files without Python.
    """
    control = records.where(F.substring("key", 1, 1) == F.lit(bytearray([venice.KEY_HEADER_CONTROL])))
    decoded = decode_venice_frame(control, cluster_regions, clock_uncertainty_ms, passthrough=("source_file",))
    return decoded.where(F.col("outcome") == F.lit("skipped")).select(
        "source_file", "replica", "topic", "partition", "offset", "reason", "control_message"
    )
