"""``schemas.conform``: the same rows and schema as casting every column, with fewer casts; local frames."""
from __future__ import annotations

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.conform import conform, local_frame
from schemas.state import ReplicaState

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


def _leaf_plan(df) -> str:
    """The class of the analyzed plan's only leaf (LocalRelation, or LogicalRDD for a Python RDD)."""
    plan = df._jdf.queryExecution().analyzed()
    while plan.children().size() > 0:
        plan = plan.children().head()
    return plan.getClass().getSimpleName()


def test_a_local_frame_holds_its_rows_in_the_plan_with_the_exact_struct(spark):
    # Bugs caught: a local frame made from a Python list again (a Python RDD: the first query
    # reading it starts Spark's Python worker daemon), or one whose types or nullability drift
    # from the struct (a long read as an int, a map of nullable keys).
    rows = [("s1", 7, 3, {"dc-a": 1, "dc-b": None}, ["x", None], None), ("s1", None, None, None, None, "y")]
    df = local_frame(spark, rows, STRUCT)
    assert _leaf_plan(df) == "LocalRelation"
    assert df.schema == STRUCT
    assert [tuple(r) for r in df.collect()] == rows
    empty = local_frame(spark, [], ReplicaState.to_structtype())
    assert _leaf_plan(empty) == "LocalRelation"
    assert empty.schema == ReplicaState.to_structtype() and empty.count() == 0
    assert _leaf_plan(spark.createDataFrame([], STRUCT)) != "LocalRelation"  # what the test tells apart


def test_a_local_frame_refuses_rows_of_another_width(spark):
    with pytest.raises(ValueError, match="rows of 2 values for a struct of 6 fields"):
        local_frame(spark, [("s1", 1)], STRUCT)


def test_select_sql_selects_what_select_expr_selects_a_separator_in_a_text_included(spark):
    """``select_sql`` sends its texts as one string split in the JVM at a separator byte.

    Bug caught: a text split in two, or texts merged, at the separator (a column lost or a parse error),
    an empty text list, and a text that itself holds the separator byte not falling back to ``selectExpr``.
    """
    from schemas.conform import select_sql

    df = spark.createDataFrame([(1, "a")], "n long, `odd name` string")
    texts = ["n + 1 AS m", "`odd name`", "concat(`odd name`, '\x1e') AS sep", "'' AS empty"]
    for chosen in (texts, texts[:3], texts[1:2], ["'' AS empty", "n"]):
        got, want = select_sql(df, chosen), df.selectExpr(*chosen)
        assert got.schema == want.schema and got.collect() == want.collect(), chosen

