"""The essential pass: the least a program must do to read a snapshot, order each stream and write it down.

``python -m replica_lens.benchmark essential`` (``__main__.py``) runs :func:`essential_pass` as
its own process through ``_essential_main``; the benchmark times that process from start to
exit (``processes.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

ESSENTIAL_MARKER = "ESSENTIAL_PASS "  # the line the essential pass prints its own timings on


def raw_message_schema():
    """The SPEC 1 message fields as a Spark schema (schemas/raw.py MESSAGE_FIELDS)."""
    from pyspark.sql import types as T

    from schemas.raw import MESSAGE_FIELDS

    return T.StructType([T.StructField(name, t) for name, t in MESSAGE_FIELDS.items()])


def _json_files(folder: str) -> list[str]:
    return sorted(str(p) for p in Path(folder).iterdir() if p.name.endswith((".jsonl", ".jsonl.gz")))


def essential_pass(snapshot: str, out: str, spark_conf: dict[str, str], schema_json: str) -> dict[str, Any]:
    """Read the snapshot, add one window per stream, write every row once as Parquet.

    Runs in its own process (``python -m replica_lens.benchmark essential``), which the
    benchmark times from start to exit. The session's settings (``spark_config`` of
    resources/session.py) and the schema (MESSAGE_FIELDS) are handed over as JSON by the
    benchmark so that this process imports PySpark only: importing schemas/raw.py loads
    pandera, and the project's packages load Dagster (seconds of imports), which are the
    audit's costs, not the essential work's.
    """
    from pyspark.sql import SparkSession, Window
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    started = time.perf_counter()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # as build_spark_session does
    builder = SparkSession.builder
    for key, value in spark_conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    session_ready = time.perf_counter()

    rows = spark.read.schema(T.StructType.fromJson(json.loads(schema_json))).json(_json_files(snapshot))
    stream = Window.partitionBy("replica", "topic", "partition", "source_region").orderBy("offset")
    rows.withColumn("running_source_offset", F.max("source_offset").over(stream)).write.mode("errorifexists").parquet(out)
    done = time.perf_counter()
    return {"session_seconds": round(session_ready - started, 2), "pass_seconds": round(done - session_ready, 2)}


def _essential_main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m replica_lens.benchmark essential",
        description="The essential pass (read with the SPEC 1 schema, one window per stream, write Parquet), "
        "as the benchmark times it. Prints its own timings on a line starting with " + ESSENTIAL_MARKER.strip() + ".",
    )
    parser.add_argument("--snapshot", required=True, help="snapshot folder holding *.jsonl / *.jsonl.gz files")
    parser.add_argument("--out", required=True, help="folder to write the Parquet files into (must not exist)")
    parser.add_argument(
        "--spark-conf", help="the session's settings as a JSON object (default: resources/session.py spark_config())"
    )
    parser.add_argument(
        "--schema", help="the read schema as Spark JSON (default: from schemas/raw.py MESSAGE_FIELDS, imported at a cost)"
    )
    args = parser.parse_args(argv)
    if args.spark_conf is None:
        from resources.session import spark_config

        args.spark_conf = json.dumps(spark_config())
    if args.schema is None:
        args.schema = raw_message_schema().json()
    timings = essential_pass(args.snapshot, args.out, json.loads(args.spark_conf), args.schema)
    print(ESSENTIAL_MARKER + json.dumps(timings), flush=True)
    return 0
