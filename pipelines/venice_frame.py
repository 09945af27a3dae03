"""Spark side of the Venice decoder: ``decode_venice_frame`` runs ``pipelines.venice.decode_record``
on the executors (mapInArrow). Input: Spark Kafka source columns (key, value, topic, partition,
offset, timestamp) plus ``region`` (the region whose version topic was read -> ``replica``).
Output: the SPEC 1 message columns (schemas.raw.MESSAGE_FIELDS) plus ``outcome``
('row' | 'skipped' | 'quarantined') and ``reason``; one output row per input row.
An unknown upstream cluster id fails the job (UnknownClusterId, naming the ids)."""
from __future__ import annotations

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
    + [T.StructField("outcome", T.StringType(), False), T.StructField("reason", T.StringType(), True)]
)

# Shipped by value: the executors need not have the project installed (as pipelines/leapfrog.py).
cloudpickle.register_pickle_by_value(venice_protocol)
cloudpickle.register_pickle_by_value(venice)
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _timestamp_ms(ts) -> int:
    # Spark's Kafka source gives a TimestampType; Arrow hands it over as datetime (UTC).
    if ts is None:
        return 0
    if isinstance(ts, int):
        return ts
    return int(round(ts.timestamp() * 1000))


def decode_venice_frame(df: DataFrame, cluster_regions: dict[int, str], clock_uncertainty_ms: int) -> DataFrame:
    regions = dict(cluster_regions)
    u = int(clock_uncertainty_ms)
    names = list(MESSAGE_FIELDS)
    arrow_schema = pa.schema(
        [(n, pa.map_(pa.string(), pa.int64()) if n == "hb_vector" else
          {T.StringType: pa.string(), T.IntegerType: pa.int32(), T.LongType: pa.int64()}[type(MESSAGE_FIELDS[n])])
         for n in names] + [("outcome", pa.string()), ("reason", pa.string())]
    )

    def run(batches):
        for batch in batches:
            cols = {n: [] for n in names + ["outcome", "reason"]}
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
            yield pa.RecordBatch.from_pydict(cols, schema=arrow_schema)

    inp = df.select("key", "value", "topic", F.col("partition").cast("int"), F.col("offset").cast("long"), "timestamp", "region")
    return inp.mapInArrow(run, OUTPUT_SCHEMA)
