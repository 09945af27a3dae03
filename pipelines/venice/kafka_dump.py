"""Version topics read from Kafka brokers into a snapshot folder of raw Venice records (issue 18 item 5, the
cut of issue 68 and SPEC 11).

``replica-lens dump-kafka`` first takes the *cut* (``pipelines/venice/kafka_cut.py``): for every partition of the named topics in every region,
Kafka's admin client (in Spark's JVM, with the consumer settings of the read) reports the log start offset,
the end offset (the last stable offset under ``read_committed``, the default) and the topic's
``cleanup.policy`` (``take_cut``), before any record is read. Each partition is then read over exactly
``[s, e)`` with Spark's Kafka source (a batch read: ``assign`` with ``startingOffsets``/``endingOffsets`` per
partition, ``reader_options``): ``e`` the end offset, never inferred from the last record; ``s`` the log start,
or with ``--continue-from`` the previous snapshot's ``e`` (``previous_ends``). The records land as Parquet with
the Kafka source's columns plus ``region``: exactly the files ingestion recognizes as raw Venice records
(``pipelines/ingest/reading.py``, ``is_venice_schema``) and decodes with the same decoder
(``pipelines/venice/frame.py``). ``_cut.json`` (``cut_document``: the cut, the records each partition
delivered and the offsets that delivered none) is written before ``_SUCCESS``; the audit turns it into the
``broker_cuts`` table (``cut_rows``, ``assets/ingest.py``). ``replica-lens audit`` then audits the snapshot like
any other.

Why a dump lands a snapshot instead of the audit reading the brokers itself: a snapshot is
immutable (Dagster partitions, re-materialization and lineage rely on reading the same rows
again), while a topic keeps moving and compacts; the landed files are what the audit proves
things about, and they stay there to be re-audited.

Layout: per region, Spark writes into ``<landing>/<snapshot_id>/.dump-<region>/``; its part
files are then moved up as ``<region>.<part file>`` and the temporary folder removed; ``_cut.json``
and then the empty ``_SUCCESS`` are written last, after every region, so the landing sensor never sees a
half-written snapshot; any failure after the cut removes the folder (``land_snapshot``). A region whose
brokers do not answer the cut stops the dump before anything is written (``BrokerUnavailable``).

Consumer settings (``kafka_options``: SASL, SSL) reach the admin client and the Kafka source and nothing else:
not ``_cut.json``, not a table, not the output; ``DumpRequest.redact`` takes their values out of error messages.

The Kafka source is not part of Spark's distribution: it needs the
``spark-sql-kafka-0-10`` jar of the running Spark version and its dependencies
(``kafka-clients``, ``commons-pool2``, ``spark-token-provider-kafka-0-10``). ``--kafka-jars
DIR`` adds every jar of a folder to ``spark.jars`` (default: ``jvm/lib/kafka-source`` when
``scripts/setup-jvm.sh`` resolved it, ``default_kafka_jars``); on a cluster with network access
``spark.jars.packages`` does the same. Without them the read fails with ``MissingKafkaSource``.
"""
from __future__ import annotations

import datetime as dt
import functools
import glob
import json
import os
from typing import Optional

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.venice.kafka_cut import CUT_FILE, DumpRequest, PartitionCut, cut_document, previous_ends, take_cut
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


def reader_options(request: DumpRequest, region: str, cut: list[PartitionCut]) -> dict[str, str]:
    """The Kafka source's options for one region's batch read of exactly its cut: per partition from ``s`` (or
    the log start, when retention removed ``[s, log start)``) up to ``e``."""
    assign: dict[str, list[int]] = {}
    starting: dict[str, dict[str, int]] = {}
    ending: dict[str, dict[str, int]] = {}
    for p in cut:
        assign.setdefault(p.topic, []).append(p.partition)
        starting.setdefault(p.topic, {})[str(p.partition)] = p.read_from()
        ending.setdefault(p.topic, {})[str(p.partition)] = p.end
    options = {f"kafka.{name}": value for name, value in request.options_for(region).items()}
    options.update(
        {
            "kafka.bootstrap.servers": request.regions[region],
            "kafka.isolation.level": request.isolation_level,
            "assign": json.dumps(assign, sort_keys=True),
            "startingOffsets": json.dumps(starting, sort_keys=True),
            "endingOffsets": json.dumps(ending, sort_keys=True),
            "includeHeaders": "true",
            # Offsets of [s, e) the broker no longer holds (retention between the cut and the read, compaction)
            # are gaps, not errors: what was delivered is counted against the cut.
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


def read_region(spark: SparkSession, request: DumpRequest, region: str, cut: list[PartitionCut]) -> DataFrame:
    """One region's version topics from its brokers, exactly its cut (fails with ``MissingKafkaSource`` without
    the jars)."""
    reader = spark.read.format("kafka")
    for name, value in reader_options(request, region, [p for p in cut if p.skipped is None]).items():
        reader = reader.option(name, value)
    try:
        records = reader.load()
    except Exception as exc:  # noqa: BLE001 - py4j/Spark raise several types; the message tells
        if _no_kafka_source(exc):
            raise _missing_source(spark) from None
        raise
    return kafka_source_to_snapshot(records, region)


def _no_kafka_source(exc: Exception) -> bool:
    text = str(exc)
    return ("Failed to find data source: kafka" in text or "DATA_SOURCE_NOT_FOUND" in text
            or "org.apache.kafka.clients.admin" in text and "ClassNotFound" in text)


def _missing_source(spark: SparkSession) -> MissingKafkaSource:
    return MissingKafkaSource(
        "Spark has no Kafka source: give the spark-sql-kafka jars with --kafka-jars DIR "
        f"({kafka_package(spark.version)} and its dependencies kafka-clients, commons-pool2, "
        "spark-token-provider-kafka-0-10), or spark.jars.packages on a machine that reaches Maven"
    )


def _has_kafka_client(spark: SparkSession) -> bool:
    jvm = spark._jvm  # noqa: SLF001
    try:  # spark.jars are on the context class loader, not on py4j's own
        loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName("org.apache.kafka.clients.admin.Admin", False, loader)
    except Exception:  # noqa: BLE001 - any JVM error means the jars are not there
        return False
    return True


def _prepare(folder: Location, overwrite: bool, landing: str, snapshot_id: str) -> None:
    if folder.is_dir():
        if not overwrite:
            raise UsageError(f"snapshot {snapshot_id!r} already exists in {landing}; pass --overwrite to replace it")
        if folder.child(SUCCESS_MARKER).is_file():
            folder.fs.delete_file(folder.child(SUCCESS_MARKER).path)
        folder.delete_tree()
    folder.fs.create_dir(folder.path, recursive=True)


def _write_region(folder: Location, region: str, frame: DataFrame) -> int:
    """Spark writes the region's records into ``.dump-<region>/``; its part files move up as ``<region>.<part>``."""
    temporary = folder.child(f".dump-{region}")
    frame.write.mode("overwrite").parquet(temporary.uri)
    files = [info for info in temporary.walk_files() if os.path.basename(info.path).startswith("part-")]
    for info in files:
        folder.fs.move(info.path, folder.child(f"{region}.{os.path.basename(info.path)}").path)
    temporary.delete_tree()
    return len(files)


def land_snapshot(frames: dict[str, DataFrame], landing: str, snapshot_id: str, overwrite: bool = False,
                  before_success=None) -> dict:
    """Write each region's records into ``<landing>/<snapshot_id>/`` and then ``_SUCCESS``; return counts.

    An existing snapshot folder is refused unless ``overwrite`` (then its ``_SUCCESS`` goes
    first, so that no reader takes it for complete while it is replaced). ``before_success(folder)`` runs
    after the data is written and before ``_SUCCESS`` (the cut's file). Any failure removes the folder: no
    half-written snapshot is left behind."""
    check_snapshot_id(snapshot_id)
    folder = Location.of(landing).child(snapshot_id)
    _prepare(folder, overwrite, landing, snapshot_id)
    try:
        written = {region: {"files": _write_region(folder, region, frame)} for region, frame in frames.items()}
        if before_success is not None:
            before_success(folder)
        with folder.fs.open_output_stream(folder.child(SUCCESS_MARKER).path):
            pass
    except BaseException:
        folder.delete_tree()
        raise
    return {"snapshot_dir": folder.uri, "regions": written}


def kafka_jars(folder: Optional[str]) -> list[str]:
    """Every jar of ``folder`` (sorted); a folder without any is refused."""
    if not folder:
        return []
    jars = sorted(glob.glob(os.path.join(os.path.expanduser(folder), "*.jar")))
    if not jars:
        raise InvalidSetting(f"--kafka-jars: no *.jar in {folder!r}")
    return jars


def default_kafka_jars() -> Optional[str]:
    """``$REPLICA_LENS_KAFKA_JARS`` when set (empty: none), else the project's ``jvm/lib/kafka-source`` if present."""
    if "REPLICA_LENS_KAFKA_JARS" in os.environ:
        return os.environ["REPLICA_LENS_KAFKA_JARS"] or None
    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                          "jvm", "lib", "kafka-source")
    return folder if glob.glob(os.path.join(folder, "*.jar")) else None


# Spark shows a data source's options in plans and its UI unless their names match these (Spark's default
# covers secret|password|token|access key; a JAAS configuration or a key store passes under other names).
REDACTION_REGEX = r"(?i)secret|password|token|access[.]?key|jaas|sasl|ssl|credential"


def kafka_spark_config(kafka_jars_dir: Optional[str] = None) -> dict[str, str]:
    """Spark settings of a session that reads brokers: the Kafka source's jars (``kafka_jars_dir``, else
    ``default_kafka_jars``; none when neither has them) and the redaction of consumer settings."""
    jars = kafka_jars(kafka_jars_dir or default_kafka_jars())
    config = {"spark.redaction.regex": REDACTION_REGEX, "spark.sql.redaction.options.regex": REDACTION_REGEX}
    if jars:
        config["spark.jars"] = ",".join(jars)
    return config


def kafka_session(spark_master: str = "local[*]", kafka_jars_dir: Optional[str] = None,
                  **settings) -> SparkSession:
    """This process's Spark session with ``kafka_spark_config``; ``settings`` are ``build_spark_session``'s (an
    audit in the same process reuses the session)."""
    from resources.session import build_spark_session

    spark = build_spark_session(master=spark_master, extra=kafka_spark_config(kafka_jars_dir), **settings)
    if not _has_kafka_client(spark):
        raise _missing_source(spark)
    return spark


def trailing_chunks(frame: DataFrame) -> dict[tuple[str, str, int], int]:
    """Per (region, topic, partition) of a read (of one region or several) whose last records are chunks of a value
    (its manifest not yet written, or past the cut): the offset of the first of those chunks. Only the records after
    each partition's last control message are decoded (heartbeats come every few records), in Spark."""
    from pipelines.venice.decoder import KEY_HEADER_CONTROL, is_value_chunk

    rp = ["region", "topic", "partition"]
    control = F.substring(F.col("key"), 1, 1) == F.lit(bytes([KEY_HEADER_CONTROL]))
    last_control = frame.where(control).groupBy(*rp).agg(F.max("offset").alias("last_control"))
    chunk = F.udf(lambda value: is_value_chunk(value), "boolean")
    tail = (frame.join(last_control, on=rp, how="left")
            .where(F.col("offset") > F.coalesce(F.col("last_control"), F.lit(-1)))
            .select(*rp, "offset", chunk(F.col("value")).alias("chunk"))
            .collect())
    starts: dict[tuple[str, str, int], int] = {}
    by_partition: dict[tuple[str, str, int], list] = {}
    for row in tail:
        by_partition.setdefault((row["region"], row["topic"], int(row["partition"])), []).append(row)
    for key, rows in by_partition.items():
        rows.sort(key=lambda r: r["offset"])
        first = None
        for row in reversed(rows):
            if not row["chunk"]:
                break
            first = int(row["offset"])
        if first is not None:
            starts[key] = first
    return starts


def _end_before_chunks(cut: list[PartitionCut], starts: dict[tuple[str, str, int], int]) -> list[PartitionCut]:
    """The cut with ``e`` moved back to the first trailing chunk of each partition, unless the chunks start where
    the read starts (a value larger than the cut: moving ``e`` there would read nothing, forever)."""
    out = []
    for p in cut:
        first = starts.get((p.region, p.topic, p.partition))
        if first is not None and p.skipped is None and p.read_from() < first < p.end:
            p = PartitionCut(**{**p.__dict__, "end": first})
        out.append(p)
    return out


def land_cut(spark: SparkSession, request: DumpRequest, cuts: dict[str, list[PartitionCut]], landing: str,
             snapshot_id: str, taken_at: dt.datetime, *, continues: Optional[str] = None,
             skipped: Optional[dict[str, dict]] = None, extra: Optional[dict] = None,
             overwrite: bool = False, whole_values: bool = False) -> dict:
    """Read exactly ``cuts`` (region -> its partitions; those marked ``skipped`` are not read) and land them as one
    snapshot, with ``_cut.json`` (the cut and what each partition delivered) written before ``_SUCCESS``; return
    ``land_snapshot``'s counts with the cut's document (``cut``) and the records per region.

    ``whole_values``: a partition whose read ends among the chunks of a value (Venice writes a large value as
    chunks, then its manifest) ends its cut before them (``trailing_chunks``): the next cut reads the value whole.
    A chain of cuts that split values would lose each split value (MISSING_CHUNKS, a gap of one position: and
    after a gap, nothing is provable until the next heartbeat vector)."""
    frames = {region: read_region(spark, request, region, cut) for region, cut in cuts.items()
              if any(p.skipped is None for p in cut)}
    if whole_values and frames:
        # Each region's records are read from its brokers once and kept by Spark (in memory, spilling to its local
        # disk: the cut, as big as the files landed from it): the trailing chunks and the writes read that copy, not
        # the brokers again (docs/performance.md, "Reading from Kafka brokers"). All regions' chunks in one job.
        frames = {region: frame.localCheckpoint(eager=True) for region, frame in frames.items()}
        starts = trailing_chunks(functools.reduce(DataFrame.unionByName, frames.values()))
        for region, frame in list(frames.items()):
            cuts[region] = _end_before_chunks(cuts[region], starts)
            ends = {(p.topic, p.partition): p.end for p in cuts[region]}
            bound = F.lit(None).cast("long")
            for (topic, partition), end in ends.items():
                bound = F.when((F.col("topic") == topic) & (F.col("partition") == partition), F.lit(end)).otherwise(bound)
            frames[region] = frame.where(F.col("offset") < bound)
    summary: dict = {}

    def record_cut(target: Location) -> None:
        # What each partition delivered, counted from the landed files (what the audit will read).
        files = _data_files(target)
        stats = {
            (r["region"], r["topic"], r["partition"]): r
            for r in spark.read.parquet(*[f.uri for f in files])
            .groupBy("region", "topic", "partition")
            .agg(F.count(F.lit(1)).alias("n"), F.min("offset").alias("lo"), F.max("offset").alias("hi"))
            .collect()
        } if files else {}
        delivered = []
        for cut in cuts.values():
            for p in cut:
                row = stats.pop((p.region, p.topic, p.partition), None)
                n = int(row["n"]) if row else 0
                if row and (p.skipped is not None or row["lo"] < p.read_from() or row["hi"] >= p.end):
                    raise RuntimeError(f"{p.region} {p.topic}[{p.partition}]: read offsets {row['lo']}..{row['hi']} "
                                       f"outside the cut [{p.read_from()}, {p.end})")
                delivered.append(PartitionCut(**{**p.__dict__, "delivered": n}))
        if stats:
            raise RuntimeError(f"records of partitions outside the cut: {sorted(stats)}")
        document = cut_document(delivered, request, taken_at, snapshot_id, continues, skipped, extra)
        target.child(CUT_FILE).write_text(json.dumps(document, indent=1) + "\n")
        summary["cut"] = document

    landed = land_snapshot(frames, landing, snapshot_id, overwrite=overwrite, before_success=record_cut)
    landed["cut"] = summary["cut"]
    landed["records"] = {region: sum(p["delivered"] for p in summary["cut"]["partitions"] if p["region"] == region)
                         for region in cuts}
    for region in landed["regions"]:
        landed["regions"][region]["records"] = landed["records"][region]
    return landed


def dump(
    request: DumpRequest,
    landing: str,
    snapshot_id: str,
    *,
    spark_master: str = "local[*]",
    kafka_jars_dir: Optional[str] = None,
    overwrite: bool = False,
    spark: Optional[SparkSession] = None,
) -> dict:
    """``replica-lens dump-kafka``: take the cut of every region first, then read exactly it and land it as one
    snapshot (``land_cut``). A region that does not answer stops the dump before anything is written."""
    check_snapshot_id(snapshot_id)
    previous = previous_ends(landing, request.continue_from)
    folder = Location.of(landing).child(snapshot_id)
    if folder.is_dir() and not overwrite:
        raise UsageError(f"snapshot {snapshot_id!r} already exists in {landing}; pass --overwrite to replace it")
    if spark is None:
        spark = kafka_session(spark_master, kafka_jars_dir)
    elif not _has_kafka_client(spark):
        raise _missing_source(spark)
    taken_at = dt.datetime.now(dt.timezone.utc)
    cuts = {region: take_cut(spark, request, region, previous) for region in request.regions}
    return land_cut(spark, request, cuts, landing, snapshot_id, taken_at, continues=request.continue_from,
                    overwrite=overwrite)


def _data_files(folder: Location) -> list:
    return [Location.of(e.uri) for e in folder.list() if e.is_file and e.name.endswith(".parquet")]
