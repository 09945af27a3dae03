"""The Delta store: one table per asset, snapshot partitions replaced atomically, both engines."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from resources.delta_store import DeltaStore, UnsafeNameError, check_snapshot_id
from resources.session import delta_jars, has_native_delta
from resources.tuning import PARQUET_BATCH_BYTES, PARQUET_BATCH_ROWS, parquet_batch_rows
from schemas.raw import RawTopicSnapshots
from tests.rows import raw_frame

STRUCT = RawTopicSnapshots.to_structtype()
# The Delta jars the suite's JVM loads (tests/conftest.py), if any.
SUITE_JARS = __import__("os").environ.get("REPLICA_LENS_TEST_DELTA_JARS")


def _columns(struct) -> list[tuple[str, str]]:
    return [(f.name, f.dataType.simpleString()) for f in struct.fields]


def _rows(n: int, replica: str = "dc-a") -> list[dict]:
    return [
        {"replica": replica, "topic": "t_v1", "partition": 0, "offset": i, "kind": "PUT", "key": f"k{i}",
         "value": f"v{i}", "source_region": "dc-a", "source_offset": i, "hb_vector": None}
        for i in range(n)
    ]


@pytest.fixture()
def store(tmp_path) -> DeltaStore:
    return DeltaStore(warehouse_root=str(tmp_path / "warehouse"), engine="embedded")


def test_write_then_read_round_trips_every_column(spark, store):
    rows = _rows(3)
    rows[0]["hb_vector"] = {"dc-a": 4, "dc-b": 7}
    rows[1]["extra_fields"] = {"trace": '"abc"'}
    df = raw_frame(spark, rows, snapshot_id="s1")
    result = store.write_snapshot(spark, df, "raw_topic_snapshots", "s1", STRUCT)

    assert result.row_count == 3
    assert result.table_uri.endswith("/warehouse/raw_topic_snapshots")
    back = store.read_snapshot(spark, "raw_topic_snapshots", "s1", STRUCT)
    assert _columns(back.schema) == _columns(STRUCT)
    assert sorted(map(tuple, back.collect())) == sorted(map(tuple, df.collect()))


def test_rematerializing_a_snapshot_replaces_its_rows_and_keeps_the_others(spark, store):
    store.write_snapshot(spark, raw_frame(spark, _rows(5), "s1"), "raw_topic_snapshots", "s1", STRUCT)
    store.write_snapshot(spark, raw_frame(spark, _rows(2), "s2"), "raw_topic_snapshots", "s2", STRUCT)
    first = store.version("raw_topic_snapshots")
    store.write_snapshot(spark, raw_frame(spark, _rows(4), "s1"), "raw_topic_snapshots", "s1", STRUCT)

    assert store.version("raw_topic_snapshots") == first + 1  # one commit per write
    assert store.read_snapshot(spark, "raw_topic_snapshots", "s1", STRUCT).count() == 4
    assert store.read_snapshot(spark, "raw_topic_snapshots", "s2", STRUCT).count() == 2
    assert store.read_all(spark, "raw_topic_snapshots", STRUCT).count() == 6
    # delta-rs, an independent reader, sees the same: no duplicates, no leftovers.
    table = pa.table(DeltaTable(store.table_uri("raw_topic_snapshots")).to_pyarrow_table())
    per_snapshot = {s: table.filter(pa.compute.equal(table["snapshot_id"], s)).num_rows for s in ("s1", "s2")}
    assert per_snapshot == {"s1": 4, "s2": 2}


def test_reading_a_missing_table_or_snapshot_gives_an_empty_frame_with_the_schema(spark, store):
    assert store.read_snapshot(spark, "raw_topic_snapshots", "nope", STRUCT).count() == 0
    store.write_snapshot(spark, raw_frame(spark, _rows(1), "s1"), "raw_topic_snapshots", "s1", STRUCT)
    empty = store.read_snapshot(spark, "raw_topic_snapshots", "other", STRUCT)
    assert empty.count() == 0 and _columns(empty.schema) == _columns(STRUCT)


def test_an_empty_result_empties_the_snapshot(spark, store):
    store.write_snapshot(spark, raw_frame(spark, _rows(3), "s1"), "raw_topic_snapshots", "s1", STRUCT)
    result = store.write_snapshot(spark, raw_frame(spark, [], "s1"), "raw_topic_snapshots", "s1", STRUCT)
    assert result.row_count == 0
    assert store.read_snapshot(spark, "raw_topic_snapshots", "s1", STRUCT).count() == 0


@pytest.mark.parametrize("bad", ["../x", "a/b", ".hidden", "", "x" * 129, "a b", "-lead", "snap\n"])
def test_unsafe_snapshot_ids_are_refused_before_any_path_is_built(spark, store, bad):
    with pytest.raises(UnsafeNameError):
        check_snapshot_id(bad)
    with pytest.raises(UnsafeNameError):
        store.write_snapshot(spark, raw_frame(spark, _rows(1)), "raw_topic_snapshots", bad, STRUCT)


def test_auto_engine_is_embedded_without_the_delta_jars(spark, tmp_path, monkeypatch):
    """Catches: ``auto`` taking delta-spark for loaded where it is not (every write would fail), and ``native``
    silently writing with delta-rs instead of refusing, naming the setting. (The suite's JVM may have the jars:
    the session is made to say it has not.)"""
    from resources import delta_native

    monkeypatch.setattr(delta_native, "has_native_delta", lambda session: False)
    store = DeltaStore(warehouse_root=str(tmp_path), engine="auto")
    result = store.write_snapshot(spark, raw_frame(spark, _rows(1), "s1"), "raw_topic_snapshots", "s1", STRUCT)
    assert result.engine == "embedded"
    with pytest.raises(RuntimeError, match="delta_jars_dir"):
        DeltaStore(warehouse_root=str(tmp_path), engine="native").write_snapshot(
            spark, raw_frame(spark, _rows(1), "s1"), "raw_topic_snapshots", "s1", STRUCT
        )


def test_a_store_of_unset_engine_writes_embedded_in_a_session_with_delta_spark(spark, tmp_path, monkeypatch):
    """Catches: the suite (and an audit of no engine setting) switched to delta-spark because the jars are loaded:
    the embedded engine is the default wherever no setting asks for another (resources/settings.py)."""
    from resources import delta_native

    monkeypatch.setattr(delta_native, "has_native_delta", lambda session: True)
    result = DeltaStore(warehouse_root=str(tmp_path)).write_snapshot(
        spark, raw_frame(spark, _rows(1), "s1"), "raw_topic_snapshots", "s1", STRUCT)
    assert result.engine == "embedded"


@pytest.mark.native_delta
@pytest.mark.skipif(not delta_jars(SUITE_JARS), reason="no Delta Lake jars (./scripts/setup-jvm.sh puts them in jvm/lib/delta)")
def test_native_engine_writes_tables_the_embedded_reader_reads(spark, tmp_path):
    """Catches: the native engine refused although the jars are loaded (delta-spark's classes looked up outside
    Spark's class loader), a re-write of a snapshot leaving two copies, and a table delta-rs cannot read."""
    assert has_native_delta(spark), "the suite's JVM was started with the Delta jars but delta-spark is not usable"
    store = DeltaStore(warehouse_root=str(tmp_path), engine="native")
    rows = [dict(replica="dc-a", topic="t", partition=0, offset=i, kind="START_OF_PUSH") for i in range(3)]
    store.write_snapshot(spark, raw_frame(spark, rows, "s1"), "raw_topic_snapshots", "s1", STRUCT)
    result = store.write_snapshot(spark, raw_frame(spark, rows[:2], "s1"), "raw_topic_snapshots", "s1", STRUCT)
    assert result.engine == "native" and result.row_count == 2, result
    table = pa.table(DeltaTable(str(tmp_path / "raw_topic_snapshots")).to_pyarrow_table())
    assert table.num_rows == 2
    assert store.read_snapshot(spark, "raw_topic_snapshots", "s1", STRUCT).count() == 2


def _write_in_files_of(spark, store, df, snapshot_id: str, rows_per_file: int):
    """Write ``df`` (one partition, in offset order) as files of ``rows_per_file``: disjoint offset ranges."""
    key = "spark.sql.files.maxRecordsPerFile"
    before = spark.conf.get(key)
    spark.conf.set(key, str(rows_per_file))
    try:
        return store.write_snapshot(spark, df, "raw_topic_snapshots", snapshot_id, STRUCT)
    finally:
        spark.conf.set(key, before)


def _file_stats_from_data(table: pa.Table) -> tuple[dict, dict, dict]:
    """Min, max and null count per column computed from the rows themselves."""
    low, high, nulls = {}, {}, {}
    for name in table.column_names:
        column = table[name]
        nulls[name] = column.null_count
        if pa.types.is_integer(column.type) or pa.types.is_string(column.type) or pa.types.is_boolean(column.type):
            bounds = pa.compute.min_max(column).as_py()
            low[name], high[name] = bounds["min"], bounds["max"]
    return low, high, nulls


def test_every_committed_file_carries_statistics_that_match_its_rows(spark, store):
    """Catches: add actions without minValues/maxValues/nullCount (readers cannot skip files), a
    bound that does not hold for the file's rows, a truncated string max, or the partition
    column in the stats instead of partitionValues."""
    import json

    rows = _rows(60)
    for row in rows[::3]:
        row.update(kind="DELETE", value=None)
    for row in rows[::4]:
        row["hb_vector"] = {"dc-a": row["offset"]}
    rows[7]["key"] = "k" * 50  # longer than the 32-character prefix: no max for key in its file
    _write_in_files_of(spark, store, raw_frame(spark, rows, "s1").coalesce(1), "s1", 30)

    dt = DeltaTable(store.table_uri("raw_topic_snapshots"))
    actions = pa.table(dt.get_add_actions(flatten=False)).to_pylist()
    assert len(actions) == 2
    log = [json.loads(line) for line in open(f"{store.table_uri('raw_topic_snapshots')}/_delta_log/00000000000000000001.json")]
    stats_by_path = {a["add"]["path"]: json.loads(a["add"]["stats"]) for a in log if "add" in a}
    for path, stats in stats_by_path.items():
        data = pq.read_table(f"{store.table_uri('raw_topic_snapshots')}/{path}")
        low, high, nulls = _file_stats_from_data(data)
        assert stats["numRecords"] == data.num_rows == 30
        assert "snapshot_id" not in stats["minValues"] and "snapshot_id" not in stats["nullCount"]
        for name, expected in nulls.items():
            if name in ("hb_vector", "extra_fields"):
                # A map's count is written only when the footer proves it (0 nulls), else left out.
                if name in stats["nullCount"]:
                    assert stats["nullCount"][name] == expected == 0, (path, name)
            else:
                assert stats["nullCount"][name] == expected, (path, name)
        for name, value in low.items():
            if value is None:  # only nulls: no bounds
                assert name not in stats["minValues"] and name not in stats["maxValues"]
                continue
            assert stats["minValues"][name] == (value[:32] if isinstance(value, str) else value), (path, name)
            if isinstance(high[name], str) and len(high[name]) > 32:
                assert name not in stats["maxValues"], (path, name)
            else:
                assert stats["maxValues"][name] == high[name], (path, name)
    offsets = sorted((s["minValues"]["offset"], s["maxValues"]["offset"]) for s in stats_by_path.values())
    assert offsets == [(0, 29), (30, 59)]


def test_a_filter_on_a_data_column_skips_files_through_the_statistics(spark, store):
    """Catches: statistics missing or unreadable by delta-rs (``numRecords`` only): a filter on
    ``offset`` then reads every file of the snapshot instead of the one that can hold a match."""
    import pyarrow.compute as pc

    rows = _rows(40)
    _write_in_files_of(spark, store, raw_frame(spark, rows, "s1").coalesce(1), "s1", 20)

    dataset = DeltaTable(store.table_uri("raw_topic_snapshots")).to_pyarrow_dataset()
    wanted = pc.field("offset") >= 25
    assert len(list(dataset.get_fragments())) == 2
    assert len(list(dataset.get_fragments(filter=wanted))) == 1
    assert len(list(dataset.get_fragments(filter=pc.field("offset") > 100))) == 0
    assert sorted(dataset.to_table(filter=wanted)["offset"].to_pylist()) == list(range(25, 40))


def test_only_string_columns_whose_values_repeat_are_dictionary_encoded(spark, store):
    """Catches: the writer options not reaching Spark's Parquet writer (every column dictionary-encoded,
    the cost the policy removes), the per-column exceptions ignored, or a column's values changed by
    the encoding (the round trip compares every row)."""
    rows = _rows(40)
    for row in rows[::5]:
        row["hb_vector"] = {"dc-a": row["offset"], "dc-b": 3}
    df = raw_frame(spark, rows, "s1").coalesce(1)
    store.write_snapshot(spark, df, "raw_topic_snapshots", "s1", STRUCT)

    actions = pa.table(DeltaTable(store.table_uri("raw_topic_snapshots")).get_add_actions(flatten=False)).to_pylist()
    footer = pq.ParquetFile(f"{store.table_uri('raw_topic_snapshots')}/{actions[0]['path']}").metadata.row_group(0)
    dictionary = {
        footer.column(i).path_in_schema: any("DICTIONARY" in e for e in footer.column(i).encodings)
        for i in range(footer.num_columns)
    }
    assert dictionary["replica"] and dictionary["topic"] and dictionary["kind"] and dictionary["source_region"]
    for name in ("offset", "partition", "source_offset", "key", "value", "hb_vector.key_value.value"):
        assert not dictionary[name], name
    back = store.read_snapshot(spark, "raw_topic_snapshots", "s1", STRUCT)
    assert sorted(map(tuple, back.collect())) == sorted(map(tuple, df.collect()))


SUMMARY = "heartbeat_segment_summary"
ADDED = ("first_kind", "opening_has_vector")  # required columns the summary gained in an upgrade


def _upgraded_summary(spark, store: DeltaStore) -> None:
    """heartbeat_segment_summary as an upgrade leaves it: snapshot s1 written before the ADDED columns (in two
    files, one per row), s2 after; Delta adds the columns to the table's schema on s2's write."""
    from pyspark.sql import types as T

    from pipelines.segments import annotate_segments, summarize_segments
    from schemas.segments import HeartbeatSegmentSummary
    from tests.reference_leapfrog import heartbeat, put, sop, stream

    new = HeartbeatSegmentSummary.to_structtype()
    old = T.StructType([f for f in new.fields if f.name not in ADDED])
    rows = stream("dc-a", "t", [sop(), put("k", "x", "dc-a", 0), heartbeat("dc-a", 1, {"dc-a": 1})])

    def summary(snapshot_id: str):
        return summarize_segments(annotate_segments(raw_frame(spark, rows, snapshot_id))).coalesce(1)

    key = "spark.sql.files.maxRecordsPerFile"
    before = spark.conf.get(key)
    spark.conf.set(key, "1")
    try:
        store.write_snapshot(spark, summary("s1").select(*old.fieldNames()), SUMMARY, "s1", old)
    finally:
        spark.conf.set(key, before)
    store.write_snapshot(spark, summary("s2"), SUMMARY, "s2", new)


def _refused(extra: str = ""):
    """pytest.raises for the refusal of snapshot s1 (``extra``: a regex of what follows the columns)."""
    from resources.delta_log import OutdatedSnapshot

    return pytest.raises(
        OutdatedSnapshot,
        match=rf"snapshot s1 .*first_kind, opening_has_vector that the table now requires{extra}: materialize "
              rf"{SUMMARY} of snapshot s1 again",
    )


def test_a_snapshot_written_before_a_required_column_existed_is_refused_by_name(spark, store):
    # Upgrading: heartbeat_segment_summary gained first_kind (required) and opening_has_vector. An existing
    # warehouse's table must take the next audit's write (Delta adds the columns) and keep the new snapshot
    # readable. The old snapshot's files lack the required columns: every reader would return null there, a value
    # no writer produced, so reading it (alone or with the others) is refused, naming the table and snapshot to
    # materialize again. Reading through read_stage, as every asset does, catches a reader that forgets the
    # model's required columns.
    from assets.tables import read_stage
    from pipelines.watermarks import partition_watermarks
    from schemas.segments import HeartbeatSegmentSummary

    _upgraded_summary(spark, store)
    assert partition_watermarks(read_stage(spark, store, SUMMARY, "s2")).first()["starts_with_sop"] is True
    for snapshot_id in ("s1", None):
        with _refused():
            read_stage(spark, store, SUMMARY, snapshot_id)
    # Without required columns (a nullable addition) the old snapshot reads, its new columns null.
    new = HeartbeatSegmentSummary.to_structtype()
    assert {(r["snapshot_id"], r["first_kind"]) for r in store.read_all(spark, SUMMARY, new).collect()} == {
        ("s1", None), ("s2", "START_OF_PUSH"), ("s2", "HEARTBEAT")
    }


def test_an_older_snapshot_is_not_compacted_and_is_refused_when_another_tool_compacted_it(spark, store):
    # A compaction rewrites a snapshot's files with the table's current columns, padding those the snapshot never
    # had with nulls: its footers then hold the required columns and only the nulls tell. Catches: our own
    # vacuum --compact padding an older snapshot (the check could no longer see it for map columns, whose nulls
    # the Delta log does not count), and a read that trusts the footers of a snapshot compacted by another tool
    # (delta-rs, delta-spark OPTIMIZE) although the log counts nulls in a required column.
    from assets.tables import read_stage

    _upgraded_summary(spark, store)
    uri = store.table_uri(SUMMARY)

    def s1_files() -> int:
        return pa.table(DeltaTable(uri).get_add_actions(flatten=True))["partition.snapshot_id"].to_pylist().count("s1")

    assert s1_files() == 2
    for dry_run in (True, False):
        (result,) = store.vacuum(compact=True, dry_run=dry_run, tables=[SUMMARY])
        assert result.compacted == () and s1_files() == 2
        assert (
            f"compaction of s1 skipped (written before column(s) {', '.join(sorted(ADDED))}: "
            f"materialize {SUMMARY} of snapshot s1 again first)" in result.note
        )

    DeltaTable(uri).optimize.compact(partition_filters=[("snapshot_id", "=", "s1")])  # another tool's OPTIMIZE
    assert s1_files() == 1
    with _refused(r" \(its files hold first_kind, opening_has_vector as nulls: compacted after the upgrade\)"):
        read_stage(spark, store, SUMMARY, "s1")


def test_a_snapshot_s_largest_value_comes_from_the_log_and_sizes_the_reader_s_batches(spark, store):
    # Bugs caught: the largest value of another snapshot (or of every snapshot) taken for this one's, a maximum read
    # from the data instead of the log (it would read every value), an unknown size taken for a small one, and a
    # batch that still holds more than its budget of large values (or shrinks batches of small ones).
    small, large = _rows(3), _rows(2, replica="dc-b")
    large[1]["value"] = "x" * 5000
    store.write_snapshot(spark, raw_frame(spark, small, "s1"), "raw_topic_snapshots", "s1", STRUCT)
    store.write_snapshot(spark, raw_frame(spark, small + large, "s2"), "raw_topic_snapshots", "s2", STRUCT)
    assert store.column_max("raw_topic_snapshots", "s1", "value_bytes") == 2
    assert store.column_max("raw_topic_snapshots", "s2", "value_bytes") == 5000
    assert store.column_max("raw_topic_snapshots", "s3", "value_bytes") is None
    assert store.column_max("no_such_table", "s1", "value_bytes") is None
    assert parquet_batch_rows(None) is None and parquet_batch_rows(2) is None
    assert parquet_batch_rows(PARQUET_BATCH_BYTES // PARQUET_BATCH_ROWS) is None
    rows = parquet_batch_rows(16 * 1024 * 1024)
    assert rows * 16 * 1024 * 1024 <= PARQUET_BATCH_BYTES and rows >= 1
    assert parquet_batch_rows(10 * PARQUET_BATCH_BYTES) == 1


def test_reading_a_snapshot_of_large_values_in_batches_gives_what_one_read_gives(spark, store, monkeypatch):
    # Bugs caught: the batch path (taken when the log says a value is large) losing rows between batches or files,
    # filtering or projecting otherwise than the one read, another snapshot's rows, or a computed column (a value
    # cut to what a page shows) not applied.
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    from resources import delta_reader
    from resources.delta_reader import TableReader

    rows = _rows(40) + _rows(30, replica="dc-b")
    for i, row in enumerate(rows):
        row["value"] = f"{i:03d}" + "v" * (30_000 if i % 7 == 0 else 10)
    store.write_snapshot(spark, raw_frame(spark, rows, "s1"), "raw_topic_snapshots", "s1", STRUCT)
    store.write_snapshot(spark, raw_frame(spark, _rows(5), "s2"), "raw_topic_snapshots", "s2", STRUCT)
    assert parquet_batch_rows(store.column_max("raw_topic_snapshots", "s1", "value_bytes")) is not None
    reader = TableReader(store.warehouse_root)
    where = ds.field("key").isin(["k1", "k7", "k14", "k29"]) & (ds.field("kind") == "PUT")
    columns = ["replica", "offset", "key", "value"]
    cut = {"value": pc.utf8_slice_codeunits(ds.field("value"), 0, 5)}

    def read(**more) -> list[tuple]:
        found = reader.read("raw_topic_snapshots", "s1", where, columns, **more).to_pylist()
        return sorted(tuple(r[c] for c in columns) for r in found)

    whole = read()
    assert len(whole) == 8 and {len(r[3]) for r in whole} == {13, 30_003}
    assert read(sized_by="value_bytes") == whole
    # Batches of 3 rows: many batches per file, and batches without a wanted row.
    monkeypatch.setattr(delta_reader, "parquet_batch_rows", lambda largest: 3)
    assert read(sized_by="value_bytes") == whole
    assert read(sized_by="value_bytes", computed=cut) == read(computed=cut) == [(*r[:3], r[3][:5]) for r in whole]


def test_a_compaction_committed_between_a_commit_s_read_and_its_write_leaves_one_copy(spark, store, monkeypatch):
    """Catches: the embedded commit letting delta-rs rebase an overwrite built on a stale version over a concurrent
    OPTIMIZE (delta-rs 1.6 sees no conflict: the compacted file stays live beside the new files, two copies of the
    snapshot), and a commit that gives up instead of being rebuilt on the fresh table. The other writer here is
    delta-rs' own compaction; tests/test_native_delta.py races delta-spark's OPTIMIZE the same way."""
    from resources import delta_embedded

    _write_in_files_of(spark, store, raw_frame(spark, _rows(6), "s1").coalesce(1), "s1", 2)
    uri = store.table_uri("raw_topic_snapshots")
    staged = store.stage(spark, raw_frame(spark, _rows(4), "s1"), "raw_topic_snapshots", "s1", STRUCT)
    attempts = []
    real = delta_embedded.commit_with_retries

    def racing(table_uri, commit):
        def after_a_compaction(dt_):
            attempts.append(dt_.version())
            if len(attempts) == 1:  # another writer commits once this attempt has read the table
                assert DeltaTable(uri).optimize.compact()["numFilesRemoved"] == 3
            return commit(dt_)
        return real(table_uri, after_a_compaction)

    monkeypatch.setattr(delta_embedded, "commit_with_retries", racing)
    result = store.commit(spark, staged)
    assert attempts == [attempts[0], attempts[0] + 1] and result.version == attempts[0] + 2
    assert sorted(r["offset"] for r in store.read_snapshot(spark, "raw_topic_snapshots", "s1", STRUCT).collect()) == [0, 1, 2, 3]
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 4


def test_a_retention_delete_racing_a_compaction_leaves_no_row_of_the_deleted_snapshot(spark, store, monkeypatch):
    """Catches: a delete of whole snapshots committed over a concurrent compaction of them without being rebuilt on
    the fresh table (the compacted file, named by no remove of the delete, would bring the deleted rows back).
    delta-rs' delete detects this conflict itself today; the commit goes through ``commit_with_retries`` all the same."""
    from resources import delta_embedded

    _write_in_files_of(spark, store, raw_frame(spark, _rows(6), "s1").coalesce(1), "s1", 2)
    store.write_snapshot(spark, raw_frame(spark, _rows(2), "s2"), "raw_topic_snapshots", "s2", STRUCT)
    uri = store.table_uri("raw_topic_snapshots")
    real, attempts = delta_embedded.commit_with_retries, []

    def racing(table_uri, commit):
        def after_a_compaction(dt_):
            attempts.append(dt_.version())
            if len(attempts) == 1:
                DeltaTable(uri).optimize.compact(partition_filters=[("snapshot_id", "=", "s1")])
            return commit(dt_)
        return real(table_uri, after_a_compaction)

    monkeypatch.setattr(delta_embedded, "commit_with_retries", racing)
    store.delete_snapshots(spark, "raw_topic_snapshots", ["s1"])
    assert len(attempts) == 2
    assert store.snapshot_ids("raw_topic_snapshots") == ["s2"]
    assert DeltaTable(uri).to_pyarrow_table().num_rows == 2
