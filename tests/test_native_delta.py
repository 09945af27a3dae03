"""Delta Lake's own Spark writer (delta-spark) on the project's warehouses: both engines' tables, Delta's own
OPTIMIZE, VACUUM, DESCRIBE HISTORY and time travel, and a delta-spark writer beside the audit's commits.

Runs where the Delta jars are (``./scripts/setup-jvm.sh`` puts them in ``jvm/lib/delta``): the suite's one JVM per
worker loads them (``tests/conftest.py``), and the embedded engine stays every other test's. The shared example
snapshot (``tests/data/two-regions``) is audited once by the native engine; Delta's own OPTIMIZE and VACUUM then run
on that warehouse and it is audited again by the embedded engine, so each table is read after each engine wrote it.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import threading
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from replica_lens.audit import run_audit
from replica_lens.cli import main
from resources import delta_embedded
from resources.delta_store import DeltaStore
from resources.session import has_native_delta
from schemas.raw import RawTopicSnapshots
from schemas.registry import struct_for
from tests.rows import EXAMPLES, PER_SNAPSHOT_TABLES, raw_frame

SUITE_JARS = os.environ.get("REPLICA_LENS_TEST_DELTA_JARS")
pytestmark = [
    pytest.mark.native_delta,
    pytest.mark.skipif(not SUITE_JARS, reason="no Delta Lake jars in jvm/lib/delta (./scripts/setup-jvm.sh fetches them)"),
]

SNAPSHOT = "two-regions"
SETTINGS = {"spark_master": "local[2]", "delta_jars_dir": None, "shuffle_partitions": 4}
STRUCT = RawTopicSnapshots.to_structtype()
RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
# The tables Delta's own tools run on (each command is a few Spark jobs): those `replica-lens explain` reads, which
# hold maps, vectors and values, and the verdicts; raw_topic_snapshots has several files per snapshot to compact.
TOOLED = ("raw_topic_snapshots", "raw_topic_skipped", "reconstructed_watermarks", "partition_watermarks",
          "divergence_reports")


@pytest.fixture(scope="module")
def delta_spark(spark):
    """The suite's session, which must have delta-spark usable (not merely its jars on the class path)."""
    assert has_native_delta(spark), "the suite's JVM was started with the Delta jars, yet delta-spark is not usable"
    from resources.session import INTERPRETED
    from tests.conftest import interpret_by_default

    before = spark.conf.get(RETENTION_CHECK, None)
    spark.conf.set(RETENTION_CHECK, "false")  # VACUUM ... RETAIN 0 HOURS, for the tests only
    # Delta's OPTIMIZE and VACUUM run many queries of their own: compiled, as in an operator's session (the
    # suite's interpreted default made this module several times slower).
    for key in INTERPRETED:
        spark.conf.unset(key)
    # Delta's VACUUM lists a table's folders in a Spark job of this many tasks (Spark's default: 10,000, one task
    # per folder at most, each a few milliseconds on two cores): one per core is plenty for a test table.
    listing = "spark.sql.sources.parallelPartitionDiscovery.parallelism"
    listing_before = spark.conf.get(listing)
    spark.conf.set(listing, "2")
    # Delta rebuilds a table's state (its log replayed) in a Spark job of this many tasks whenever it reads,
    # writes, optimizes or vacuums a version it has not cached; the default, 50, is sized for logs of thousands
    # of files. A test table has a few commits: one task gives the same state (most of this module's time went
    # to those 50-task jobs: its fixture took 196 s alone, 40 s with one task).
    state_tasks = "spark.databricks.delta.snapshotPartitions"
    state_tasks_before = spark.conf.get(state_tasks, None)
    spark.conf.set(state_tasks, "1")
    try:
        yield spark
    finally:
        interpret_by_default(spark)
        spark.conf.set(listing, listing_before)
        if state_tasks_before is None:
            spark.conf.unset(state_tasks)
        else:
            spark.conf.set(state_tasks, state_tasks_before)
        if before is None:
            spark.conf.unset(RETENTION_CHECK)
        else:
            spark.conf.set(RETENTION_CHECK, before)


# ------------------------------------------------------------------------------------------------ helpers
def _canonical(value):
    """One form for a value as delta-spark (Rows, dicts for maps) and delta-rs (Arrow: lists of pairs) give it."""
    if isinstance(value, dict):
        return tuple(sorted((str(k), _canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        if value and all(isinstance(x, tuple) and len(x) == 2 for x in value):  # an Arrow map
            return tuple(sorted((str(k), _canonical(v)) for k, v in value))
        return tuple(_canonical(x) for x in value)
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.timezone.utc).replace(tzinfo=None)
    if isinstance(value, float) and value != value:
        return "NaN"
    return value


def _sorted_rows(rows: list[tuple]) -> list[tuple]:
    return sorted(rows, key=repr)


def _rows_by_delta_spark(spark, uri: str, columns: list[str], version: int | None = None) -> list[tuple]:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    found = reader.load(uri).select(*columns).collect()
    return _sorted_rows([tuple(_canonical(r.asDict(recursive=True)[c]) for c in columns) for r in found])


def _rows_by_delta_rs(uri: str, columns: list[str]) -> list[tuple]:
    table = pa.table(DeltaTable(uri).to_pyarrow_table()).select(columns)
    return _sorted_rows([tuple(_canonical(r[c]) for c in columns) for r in table.to_pylist()])


def _columns(uri: str) -> list[str]:
    return sorted(pa.schema(DeltaTable(uri).schema().to_arrow()).names)


def _tables(warehouse: Path) -> dict[str, str]:
    store = DeltaStore(warehouse_root=str(warehouse))
    assert set(PER_SNAPSHOT_TABLES) <= set(store.tables())
    return {name: store.table_uri(name) for name in TOOLED}


def _verdicts(warehouse: Path) -> set[tuple]:
    uri = DeltaStore(warehouse_root=str(warehouse)).table_uri("divergence_reports")
    rows = pa.table(DeltaTable(uri).to_pyarrow_table()).to_pylist()
    return {(r["topic"], r["partition"], r["replica_a"], r["replica_b"], r["key"], r["verdict"]) for r in rows}


def _explained(warehouse: Path, report: tuple, out: Path) -> dict:
    topic, partition, _, _, key, _ = report
    assert main(["explain", "--warehouse", str(warehouse), "--snapshot-id", SNAPSHOT, "--topic", topic,
                 "--partition", str(partition), "--key", key, "--json", str(out)]) == 0
    return json.loads(out.read_text())


def _missing_log_files(uri: str) -> list[str]:
    """The data files the table's current version names that are not on disk."""
    return [path for path in DeltaTable(uri).file_uris() if not os.path.exists(path.removeprefix("file://"))]


def _history(spark, uri: str) -> list[dict]:
    return [r.asDict() for r in spark.sql(f"DESCRIBE HISTORY delta.`{uri}`").orderBy("version").collect()]


def _relative(uri: str, path: str) -> str:
    return path.removeprefix("file:").removeprefix("//")[len(uri.removeprefix("file://")) + 1:]


# ------------------------------------------------------------------------------------------------ the audits
@pytest.fixture(scope="module")
def audited(delta_spark, tmp_path_factory) -> dict:
    """The example audited by the native engine, then OPTIMIZE and VACUUM RETAIN 0 HOURS by delta-spark, then audited
    again by the embedded engine; what each stage left is recorded for the tests below."""
    spark = delta_spark
    base = tmp_path_factory.mktemp("native-delta")
    landing, warehouse = base / "landing", base / "warehouse"
    shutil.copytree(EXAMPLES / SNAPSHOT, landing / SNAPSHOT)

    # Files of at most 16 rows: Delta's OPTIMIZE below then has small files to compact in every table.
    files_key = "spark.sql.files.maxRecordsPerFile"
    before = spark.conf.get(files_key)
    spark.conf.set(files_key, "16")
    try:
        native = run_audit(SNAPSHOT, str(landing), str(warehouse), delta_engine="native", **SETTINGS)
    finally:
        spark.conf.set(files_key, before)
    assert native.success, native.error
    tables = _tables(warehouse)
    record = {"warehouse": warehouse, "tables": tables, "native": native}
    record["native_rows"] = {t: _rows_by_delta_rs(uri, _columns(uri)) for t, uri in tables.items()}
    record["native_spark_rows"] = {t: _rows_by_delta_spark(spark, uri, _columns(uri)) for t, uri in tables.items()}
    record["native_history"] = {t: _history(spark, uri) for t, uri in tables.items()}
    record["native_verdicts"] = _verdicts(warehouse)
    proven = sorted(r for r in record["native_verdicts"] if r[-1] == "DIVERGENT")
    record["explained_key"] = proven[0]
    record["native_explained"] = _explained(warehouse, proven[0], base / "native.json")

    optimized = {}
    for table, uri in tables.items():
        metrics = spark.sql(f"OPTIMIZE delta.`{uri}`").collect()[0]["metrics"]
        optimized[table] = (metrics["numFilesRemoved"], metrics["numFilesAdded"])
        spark.sql(f"VACUUM delta.`{uri}` RETAIN 0 HOURS").collect()
    record["optimized"] = optimized
    record["missing_after_vacuum"] = {t: _missing_log_files(uri) for t, uri in tables.items()}
    record["optimized_rows"] = {t: _rows_by_delta_rs(uri, _columns(uri)) for t, uri in tables.items()}
    record["optimized_explained"] = _explained(warehouse, proven[0], base / "optimized.json")

    embedded = run_audit(SNAPSHOT, str(landing), str(warehouse), delta_engine="embedded", **SETTINGS)
    assert embedded.success, embedded.error
    record["embedded"] = embedded
    record["embedded_verdicts"] = _verdicts(warehouse)
    record["embedded_explained"] = _explained(warehouse, proven[0], base / "embedded.json")
    return record


def test_the_native_audit_writes_with_delta_spark_and_delta_rs_reads_every_row_it_wrote(audited):
    """Catches: the native engine not taken although asked for (the tables written by delta-rs, the engine
    untested), a table delta-spark wrote that delta-rs reads otherwise than delta-spark (rows, nulls, maps,
    timestamps), and verdicts of the native audit other than the example's."""
    for table in TOOLED:
        assert audited["native_history"][table][-1]["operation"] == "WRITE", (table, audited["native_history"][table])
        assert audited["native_rows"][table] == audited["native_spark_rows"][table], table
    assert {audited["native"].metadata[t]["delta_engine"] for t in PER_SNAPSHOT_TABLES} == {"native"}
    expected = json.loads((EXAMPLES / "two-regions.expected.json").read_text())["expected_reports"]
    proven = {r for r in audited["native_verdicts"] if r[-1] in ("DIVERGENT", "MISSING")}
    assert proven == {(e["topic"], e["partition"], e["replica_a"], e["replica_b"], e["key"], e["verdict"]) for e in expected}


def test_delta_s_own_optimize_and_vacuum_lose_nothing_and_a_re_audit_and_explain_say_the_same(audited):
    """Catches: a file the log still names removed by Delta's VACUUM (files staged outside the table's layout, or
    committed with a path delta-spark resolves otherwise), rows lost or changed by Delta's OPTIMIZE of the files
    the embedded engine and Spark wrote, and a re-audit over a table another tool compacted that changes a verdict
    or an explanation (its commit lost to a conflict, or two copies of a snapshot)."""
    assert all(not missing for missing in audited["missing_after_vacuum"].values()), audited["missing_after_vacuum"]
    for table in ("raw_topic_snapshots", "reconstructed_watermarks"):  # it compacted something (files of 16 rows)
        assert audited["optimized"][table][0] > 1, audited["optimized"]
    assert audited["optimized_rows"] == audited["native_rows"]
    assert audited["embedded_verdicts"] == audited["native_verdicts"]
    assert audited["optimized_explained"] == audited["native_explained"]
    assert audited["embedded_explained"] == audited["native_explained"]
    assert audited["native_explained"]["pairs"], audited["native_explained"]


def test_tables_the_embedded_engine_wrote_read_alike_in_delta_spark_and_delta_rs(audited, delta_spark):
    """Catches: a log entry of the embedded engine that delta-spark reads otherwise than delta-rs (statistics it
    skips files by wrongly, partition values, a protocol it refuses), and a re-audit whose rows differ from the
    native audit's."""
    for table, uri in audited["tables"].items():
        columns = _columns(uri)
        assert _rows_by_delta_spark(delta_spark, uri, columns) == _rows_by_delta_rs(uri, columns), table
        assert _rows_by_delta_rs(uri, columns) == audited["native_rows"][table], table
    # delta-spark's data skipping by the embedded engine's statistics: a filter on a data column keeps every match.
    uri = audited["tables"]["raw_topic_snapshots"]
    offsets = sorted(r["offset"] for r in pa.table(DeltaTable(uri).to_pyarrow_table()).to_pylist())
    middle = offsets[len(offsets) // 2]
    read = delta_spark.read.format("delta").load(uri).where(f"offset >= {middle}").count()
    assert read == sum(1 for o in offsets if o >= middle)


def test_history_shows_one_version_per_publish_and_time_travel_reads_each(audited, delta_spark):
    """Catches: a publish that takes several commits (readers would see a snapshot half replaced) or none (an
    OPTIMIZE's rows taken for the audit's), a version the audit reports that is not the one it committed, and the
    version before the re-audit (Delta's VACUUM's) that time travel can no longer read. (The native audit's own
    version is gone by design: OPTIMIZE superseded its files and VACUUM RETAIN 0 HOURS removed them.)"""
    for table, uri in audited["tables"].items():
        history = _history(delta_spark, uri)
        native = audited["native_history"][table]
        later = [h["operation"] for h in history[len(native):]]
        assert later in (["OPTIMIZE", "VACUUM START", "VACUUM END", "WRITE"], ["VACUUM START", "VACUUM END", "WRITE"]), \
            (table, later)
        assert history[-1]["version"] == audited["embedded"].metadata[table]["delta_version"], table
        columns = _columns(uri)
        assert _rows_by_delta_spark(delta_spark, uri, columns, version=history[-2]["version"]) == audited["native_rows"][table]


def test_replica_lens_vacuum_and_delta_s_vacuum_agree_on_what_may_be_removed(audited, delta_spark, capsys):
    """Catches: the project's vacuum removing a file Delta's would keep (one a version still names) or keeping one
    Delta's removes (superseded by the re-audit, or staged by a write that never committed), on the same tables."""
    store = DeltaStore(warehouse_root=str(audited["warehouse"]))
    uri = audited["tables"]["raw_topic_snapshots"]
    crashed = store.stage(delta_spark, raw_frame(delta_spark, [dict(replica="dc-a", topic="t", partition=0, offset=0,
                                                                    kind="START_OF_PUSH")], SNAPSHOT),
                          "raw_topic_snapshots", SNAPSHOT, STRUCT)  # a write that never committed
    ours = {r.table: set(r.paths) for r in store.vacuum(retention_hours=0, dry_run=True, tables=TOOLED)}
    assert any(p.startswith(crashed.relative_dir) for p in ours["raw_topic_snapshots"]), ours["raw_topic_snapshots"]
    delta = {
        table: {_relative(uri, r["path"]) for r in delta_spark.sql(f"VACUUM delta.`{uri}` RETAIN 0 HOURS DRY RUN").collect()}
        for table, uri in audited["tables"].items()
    }
    # Delta's VACUUM never lists hidden files; deleting a data file through Hadoop's local filesystem takes its
    # ".<name>.crc" with it. Ours lists those checksums, and the "_SUCCESS" markers of writes that never committed.
    for table, paths in ours.items():
        data = {p for p in paths if not os.path.basename(p).startswith(("_", "."))}
        assert data == delta[table], table
        for hidden in paths - data:
            folder, name = os.path.split(hidden)
            checksum_of = os.path.join(folder, name[1:-len(".crc")]) if name.startswith(".") and name.endswith(".crc") else None
            assert checksum_of in paths or (name == "_SUCCESS" and hidden.startswith("write-")), (table, hidden)
    assert delta["raw_topic_snapshots"] and any(p.startswith(crashed.relative_dir) for p in delta["raw_topic_snapshots"])
    assert main(["vacuum", "--warehouse", str(audited["warehouse"]), "--retention-hours", "0", "--dry-run"]) == 0
    printed = {line.split()[0]: int(line.split()[1].replace(",", "")) for line in capsys.readouterr().out.splitlines()[2:-1]}
    assert {table: printed[table] for table in TOOLED} == {table: len(paths) for table, paths in ours.items()}
    assert not _missing_log_files(uri)


# ----------------------------------------------------------------------------------- a writer beside the audit
def test_a_delta_spark_optimize_between_an_audit_s_read_and_its_commit_loses_no_commit(delta_spark, tmp_path, monkeypatch):
    """Catches: the embedded commit overwriting the snapshot on a stale version (the OPTIMIZE's files and the new
    ones both live: two copies), or giving up instead of retrying on the fresh table (the audit's write lost), or
    the OPTIMIZE's commit dropped from the history."""
    spark = delta_spark
    store = DeltaStore(warehouse_root=str(tmp_path), engine="embedded")
    rows = [dict(replica="dc-a", topic="t", partition=0, offset=i, kind="START_OF_PUSH") for i in range(6)]
    key = "spark.sql.files.maxRecordsPerFile"
    before = spark.conf.get(key)
    spark.conf.set(key, "2")
    try:
        store.write_snapshot(spark, raw_frame(spark, rows, "s1").coalesce(1), "raw_topic_snapshots", "s1", STRUCT)
    finally:
        spark.conf.set(key, before)
    uri = store.table_uri("raw_topic_snapshots")
    staged = store.stage(spark, raw_frame(spark, rows[:4], "s1"), "raw_topic_snapshots", "s1", STRUCT)

    attempts, optimize = [], threading.Event()
    real = delta_embedded.commit_with_retries

    def racing(table_uri, commit):
        def first_after_optimize(dt_):
            attempts.append(dt_.version())
            if not optimize.is_set():  # the other writer commits after this attempt read the table
                optimize.set()
                worker = threading.Thread(target=lambda: spark.sql(f"OPTIMIZE delta.`{uri}`").collect())
                worker.start()
                worker.join()
            return commit(dt_)
        return real(table_uri, first_after_optimize)

    monkeypatch.setattr(delta_embedded, "commit_with_retries", racing)
    result = store.commit(spark, staged)
    operations = [h["operation"] for h in _history(spark, uri)]
    assert operations[-2:] == ["OPTIMIZE", "WRITE"], operations
    assert len(attempts) == 2 and attempts[1] == attempts[0] + 1, attempts
    assert result.version == len(operations) - 1
    assert sorted(r["offset"] for r in store.read_snapshot(spark, "raw_topic_snapshots", "s1", STRUCT).collect()) == [0, 1, 2, 3]
    assert delta_spark.read.format("delta").load(uri).count() == 4
