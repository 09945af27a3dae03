"""The replica state's checksum counted on Arrow rows (``pipelines/state/arrow_checksum.py``) against Spark's.

A context's ``state_checksum`` is checked by Spark's ``xxhash64`` when the next audit uses the state
(``pipelines/state/prior.py``), but written from the sums the comparison's pass counts with numpy:
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
