"""Validate a table against its pandera model in one Spark pass, or in none at all while it is written.

The pandera ``DataFrameModel`` of a table declares its columns, their types, which may be
null, and their value checks (``ge``, ``le``, ``isin``). pandera's own PySpark backend
evaluates that declaration with one Spark job per column check (18 to 32 jobs per table,
even an empty one), which was most of the fixed cost of an audit (docs/performance.md). So the declaration is compiled here instead:

- the *structure* (every model column present, no other column when the model is strict,
  each with its declared Spark type) is compared with the frame's schema in Python: no job;
- every *data* rule (``nullable=False`` and each value check) becomes one aggregate
  ``count_if(row violates it)``. All of a table's aggregates run in one job
  (``validation_errors``), or ride along the job that writes the table
  (``TableValidation.aggregates`` given to ``DataFrame.observe``): validating then costs no
  pass of its own, and the staged files are judged before they are committed.

Null values pass value checks and type checks are the structure's business, exactly as in
pandera; reasons and levels are pandera's (``SERIES_CONTAINS_NULLS``, ``DATAFRAME_CHECK``,
``COLUMN_NOT_IN_DATAFRAME``, ``COLUMN_NOT_IN_SCHEMA``, ``WRONG_DATATYPE``).
``tests/test_validation.py`` checks on random frames that the compiled rules find
exactly the violations pandera's own ``validate`` finds. A model check with no compiled
form fails loudly at compile time: no declared rule is ever skipped.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import dagster as dg
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.arrow_rules import NOT_NULLABLE, ArrowRule
from schemas.conform import quoted, sql_literal


@dataclass(frozen=True)
class SchemaViolation:
    level: str  # SCHEMA or DATA
    reason: str  # pandera's reason code, e.g. SERIES_CONTAINS_NULLS
    column: str | None
    check: str | None
    error: str

    def as_dict(self) -> dict:
        return {
            "level": self.level,
            "reason": self.reason,
            "column": self.column,
            "check": self.check,
            "error": self.error,
        }


def _in_list(values) -> str:
    return ", ".join(sql_literal(v) for v in values)


# pandera's built-in checks, as SQL text for "this row violates the check" (null when the value is null).
# SQL text, not Columns: a table's rules go to the JVM as one expression (``TableValidation.aggregates``),
# where built as Columns they were a few round trips each, on every table staged (about 2,800 per audit).
_VIOLATED: dict[str, Callable[[str, Mapping[str, Any]], str]] = {
    "greater_than_or_equal_to": lambda c, s: f"{c} < {sql_literal(s['min_value'])}",
    "greater_than": lambda c, s: f"{c} <= {sql_literal(s['min_value'])}",
    "less_than_or_equal_to": lambda c, s: f"{c} > {sql_literal(s['max_value'])}",
    "less_than": lambda c, s: f"{c} >= {sql_literal(s['max_value'])}",
    "equal_to": lambda c, s: f"{c} != {sql_literal(s['value'])}",
    "not_equal_to": lambda c, s: f"{c} = {sql_literal(s['value'])}",
    "isin": lambda c, s: f"NOT ({c} IN ({_in_list(s['allowed_values'])}))",
    "notin": lambda c, s: f"{c} IN ({_in_list(s['forbidden_values'])})",
}


@dataclass(frozen=True)
class DataRule:
    """One data rule of a model: which column, pandera's reason and check name, and when a row breaks it (SQL)."""

    column: str
    level: str
    reason: str
    check: str
    violated: str  # a Spark SQL condition on the row
    arrow: ArrowRule  # the same rule, counted on Arrow data (schemas/arrow_rules.py)


def data_rules(model) -> list[DataRule]:
    """Every data rule the pandera ``model`` declares, as a Spark SQL condition; raises on a check with no compiled form."""
    schema = model.to_schema()
    if schema.checks or schema.unique:
        raise NotImplementedError(
            f"{schema.name}: model-wide rules (dataframe checks, unique) have no one-pass form; "
            "add them to schemas/validation.py"
        )
    rules: list[DataRule] = []
    for name, column in schema.columns.items():
        value = quoted(name)
        if not column.nullable:
            rules.append(DataRule(name, "SCHEMA", "SERIES_CONTAINS_NULLS", NOT_NULLABLE, f"{value} IS NULL",
                                  ArrowRule(name, NOT_NULLABLE)))
        for check in column.checks:
            compile_rule = _VIOLATED.get(check.name)
            if compile_rule is None:
                raise NotImplementedError(
                    f"{schema.name}.{name}: pandera check {check.name!r} has no one-pass form; "
                    "add it to schemas/validation.py (_VIOLATED)"
                )
            rules.append(DataRule(name, "DATA", "DATAFRAME_CHECK", check.error, compile_rule(value, check.statistics),
                                  ArrowRule(name, check.name, tuple(sorted(check.statistics.items())))))
    return rules


def structure_violations(model, struct: T.StructType) -> list[SchemaViolation]:
    """Missing, unexpected and mistyped columns of ``struct`` against the model (no Spark job)."""
    schema = model.to_schema()
    expected = model.to_structtype()
    found = {f.name: f.dataType for f in struct.fields}
    violations = []
    for field in expected.fields:
        if field.name not in found:
            violations.append(SchemaViolation(
                "SCHEMA", "COLUMN_NOT_IN_DATAFRAME", field.name, "column_in_dataframe",
                f"column '{field.name}' not in the table",
            ))
        elif found[field.name] != field.dataType:
            violations.append(SchemaViolation(
                "SCHEMA", "WRONG_DATATYPE", field.name, f"dtype('{field.dataType}')",
                f"expected column '{field.name}' to have type {field.dataType.simpleString()}, "
                f"got {found[field.name].simpleString()}",
            ))
    if schema.strict:
        declared = set(expected.names)
        for name in found:
            if name not in declared:
                violations.append(SchemaViolation(
                    "SCHEMA", "COLUMN_NOT_IN_SCHEMA", schema.name, "column_in_schema",
                    f"column '{name}' not in the model {schema.name}",
                ))
    return violations


class TableValidation:
    """A model compiled for one table: aggregates to compute over its rows, and how to read them back."""

    ROWS = "__rows"
    METRIC = "__validation"  # the one aggregate's name: a struct of ROWS and every checkable rule's count

    def __init__(self, model):
        self.model = model
        self.rules = data_rules(model)

    def aggregates(self, struct: T.StructType) -> list[Column]:
        """One aggregate: the struct of ``count(*)`` and one ``count_if`` per data rule whose column is in ``struct``
        with its declared type, parsed by the JVM from one SQL text (``violations`` reads it back)."""
        checkable = self._checkable(struct)
        counts = [f"count(1) AS {self.ROWS}"] + [
            f"count_if({rule.violated}) AS __rule_{i}" for i, rule in enumerate(self.rules) if i in checkable
        ]
        return [F.expr(f"struct({', '.join(counts)}) AS {self.METRIC}")]

    def arrow_rules(self) -> tuple[ArrowRule, ...]:
        """Every data rule, in order, to count on Arrow data of the table's declared columns (``arrow_metrics``)."""
        return tuple(rule.arrow for rule in self.rules)

    def arrow_metrics(self, rows: int, counts: list[int]) -> dict[str, int]:
        """What ``violations`` reads, from ``rows`` and the rows breaking each of ``arrow_rules`` (``counts``)."""
        if len(counts) != len(self.rules):
            raise ValueError(f"{len(counts)} rule counts for the {len(self.rules)} rules of {self.model.__name__}")
        return {self.ROWS: rows, **{f"__rule_{i}": count for i, count in enumerate(counts)}}

    def _checkable(self, struct: T.StructType) -> set[int]:
        # A missing column is a structure violation already. A mistyped one is too, and its value
        # checks are not run on the wrong type; whether it holds nulls does not depend on its type.
        declared = {f.name: f.dataType for f in self.model.to_structtype().fields}
        found = {f.name: f.dataType for f in struct.fields}
        return {
            i for i, rule in enumerate(self.rules)
            if rule.column in found and (rule.reason == "SERIES_CONTAINS_NULLS" or found[rule.column] == declared[rule.column])
        }

    def violations(self, struct: T.StructType, metrics: Mapping[str, Any]) -> list[SchemaViolation]:
        """Every violation, from ``struct`` and the computed ``aggregates``."""
        found = structure_violations(self.model, struct)
        if self.METRIC in metrics:
            metrics = metrics[self.METRIC].asDict()
        for i, rule in enumerate(self.rules):
            count = int(metrics.get(f"__rule_{i}") or 0)
            if count:
                found.append(SchemaViolation(
                    rule.level, rule.reason, rule.column, rule.check,
                    f"{count} of {metrics.get(self.ROWS)} row(s) of column '{rule.column}' fail {rule.check}",
                ))
        return found


def validation_errors(model, df: DataFrame) -> list[SchemaViolation]:
    """Validate ``df`` against the pandera ``model`` in one Spark job; return every violation found."""
    validation = TableValidation(model)
    metrics = df.agg(*validation.aggregates(df.schema)).first().asDict()
    return validation.violations(df.schema, metrics)


def pandera_errors(model, df: DataFrame) -> list[SchemaViolation]:
    """pandera's own validation of ``df`` (one Spark job per check): the reference the compiled rules are tested against."""
    errors = model.validate(check_obj=df).pandera.errors
    found: list[SchemaViolation] = []
    for level, by_reason in dict(errors).items():
        for reason, items in dict(by_reason).items():
            for item in items:
                found.append(
                    SchemaViolation(
                        level=str(level),
                        reason=str(reason),
                        column=item.get("column"),
                        check=str(item.get("check")) if item.get("check") is not None else None,
                        error=str(item.get("error")),
                    )
                )
    return found


def dagster_table_schema(struct: T.StructType) -> dg.TableSchema:
    """The Dagster ``TableSchema`` of a Spark ``StructType`` (shown on every materialization)."""
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                name=field.name,
                type=field.dataType.simpleString(),
                constraints=dg.TableColumnConstraints(nullable=field.nullable),
            )
            for field in struct.fields
        ]
    )
