"""``replica-lens dump-kafka`` (issue 18 item 5): version topics read with Spark's Kafka source land as a
snapshot of raw Venice records that ingestion decodes with the same decoder.

No Kafka broker and no spark-sql-kafka jars exist on the development machine: the landing step is tested
with Kafka source rows built locally (same schema as the source), the missing-jar error for real, and the
read from a broker only where ``REPLICA_LENS_KAFKA_JARS`` and ``REPLICA_LENS_KAFKA_BOOTSTRAP`` are set.
"""
from __future__ import annotations

import datetime as dt
import os

import pytest
from pyspark.sql import types as T

from pipelines.ingest import VeniceSettings, judge_rows, read_snapshot_lines
from pipelines.venice.kafka_dump import DumpRequest, kafka_source_to_snapshot, land_snapshot, parse_pairs, reader_options
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
    assert reader_options(request, "h:9092") == {
        "kafka.security.protocol": "SSL", "kafka.bootstrap.servers": "h:9092", "subscribe": "store_v1,store_v2",
        "startingOffsets": "earliest", "endingOffsets": "latest", "failOnDataLoss": "false",
    }


@pytest.mark.skipif(bool(os.environ.get("REPLICA_LENS_KAFKA_JARS")), reason="the spark-sql-kafka jars are present")
def test_without_the_kafka_jars_the_dump_says_which_package_is_missing(spark, tmp_path, capsys):
    """Catches a Java stack trace (or an exit code meaning 'bug') where the operator needs to be told
    which package to provide."""
    code = main(["dump-kafka", "--region", "dc-a=127.0.0.1:9", "--topic", "store_v1", "--landing", str(tmp_path),
                 "--snapshot-id", "s1"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert "spark-sql-kafka-0-10_2.13:" + spark.version in err and "--kafka-jars" in err
    assert "Traceback" not in err and not (tmp_path / "s1").exists()


@pytest.mark.skipif(
    not (os.environ.get("REPLICA_LENS_KAFKA_JARS") and os.environ.get("REPLICA_LENS_KAFKA_BOOTSTRAP")),
    reason="needs the spark-sql-kafka jars (REPLICA_LENS_KAFKA_JARS) and a Kafka broker "
    "(REPLICA_LENS_KAFKA_BOOTSTRAP) holding version topic REPLICA_LENS_KAFKA_TOPIC; neither exists here",
)
def test_a_dump_from_a_broker_is_audited_with_the_same_decoder(tmp_path):
    """Catches a broker read whose rows ingestion cannot decode (run where a broker and the jars exist)."""
    bootstrap = os.environ["REPLICA_LENS_KAFKA_BOOTSTRAP"]
    topic = os.environ.get("REPLICA_LENS_KAFKA_TOPIC", "store_v1")
    assert main(["dump-kafka", "--region", f"dc-a={bootstrap}", "--topic", topic, "--landing", str(tmp_path),
                 "--snapshot-id", "broker"]) == 0
    assert (tmp_path / "broker" / "_SUCCESS").exists()
