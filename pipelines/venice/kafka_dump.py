"""Version topics read from Kafka brokers into a snapshot folder of raw Venice records (issue 18 item 5).

``replica-lens dump-kafka`` reads each region's version topics with Spark's Kafka source
(``spark.read.format("kafka")``, a batch read between two offset specifications) and lands
them as Parquet with the Kafka source's columns plus ``region``: exactly the files ingestion
recognizes as raw Venice records (``pipelines/ingest/reading.py``, ``is_venice_schema``) and decodes
with the same decoder (``pipelines/venice/frame.py``). ``replica-lens audit`` then audits the
snapshot like any other.

Why a dump lands a snapshot instead of the audit reading the brokers itself: a snapshot is
immutable (Dagster partitions, re-materialization and lineage rely on reading the same rows
again), while a topic keeps moving and compacts; the landed files are what the audit proves
things about, and they stay there to be re-audited.

Layout: per region, Spark writes into ``<landing>/<snapshot_id>/.dump-<region>/``; its part
files are then moved up as ``<region>.<part file>`` and the temporary folder removed; the
empty ``_SUCCESS`` is written last, after every region, so the landing sensor never sees a
half-written snapshot.

The Kafka source is not part of Spark's distribution: it needs the
``spark-sql-kafka-0-10`` jar of the running Spark version and its dependencies
(``kafka-clients``, ``commons-pool2``, ``spark-token-provider-kafka-0-10``). ``--kafka-jars
DIR`` adds every jar of a folder to ``spark.jars``; on a cluster with network access
``spark.jars.packages`` does the same. Without them the read fails with ``MissingKafkaSource``.
"""
from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from resources.errors import InvalidSetting, UsageError
from resources.filesystem import Location
from resources.snapshots import SUCCESS_MARKER, check_snapshot_id

# The columns of Spark's Kafka source, in its order, plus the region the topics were read from.
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")


class MissingKafkaSource(UsageError):
    """Spark has no Kafka data source: the spark-sql-kafka jars are not on its class path."""


def kafka_package(spark_version: str) -> str:
    """The Maven coordinates of the Kafka source for a Spark version (Scala 2.13, as Spark 4 is built)."""
    return f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark_version}"


@dataclass(frozen=True)
class DumpRequest:
    """What to read: per region its brokers, the version topics, and the offsets to read between."""

    regions: dict[str, str]  # region -> bootstrap servers
    topics: tuple[str, ...]
    starting_offsets: str = "earliest"
    ending_offsets: str = "latest"
    kafka_options: dict[str, str] = field(default_factory=dict)  # passed as kafka.<name>

    def __post_init__(self) -> None:
        if not self.regions:
            raise InvalidSetting("name at least one region and its brokers: --region dc-a=HOST:PORT")
        if not self.topics:
            raise InvalidSetting("name at least one version topic: --topic store_v1")
        for region, servers in self.regions.items():
            if not region or not servers:
                raise InvalidSetting(f"region {region!r}: expected REGION=HOST:PORT[,HOST:PORT...]")


def parse_pairs(items: list[str], what: str) -> dict[str, str]:
    """``["a=1", "b=2"]`` -> ``{"a": "1", "b": "2"}``; a malformed or repeated name is refused."""
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise InvalidSetting(f"{what}: {item!r} is not NAME=VALUE")
        if name in pairs:
            raise InvalidSetting(f"{what}: {name!r} is given twice")
        pairs[name] = value
    return pairs


def reader_options(request: DumpRequest, bootstrap_servers: str) -> dict[str, str]:
    """The Kafka source's options for one region's read (a batch read: no checkpoint, no streaming)."""
    options = {f"kafka.{name}": value for name, value in request.kafka_options.items()}
    options.update(
        {
            "kafka.bootstrap.servers": bootstrap_servers,
            "subscribe": ",".join(request.topics),
            "startingOffsets": request.starting_offsets,
            "endingOffsets": request.ending_offsets,
            # A version topic read mid-retention has lost its head: read what is there.
            "failOnDataLoss": "false",
        }
    )
    return options


def kafka_source_to_snapshot(records: DataFrame, region: str) -> DataFrame:
    """Kafka source rows -> raw Venice records as a snapshot holds them: its columns plus ``region``."""
    missing = [c for c in KAFKA_COLUMNS if c not in records.columns]
    if missing:
        raise InvalidSetting(f"not Kafka source rows: missing columns {missing}")
    return records.select(*KAFKA_COLUMNS, F.lit(region).alias("region"))


def read_region(spark: SparkSession, request: DumpRequest, region: str) -> DataFrame:
    """One region's version topics from its brokers (fails with ``MissingKafkaSource`` without the jars)."""
    reader = spark.read.format("kafka")
    for name, value in reader_options(request, request.regions[region]).items():
        reader = reader.option(name, value)
    try:
        records = reader.load()
    except Exception as exc:  # noqa: BLE001 - py4j/Spark raise several types; the message tells
        if "Failed to find data source: kafka" in str(exc) or "DATA_SOURCE_NOT_FOUND" in str(exc):
            raise MissingKafkaSource(
                "Spark has no Kafka source: give the spark-sql-kafka jars with --kafka-jars DIR "
                f"({kafka_package(spark.version)} and its dependencies kafka-clients, commons-pool2, "
                "spark-token-provider-kafka-0-10), or spark.jars.packages on a machine that reaches Maven"
            ) from None
        raise
    return kafka_source_to_snapshot(records, region)


def land_snapshot(frames: dict[str, DataFrame], landing: str, snapshot_id: str, overwrite: bool = False) -> dict:
    """Write each region's records into ``<landing>/<snapshot_id>/`` and then ``_SUCCESS``; return counts.

    An existing snapshot folder is refused unless ``overwrite`` (then its ``_SUCCESS`` goes
    first, so that no reader takes it for complete while it is replaced)."""
    check_snapshot_id(snapshot_id)
    folder = Location.of(landing).child(snapshot_id)
    if folder.is_dir():
        if not overwrite:
            raise UsageError(f"snapshot {snapshot_id!r} already exists in {landing}; pass --overwrite to replace it")
        if folder.child(SUCCESS_MARKER).is_file():
            folder.fs.delete_file(folder.child(SUCCESS_MARKER).path)
        folder.delete_tree()
    folder.fs.create_dir(folder.path, recursive=True)
    written: dict[str, dict[str, int]] = {}
    for region, frame in frames.items():
        temporary = folder.child(f".dump-{region}")
        frame.write.mode("overwrite").parquet(temporary.uri)
        files = [info for info in temporary.walk_files() if os.path.basename(info.path).startswith("part-")]
        for info in files:
            name = f"{region}.{os.path.basename(info.path)}"
            folder.fs.move(info.path, folder.child(name).path)
        temporary.delete_tree()
        written[region] = {"files": len(files)}
    with folder.fs.open_output_stream(folder.child(SUCCESS_MARKER).path):
        pass
    return {"snapshot_dir": folder.uri, "regions": written}


def kafka_jars(folder: Optional[str]) -> list[str]:
    """Every jar of ``folder`` (sorted); a folder without any is refused."""
    if not folder:
        return []
    jars = sorted(glob.glob(os.path.join(os.path.expanduser(folder), "*.jar")))
    if not jars:
        raise InvalidSetting(f"--kafka-jars: no *.jar in {folder!r}")
    return jars


def dump(
    request: DumpRequest,
    landing: str,
    snapshot_id: str,
    *,
    spark_master: str = "local[*]",
    kafka_jars_dir: Optional[str] = None,
    overwrite: bool = False,
) -> dict:
    """``replica-lens dump-kafka``: read every region's version topics and land them as one snapshot."""
    from resources.session import build_spark_session

    jars = kafka_jars(kafka_jars_dir)
    spark = build_spark_session(master=spark_master, extra={"spark.jars": ",".join(jars)} if jars else None)
    frames = {region: read_region(spark, request, region) for region in request.regions}
    summary = land_snapshot(frames, landing, snapshot_id, overwrite=overwrite)
    counts = spark.read.parquet(summary["snapshot_dir"]).groupBy("region").count().collect()
    for row in counts:
        summary["regions"][row["region"]]["records"] = row["count"]
    return summary
