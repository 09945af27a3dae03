"""A table's compiled schema rules counted on Arrow data, where a pass writes its rows itself (no Spark query).

``schemas/validation.py`` compiles a pandera model's data rules into Spark SQL conditions, counted
by the Spark job that writes a table. A table that a pass writes from Arrow batches in a Python
task (``resources/staged_files.py``) is counted there instead, by the same rules in this form:
``ArrowRule`` (the column, pandera's check name and its statistics) and ``violations``, with
Spark SQL's meaning (a null value breaks no value check; ``NOT (x IN (...))`` is null for a null
``x``). ``tests/test_validation.py`` checks on random tables that both forms count the same rows.

This module imports pyarrow only and travels by value to Spark's Python workers, with the pass.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle

NOT_NULLABLE = "not_nullable"
# pandera's comparison checks: what breaks each (a comparison, true where the value breaks it) and its bound.
_COMPARED = {
    "greater_than_or_equal_to": (pc.less, "min_value"),
    "greater_than": (pc.less_equal, "min_value"),
    "less_than_or_equal_to": (pc.greater, "max_value"),
    "less_than": (pc.greater_equal, "max_value"),
    "equal_to": (pc.not_equal, "value"),
    "not_equal_to": (pc.equal, "value"),
}


@dataclass(frozen=True)
class ArrowRule:
    """One data rule: the column, pandera's check name (or ``not_nullable``) and the check's statistics."""

    column: str
    check: str
    statistics: tuple[tuple[str, Any], ...] = ()

    def broken(self, values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
        """Per value, whether it breaks the rule (true), keeps it (false) or is not judged (null, as in SQL)."""
        s = dict(self.statistics)
        if self.check == NOT_NULLABLE:
            return pc.is_null(values)
        if self.check in _COMPARED:
            breaks, statistic = _COMPARED[self.check]
            return breaks(values, s[statistic])
        if self.check in ("isin", "notin"):
            listed = s["allowed_values"] if self.check == "isin" else s["forbidden_values"]
            found = pc.is_in(values, value_set=pa.array(list(listed), type=values.type))
            # SQL: a null value is in no list and outside none (the condition is null, not counted).
            return pc.if_else(pc.is_valid(values), pc.invert(found) if self.check == "isin" else found, None)
        raise NotImplementedError(f"check {self.check!r} has no Arrow form (schemas/arrow_rules.py)")


def violations(
    rules: tuple[ArrowRule, ...], table: pa.Table | pa.RecordBatch, constants: dict[str, Any] | None = None,
) -> list[int]:
    """Per rule, how many rows of ``table`` break it.

    ``constants``: columns that are not in ``table`` but hold one value on every row (a partition
    column, which the folder names): a rule on one counts every row or none.
    """
    counts = []
    for rule in rules:
        if constants and rule.column in constants:
            broken = rule.broken(pa.array([constants[rule.column]]))
            counts.append(table.num_rows * int(pc.sum(broken).as_py() or 0))
        else:
            counts.append(int(pc.sum(rule.broken(table.column(rule.column))).as_py() or 0))
    return counts


# Sent to Spark's Python workers by value, with the pass that writes through it.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
