"""``schemas.conform``: the same rows and schema as casting every column, with fewer casts."""
from __future__ import annotations

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.conform import conform

STRUCT = T.StructType([
    T.StructField("snapshot_id", T.StringType(), False),
    T.StructField("offset", T.LongType()),
    T.StructField("odd name", T.IntegerType()),
    T.StructField("vector", T.MapType(T.StringType(), T.LongType(), True)),
    T.StructField("entries", T.ArrayType(T.StringType(), True)),
    T.StructField("missing_later", T.StringType()),
])


def _plain(df, struct):
    """What every table's conform used to be: each column cast to its declared type."""
    return df.select([F.col(f"`{f.name}`").cast(f.dataType).alias(f.name) for f in struct.fields])


def _frame(spark):
    # offset as int (an atomic cast), the map's values not null (a cast that only changes nullability),
    # the array already declared, columns out of order, and one column the struct does not have.
    return spark.range(3).select(
        F.col("id").cast("int").alias("offset"),
        F.create_map(F.lit("dc-a"), F.col("id")).alias("vector"),
        F.lit("s1").alias("snapshot_id"),
        F.array(F.lit("x"), F.lit(None).cast("string")).alias("entries"),
        (F.col("id") * 2).cast("short").alias("odd name"),
        F.lit(None).cast("string").alias("missing_later"),
        F.lit("not in the table").alias("extra"),
    )


def test_conform_gives_the_rows_and_exact_schema_of_casting_every_column(spark):
    """Catches a skipped cast: comparing types by name (map<string,bigint>) would keep the map's
    non-null values, and the written file's schema would differ from the table's."""
    df = _frame(spark)
    assert df.schema["vector"].dataType.valueContainsNull is False
    conformed, plain = conform(df, STRUCT), _plain(df, STRUCT)
    assert conformed.schema == plain.schema
    assert [f.dataType for f in conformed.schema.fields] == [f.dataType for f in STRUCT.fields]
    assert conformed.columns == STRUCT.names
    assert sorted(conformed.collect()) == sorted(plain.collect())


def test_columns_are_computed_then_cast_to_their_declared_types(spark):
    """Catches an expression taken as it is (a null literal of no type, an int sum) instead of cast."""
    df = _frame(spark)
    columns = {"missing_later": F.lit(None), "offset": F.col("offset") + F.lit(1)}
    conformed = conform(df.drop("missing_later"), STRUCT, columns)
    assert conformed.schema == _plain(df, STRUCT).schema
    assert sorted(r["offset"] for r in conformed.collect()) == [1, 2, 3]
    assert {r["missing_later"] for r in conformed.collect()} == {None}


def test_a_frame_that_already_conforms_is_returned_as_it_is(spark):
    """Catches a select (one more plan to analyse, and a few round trips per column) where none is needed."""
    df = _plain(_frame(spark), STRUCT)
    assert conform(df, STRUCT) is df


def test_atomic_casts_and_odd_names_as_sql_text(spark):
    """Catches a name not quoted in the SQL text (``odd name`` would read as column ``odd`` aliased ``name``)."""
    struct = T.StructType([f for f in STRUCT.fields if f.name != "vector"])
    df = _frame(spark).drop("vector")
    conformed = conform(df, struct)
    assert conformed.schema == _plain(df, struct).schema
    assert sorted(r["odd name"] for r in conformed.collect()) == [0, 2, 4]


def test_a_frame_with_a_name_twice_is_not_taken_as_conforming(spark):
    """Catches a check by the set of names: a frame holding ``offset`` twice would be written as it is."""
    struct = T.StructType([T.StructField("offset", T.LongType())])
    df = spark.range(2).select(F.col("id").alias("offset"), F.col("id").alias("offset"))
    with pytest.raises(AnalysisException):
        conform(df, struct)
