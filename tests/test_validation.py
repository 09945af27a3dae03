"""The compiled validation (schemas/validation.py) finds exactly what pandera's own validation finds.

``validation_errors`` compiles a pandera model's declared rules (structure, ``nullable=False``,
``ge``/``le``/``isin``...) into one aggregation; ``pandera_errors`` is pandera's PySpark
validation, kept as the reference. pandera runs about one Spark job per rule, so the
reference is slow: the property test uses few, small frames and no shrinking.
"""
from __future__ import annotations

import pandera.pyspark as pa
import pytest
from hypothesis import Phase, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.registry import model_for, struct_for
from schemas.conform import sql_literal
from schemas.validation import TableValidation, data_rules, pandera_errors, validation_errors
from tests.examples import examples
from tests.spark_work import measure_work

# Between them: ge (every model), le (heartbeat_segment_summary.heartbeats), isin (kind,
# anomaly, bound_reason), nullable=False, nullable columns with value checks, map columns.
PROPERTY_MODELS = (
    "divergence_summary",
    "heartbeat_segments",
    "heartbeat_segment_summary",
    "raw_topic_snapshots",
    "stream_anomalies",
    "compaction_bounds",
)
# Small (3 nullable=False columns, one isin): pandera validates it in a handful of jobs.
SMALL_MODEL = "raw_topic_quarantine"

_INT_RANGE = {
    T.IntegerType: (-(2**31), 2**31 - 1),
    T.LongType: (-(2**63), 2**63 - 1),
}


def key(violations) -> set[tuple]:
    return {(v.level, v.reason, v.column, v.check) for v in violations}


def any_value(dtype: T.DataType) -> st.SearchStrategy:
    """Any non-null value of a Spark type, as ``createDataFrame`` takes it."""
    if isinstance(dtype, T.StringType):
        return st.text(alphabet="abAB _", max_size=4)
    if type(dtype) in _INT_RANGE:
        lo, hi = _INT_RANGE[type(dtype)]
        return st.integers(lo, hi)
    if isinstance(dtype, T.DoubleType):
        return st.floats(allow_nan=True, allow_infinity=True)
    if isinstance(dtype, T.BooleanType):
        return st.booleans()
    if isinstance(dtype, T.MapType):
        values = any_value(dtype.valueType)
        if dtype.valueContainsNull:
            values = st.none() | values
        return st.dictionaries(any_value(dtype.keyType), values, max_size=2)
    raise NotImplementedError(f"tests/test_validation.py: no strategy for {dtype!r}; add one to any_value")


def column_values(column, dtype: T.DataType) -> tuple[st.SearchStrategy, st.SearchStrategy]:
    """(values that pass every check of the column, values that may break them) for one model column.

    Derived from the model's declaration, so the frames follow the models when they change; a
    check this test does not know fails here rather than going untested.
    """
    valid = any_value(dtype)
    edges: list = []  # values on and either side of each bound, and near misses of isin lists
    if type(dtype) in _INT_RANGE:
        lo, hi = _INT_RANGE[type(dtype)]
    for check in column.checks:
        stats = check.statistics
        if check.name in ("greater_than_or_equal_to", "greater_than") and type(dtype) in _INT_RANGE:
            lo = max(lo, stats["min_value"] + (check.name == "greater_than"))
            edges += [stats["min_value"] + d for d in (-1, 0, 1)]
        elif check.name in ("less_than_or_equal_to", "less_than") and type(dtype) in _INT_RANGE:
            hi = min(hi, stats["max_value"] - (check.name == "less_than"))
            edges += [stats["max_value"] + d for d in (-1, 0, 1)]
        elif check.name == "isin":
            allowed = list(stats["allowed_values"])
            valid = st.sampled_from(allowed)
            edges += [a.lower() for a in allowed] + [allowed[0] + " ", "", allowed[-1][:-1]]
        else:
            raise NotImplementedError(
                f"tests/test_validation.py: check {check.name!r} on {column.name!r} has no strategy; add it to column_values"
            )
    if type(dtype) in _INT_RANGE:
        valid = st.integers(lo, hi)
        type_lo, type_hi = _INT_RANGE[type(dtype)]
        edges = [e for e in edges if type_lo <= e <= type_hi]
    dirty = st.none() | valid | any_value(dtype)
    if edges:
        dirty = dirty | st.sampled_from(edges)
    return valid, dirty


@st.composite
def tables(draw, names=PROPERTY_MODELS):
    """(table name, rows): 0 to 6 rows with the model's exact struct; about a third of the
    columns with rules are "dirty" (nulls, out-of-range values, strings outside the isin list)."""
    name = draw(st.sampled_from(names))
    struct = struct_for(name)
    columns = model_for(name).to_schema().columns
    cells = []
    for field in struct.fields:
        column = columns[field.name]
        valid, dirty = column_values(column, field.dataType)
        has_rules = bool(column.checks) or not column.nullable
        if has_rules and draw(st.integers(0, 2)) == 0:
            cells.append(dirty)
        else:
            cells.append(st.none() | valid if column.nullable else valid)
    rows = draw(st.lists(st.tuples(*cells), max_size=6))
    return name, rows


def _row(name: str, **values) -> tuple:
    """A row of table ``name`` in its struct's order, null where no value is given."""
    return tuple(values.get(f.name) for f in struct_for(name).fields)


# le is declared by one column of one model: this example makes sure every run breaks it, and
# sits on both sides of the bounds (heartbeats 1 passes le=1, 2 does not; rows 1 passes ge=1,
# 0 does not; a null opening_offset passes its ge=0).
_SUMMARY = dict(
    snapshot_id="s", replica="r", topic="t", partition=0, segment=0, first_offset=0, last_offset=0,
    puts=0, deletes=0, other_rows=0, closing_watermark={},
)
BOUNDS_EXAMPLE = (
    "heartbeat_segment_summary",
    [
        _row("heartbeat_segment_summary", **_SUMMARY, rows=1, heartbeats=1),
        _row("heartbeat_segment_summary", **_SUMMARY, rows=0, heartbeats=2),
    ],
)


def test_compiled_rules_find_what_pandera_finds(spark):
    """On random frames of several models, the compiled rules report exactly pandera's violations.

    Bugs caught: an off-by-one bound (``<=`` for ``ge``), a null counted as breaking a value
    check (pandera lets nulls pass them), an isin compared case-insensitively or trimmed, a
    nullable=False rule dropped or reported under another reason/check name, a rule read
    back from the wrong aggregate (rules numbered differently in ``aggregates`` and
    ``violations``). The last assertion catches the strategy itself going vacuous.
    """
    seen: set[str] = set()

    # No shrinking: each step would be a pandera validation (~1 job per rule). A failure prints
    # the rows and which (level, reason, column, check) only one side reported.
    @settings(max_examples=examples(8), deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate])
    @given(table=tables())
    @example(table=BOUNDS_EXAMPLE)
    def compiled_equals_pandera(table):
        name, rows = table
        model = model_for(name)
        df = spark.createDataFrame(rows, struct_for(name))
        compiled = key(validation_errors(model, df))
        reference = key(pandera_errors(model, df))
        assert compiled == reference, (
            f"{name}: only compiled {sorted(compiled - reference)}; only pandera {sorted(reference - compiled)}; rows {rows}"
        )
        seen.update(check.split("(")[0] for _, _, _, check in compiled)

    compiled_equals_pandera()
    assert {"not_nullable", "greater_than_or_equal_to", "less_than_or_equal_to", "isin"} <= seen, seen


def _quarantine_row(**overrides) -> dict:
    row = dict(snapshot_id="s", source_file=None, replica="r", raw="{}", reason="BAD_TYPE", detail=None)
    row.update(overrides)
    return row


def _with_field(struct: T.StructType, name: str, dtype: T.DataType) -> T.StructType:
    return T.StructType([T.StructField(f.name, dtype) if f.name == name else f for f in struct.fields])


@pytest.mark.parametrize("case", ["missing", "extra", "mistyped"])
def test_structure_violations_are_pandera_s(spark, case):
    """A missing column, a column the strict model does not declare, and a column of the wrong
    type are each reported with pandera's reason, and the data rules of the other columns still run.

    Bugs caught: strictness ignored, a type compared loosely (int for bigint, or by name only),
    a missing column crashing the aggregation instead of being reported, reasons or the
    reported column/check differing from pandera's, and a structure problem short-circuiting
    the value rules of the sound columns (``source_file`` is null in every case).
    """
    model, struct = model_for(SMALL_MODEL), struct_for(SMALL_MODEL)
    rows = [_quarantine_row(), _quarantine_row(source_file="f", reason="MALFORMED_JSON")]
    if case == "missing":
        expected_reason = "COLUMN_NOT_IN_DATAFRAME"
        df = spark.createDataFrame(rows, struct).drop("reason")
    elif case == "extra":
        expected_reason = "COLUMN_NOT_IN_SCHEMA"
        df = spark.createDataFrame(rows, struct).withColumn("unexpected", F.lit(1))
    else:
        expected_reason = "WRONG_DATATYPE"
        # An int column where the model declares a string one; not null (nulls in it: the test below).
        rows = [dict(row, reason=i) for i, row in enumerate(rows)]
        df = spark.createDataFrame(rows, _with_field(struct, "reason", T.IntegerType()))
    compiled = key(validation_errors(model, df))
    # pandera still runs the value checks of a mistyped column: its check (isin here) refuses
    # the column's type and pandera reports a CHECK_ERROR for it. The compiled form reports the
    # type once (WRONG_DATATYPE) and skips the value rules of that column, so CHECK_ERROR rows
    # are left out of the comparison.
    reference = {v for v in key(pandera_errors(model, df)) if v[1] != "CHECK_ERROR"}
    assert expected_reason in {reason for _, reason, _, _ in compiled}
    assert ("SCHEMA", "SERIES_CONTAINS_NULLS", "source_file", "not_nullable") in compiled
    assert compiled == reference


def test_nulls_in_a_mistyped_column_are_reported(spark):
    """A null in a nullable=False column of the wrong type is reported, as pandera does.

    Bug caught: the null check of a mistyped column dropped along with its value checks
    (null-ness does not depend on the type, and pandera checks it).
    """
    model, struct = model_for(SMALL_MODEL), struct_for(SMALL_MODEL)
    df = spark.createDataFrame(
        [_quarantine_row(source_file=None, reason="BAD_TYPE")], _with_field(struct, "source_file", T.IntegerType())
    )
    compiled = key(validation_errors(model, df))
    reference = {v for v in key(pandera_errors(model, df)) if v[1] != "CHECK_ERROR"}
    assert ("SCHEMA", "SERIES_CONTAINS_NULLS", "source_file", "not_nullable") in reference
    assert compiled == reference


def _count_work(spark, action) -> tuple[int, int]:
    """(SQL executions, Spark jobs) that ``action()`` ran."""
    with measure_work(spark) as work:
        action()
    return work.executions, work.jobs


def test_validation_is_one_aggregation_whatever_the_number_of_rules(spark):
    """``validation_errors`` runs one query, with the jobs of a single plain aggregation, for a
    model with 4 rules as for one with 27.

    Bug caught: a per-rule (or per-column) Spark job creeping back, e.g. a ``count()`` or
    ``first()`` per rule, or pandera's validation being called again. Under adaptive query
    execution a global aggregation is 2 job ids (its shuffle map stage is submitted as a job
    of its own, then the result stage), so the jobs are compared with those of
    ``df.agg(count(1)).first()`` on the same frame rather than with a constant.
    """
    rules = {}
    for name in (SMALL_MODEL, "heartbeat_segment_summary"):
        model, struct = model_for(name), struct_for(name)
        rules[name] = len(data_rules(model))
        df = spark.createDataFrame([tuple(None for _ in struct.fields)] * 3, struct)
        baseline = _count_work(spark, lambda: df.agg(F.count(F.lit(1))).first())
        found = []
        work = _count_work(spark, lambda: found.extend(validation_errors(model, df)))
        assert found, "every nullable=False rule is broken by the null rows"
        assert baseline[0] == 1 and 1 <= baseline[1] <= 2, baseline
        assert work == baseline, f"{name}: {rules[name]} rules ran {work} (executions, jobs), one aggregation {baseline}"
    assert rules[SMALL_MODEL] < 10 < rules["heartbeat_segment_summary"], rules


@settings(max_examples=25, deadline=None, phases=[Phase.explicit, Phase.generate])
@example(value="it's a \\ back'slash \\' and \\\\ two")
@example(value=-(2**62))
@example(value=0.1)
@given(value=st.one_of(
    st.text(max_size=20), st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
))
def test_a_rule_s_literal_reads_back_as_the_same_value(spark, value):
    """The rules are SQL text: each check's statistic is written as a literal the JVM parses back.

    Bug caught: a quote or backslash in an ``isin`` value ending the literal early or changing
    it (a rule then checking another value, or an audit failing to parse its rules), a float
    becoming a DECIMAL that rounds, or a large integer losing digits.
    """
    (row,) = spark.sql(f"SELECT {sql_literal(value)} AS v").collect()
    assert row["v"] == value and type(row["v"]) is type(value), (value, sql_literal(value), row["v"])


def test_compiling_a_model_costs_no_round_trip_to_the_jvm_and_its_aggregate_one(spark, monkeypatch):
    """The rules of every table are compiled in Python, and a table's aggregate is one SQL text.

    Bug caught: rules built as Columns again (each a few calls from Python to the JVM, about 0.2 ms each on 2
    cores: with ~20 tables staged per audit and up to 60 rules per table, seconds of every small audit).
    """
    import py4j.clientserver as clientserver

    calls = []
    original = clientserver.ClientServerConnection.send_command
    def counted(self, command):
        # py4j's finalizer thread deletes the JVM objects of earlier tests' garbage ("m\nd\n..."): not calls of this code.
        if not command.startswith("m\nd\n"):
            calls.append(command)
        return original(self, command)

    monkeypatch.setattr(clientserver.ClientServerConnection, "send_command", counted)
    validation = TableValidation(model_for("heartbeat_segment_summary"))
    assert calls == [] and len(validation.rules) > 10
    validation.aggregates(struct_for("heartbeat_segment_summary"))
    assert len(calls) <= 4, f"{len(calls)} calls to build one table's aggregate: {calls}"


class _StartsWith(pa.DataFrameModel):
    source: T.StringType() = pa.Field(nullable=False, str_startswith="s3://")

    class Config:
        name = "starts_with"
        strict = True


def test_a_check_with_no_compiled_form_fails_loudly(spark):
    """A model check with no one-pass form raises NotImplementedError when the model is compiled
    (compiled to SQL text in Python: no session is needed, but the write path must refuse it too).

    Bug caught: an unknown check skipped silently (``_VIOLATED.get`` falling through), so a
    declared rule would never be enforced while every validation passes.
    """
    with pytest.raises(NotImplementedError, match="str_startswith"):
        data_rules(_StartsWith)
    with pytest.raises(NotImplementedError, match="str_startswith"):
        TableValidation(_StartsWith)  # the write path compiles the same way


class _DataFrameCheck(pa.DataFrameModel):
    a: T.LongType() = pa.Field(nullable=True)

    @pa.dataframe_check
    def a_not_negative(cls, df):
        return df.filter(F.col("a") < 0).limit(1).count() == 0

    class Config:
        name = "dataframe_check"


class _UniqueRows(pa.DataFrameModel):
    a: T.LongType() = pa.Field(nullable=True)

    class Config:
        name = "unique_rows"
        unique = ["a"]


@pytest.mark.parametrize("model", [_DataFrameCheck, _UniqueRows], ids=["dataframe_check", "config_unique"])
def test_a_model_wide_rule_with_no_compiled_form_fails_loudly(spark, model):
    """Model-wide rules (``@pa.dataframe_check``, ``Config.unique``) have no compiled form either:
    compiling them raises. No project model declares one yet.

    Bug caught: the first model that declares one would validate clean whatever its rows hold.
    """
    with pytest.raises(NotImplementedError):
        data_rules(model)


def _arrow_table(name: str, rows: list[tuple]):
    """``rows`` (in the struct's order, maps as dicts) as an Arrow table of the table's struct."""
    import pyarrow

    from schemas.conform import to_arrow_schema

    schema = to_arrow_schema(struct_for(name))
    columns = list(zip(*rows)) if rows else [()] * len(schema)
    arrays = [pyarrow.array([list(v.items()) if isinstance(v, dict) else v for v in values], type=field.type)
              for values, field in zip(columns, schema)]
    return pyarrow.Table.from_arrays(arrays, schema=schema)


def test_the_rules_counted_on_arrow_count_what_spark_counts(spark):
    """The Arrow form of each rule (what a pass writing its own files counts) counts the rows Spark's form counts.

    Bugs caught: a null counted as breaking a value check or an isin (``NOT (x IN ...)`` is null in SQL; Arrow's
    ``is_in`` says false), a bound off by one, rules numbered differently in the two forms, a map's emptiness taken
    for a null.
    """
    from schemas.arrow_rules import violations as arrow_violations

    names = (*PROPERTY_MODELS, "reconstructed_watermarks")
    seen: set[str] = set()

    @settings(max_examples=examples(25), deadline=None, derandomize=True, database=None)
    @given(table=tables(names))
    @example(table=BOUNDS_EXAMPLE)
    def same_counts(table):
        name, rows = table
        validation = TableValidation(model_for(name))
        struct = struct_for(name)
        metric = spark.createDataFrame(rows, struct).agg(*validation.aggregates(struct)).first()[0].asDict()
        spark_counts = [metric[f"__rule_{i}"] for i in range(len(validation.rules))]
        arrow_counts = arrow_violations(validation.arrow_rules(), _arrow_table(name, rows))
        assert arrow_counts == spark_counts, (name, rows)
        seen.update(rule.check.split("(")[0] for rule, count in zip(validation.rules, arrow_counts) if count)

    same_counts()
    assert {"not_nullable", "greater_than_or_equal_to", "less_than_or_equal_to", "isin"} <= seen, seen
