"""Run a pandera PySpark model and read its errors at once.

pandera's PySpark validation does not raise: it attaches the failures to
``df.pandera.errors``. ``validation_errors`` flattens them right away so that a
blocking asset check can report them; nothing is read later from a lazily
evaluated frame.
"""
from __future__ import annotations

from dataclasses import dataclass

import dagster as dg
from pyspark.sql import DataFrame
from pyspark.sql import types as T


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


def validation_errors(model, df: DataFrame) -> list[SchemaViolation]:
    """Validate ``df`` against the pandera ``model``; return every violation found."""
    validated = model.validate(check_obj=df)
    errors = validated.pandera.errors
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


def _type_name(data_type: T.DataType) -> str:
    return data_type.simpleString()


def dagster_table_schema(struct: T.StructType) -> dg.TableSchema:
    """The Dagster ``TableSchema`` of a Spark ``StructType`` (shown on every materialization)."""
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                name=field.name,
                type=_type_name(field.dataType),
                constraints=dg.TableColumnConstraints(nullable=field.nullable),
            )
            for field in struct.fields
        ]
    )
