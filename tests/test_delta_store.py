"""The Delta store: one table per asset, snapshot partitions replaced atomically, both engines."""
from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from resources.delta_store import DeltaStore, UnsafeNameError, check_snapshot_id
from resources.spark import delta_jars, has_native_delta
from schemas.raw import RawTopicSnapshots
from tests.rows import raw_frame

STRUCT = RawTopicSnapshots.to_structtype()


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


def test_auto_engine_is_embedded_without_the_delta_jars(spark, tmp_path):
    if has_native_delta(spark):
        pytest.skip("delta-spark is loaded in this session")
    store = DeltaStore(warehouse_root=str(tmp_path), engine="auto")
    result = store.write_snapshot(spark, raw_frame(spark, _rows(1), "s1"), "raw_topic_snapshots", "s1", STRUCT)
    assert result.engine == "embedded"
    with pytest.raises(RuntimeError, match="delta_jars_dir"):
        DeltaStore(warehouse_root=str(tmp_path), engine="native").write_snapshot(
            spark, raw_frame(spark, _rows(1), "s1"), "raw_topic_snapshots", "s1", STRUCT
        )


JARS = __import__("os").environ.get("REPLICA_LENS_DELTA_JARS")


@pytest.mark.native_delta
@pytest.mark.skipif(not delta_jars(JARS), reason="no Delta Lake jars (set REPLICA_LENS_DELTA_JARS to a folder with them)")
def test_native_engine_writes_tables_the_embedded_reader_reads(tmp_path):
    """Runs where the Delta jars exist: a separate JVM with delta-spark, then delta-rs reads the result."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(
        f"""
        from resources.spark import build_spark_session
        from resources.delta_store import DeltaStore
        from schemas.raw import RawTopicSnapshots
        from tests.rows import raw_frame
        spark = build_spark_session(master="local[1]", delta_jars_dir={JARS!r})
        store = DeltaStore(warehouse_root={str(tmp_path)!r}, engine="native")
        rows = [dict(replica="dc-a", topic="t", partition=0, offset=i, kind="START_OF_PUSH") for i in range(3)]
        s = RawTopicSnapshots.to_structtype()
        store.write_snapshot(spark, raw_frame(spark, rows, "s1"), "raw_topic_snapshots", "s1", s)
        r = store.write_snapshot(spark, raw_frame(spark, rows[:2], "s1"), "raw_topic_snapshots", "s1", s)
        assert r.engine == "native" and r.row_count == 2, r
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True, cwd=str(__import__("pathlib").Path(__file__).parents[1]))
    table = pa.table(DeltaTable(str(tmp_path / "raw_topic_snapshots")).to_pyarrow_table())
    assert table.num_rows == 2
