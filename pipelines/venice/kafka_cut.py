"""The cut of a dump of Kafka brokers (SPEC 11, issue 68): what to read and exactly which offsets.

``DumpRequest`` says what to read (per region its brokers, the version topics, the isolation level, consumer
settings, the bound per cut); ``take_cut`` asks each region's brokers, with Kafka's admin client in Spark's JVM,
for every partition's log start, end offset (the last stable offset under ``read_committed``) and the topic's
``cleanup.policy`` before any record is read; ``cut_document`` is the cut as ``_cut.json`` records it, and
``cut_rows`` turns that file into the ``broker_cuts`` table. Reading the cut and landing it is
``pipelines/venice/kafka_dump.py``'s.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Optional

from pyspark.sql import SparkSession

from resources.errors import InvalidSetting, UsageError
from resources.filesystem import Location
from resources.snapshots import SUCCESS_MARKER, check_snapshot_id


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
