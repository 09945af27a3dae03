"""Housekeeping: VACUUM removes what no version needs once past the retention, and nothing else."""
from __future__ import annotations

import os
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from resources.delta_store import DeltaStore
from resources.delta_vacuum import partitions_to_compact
from resources.errors import InvalidSetting
from schemas.raw import RawTopicSnapshots
from tests.rows import raw_frame

STRUCT = RawTopicSnapshots.to_structtype()
TABLE = "raw_topic_snapshots"
DAY = 24 * 3600


def _rows(n: int, start: int = 0) -> list[dict]:
    return [
        {"replica": "dc-a", "topic": "t_v1", "partition": 0, "offset": i, "kind": "PUT", "key": f"k{i}",
         "value": f"v{i}", "source_region": "dc-a", "source_offset": i, "hb_vector": {"dc-a": i}}
        for i in range(start, start + n)
    ]


@pytest.fixture()
def store(tmp_path) -> DeltaStore:
    return DeltaStore(warehouse_root=str(tmp_path / "warehouse"), engine="embedded")


def _write(spark, store, snapshot_id: str, n: int, rows_per_file: int = 0):
    df = raw_frame(spark, _rows(n), snapshot_id).coalesce(1)
    key = "spark.sql.files.maxRecordsPerFile"
    before = spark.conf.get(key)
    spark.conf.set(key, str(rows_per_file))
    try:
        return store.write_snapshot(spark, df, TABLE, snapshot_id, STRUCT)
    finally:
        spark.conf.set(key, before)


def _files(folder: str) -> dict[str, int]:
    """Every file under ``folder`` (relative path -> size), the Delta log aside."""
    found = {}
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if d != "_delta_log"]
        for name in names:
            path = os.path.join(root, name)
            found[os.path.relpath(path, folder)] = os.path.getsize(path)
    return found


def _age(folder: str, seconds: float) -> None:
    """Make every file and folder under ``folder`` (and itself) ``seconds`` old."""
    moment = time.time() - seconds
    for root, dirs, names in os.walk(folder):
        for name in names + dirs:
            os.utime(os.path.join(root, name), (moment, moment))
    os.utime(folder, (moment, moment))


def _versions(uri: str, upto: int = 0) -> dict[int, list[tuple]]:
    """Every version's rows (up to ``upto``) as delta-rs reads them (offset, snapshot), sorted."""
    latest = upto or DeltaTable(uri).version()
    out = {}
    for version in range(1, latest + 1):
        table = pa.table(DeltaTable(uri, version=version).to_pyarrow_table(columns=["snapshot_id", "offset"]))
        out[version] = sorted(zip(table["snapshot_id"].to_pylist(), table["offset"].to_pylist()))
    return out


def test_a_crashed_writes_files_go_once_past_the_retention_and_every_version_stays_readable(spark, store):
    """Catches: orphans of a write that never committed left forever (VACUUM without ``full``), a
    vacuum that removes a live file of any committed version (time travel within the retention
    broken), a staged write younger than the retention removed (a write in flight would commit
    files that are gone), or the empty ``write-<uuid>`` folders left behind."""
    _write(spark, store, "s1", 5)
    _write(spark, store, "s1", 4)
    _write(spark, store, "s2", 2)
    uri = store.table_uri(TABLE)
    before = _versions(uri)
    crashed = store.stage(spark, raw_frame(spark, _rows(3), "s1"), TABLE, "s1", STRUCT)  # never committed
    in_flight = store.stage(spark, raw_frame(spark, _rows(3), "s2"), TABLE, "s2", STRUCT)
    _age(crashed.folder, 8 * DAY)
    orphans = {p: size for p, size in _files(uri).items() if p.startswith(crashed.relative_dir)}
    assert any(p.endswith(".parquet") for p in orphans)
    young = {p for p in _files(uri) if p.startswith(in_flight.relative_dir)}

    (result,) = store.vacuum()

    assert (result.table, result.files, result.bytes) == (TABLE, len(orphans), sum(orphans.values()))
    assert not os.path.exists(crashed.folder)  # with its empty folders
    assert result.folders == 2  # write-<uuid> and its snapshot_id=s1
    left = set(_files(uri))
    assert young <= left and not any(p.startswith(crashed.relative_dir) for p in left)
    # The superseded files are younger than the retention: every version reads as before (the
    # vacuum's own VACUUM START/END commits come after them).
    assert _versions(uri, upto=max(before)) == before
    back = store.read_all(spark, TABLE, STRUCT)
    assert sorted((r["snapshot_id"], r["offset"]) for r in back.collect()) == before[max(before)]


def test_a_dry_run_reports_what_would_go_and_removes_nothing(spark, store):
    """Catches: a dry run that deletes (or commits to the log), or that reports other files or
    bytes than the real run then removes."""
    _write(spark, store, "s1", 3)
    crashed = store.stage(spark, raw_frame(spark, _rows(2), "s1"), TABLE, "s1", STRUCT)
    _age(crashed.folder, 8 * DAY)
    uri = store.table_uri(TABLE)
    files, version = _files(uri), store.version(TABLE)

    (dry,) = store.vacuum(dry_run=True)

    assert dry.dry_run and dry.files > 0 and dry.bytes > 0 and dry.folders == 0
    assert _files(uri) == files and store.version(TABLE) == version
    (real,) = store.vacuum()
    assert (real.files, real.bytes) == (dry.files, dry.bytes)


def test_superseded_files_stay_for_the_retention_then_go_and_take_time_travel_with_them(spark, store):
    """Catches: a retention that is not applied to files removed by a later commit (the previous
    version's files deleted at once), or a vacuum that removes the current version's files."""
    _write(spark, store, "s1", 5)
    _write(spark, store, "s1", 4)
    uri = store.table_uri(TABLE)
    current = _versions(uri)[2]

    (kept,) = store.vacuum()  # the superseded file is minutes old
    assert kept.files == 0 and len(_versions(uri)) == 2  # (nothing removed: no VACUUM commits either)

    (gone,) = store.vacuum(retention_hours=0)
    assert gone.files == 1
    assert pa.table(DeltaTable(uri).to_pyarrow_table(columns=["snapshot_id", "offset"])).num_rows == len(current)
    assert sorted(r["offset"] for r in store.read_snapshot(spark, TABLE, "s1", STRUCT).collect()) == [0, 1, 2, 3]
    with pytest.raises(Exception):  # the trade-off: version 1's file is gone
        DeltaTable(uri, version=1).to_pyarrow_table()


def test_compaction_rewrites_a_snapshots_small_files_into_one_with_the_same_rows(spark, store):
    """Catches: compaction that changes, loses or duplicates rows, touches snapshots that do not need
    it, runs on a dry run, or leaves the file count as it was."""
    _write(spark, store, "s1", 20, rows_per_file=5)  # four small files
    _write(spark, store, "s2", 3)  # one file: nothing to compact
    uri = store.table_uri(TABLE)

    def live() -> dict[str, int]:
        actions = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pydict()
        counts: dict[str, int] = {}
        for part in actions["partition.snapshot_id"]:
            counts[part] = counts.get(part, 0) + 1
        return counts

    before = sorted(map(tuple, store.read_all(spark, TABLE, STRUCT).collect()))
    assert live() == {"s1": 4, "s2": 1}

    (dry,) = store.vacuum(dry_run=True, compact=True)
    assert dry.compacted == ("s1",) and dry.files_compacted == 4 and live() == {"s1": 4, "s2": 1}

    (done,) = store.vacuum(compact=True)
    assert done.compacted == ("s1",) and (done.files_compacted, done.files_written) == (4, 1)
    assert live() == {"s1": 1, "s2": 1}
    assert done.files == 0  # the four small files are superseded, kept for the retention
    assert sorted(map(tuple, store.read_all(spark, TABLE, STRUCT).collect())) == before
    (again,) = store.vacuum(compact=True)
    assert again.compacted == ()


def test_which_snapshots_need_compaction():
    """Catches: compacting a lone file or files near the target size (a rewrite for nothing)."""
    mib = 1024 * 1024
    files = [("a", 1 * mib), ("a", 2 * mib), ("b", 3 * mib), ("c", 60 * mib), ("c", 70 * mib), ("d", 1), ("d", 80 * mib)]
    assert partitions_to_compact(files, target_bytes=100 * mib) == ["a"]
    assert partitions_to_compact(files, target_bytes=100 * mib, min_files=1) == ["a", "b", "d"]


def test_a_negative_or_fractional_retention_and_an_unsafe_table_name_are_refused(store):
    """Catches: a retention that cannot be meant (negative) passed on to delta-rs, or a table name
    used in a path unchecked."""
    for bad in (-1, 1.5, True):
        with pytest.raises(InvalidSetting):
            store.vacuum(retention_hours=bad)
    with pytest.raises(InvalidSetting):
        store.vacuum(tables=["../elsewhere"])
    assert store.vacuum() == []  # no warehouse yet: nothing to do


def test_the_vacuum_job_runs_through_dagster_and_reports_each_table(tmp_path):
    """Catches: a job that does not reach the store resource, ignores its run config (retention,
    dry run), or whose output metadata lacks the per-table files and bytes removed."""
    from deltalake import write_deltalake

    from replica_lens.definitions import build_definitions

    warehouse = tmp_path / "warehouse"
    for table in ("alpha", "beta"):
        write_deltalake(str(warehouse / table), pa.table({"offset": [1, 2], "snapshot_id": ["s1", "s1"]}),
                        partition_by=["snapshot_id"])
    orphan = warehouse / "alpha" / "write-crashed" / "snapshot_id=s1" / "part-0.parquet"
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(b"x" * 100)
    _age(str(warehouse / "alpha" / "write-crashed"), 8 * DAY)
    defs = build_definitions(landing_root=str(tmp_path / "landing"), warehouse_root=str(warehouse),
                             spark_master="local[1]", delta_jars_dir=None)
    job = defs.resolve_job_def("vacuum_warehouse")

    def run(**config):
        result = job.execute_in_process(run_config={"ops": {"vacuum_tables": {"config": config}}})
        assert result.success
        (output,) = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
        return result.output_for_node("vacuum_tables"), output.event_specific_data.metadata

    rows, metadata = run(dry_run=True)
    assert orphan.exists() and metadata["dry_run"].value is True
    assert {r["table"]: (r["files_removed"], r["bytes_removed"]) for r in rows} == {"alpha": (1, 100), "beta": (0, 0)}
    rows, metadata = run(retention_hours=24 * 30)  # the orphan is 8 days old: within a 30-day retention
    assert orphan.exists() and metadata["files_removed"].value == 0
    rows, metadata = run()
    assert not orphan.exists() and not orphan.parent.parent.exists()
    assert (metadata["files_removed"].value, metadata["bytes_removed"].value) == (1, 100)
    by_table = {r.data["table"]: r.data for r in metadata["by_table"].value.records}
    assert by_table["alpha"]["files_removed"] == 1 and by_table["beta"]["bytes_removed"] == 0
    assert pa.table(DeltaTable(str(warehouse / "alpha")).to_pyarrow_table()).num_rows == 2


def test_files_another_tool_already_removed_are_neither_listed_nor_counted(spark, store):
    """Catches: a vacuum reporting (and counting in its summary) superseded files that are no longer there, as
    delta-rs lists every expired remove of the log: after Delta's own VACUUM (delta-spark) removed them, ours
    claimed to remove them again, and the two disagreed on what may be removed (tests/test_native_delta.py)."""
    _write(spark, store, "s1", 4)
    uri = store.table_uri("raw_topic_snapshots")
    first = set(pa.table(DeltaTable(uri).get_add_actions(flatten=True))["path"].to_pylist())
    _write(spark, store, "s1", 2)
    (listed,) = store.vacuum(retention_hours=0, dry_run=True, tables=["raw_topic_snapshots"])
    assert set(listed.paths) >= first and listed.files == len(listed.paths)
    for path in first:  # another tool's VACUUM, without a commit of ours to say so
        os.remove(os.path.join(uri, path))
    (after,) = store.vacuum(retention_hours=0, dry_run=True, tables=["raw_topic_snapshots"])
    assert not set(after.paths) & first and after.files == len(after.paths) == len(listed.paths) - len(first)
    (done,) = store.vacuum(retention_hours=0, tables=["raw_topic_snapshots"])
    assert done.paths == after.paths and done.files == after.files
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 2
