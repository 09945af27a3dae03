"""``replica-lens dump-kafka`` (issue 18 item 5): version topics read with Spark's Kafka source land as a
snapshot of raw Venice records that ingestion decodes with the same decoder.

The landing step is tested with Kafka source rows built locally (same schema as the source) and the
missing-jar error for real; reads from real brokers are in tests/test_kafka_brokers.py.
"""
from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.ingest import VeniceSettings, judge_rows, read_snapshot_lines
from pipelines.venice.kafka_cut import DumpRequest, PartitionCut, parse_pairs
from pipelines.venice.kafka_dump import kafka_source_to_snapshot, land_snapshot, reader_options
from pipelines.venice.decoder import encode_record
from replica_lens.cli import EXIT_USAGE, main
from resources.errors import InvalidSetting, UsageError
from tests.test_venice_ingest import CLUSTERS, REGIONS, U, spec_rows

# The schema of Spark's Kafka source (DataSourceV2 KafkaRecordToRowConverter, without headers disabled).
KAFKA_SOURCE = T.StructType([
    T.StructField("key", T.BinaryType()), T.StructField("value", T.BinaryType()),
    T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()),
    T.StructField("offset", T.LongType()), T.StructField("timestamp", T.TimestampType()),
    T.StructField("timestampType", T.IntegerType()),
    T.StructField("headers", T.ArrayType(T.StructType([T.StructField("key", T.StringType()),
                                                       T.StructField("value", T.BinaryType())]))),
])


def kafka_rows(spark, replica: str):
    """What the Kafka source gives for one region's version topic holding ``spec_rows(replica)``."""
    rows = []
    for row in spec_rows(replica):
        rec = encode_record(row, region_clusters=REGIONS, clock_uncertainty_ms=U)
        ts = dt.datetime.fromtimestamp(rec.timestamp_ms / 1000, dt.timezone.utc)
        rows.append((rec.key, rec.value, row["topic"], row["partition"], row["offset"], ts, 0, []))
    return spark.createDataFrame(rows, KAFKA_SOURCE)


def test_landed_kafka_source_rows_are_decoded_like_any_raw_venice_snapshot(spark, tmp_path):
    """Catches a landed file ingestion does not recognize as raw Venice records (a column renamed, lost or
    retyped, e.g. the region missing), part files left in a sub-folder ingestion does not read, or
    ``_SUCCESS`` written before the data."""
    landing = tmp_path / "landing"
    frames = {r: kafka_source_to_snapshot(kafka_rows(spark, r), r) for r in ("dc-a", "dc-b")}
    summary = land_snapshot(frames, str(landing), "dumped")
    folder = landing / "dumped"
    names = sorted(p.name for p in folder.iterdir())
    assert "_SUCCESS" in names and not [n for n in names if n.startswith(".dump-")]
    data = [n for n in names if n.endswith(".parquet")]
    assert {n.split(".")[0] for n in data} == {"dc-a", "dc-b"}
    success = (folder / "_SUCCESS").stat().st_mtime_ns
    assert all((folder / n).stat().st_mtime_ns <= success for n in data)
    assert set(summary["regions"]) == {"dc-a", "dc-b"}

    judged = judge_rows(read_snapshot_lines(spark, str(folder), VeniceSettings(CLUSTERS, U)), "dumped")
    got = sorted((r["replica"], r["offset"], r["kind"], r["key"], r["source_region"], r["source_offset"])
                 for r in judged.accepted.collect())
    want = sorted((row["replica"], row["offset"], row["kind"], row.get("key"), row.get("source_region"),
                   row.get("source_offset")) for r in ("dc-a", "dc-b") for row in spec_rows(r))
    assert got == want
    assert judged.quarantined.count() == 0


def test_an_existing_snapshot_or_a_bad_request_is_refused(spark, tmp_path):
    """Catches a dump that silently mixes new records into an existing snapshot, an unsafe snapshot id
    used in a path, and malformed region or option pairs read as something else."""
    frames = {"dc-a": kafka_source_to_snapshot(kafka_rows(spark, "dc-a"), "dc-a")}
    land_snapshot(frames, str(tmp_path), "s1")
    with pytest.raises(UsageError, match="already exists"):
        land_snapshot(frames, str(tmp_path), "s1")
    land_snapshot(frames, str(tmp_path), "s1", overwrite=True)
    assert len([p for p in (tmp_path / "s1").iterdir() if p.suffix == ".parquet"]) >= 1
    with pytest.raises(InvalidSetting, match="refusing snapshot id"):
        land_snapshot(frames, str(tmp_path), "../escape")
    with pytest.raises(InvalidSetting):
        parse_pairs(["dc-a"], "--region")
    with pytest.raises(InvalidSetting, match="twice"):
        parse_pairs(["dc-a=h:1", "dc-a=h:2"], "--region")
    with pytest.raises(InvalidSetting):
        kafka_source_to_snapshot(spark.range(1), "dc-a")
    request = DumpRequest({"dc-a": "h:9092"}, ("store_v1", "store_v2"), kafka_options={"security.protocol": "SSL"})
    cut = [PartitionCut("dc-a", "store_v1", 0, 5, 9, 7, "delete"), PartitionCut("dc-a", "store_v2", 1, 3, 3, 0, "compact")]
    assert reader_options(request, "dc-a", cut) == {
        "kafka.security.protocol": "SSL", "kafka.bootstrap.servers": "h:9092", "kafka.isolation.level": "read_committed",
        "assign": '{"store_v1": [0], "store_v2": [1]}',
        # [5, 7) was removed by retention before the read: the read starts at the log start
        "startingOffsets": '{"store_v1": {"0": 7}, "store_v2": {"1": 3}}',
        "endingOffsets": '{"store_v1": {"0": 9}, "store_v2": {"1": 3}}',
        "includeHeaders": "true", "failOnDataLoss": "false",
    }
    with pytest.raises(InvalidSetting, match="isolation"):
        DumpRequest({"dc-a": "h:9092"}, ("t",), isolation_level="committed")
    with pytest.raises(InvalidSetting, match="--region"):
        DumpRequest({"dc-a": "h:9092"}, ("t",), kafka_options={"bootstrap.servers": "x:1"})


def test_without_the_kafka_jars_the_dump_says_which_package_is_missing(tmp_path):
    """Catches a Java stack trace (or an exit code meaning 'bug') where the operator needs to be told
    which package to provide. A process of its own with REPLICA_LENS_KAFKA_JARS empty: the suite's JVM
    has the jars when scripts/setup-jvm.sh resolved them, and an empty variable must mean none."""
    env = {**os.environ, "REPLICA_LENS_KAFKA_JARS": "", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run(
        [sys.executable, "-m", "replica_lens.cli", "dump-kafka", "--region", "dc-a=127.0.0.1:9", "--topic",
         "store_v1", "--landing", str(tmp_path), "--snapshot-id", "s1", "--spark-master", "local[1]"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "spark-sql-kafka-0-10_2.13:" in done.stderr and "--kafka-jars" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "s1").exists()


def test_a_cut_that_ends_among_a_values_chunks_ends_before_them(spark, tmp_path):
    """``watch`` cuts keep chunked values whole (``land_cut(whole_values=True)``). Catches a cut ending after a
    value's chunks but before its manifest (the value is then lost to both snapshots, MISSING_CHUNKS, and nothing
    is provable after the gap), a trim that also drops whole records, regions read together whose partitions are
    mixed up (one region's trailing chunks trimming another's whole records), and one that would make no progress when a
    single value's chunks fill the whole cut."""
    from pipelines.venice.decoder import is_value_chunk
    from pipelines.venice.kafka_dump import _end_before_chunks, trailing_chunks
    from replica_lens.simulator import SimulationConfig, simulate

    simulate(str(tmp_path), "s", SimulationConfig(seed=3, regions=1, partitions=1, keys=20, writes=80,
                                                  file_format="venice-kafka", compression="zstd-dict",
                                                  chunk_above=64, push_control_messages=True))
    (path,) = (tmp_path / "s").glob("*.kafka.parquet")
    records = spark.read.parquet(str(path))
    rows = sorted(records.collect(), key=lambda r: r["offset"])
    chunks = [r["offset"] for r in rows if is_value_chunk(r["value"])]
    # The first offset where a value's chunks run on: a cut ending two records later splits the value.
    first = next(o for o in chunks if o + 1 in chunks and o - 1 not in chunks)
    inside = records.where(records["offset"] < first + 2)
    (region,) = {r["region"] for r in rows}
    assert trailing_chunks(inside) == {(region, "store_v1", 0): first}
    assert trailing_chunks(records.where(records["offset"] < first)) == {}  # ends on a whole record: untouched
    # The watch reads every region in one job: each region's partitions are judged on their own records only. Another
    # region read past the value's manifest (ending on a whole record after inside's chunks) must not hide them.
    manifest = next(o for o in range(first, len(rows)) if o not in chunks)
    whole = records.where(records["offset"] <= manifest).withColumn("region", F.lit("dc-z"))
    assert trailing_chunks(inside.unionByName(whole)) == {(region, "store_v1", 0): first}
    cut = [PartitionCut(region, "store_v1", 0, 0, first + 2, 0, "delete", broker_end=len(rows))]
    (trimmed,) = _end_before_chunks(cut, {(region, "store_v1", 0): first})
    assert (trimmed.start, trimmed.end, trimmed.broker_end) == (0, first, len(rows))
    lone = [PartitionCut(region, "store_v1", 0, first, first + 2, 0, "delete")]
    assert _end_before_chunks(lone, {(region, "store_v1", 0): first}) == lone  # the value is bigger than the cut
