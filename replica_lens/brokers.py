"""Local single-node Kafka clusters (KRaft, no ZooKeeper), one per region, for the tests and
``scripts/kafka-demo.sh``; and a producer that writes a simulated store's raw Venice records into them.

``start_clusters(["dc-a", "dc-b"])`` starts one broker+controller JVM per region on loopback, all at
once (their start-ups overlap: three cost about one), from the jars ``scripts/setup-jvm.sh`` resolves
into ``jvm/lib/kafka-broker``. Each node gets free ports, a temporary folder (its log dirs,
``server.properties``, its log file), and storage formatted by writing ``meta.properties`` directly
(as ``kafka-storage format`` does for a static quorum, without its ``bootstrap.checkpoint``: the node then
bootstraps the broker's default metadata version; this saves a JVM start per node). The settings
aim at a fast start and a log cleaner that runs promptly (``log.cleaner.backoff.ms``), not at
durability. ``Clusters.stop()`` kills each node's process group and removes its folder.

``produce_snapshot`` writes the ``*.kafka.parquet`` files of a ``simulate --format venice-kafka``
snapshot into the brokers of their regions, partition by partition in offset order, with one
in-flight request per partition and no retries, so that the broker assigns every record the offset
the simulator gave it (checked: a mismatch is an error, never a silently shifted topic).
"""
from __future__ import annotations

import atexit
import base64
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Optional

PROJECT = Path(__file__).resolve().parent.parent
BROKER_JARS = PROJECT / "jvm" / "lib" / "kafka-broker"

# JVM options of a local node: a small heap and the first JIT tier (a node lives seconds to minutes and
# serves small topics; C2 compilation costs the shared cores more than it returns). The benchmark
# passes its own (``jvm_options``).
QUICK_JVM = ("-Xms64m", "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Xshare:auto")

LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d %p %c{{1}}: %m%n
logger.cleaner.name = kafka.log.LogCleaner
logger.cleaner.level = info
"""


def broker_jars_present(folder: Path = BROKER_JARS) -> bool:
    return bool(glob.glob(str(folder / "kafka_2.13-*.jar")))


def free_ports(count: int) -> list[int]:
    """``count`` distinct free loopback ports (bound together, then released)."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _kafka_uuid() -> str:
    """A Kafka ``Uuid`` as its ``toString`` writes it: URL-safe base64 of 16 bytes, no padding."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")


def server_properties(folder: Path, port: int, controller_port: int, overrides: Optional[dict] = None) -> dict:
    """A one-node cluster's settings: broker and controller in one process, fast start, prompt cleaner."""
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(folder / "data"),
        "metadata.log.dir": str(folder / "metadata"),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "num.network.threads": "2",
        "num.io.threads": "2",
        "background.threads": "2",
        "num.recovery.threads.per.data.dir": "1",
        "log.cleaner.threads": "1",
        "log.cleaner.backoff.ms": "200",
        "log.cleaner.dedupe.buffer.size": str(4 * 1024 * 1024),
        "log.cleaner.io.buffer.size": str(512 * 1024),
        "log.segment.delete.delay.ms": "0",
        # Simulated records carry 2023 timestamps: time-based retention would delete them on sight.
        "log.retention.ms": "-1",
        "log.retention.check.interval.ms": "1000",
        "log.initial.task.delay.ms": "0",
        "transaction.remove.expired.transaction.cleanup.interval.ms": "3600000",
        "controller.quorum.election.timeout.ms": "500",
        "controller.quorum.fetch.timeout.ms": "1000",
        "metadata.max.idle.interval.ms": "500",
    }
    props.update(overrides or {})
    return props


@dataclass
class Node:
    """One region's single-node cluster."""

    region: str
    bootstrap: str
    folder: Path
    process: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None


@dataclass
class Clusters:
    """Running clusters, region -> node. ``stop()`` is idempotent."""

    nodes: dict[str, Node] = field(default_factory=dict)
    keep: bool = False

    def bootstrap(self, region: str) -> str:
        return self.nodes[region].bootstrap

    def regions_arg(self) -> list[str]:
        """``--region`` arguments of ``replica-lens dump-kafka`` for every cluster."""
        out: list[str] = []
        for region, node in self.nodes.items():
            out += ["--region", f"{region}={node.bootstrap}"]
        return out

    def stop(self) -> None:
        for node in self.nodes.values():
            if node.alive():
                try:
                    os.killpg(node.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            try:
                node.process.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not wait for anything
                pass
            if not self.keep:
                shutil.rmtree(node.folder, ignore_errors=True)
        self.nodes = {}

    def __enter__(self) -> "Clusters":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


class BrokerError(RuntimeError):
    """A local broker did not start (its log's last lines say why)."""


def _launch(region: str, root: Path, jars: Path, jvm_options: Iterable[str], overrides: Optional[dict]) -> Node:
    folder = Path(tempfile.mkdtemp(prefix=f"kafka-{region}-", dir=root))
    port, controller_port = free_ports(2)
    props = server_properties(folder, port, controller_port, overrides)
    (folder / "server.properties").write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    cluster_id = _kafka_uuid()
    for name in ("data", "metadata"):
        (folder / name).mkdir()
        (folder / name / "meta.properties").write_text(
            f"version=1\ncluster.id={cluster_id}\nnode.id=1\ndirectory.id={_kafka_uuid()}\n"
        )
    log = folder / "server.log"
    (folder / "log4j2.properties").write_text(LOG4J2.format(log=log))
    command = [
        "java", *jvm_options, f"-Dlog4j2.configurationFile=file:{folder / 'log4j2.properties'}",
        "-Djava.awt.headless=true", "-cp", str(jars / "*"), "kafka.Kafka", str(folder / "server.properties"),
    ]
    with open(folder / "stdout.log", "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)
    return Node(region, f"127.0.0.1:{port}", folder, process, log)


def _ready(node: Node) -> bool:
    """The node answers metadata requests with a broker registered (a KRaft node accepts connections first)."""
    from confluent_kafka.admin import AdminClient

    try:
        host, port = node.bootstrap.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=0.5):
            pass
        admin = AdminClient({"bootstrap.servers": node.bootstrap, "socket.timeout.ms": 1000, "log_level": 0})
        metadata = admin.list_topics(timeout=1)
        return bool(metadata.brokers)
    except Exception:  # noqa: BLE001 - any failure means "not yet"
        return False


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start_clusters(
    regions: Iterable[str],
    *,
    root: Optional[str] = None,
    jars: Path = BROKER_JARS,
    jvm_options: Iterable[str] = QUICK_JVM,
    overrides: Optional[dict] = None,
    timeout_s: float = 90.0,
    keep: bool = False,
) -> Clusters:
    """Start one single-node cluster per region, all at once, and wait until every one serves metadata."""
    if not broker_jars_present(jars):
        raise BrokerError(f"no Kafka broker jars in {jars}: run ./scripts/setup-jvm.sh (needs Maven)")
    base = Path(root or tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    clusters = Clusters(keep=keep)
    atexit.register(clusters.stop)  # an interpreter that ends without stopping them (an error, Ctrl-C) still does
    try:
        for region in regions:
            clusters.nodes[region] = _launch(region, base, jars, tuple(jvm_options), overrides)
        deadline = time.monotonic() + timeout_s
        waiting = dict(clusters.nodes)
        while waiting:
            for region, node in list(waiting.items()):
                if not node.alive():
                    raise BrokerError(f"the broker of region {region} exited: {_tail(node.folder / 'stdout.log')}"
                                      f" {_tail(node.log)}")
                if _ready(node):
                    del waiting[region]
            if waiting and time.monotonic() > deadline:
                raise BrokerError(f"brokers of {sorted(waiting)} did not start within {timeout_s:.0f} s")
            if waiting:
                time.sleep(0.2)
    except BaseException:
        clusters.stop()
        raise
    return clusters


def create_topic(bootstrap: str, topic: str, partitions: int, config: Optional[dict] = None) -> None:
    """Create a topic (replication 1) and wait until every partition has a leader."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config=dict(config or {}))], operation_timeout=30)
    futures[topic].result(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        if meta and meta.error is None and len(meta.partitions) == partitions and all(
            p.leader >= 0 for p in meta.partitions.values()
        ):
            return
        time.sleep(0.1)
    raise BrokerError(f"topic {topic} on {bootstrap}: partitions without a leader after 30 s")


def _epoch_ms(ts) -> Optional[int]:
    if ts is None:
        return None
    return int(ts.timestamp() * 1000)


def producer_config(bootstrap: str, **extra) -> dict:
    """An idempotent producer that keeps each partition's order: one request in flight, no reordering retry."""
    config = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "max.in.flight.requests.per.connection": 1,
        "linger.ms": 5,
        "batch.num.messages": 10000,
        "compression.type": "lz4",
        "message.max.bytes": 8 * 1024 * 1024,
        "log_level": 3,  # errors only: a fresh broker's "coordinator load in progress" retries are expected
    }
    config.update(extra)
    return config


def kafka_files(snapshot: str) -> dict[tuple[str, str, int], list[str]]:
    """A simulated venice-kafka snapshot's record files per (region, topic, partition), in offset order."""
    import pyarrow.parquet as pq

    out: dict[tuple[str, str, int], list[str]] = {}
    for path in sorted(glob.glob(os.path.join(snapshot, "*.kafka.parquet"))):
        first = pq.read_table(path, columns=["region", "topic", "partition"]).slice(0, 1).to_pylist()
        if first:
            row = first[0]
            out.setdefault((row["region"], row["topic"], int(row["partition"])), []).append(path)
    return out


def partition_rows(paths: list[str]) -> list[dict]:
    """The records of one simulated partition's files, in offset order."""
    import pyarrow.parquet as pq

    rows = [row for path in paths for row in pq.read_table(path).to_pylist()]
    return sorted(rows, key=lambda row: row["offset"])


def produce_rows(producer, topic: str, partition: int, rows: list[dict], *, offsets: bool = True) -> list[str]:
    """Produce ``rows`` (simulated records) into one partition in order; with ``offsets``, each must land at the
    offset the simulator gave it. Returns the delivery errors once every record is acknowledged."""
    errors: list[str] = []
    for row in rows:
        expected = int(row["offset"]) if offsets else None

        def delivered(err, msg, expected=expected):
            if err is not None:
                errors.append(str(err))
            elif expected is not None and msg.offset() != expected:
                errors.append(f"{msg.topic()}[{msg.partition()}] got offset {msg.offset()}, expected {expected}")

        headers = [(h["key"], h["value"]) for h in (row.get("headers") or [])]
        while True:
            try:
                producer.produce(topic, value=row["value"], key=row["key"], partition=partition,
                                 timestamp=_epoch_ms(row.get("timestamp")) or 0, headers=headers or None,
                                 on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(60) != 0:
        errors.append("records still unsent after 60 s")
    return errors


def transactions(bootstrap: str, transactional_id: str, topic: str, partition: int,
                 batches: list[tuple[list[dict], bool]]) -> None:
    """Produce each ``(rows, commit)`` batch into one partition in a transaction of its own, committed or aborted,
    in order (offsets as the broker gives them: a transaction's records and its marker take offsets of their own).

    One transactional id for them all: the broker answers a commit or an abort once its coordinator has decided,
    and writes the marker into the partition after that. A producer with another id could write its records
    before that marker; the same id's next transaction waits until the marker is written, so the partition holds
    each batch and then its marker, in the order given."""
    from confluent_kafka import Producer

    producer = Producer(producer_config(bootstrap, **{"transactional.id": transactional_id}))
    producer.init_transactions(30)
    for rows, commit in batches:
        producer.begin_transaction()
        errors = produce_rows(producer, topic, partition, rows, offsets=False)
        if errors:
            raise BrokerError(f"{topic}[{partition}]: {errors[0]}")
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)


def produce_snapshot(
    snapshot: str,
    bootstrap_of: dict[str, str],
    *,
    topic_config: Optional[dict] = None,
    rename: Optional[dict[str, str]] = None,
    create: bool = True,
    compression: str = "lz4",
) -> dict[tuple[str, str, int], int]:
    """Produce a simulated venice-kafka snapshot's records into each region's cluster, at the offsets the
    simulator gave them (records of a partition in offset order, starting at 0 in an empty topic); returns
    records per (region, topic, partition). ``rename`` maps a simulated topic to the topic written (the
    records' own bytes do not name their topic). A record the broker puts elsewhere is an error."""
    from confluent_kafka import Producer

    rename = rename or {}
    files = kafka_files(snapshot)
    partitions: dict[tuple[str, str], int] = {}
    for region, topic, partition in files:
        key = (region, rename.get(topic, topic))
        partitions[key] = max(partitions.get(key, 0), partition + 1)
    if create:
        for (region, topic), count in sorted(partitions.items()):
            create_topic(bootstrap_of[region], topic, count, topic_config)
    produced: dict[tuple[str, str, int], int] = {}
    for region in sorted({r for r, _, _ in files}):
        producer = Producer(producer_config(bootstrap_of[region], **{"compression.type": compression}))
        for (r, topic, partition), paths in sorted(files.items()):
            if r != region:
                continue
            rows = partition_rows(paths)
            errors = produce_rows(producer, rename.get(topic, topic), partition, rows)
            if errors:
                raise BrokerError(f"region {region}: {len(errors)} records not produced as simulated; "
                                  f"first: {errors[0]}")
            produced[(region, rename.get(topic, topic), partition)] = len(rows)
    return produced


def demo(argv: Optional[list[str]] = None) -> int:
    """``scripts/kafka-demo.sh``: start a broker per region, produce a simulated store into them, dump it with
    ``replica-lens dump-kafka``, audit the snapshot, and stop the brokers (also on failure or Ctrl-C)."""
    import argparse
    import json
    import sys

    parser = argparse.ArgumentParser(prog="kafka-demo", description=demo.__doc__)
    parser.add_argument("--landing", default="landing")
    parser.add_argument("--warehouse", default="warehouse")
    parser.add_argument("--snapshot-id", default=time.strftime("kafka-demo-%Y%m%d-%H%M%S"))
    parser.add_argument("--regions", type=int, default=3)
    parser.add_argument("--keys", type=int, default=500)
    parser.add_argument("--writes", type=int, default=10000)
    args = parser.parse_args(argv)

    from replica_lens.simulator import SimulationConfig, simulate

    cli = [sys.executable, "-m", "replica_lens.cli"]
    source = f"{args.snapshot_id}-simulated"
    config = SimulationConfig(regions=args.regions, partitions=2, keys=args.keys, writes=args.writes, exporters=0,
                              conflicting_writes=3, lost_writes=2, file_format="venice-kafka",
                              compression="zstd-dict", chunk_above=64, push_control_messages=True)
    scratch = Path(tempfile.mkdtemp(prefix="kafka-demo-"))
    simulate(str(scratch), source, config)
    truth = json.loads((scratch / f"{source}.ground_truth.json").read_text())["venice"]
    regions = sorted({region for region, _, _ in kafka_files(str(scratch / source))})
    print(f"kafka-demo: starting a single-node KRaft cluster per region: {', '.join(regions)}", flush=True)
    with start_clusters(regions, root=str(scratch)) as clusters:
        for region, node in clusters.nodes.items():
            print(f"  {region}: {node.bootstrap}")
        produced = produce_snapshot(str(scratch / source), {r: n.bootstrap for r, n in clusters.nodes.items()},
                                    topic_config={"retention.ms": "-1"})
        print(f"kafka-demo: produced {sum(produced.values()):,} simulated Venice records "
              f"({truth['push_settings']}) into {len(produced)} partitions", flush=True)
        topics = sorted({topic for _, topic, _ in produced})
        dump = [*cli, "dump-kafka", *clusters.regions_arg(), "--landing", args.landing,
                "--snapshot-id", args.snapshot_id, *[a for t in topics for a in ("--topic", t)]]
        print("$ replica-lens " + " ".join(dump[3:]), flush=True)
        code = subprocess.call(dump)
    shutil.rmtree(scratch, ignore_errors=True)
    if code != 0:
        return code
    audit = [*cli, "audit", "--landing", args.landing, "--warehouse", args.warehouse, "--snapshot-id",
             args.snapshot_id, "--cluster-regions", truth["cluster_regions"],
             "--venice-clock-uncertainty-ms", str(truth["clock_uncertainty_ms"])]
    print("$ replica-lens " + " ".join(audit[3:]), flush=True)
    return subprocess.call(audit)


if __name__ == "__main__":
    raise SystemExit(demo())
