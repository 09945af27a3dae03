"""Shape a frame to a table's declared struct: its columns, in order, each of its declared type.

Every table is conformed before it is written (and every embedded read after it is read),
so this runs a few hundred times per audit, on the driver, while the plans are built.
Written plainly (``F.col(name).cast(field.dataType).alias(name)`` for every field) it made
a large share of the round trips from Python to the JVM of a small audit: PySpark's
``Column.cast`` of a ``DataType`` looks for the thread's active session, and on the
audit's step threads (which have none in the JVM) goes through
``SparkSession.builder.getOrCreate()``, then parses the type's JSON in the JVM: 13 round
trips per cast (9 on a thread whose session is active), where most columns already have
their declared type. The cost is the casts that change nothing, not the missing session.

So ``conform`` reads the frame's schema once and casts only the columns whose type differs
(nullability and metadata included: a cast is kept wherever it could change the written
file's schema); an atomic type is cast by its SQL name, one round trip. The rows and the
resulting schema are the same as the plain form's.

``select_sql`` is ``selectExpr`` with its texts sent to the JVM as one string (PySpark sends a
list element by element): ``conform``, the staged reads and the judging go through it.

``local_frame`` makes a frame of a few driver-side rows of a struct through Arrow: a local
relation in the plan. ``spark.createDataFrame`` of a Python list (even an empty one) is a
Python RDD instead, and the first query that reads one starts Spark's Python worker daemon
and a worker (seconds in a fresh JVM: docs/performance.md), which a small JSONL audit need not start at all.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Optional, Sequence

import pyarrow as pa
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

# Types whose SQL name says everything the DataType does (no nested nullability or metadata).
_ATOMIC = (
    T.StringType, T.LongType, T.IntegerType, T.ShortType, T.ByteType, T.BooleanType, T.DoubleType, T.FloatType,
    T.BinaryType, T.DateType, T.TimestampType, T.DecimalType,
)


def quoted(name: str) -> str:
    """``name`` as a column reference Spark reads literally (dots, spaces and backticks in it included)."""
    return "`" + name.replace("`", "``") + "`"


def sql_literal(value: Any) -> str:
    """``value`` as a Spark SQL literal of its own type (a string quoted and escaped, a float a DOUBLE)."""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return f"{value!r}D"
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    raise NotImplementedError(f"no SQL literal for {value!r} ({type(value).__name__}); add it to schemas/conform.py")


# Between the texts of ``select_sql`` on their way to the JVM (ASCII's record separator; a text holding it is
# sent the usual way).
_SEPARATOR = "\x1e"


def select_sql(df: DataFrame, expressions: Sequence[str]) -> DataFrame:
    """``df.selectExpr(*expressions)`` in a handful of round trips to the JVM instead of one per expression.

    PySpark hands a Python list to the JVM element by element (py4j's list converter: one call
    each, about 0.2 ms on 2 cores), and frames are shaped this way hundreds of times per audit.
    Here the texts go over as one string, split in the JVM.
    """
    if not expressions or any(_SEPARATOR in e for e in expressions):
        return df.selectExpr(*expressions)
    strings, sequences = _jvm_classes(df.sparkSession._jvm)
    texts = strings.splitByWholeSeparatorPreserveAllTokens(_SEPARATOR.join(expressions), _SEPARATOR)
    return DataFrame(df._jdf.selectExpr(sequences.unsafeWrapArray(texts)), df.sparkSession)


_CLASSES: dict[int, tuple] = {}


def _jvm_classes(jvm) -> tuple:
    """The JVM classes ``select_sql`` calls, looked up once per JVM (each lookup is a round trip)."""
    found = _CLASSES.get(id(jvm))
    if found is None or found[0] is not jvm:
        found = (jvm, jvm.org.apache.commons.lang3.StringUtils, jvm.scala.collection.immutable.ArraySeq)
        _CLASSES[id(jvm)] = found
    return found[1:]


def _cast(column: Column, data_type: T.DataType) -> Column:
    """``column.cast(data_type)``, by the type's SQL name when that is exact (one round trip to the JVM)."""
    if isinstance(data_type, _ATOMIC):
        return column.cast(data_type.simpleString())
    return column.cast(data_type)


def conform(df: DataFrame, struct: T.StructType, columns: Optional[Mapping[str, Column]] = None) -> DataFrame:
    """``df`` with ``struct``'s columns only, in its order, each of its declared type.

    ``columns`` give expressions for some fields (the others are ``df``'s columns of that
    name); they are computed first, so that their types are known too. A column is cast
    only when its type differs from the declared one.
    """
    if columns:
        given = {name: column for name, column in columns.items() if name in struct.names}
        df = select_sql(df.withColumns(given) if given else df, [quoted(name) for name in struct.names])
    fields = df.schema.fields
    have = {f.name: f.dataType for f in fields}
    if [f.name for f in fields] == struct.names and all(have[f.name] == f.dataType for f in struct.fields):
        return df
    if all(have.get(f.name) == f.dataType or isinstance(f.dataType, _ATOMIC) for f in struct.fields):
        # As SQL text: one round trip for the whole selection instead of a few per column.
        return select_sql(df, [
            quoted(f.name) if have.get(f.name) == f.dataType
            else f"CAST({quoted(f.name)} AS {f.dataType.simpleString()}) AS {quoted(f.name)}"
            for f in struct.fields
        ])
    return df.select(
        *[F.col(quoted(f.name)) if have.get(f.name) == f.dataType else _cast(F.col(quoted(f.name)), f.dataType).alias(f.name)
          for f in struct.fields]
    )


def local_frame(spark: SparkSession, rows: Sequence[Sequence], struct: T.StructType) -> DataFrame:
    """``rows`` (tuples in the order of ``struct``'s fields) as a frame of exactly ``struct``: a local relation."""
    schema = to_arrow_schema(struct)
    columns = list(zip(*rows)) if rows else [()] * len(schema)
    if len(columns) != len(schema):
        raise ValueError(f"rows of {len(columns)} values for a struct of {len(schema)} fields")
    arrays = [pa.array(list(values), type=f.type) for values, f in zip(columns, schema)]
    return local_batches(spark, pa.Table.from_arrays(arrays, schema=schema).to_batches(), struct)


def local_batches(spark: SparkSession, batches: Iterable[pa.RecordBatch], struct: T.StructType) -> DataFrame:
    """Arrow record batches made on the driver (``struct``'s columns, in order) as a local relation of exactly ``struct``."""
    schema = to_arrow_schema(struct)
    received = list(batches)
    table = pa.Table.from_batches(received).cast(schema) if received else schema.empty_table()
    return spark.createDataFrame(table)
