"""The replica state's checksum counted on Arrow rows (``pipelines/state/arrow_checksum.py``) against Spark's.

A context's ``state_checksum`` is checked by Spark's ``xxhash64`` when the next audit uses the state
(``pipelines/state/check.py``), but written from the sums the comparison's pass counts with numpy:
the two must agree bit for bit, on every type and length the state's columns can hold.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.state.arrow_checksum import checksum, row_hashes, signed
from pipelines.state.rows import checksum as spark_checksum

COLUMNS = ("text", "number", "vector", "other")
SCHEMA = T.StructType([
    T.StructField("text", T.StringType()),
    T.StructField("number", T.LongType()),
    T.StructField("vector", T.MapType(T.StringType(), T.LongType())),
    T.StructField("other", T.StringType()),
])
# Strings of every length class the algorithm treats apart (under 4, 4 to 7, 8 to 31, 32 and more, several
# stripes), with multi-byte characters; longs over the whole range; vectors with up to four regions.
texts = st.one_of(st.none(), st.text(max_size=80), st.text(alphabet="ab€😀", min_size=28, max_size=70))
numbers = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))
vectors = st.one_of(st.none(), st.dictionaries(st.sampled_from(["dc-a", "dc-b", "é", "Z", "r" * 33]),
                                               st.integers(0, 2**62), max_size=4))
rows = st.lists(st.tuples(texts, numbers, vectors, texts), min_size=1, max_size=40)


def spark_hashes(frame):
    hashed = F.xxhash64(*[F.array_sort(F.map_entries(F.col(c))) if c == "vector" else F.col(c) for c in COLUMNS])
    return [r[0] for r in frame.select(hashed).collect()], frame.select(spark_checksum(hashed)).first()[0]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=rows)
@example(rows=[("", 0, {}, None), (None, None, None, None), ("a" * 32, -1, {"dc-b": 1, "dc-a": 2}, "x" * 64)])
def test_the_arrow_hash_of_each_row_is_sparks_xxhash64(spark, rows):
    # Catches a string hashed other than as Spark's hashUnsafeBytes (a stripe, word, int or byte step wrong, a
    # length off by one, bytes read as characters), a long hashed as an int, a null hashed instead of skipped, a
    # vector's entries taken in map order rather than sorted by region, and a sum not taken modulo 2^64.
    frame = spark.createDataFrame(rows, SCHEMA)
    expected, total = spark_hashes(frame)
    hashes = row_hashes(frame.toArrow(), COLUMNS)
    assert hashes.view(np.int64).tolist() == expected
    assert checksum(hashes) == total
    # Shares of a checksum add up modulo 2^64, as the tasks' shares do on the driver.
    half = len(hashes) // 2
    assert signed(checksum(hashes[:half]) + checksum(hashes[half:])) == total


def test_the_arrow_hash_reads_sliced_and_chunked_columns(spark):
    # Catches offsets read from the start of a string or map buffer instead of the slice's (a task's rows are a slice
    # of the batch it received), and a table of several chunks hashed chunk by chunk with wrong seeds.
    rows = [(f"key-{i}" * (i % 7), i - 20, {"dc-a": i, "dc-b": 2 * i} if i % 3 else None, None) for i in range(40)]
    frame = spark.createDataFrame(rows, SCHEMA)
    expected, _ = spark_hashes(frame)
    table = frame.toArrow()
    chunked = pa.concat_tables([table.slice(0, 13), table.slice(13, 27)])
    assert row_hashes(chunked, COLUMNS).view(np.int64).tolist() == expected
    assert row_hashes(table.slice(5, 20), COLUMNS).view(np.int64).tolist() == expected[5:25]


def test_digests_of_one_length_broken_by_nulls_and_other_lengths_hash_as_spark_hashes_them(spark):
    # Catches the copy of one length's strings run by run (a column of digests: value_hash) taking a run from the
    # wrong place (one byte or one string off, the next run's start), treating strings apart as one run, or a region
    # name in a vector hashed with another entry's seed. Runs of 64-character digests are broken by nulls and by
    # shorter strings, in a slice, and twenty scattered lengths leave the same length's rows apart (gathered).
    digests = [None if i % 11 == 3 else "short-one" if i % 50 == 25 else f"{i:064x}" for i in range(200)]
    scattered = [f"{i:0{20 + i % 20}d}" for i in range(200)]
    rows = [(d, i, {"dc-b": i, "dc-a": -i, "dc-c": 2 * i} if i % 4 else {"dc-c": i}, s)
            for i, (d, s) in enumerate(zip(digests, scattered))]
    frame = spark.createDataFrame(rows, SCHEMA)
    expected, _ = spark_hashes(frame)
    table = frame.toArrow()
    assert row_hashes(table, COLUMNS).view(np.int64).tolist() == expected
    assert row_hashes(table.slice(7, 150), COLUMNS).view(np.int64).tolist() == expected[7:157]


def test_the_state_files_are_counted_as_sparks_read_of_them_counts_them(spark, tmp_path):
    # Catches the count of a carried state from its files (what an incremental audit checks a large state with)
    # differing from the count over Spark's read of the same files: a CONTEXT row counted, a column the file was
    # written without dropped or hashed as other than null, a column of another type than Spark reads (a partition
    # hashed as a long), the snapshot taken from elsewhere than the file's folder, a file's rows left out, or a file
    # holding views of strings (another writer's) failing the count.
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import to_arrow_schema

    from pipelines.state.check import found_sums, found_sums_of_files
    from pipelines.state.rows import CONTEXT, VERSION
    from resources.filesystem import Location
    from schemas.state import ReplicaState

    struct = ReplicaState.to_structtype()
    stored = T.StructType([f for f in struct.fields if f.name != "snapshot_id"])
    schema = to_arrow_schema(stored)

    def version(replica: str, i: int) -> dict:
        return {"row_kind": VERSION, "replica": replica, "topic": "orders", "partition": i % 2, "key": f"k{i}",
                "offset": 10 + i, "kind": "PUT", "value_hash": f"h{i}" * (i % 5), "source_region": "dc-a",
                "source_offset": i * 7, "write_ts": 1_700_000_000_000 + i, "key_touch": {"dc-a": i, "dc-b": 2 * i},
                "first_lower_bound": {"dc-b": i} if i % 3 else {}, "origin_snapshot_id": "s0",
                "touch_bound": {"dc-a": i + 1}, "reach": None if i % 4 else {"dc-a": 99}, "missing_before": i % 2}

    context = {"row_kind": CONTEXT, "replica": "dc-a", "topic": "orders", "partition": 0, "last_offset": 30,
               "state_rows": 9, "state_checksum": 5}
    written = {
        ("s1", 0): [version("dc-a", i) for i in range(12)],
        # Without two columns (written before they existed), and holding a context, which is not counted.
        ("s1", 1): [version("dc-b", i) for i in range(7)] + [context],
        ("s2", 0): [version("dc-a", i) for i in range(20, 25)],
    }
    locations: dict[str, list] = {}
    for (snapshot_id, number), rows in written.items():
        folder = tmp_path / f"snapshot_id={snapshot_id}"
        folder.mkdir(exist_ok=True)
        table = pa.Table.from_pylist(rows, schema=schema)
        if number == 1:
            table = table.drop_columns(["value", "missing_before"])
        if snapshot_id == "s2":  # rewritten by another writer (delta-rs writes views of strings)
            for name in ("row_kind", "replica", "value_hash"):
                table = table.set_column(table.schema.get_field_index(name), name, table[name].cast(pa.string_view()))
        pq.write_table(table, folder / f"part-{number}.parquet")
        locations.setdefault(snapshot_id, []).append(Location.of(str(folder / f"part-{number}.parquet")))

    read = spark.read.schema(stored).option("basePath", str(tmp_path)).parquet(
        *[str(tmp_path / f"snapshot_id={s}") for s in ("s1", "s2")])
    expected = sorted(tuple(r) for r in found_sums(read).collect())
    assert [(r[0], r[1], r[4]) for r in expected] == [("s1", "dc-a", 6), ("s1", "dc-a", 6), ("s1", "dc-b", 4),
                                                      ("s1", "dc-b", 3), ("s2", "dc-a", 3), ("s2", "dc-a", 2)]
    assert sorted(tuple(r) for r in found_sums_of_files(spark, locations).collect()) == expected
    # A file left out changes the counts.
    fewer = {"s1": locations["s1"][:1], "s2": locations["s2"]}
    assert sorted(tuple(r) for r in found_sums_of_files(spark, fewer).collect()) != expected
