"""``replica-lens dump-kafka`` against real Kafka brokers (issue 68): one single-node KRaft cluster per region
(the session fixture ``kafka_clusters``, tests/conftest.py), records produced with a real producer from a
simulated store's raw Venice records (zstd with a dictionary, chunked values, push control messages).

One history, simulated once, is written four times into every region's cluster: as it is (``store_v1``), into a
compacted topic the broker's own log cleaner compacts (``compact_v1``), with an aborted transaction in the
middle of each partition and a committed one at its end (``txn_v1``), and with its head removed by
``deleteRecords`` (``head_v1``). One dump reads all four topics; one audit audits it; the simulator's own files
are audited once too. Skipped only where ``jvm/lib/kafka-broker`` is absent.
"""
from __future__ import annotations

import base64
import json
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pipelines.venice.kafka_cut import CUT_FILE, DumpRequest
from pipelines.venice.kafka_dump import dump
from replica_lens.audit import run_audit
from replica_lens.brokers import (
    BROKER_JARS, broker_jars_present, create_topic, free_ports, kafka_files, partition_rows, produce_rows,
    produce_snapshot, producer_config, transactions,
)
from replica_lens.cli import EXIT_RUN_FAILED, main
from pipelines.venice.values import COMPRESSION_NAMES
from replica_lens.simulator import SimulationConfig, simulate
from replica_lens.simulator.venice import venice_push_settings
from resources.delta_store import DeltaStore
from schemas.registry import struct_for
from tests.rows import plain

pytestmark = pytest.mark.skipif(not broker_jars_present(), reason=f"no Kafka broker jars in {BROKER_JARS}")

SETTINGS = {"spark_master": "local[2]", "delta_jars_dir": None, "shuffle_partitions": 4}
HISTORY = dict(
    seed=31, regions=3, partitions=1, keys=40, writes=450, heartbeat_every=15, exporters=0,
    conflicting_writes=2, lost_writes=2, file_format="venice-kafka", compression="zstd-dict", chunk_above=64,
    push_control_messages=True,
)
COMPARED = ("divergence_reports", "partition_watermarks", "reconstructed_watermarks", "heartbeat_segment_summary")
IGNORED = {"snapshot_id", "source_file"}
COMPACT = {"cleanup.policy": "compact", "segment.ms": "50", "min.cleanable.dirty.ratio": "0.0001",
           "min.compaction.lag.ms": "0", "delete.retention.ms": "0", "retention.ms": "-1"}
HEAD = 40  # deleteRecords removes offsets [0, 40) of every head_v1 partition
ABORTED = 3  # records of the aborted transaction in the middle of each txn_v1 partition
SECRET = "s3cr3t-Do-Not-Print-4711"


def _wait_for_cleaner(clusters, topic: str, partitions: int, timeout_s: float = 60) -> None:
    """Until Kafka's log cleaner has cleaned every partition of ``topic`` in every region (its checkpoint)."""
    deadline = time.monotonic() + timeout_s
    pending = {(region, p) for region in clusters.nodes for p in range(partitions)}
    while pending and time.monotonic() < deadline:
        for region, node in clusters.nodes.items():
            checkpoint = node.folder / "data" / "cleaner-offset-checkpoint"
            text = checkpoint.read_text() if checkpoint.exists() else ""
            for line in text.splitlines()[2:]:
                name, partition, offset = line.split()
                if name == topic and int(offset) > 0:
                    pending.discard((region, int(partition)))
        time.sleep(0.2)
    assert not pending, f"the log cleaner did not clean {sorted(pending)} within {timeout_s} s"


def _produce_history(clusters, snapshot: Path) -> None:
    bootstrap = {region: node.bootstrap for region, node in clusters.nodes.items()}
    produce_snapshot(str(snapshot), bootstrap)  # store_v1, at the simulator's offsets
    files = kafka_files(str(snapshot))
    # Each region's cluster is a broker of its own: the regions are written at once (topic creations, the
    # transaction coordinators' start and the acknowledgements overlap; each partition is still written in order).
    with ThreadPoolExecutor(len(bootstrap), thread_name_prefix="produce") as regions:
        for written in [regions.submit(_produce_region, bootstrap[region], region, files) for region in bootstrap]:
            written.result()
    _wait_for_cleaner(clusters, "compact_v1", HISTORY["partitions"])


def _produce_region(bootstrap: str, region: str, files: dict) -> None:
    """compact_v1, txn_v1 and head_v1 in one region's cluster, from the region's simulated partitions."""
    from confluent_kafka import Producer, TopicPartition
    from confluent_kafka.admin import AdminClient

    for topic, config in (("compact_v1", COMPACT), ("txn_v1", {"retention.ms": "-1"}),
                          ("head_v1", {"retention.ms": "-1"})):
        create_topic(bootstrap, topic, HISTORY["partitions"], config)
    producer = Producer(producer_config(bootstrap))
    for (r, _, partition), paths in sorted(files.items()):
        if r != region:
            continue
        rows = partition_rows(paths)
        # compact_v1: in slices, a segment rolled between them (segment.ms), so that the cleaner has
        # closed segments to compact.
        for i in range(0, len(rows), 150):
            assert not produce_rows(producer, "compact_v1", partition, rows[i:i + 150])
            time.sleep(0.06)
        assert not produce_rows(producer, "head_v1", partition, rows)
        half = len(rows) // 2
        assert not produce_rows(producer, "txn_v1", partition, rows[:half])
        junk = [{"key": b"junk", "value": b"never committed", "offset": -1}] * ABORTED
        # one transactional id: the committed records come after the aborted transaction's marker
        transactions(bootstrap, f"txn-{region}-{partition}", "txn_v1", partition,
                     [(junk, False), (rows[half:], True)])
    # roll the last compact_v1 segment that holds data: one more record after segment.ms
    time.sleep(0.06)
    for partition in range(HISTORY["partitions"]):
        assert not produce_rows(producer, "compact_v1", partition, [files_last(files, region, partition)],
                                offsets=False)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.delete_records([TopicPartition("head_v1", p, HEAD) for p in range(HISTORY["partitions"])])
    for future in futures.values():
        future.result(30)


def files_last(files, region: str, partition: int) -> dict:
    """The last record of a simulated partition (produced again: a copy at a new offset, for the cleaner)."""
    rows = partition_rows(next(paths for (r, _, p), paths in files.items() if r == region and p == partition))
    return rows[-1]


@pytest.fixture(scope="module")
def broker_history(spark, kafka_clusters, tmp_path_factory):
    """The history's files and its broker dump, both audited: (store, landing, cut, audits)."""
    landing = tmp_path_factory.mktemp("kafka-landing")
    warehouse = tmp_path_factory.mktemp("kafka-warehouse")
    simulate(str(landing), "files", SimulationConfig(**HISTORY))
    truth = json.loads((landing / "files.ground_truth.json").read_text())["venice"]
    # Compaction (the control messages of a producer share a Kafka key) and deleteRecords both remove the
    # START_OF_PUSH: the operator names the version's settings (docs/venice-input.md), as here.
    settings = venice_push_settings(SimulationConfig(**HISTORY))
    entry = {"compression": COMPRESSION_NAMES[settings.compression], "chunked": settings.chunked,
             "dictionary_base64": base64.b64encode(settings.dictionary).decode("ascii")}
    push_file = landing.parent / "push-settings.json"
    push_file.write_text(json.dumps({"compact_v1": entry, "head_v1": entry}))
    decode = {"cluster_regions": truth["cluster_regions"], "venice_clock_uncertainty_ms": truth["clock_uncertainty_ms"],
              "venice_push_settings": str(push_file)}
    audits = {}
    # The brokers are written while the simulated files are audited (the producers wait on the brokers, the audit
    # on Spark): the files' audit reads only their own folder, the dump only what the brokers hold once written.
    with ThreadPoolExecutor(1, thread_name_prefix="brokers") as background:
        produced = background.submit(_produce_history, kafka_clusters, landing / "files")
        audits["files"] = run_audit("files", str(landing), str(warehouse), **SETTINGS, **decode)
        produced.result()
    request = DumpRequest({r: n.bootstrap for r, n in kafka_clusters.nodes.items()},
                          ("store_v1", "compact_v1", "txn_v1", "head_v1"))
    summary = dump(request, str(landing), "broker", spark=spark)
    audits["broker"] = run_audit("broker", str(landing), str(warehouse), **SETTINGS, **decode)
    for sid, audit in audits.items():
        assert audit.success, (sid, audit.error)
    return DeltaStore(warehouse_root=str(warehouse)), landing, summary["cut"], audits


def _rows(spark, store, table: str, snapshot_id: str, topic: str) -> Counter:
    frame = store.read_snapshot(spark, table, snapshot_id, struct_for(table)).where(f"topic = '{topic}'")
    columns = [c for c in frame.columns if c not in IGNORED]
    return Counter(tuple(sorted((k, plain(v)) for k, v in r.asDict(recursive=True).items()))
                   for r in frame.select(*columns).collect())


@pytest.mark.parametrize("table", COMPARED)
def test_a_broker_dump_audits_exactly_like_the_simulated_files(spark, broker_history, table):
    """Catches any change between producing the simulator's records, the broker, Spark's Kafka source and the
    landed files: a header, timestamp, key or value bytes not kept, a record read twice or at another offset,
    a partition read past its cut, changes a verdict, watermark, segment, anomaly or lag row here."""
    store, _, _, _ = broker_history
    files, broker = _rows(spark, store, table, "files", "store_v1"), _rows(spark, store, table, "broker", "store_v1")
    assert files, f"{table} is empty: the comparison would prove nothing"
    assert broker == files, (f"{table}: only in the files {list((files - broker).items())[:2]}, "
                             f"only in the broker dump {list((broker - files).items())[:2]}")


def test_the_accounting_of_a_broker_dump_equals_the_files_and_the_cut(broker_history):
    """Catches records of the cut not read, read twice, or not accounted for (rows read = accepted +
    quarantined + skipped) on a compacted topic, around transaction markers and after deleteRecords; and a
    store_v1 dump whose accounting differs from the simulated files'."""
    _, _, cut, audits = broker_history
    meta = {sid: audits[sid].metadata["raw_topic_snapshots"] for sid in audits}
    for m in meta.values():
        assert int(m["rows_read"]) == int(m["rows_accepted"]) + int(m["rows_quarantined"]) + int(m["rows_skipped"])
    assert int(meta["broker"]["rows_read"]) == sum(p["delivered"] for p in cut["partitions"])
    store_v1 = sum(p["delivered"] for p in cut["partitions"] if p["topic"] == "store_v1")
    assert store_v1 == int(meta["files"]["rows_read"])


def test_the_cut_records_what_only_a_broker_does(broker_history):
    """Catches a cut inferred from the records read (an end offset at the last record, not at the transaction
    marker after it), a log start offset not reported after deleteRecords, a compacted topic's missing offsets
    not counted, an aborted record delivered under read_committed, and a cut file holding a setting."""
    _, landing, cut, _ = broker_history
    written = json.loads((landing / "broker" / CUT_FILE).read_text())
    assert written == cut and cut["isolation_level"] == "read_committed"
    by = {(p["region"], p["topic"], p["partition"]): p for p in cut["partitions"]}
    assert len(by) == 3 * 4 * HISTORY["partitions"]
    for (region, topic, partition), p in by.items():
        plain_p = by[(region, "store_v1", partition)]
        assert p["delivered"] + p["not_delivered"] == p["end"] - p["start"]
        if topic == "store_v1":
            assert (p["start"], p["log_start"], p["not_delivered"], p["cleanup_policy"]) == (0, 0, 0, "delete")
        elif topic == "txn_v1":
            # the aborted records and their marker in the middle, the commit marker last
            assert p["end"] == plain_p["end"] + ABORTED + 2 and p["not_delivered"] == ABORTED + 2
        elif topic == "head_v1":
            assert p["start"] == p["log_start"] == HEAD and p["delivered"] == plain_p["delivered"] - HEAD
        else:
            assert p["cleanup_policy"] == "compact" and p["not_delivered"] > 0


def test_the_cut_is_a_table_after_the_audit(spark, broker_history):
    """Catches a cut lost between the snapshot and the warehouse: a partition missing or altered in
    ``broker_cuts``, or rows in it for a snapshot of files."""
    store, _, cut, _ = broker_history
    table = store.read_snapshot(spark, "broker_cuts", "broker", struct_for("broker_cuts")).collect()
    got = sorted((r["region"], r["topic"], r["partition"], r["start_offset"], r["end_offset"], r["log_start_offset"],
                  r["records_delivered"], r["offsets_not_delivered"], r["cleanup_policy"]) for r in table)
    want = sorted((p["region"], p["topic"], p["partition"], p["start"], p["end"], p["log_start"], p["delivered"],
                   p["not_delivered"], p["cleanup_policy"]) for p in cut["partitions"])
    assert got == want and {r["isolation_level"] for r in table} == {"read_committed"}
    assert store.read_snapshot(spark, "broker_cuts", "files", struct_for("broker_cuts")).count() == 0


def test_broker_gaps_are_reported_and_prove_nothing_the_complete_topic_does_not(spark, broker_history):
    """Catches the aborted transaction's offsets or the compacted records not reported as gaps where the
    watermarks are, and a verdict proven on a compacted, transactional or truncated dump that the complete
    history does not prove (SPEC 3a's safety property)."""
    store, _, _, _ = broker_history
    marks = store.read_snapshot(spark, "partition_watermarks", "broker", struct_for("partition_watermarks"))
    txn = marks.where("topic = 'txn_v1'").collect()
    assert txn and all(r["gaps"] == 1 and r["gap_positions"] == ABORTED + 1 for r in txn), "\n".join(
        str({k: r[k] for k in ("replica", "partition", "first_offset", "last_offset", "gaps", "gap_positions",
                               "first_gap_offset", "last_gap_offset")}) for r in txn)  # a string: pytest cuts a list
    assert sum(r["gap_positions"] for r in marks.where("topic = 'compact_v1'").collect()) > 0

    def proven(snapshot_id: str, topic: str) -> set:
        frame = store.read_snapshot(spark, "divergence_reports", snapshot_id, struct_for("divergence_reports"))
        return {(r["replica_a"], r["replica_b"], r["key"], r["verdict"], r["missing_in"]) for r in
                frame.where(f"topic = '{topic}' and verdict in ('DIVERGENT', 'MISSING')").collect()}

    complete = proven("files", "store_v1")
    assert complete, "the history proves nothing: the comparison would be empty"
    for topic in ("compact_v1", "txn_v1", "head_v1"):
        assert proven("broker", topic) <= complete, topic
    # The aborted transaction's offsets may have held anything (SPEC 3a): reach stops there, yet the records on
    # either side still prove divergence.
    assert proven("broker", "txn_v1")


def test_a_continued_dump_starts_at_the_previous_end_and_keeps_secrets_out(kafka_clusters, spark, tmp_path, capsys):
    """Catches a continued dump that re-reads or skips offsets (its s is not the previous e), records read
    outside the cut, and a consumer setting (a password in a JAAS line) that reaches a file, the cut or the
    output."""
    bootstrap = {r: n.bootstrap for r, n in kafka_clusters.nodes.items()}
    snapshot = tmp_path / "sim"
    simulate(str(snapshot), "s", SimulationConfig(**{**HISTORY, "keys": 20, "writes": 120, "seed": 5}))
    rows = {key: partition_rows(paths) for key, paths in kafka_files(str(snapshot / "s")).items()}
    region = "dc-a"
    create_topic(bootstrap[region], "chain_v1", 1, {"retention.ms": "-1"})
    from confluent_kafka import Producer

    producer = Producer(producer_config(bootstrap[region]))
    first = rows[(region, "store_v1", 0)]
    assert not produce_rows(producer, "chain_v1", 0, first[:30])
    options = tmp_path / "kafka.properties"
    options.write_text(f"# secrets\nsasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule "
                       f"required username=\"u\" password=\"{SECRET}\";\nsasl.mechanism=PLAIN\n")
    landing = tmp_path / "landing"
    common = ["dump-kafka", "--region", f"{region}={bootstrap[region]}", "--topic", "chain_v1",
              "--landing", str(landing), "--kafka-options-file", str(options)]
    assert main([*common, "--snapshot-id", "c1"]) == 0
    assert not produce_rows(producer, "chain_v1", 0, first[30:])
    assert main([*common, "--snapshot-id", "c2", "--continue-from", "c1"]) == 0
    c1, c2 = (json.loads((landing / s / CUT_FILE).read_text())["partitions"][0] for s in ("c1", "c2"))
    assert (c1["start"], c1["end"], c1["delivered"]) == (0, 30, 30)
    assert (c2["start"], c2["end"], c2["delivered"]) == (30, len(first), len(first) - 30)
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err
    for path in landing.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_a_region_that_does_not_answer_fails_in_one_line_and_writes_nothing(kafka_clusters, spark, tmp_path, capsys):
    """Catches a dump that hangs, prints a Java stack trace, leaves a half-written snapshot folder, or quotes a
    consumer setting when one region's brokers do not answer."""
    dead = free_ports(1)[0]
    code = main(["dump-kafka", "--region", f"dc-a={kafka_clusters.bootstrap('dc-a')}",
                 "--region", f"dc-z=127.0.0.1:{dead}", "--topic", "store_v1", "--landing", str(tmp_path),
                 "--snapshot-id", "s1", "--broker-timeout", "3",
                 "--kafka-option", f"sasl.jaas.config=x password=\"{SECRET}\";"])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_RUN_FAILED
    assert len(err.splitlines()) == 1 and "region dc-z" in err and "Traceback" not in err, err
    assert SECRET not in err
    assert not (tmp_path / "s1").exists()

