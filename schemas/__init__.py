"""One pandera ``DataFrameModel`` (pyspark.sql types) per table.

The models are the single source of truth for every table's columns: the Spark
``StructType`` used to build and read a table comes from ``Model.to_structtype()``,
the Dagster ``TableSchema`` shown in the UI comes from the same model, and the
blocking asset checks validate each stage against it.
"""
from schemas.validation import SchemaViolation, validation_errors, dagster_table_schema

__all__ = ["SchemaViolation", "validation_errors", "dagster_table_schema"]
