"""Version topics read from Kafka brokers into a snapshot folder of raw Venice records (issue 18 item 5, the
cut of issue 68 and SPEC 11).

``replica-lens dump-kafka`` first takes the *cut*: for every partition of the named topics in every region,
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
import re
from contextlib import contextmanager
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


ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
CUT_FILE = "_cut.json"
# Consumer settings that never reach a file, a table, a log line or an error message as they are:
# every value given with --kafka-option or --kafka-options-file is treated as one (``redact``).
REDACTED = "<redacted>"


class BrokerUnavailable(RuntimeError):
    """A region's brokers did not answer the cut (or a partition has no leader): nothing was written."""


@dataclass(frozen=True)
class DumpRequest:
    """What to read: per region its brokers, the version topics, the isolation level, consumer settings, and
    optionally the previous snapshot of the chain (its cut's ``e`` is this cut's ``s``)."""

    regions: dict[str, str]  # region -> bootstrap servers
    topics: tuple[str, ...]
    isolation_level: str = "read_committed"
    kafka_options: dict[str, str] = field(default_factory=dict)  # passed as kafka.<name>
    continue_from: Optional[str] = None  # snapshot id in the same landing folder
    timeout_s: float = 30.0
    # Per region, consumer settings that add to (and override) ``kafka_options`` for that region's brokers.
    region_options: dict[str, dict[str, str]] = field(default_factory=dict)
    # At most this many offsets per partition in one cut (None: up to the end offset); a backlog is then read
    # as several cuts in order (``replica-lens watch``).
    max_offsets: Optional[int] = None
    # Per region, how long its brokers have to answer (seconds), instead of ``timeout_s``.
    region_timeouts: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.regions:
            raise InvalidSetting("name at least one region and its brokers: --region dc-a=HOST:PORT")
        if not self.topics:
            raise InvalidSetting("name at least one version topic: --topic store_v1")
        for region, servers in self.regions.items():
            if not region or not servers:
                raise InvalidSetting(f"region {region!r}: expected REGION=HOST:PORT[,HOST:PORT...]")
        if self.isolation_level not in ISOLATION_LEVELS:
            raise InvalidSetting(f"--isolation-level: {self.isolation_level!r} is not one of {ISOLATION_LEVELS}")
        for name in [*self.kafka_options, *(n for options in self.region_options.values() for n in options)]:
            if name in RESERVED_OPTIONS:
                raise InvalidSetting(f"--kafka-option {name}: set by the dump itself ({RESERVED_OPTIONS[name]})")
        if self.max_offsets is not None and self.max_offsets < 1:
            raise InvalidSetting(f"the bound per cut must be at least 1 offset per partition; got {self.max_offsets}")

    def timeout_for(self, region: str) -> float:
        return self.region_timeouts.get(region, self.timeout_s)

    def options_for(self, region: str) -> dict[str, str]:
        """The consumer settings of one region's clients: the common ones, then the region's own."""
        return {**self.kafka_options, **self.region_options.get(region, {})}

    def redact(self, text: str) -> str:
        """``text`` with every consumer setting's value replaced (error messages may quote a setting)."""
        values = [*self.kafka_options.values(), *(v for options in self.region_options.values() for v in options.values())]
        for value in sorted(values, key=len, reverse=True):
            if len(value) >= 3:
                text = text.replace(value, REDACTED)
        return text


RESERVED_OPTIONS = {
    "bootstrap.servers": "--region",
    "isolation.level": "--isolation-level",
    "group.id": "the Kafka source",
    "enable.auto.commit": "the Kafka source",
    "auto.offset.reset": "the cut",
}


def parse_pairs(items: list[str], what: str) -> dict[str, str]:
    """``["a=1", "b=2"]`` -> ``{"a": "1", "b": "2"}``; a malformed or repeated name is refused."""
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not sep or not name or not value:
            raise InvalidSetting(f"{what}: {name or item!r} is not NAME=VALUE")
        if name in pairs:
            raise InvalidSetting(f"{what}: {name!r} is given twice")
        pairs[name] = value
    return pairs


def options_file(path: Optional[str]) -> dict[str, str]:
    """Consumer settings from a properties file (``name=value`` lines; ``#`` comments, blank lines skipped):
    where secrets belong (a command line is visible to every user of the machine in ``ps``)."""
    if not path:
        return {}
    try:
        text = open(os.path.expanduser(path), encoding="utf-8").read()
    except OSError as exc:
        raise InvalidSetting(f"--kafka-options-file: cannot read {path!r} ({exc.strerror})") from None
    lines = [line.strip() for line in text.splitlines()]
    return parse_pairs([line for line in lines if line and not line.startswith(("#", "!"))],
                       f"--kafka-options-file {path}")


@dataclass(frozen=True)
class PartitionCut:
    """One (region, topic, partition) of a cut: read ``[start, end)``; ``log_start`` as the broker reported it."""

    region: str
    topic: str
    partition: int
    start: int  # s: the previous snapshot's e, or the log start offset for a chain's first snapshot
    end: int  # e: the end offset (last stable offset under read_committed) when the cut was taken
    log_start: int
    cleanup_policy: str
    delivered: Optional[int] = None  # records read in [s, e), once the read is done
    broker_end: Optional[int] = None  # the end offset the broker reported (> e when the cut was bounded)
    skipped: Optional[str] = None  # why the partition's region was not read in this cut (then s = e)

    def read_from(self) -> int:
        """Where the read starts: ``s``, or the log start when retention removed ``[s, log start)``."""
        return max(self.start, self.log_start)

    def backlog(self) -> int:
        """Offsets the broker held past ``e`` when the cut was taken (a bounded cut leaves them for the next)."""
        return max(0, (self.broker_end if self.broker_end is not None else self.end) - self.end)


def _java_list(jvm, items):
    out = jvm.java.util.ArrayList()
    for item in items:
        out.add(item)
    return out


@contextmanager
def _admin(spark: SparkSession, request: DumpRequest, region: str):
    """Kafka's admin client for one region's brokers (in Spark's JVM: the consumer settings mean what they mean to
    the Kafka source), closed on leaving; every failure at the brokers becomes ``BrokerUnavailable`` naming the region."""
    jvm = spark._jvm  # noqa: SLF001 - the Kafka client ships with the Kafka source's jars
    props = jvm.java.util.Properties()
    for name, value in request.options_for(region).items():
        props.put(name, value)
    timeout_ms = str(int(request.timeout_for(region) * 1000))
    props.put("bootstrap.servers", request.regions[region])
    props.put("request.timeout.ms", timeout_ms)
    props.put("default.api.timeout.ms", timeout_ms)
    props.put("client.id", f"replica-lens-cut-{region}")
    admin = None
    try:
        admin = jvm.org.apache.kafka.clients.admin.Admin.create(props)
        yield admin
    except (BrokerUnavailable, UsageError):
        raise
    except Exception as exc:  # noqa: BLE001 - py4j wraps Kafka's TimeoutException, UnknownTopic..., auth errors
        raise BrokerUnavailable(request.redact(
            f"region {region}: the cut failed at its brokers ({request.regions[region]}): {_java_reason(exc)}"
        )) from None
    finally:
        if admin is not None:
            try:
                admin.close(jvm.java.time.Duration.ofSeconds(2))
            except Exception:  # noqa: BLE001 - closing a client of unreachable brokers may fail too
                pass


def list_topics(spark: SparkSession, request: DumpRequest, region: str, pattern: str) -> list[str]:
    """The topics of one region's brokers whose whole name matches ``pattern`` (a regular expression), sorted."""
    compiled = re.compile(pattern)
    jvm = spark._jvm  # noqa: SLF001
    with _admin(spark, request, region) as admin:
        names = admin.listTopics().names().get(int(request.timeout_for(region)) + 5,
                                               jvm.java.util.concurrent.TimeUnit.SECONDS)
        return sorted(str(name) for name in names if compiled.fullmatch(str(name)))


def take_cut(spark: SparkSession, request: DumpRequest, region: str, previous: dict,
             topics: Optional[tuple[str, ...]] = None) -> list[PartitionCut]:
    """Ask one region's brokers, before anything is read, for every partition of the topics (``topics``, else the
    request's): its log start offset, its end offset (the last stable offset under read_committed) and the topic's
    ``cleanup.policy``.

    ``previous``: (region, topic, partition) -> the previous cut's ``e``; ``s`` is that, else the log start.
    ``e`` is the end offset, or with ``request.max_offsets`` at most that many offsets past where the read starts
    (the broker's end is kept as ``broker_end``). Raises ``BrokerUnavailable`` naming the region when its brokers
    do not answer within the timeout or a partition has no leader."""
    topics = tuple(topics if topics is not None else request.topics)
    if not topics:
        return []
    jvm = spark._jvm  # noqa: SLF001
    admin_pkg = jvm.org.apache.kafka.clients.admin
    seconds = jvm.java.util.concurrent.TimeUnit.SECONDS
    wait = int(request.timeout_for(region)) + 5
    with _admin(spark, request, region) as admin:
        described = admin.describeTopics(_java_list(jvm, topics)).allTopicNames().get(wait, seconds)
        resource_type = getattr(jvm.org.apache.kafka.common.config, "ConfigResource$Type").TOPIC
        resources = [jvm.org.apache.kafka.common.config.ConfigResource(resource_type, t) for t in topics]
        configs = admin.describeConfigs(_java_list(jvm, resources)).all().get(wait, seconds)
        partitions: list[tuple[str, int]] = []
        policies: dict[str, str] = {}
        for topic, resource in zip(topics, resources):
            description = described.get(topic)
            for info in description.partitions():
                if info.leader() is None:
                    raise BrokerUnavailable(f"region {region}: partition {topic}[{info.partition()}] has no leader")
                partitions.append((topic, int(info.partition())))
            entry = configs.get(resource).get("cleanup.policy")
            policies[topic] = entry.value() if entry is not None else "delete"
        isolation = jvm.org.apache.kafka.common.IsolationLevel.valueOf(request.isolation_level.upper())
        options = admin_pkg.ListOffsetsOptions(isolation)

        def offsets(spec) -> dict[tuple[str, int], int]:
            wanted = jvm.java.util.HashMap()
            keys = {}
            for topic, partition in partitions:
                tp = jvm.org.apache.kafka.common.TopicPartition(topic, partition)
                keys[(topic, partition)] = tp
                wanted.put(tp, spec)
            result = admin.listOffsets(wanted, options).all().get(wait, seconds)
            return {key: int(result.get(tp).offset()) for key, tp in keys.items()}

        earliest = offsets(admin_pkg.OffsetSpec.earliest())
        latest = offsets(admin_pkg.OffsetSpec.latest())
    cut = []
    for topic, partition in partitions:
        log_start, end = earliest[(topic, partition)], latest[(topic, partition)]
        start = previous.get((region, topic, partition), log_start)
        if start > end:
            raise UsageError(
                f"region {region}: {topic}[{partition}] ends at {end}, before the previous snapshot's end {start} "
                "(the topic was re-created or truncated): start a new chain without --continue-from"
            )
        bounded = end if request.max_offsets is None else min(end, max(start, log_start) + request.max_offsets)
        cut.append(PartitionCut(region, topic, partition, start, bounded, log_start, policies[topic], broker_end=end))
    return cut


def _java_reason(exc: Exception) -> str:
    """The innermost Java exception's class and message, in one line."""
    text = str(getattr(exc, "java_exception", None) or exc)
    causes = [line.strip() for line in text.splitlines() if "Exception" in line and ":" in line]
    reason = causes[-1] if causes else (text.strip().splitlines() or [type(exc).__name__])[0]
    reason = reason.removeprefix("Caused by: ")
    return reason[:300]


def previous_ends(landing: str, snapshot_id: Optional[str]) -> dict[tuple[str, str, int], int]:
    """The ``e`` of every partition of a published snapshot's cut (``--continue-from``)."""
    if not snapshot_id:
        return {}
    check_snapshot_id(snapshot_id)
    folder = Location.of(landing).child(snapshot_id)
    if not folder.child(SUCCESS_MARKER).is_file():
        raise UsageError(f"--continue-from {snapshot_id}: no complete snapshot of that id in {landing}")
    if not folder.child(CUT_FILE).is_file():
        raise UsageError(f"--continue-from {snapshot_id}: it has no {CUT_FILE} (not a broker snapshot)")
    cut = json.loads(folder.child(CUT_FILE).read_text())
    return {(p["region"], p["topic"], int(p["partition"])): int(p["end"]) for p in cut["partitions"]}


def cut_document(cut: list[PartitionCut], request: DumpRequest, taken_at: dt.datetime, snapshot_id: str,
                 previous: Optional[str], skipped: Optional[dict[str, dict]] = None,
                 extra: Optional[dict] = None) -> dict:
    """What ``_cut.json`` holds: the cut per partition, when it was taken, how it was read, the regions not read
    (``skipped``: region -> its reason and how many cuts in a row skipped it) and ``extra`` (the watched store); no
    consumer setting."""
    return {
        "snapshot_id": snapshot_id,
        "cut_at": taken_at.isoformat(timespec="milliseconds"),
        "isolation_level": request.isolation_level,
        "continues": previous,
        "regions": {region: request.regions[region] for region in request.regions},
        "max_offsets": request.max_offsets,
        "skipped_regions": dict(sorted((skipped or {}).items())),
        **(extra or {}),
        "partitions": [
            {
                "region": p.region, "topic": p.topic, "partition": p.partition, "start": p.start, "end": p.end,
                "log_start": p.log_start, "delivered": p.delivered, "cleanup_policy": p.cleanup_policy,
                "not_delivered": (p.end - p.start - p.delivered) if p.delivered is not None else None,
                "broker_end": p.broker_end if p.broker_end is not None else p.end, "skipped": p.skipped,
            }
            for p in cut
        ],
    }


def cut_rows(text: str, snapshot_id: str) -> list[dict]:
    """``_cut.json``'s partitions as rows of ``broker_cuts`` (schemas/broker.py)."""
    document = json.loads(text)
    cut_at_ms = int(dt.datetime.fromisoformat(document["cut_at"]).timestamp() * 1000)
    return [
        {
            "snapshot_id": snapshot_id, "region": p["region"], "topic": p["topic"], "partition": int(p["partition"]),
            "start_offset": int(p["start"]), "end_offset": int(p["end"]), "log_start_offset": int(p["log_start"]),
            "records_delivered": int(p["delivered"]), "offsets_not_delivered": int(p["not_delivered"]),
            "backlog_offsets": max(0, int(p.get("broker_end", p["end"])) - int(p["end"])),
            "cleanup_policy": p["cleanup_policy"], "isolation_level": document["isolation_level"],
            "cut_at_ms": cut_at_ms, "continues": document.get("continues"), "skipped_reason": p.get("skipped"),
        }
        for p in document["partitions"]
    ]


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
        # Every region's trailing chunks in one Spark job (a job per region paid its start-up three times a tick).
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
