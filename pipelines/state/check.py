"""The commit-context check: does a carried state's CONTEXT row match its VERSION rows?

A context keeps ``state_rows`` and ``state_checksum`` of its VERSION rows (``rows.py``). Before
``prior.py`` lets a snapshot continue a state, ``context_problems`` counts the VERSION rows found
and compares: a state changed outside an audit (rows lost, changed or added, a context
duplicated) is refused. The rows are counted with numpy (``arrow_checksum.py``, bit for bit
Spark's ``xxhash64``): a few on the driver, more in Spark's Python workers over Spark's read of
the rows (``found_sums``), or, where the store lists the state's files, one task per file reading
it with pyarrow (``found_sums_of_files``), or the tasks that settle keys, in the same read
(``pipelines/state/settled.py``; ``prior.check_state``).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Mapping

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.state.arrow_checksum import file_state_sums, state_sums
from pipelines.state.rows import CONTEXT, REPLICA_PARTITION, VERSION, VERSION_COLUMNS, checksum
from schemas.state import ReplicaState

PROBLEMS = ("DUPLICATE_CONTEXT", "STATE_ROWS", "STATE_CHECKSUM")


_FOUND = T.StructType([
    T.StructField("snapshot_id", T.StringType()), T.StructField("replica", T.StringType()),
    T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()),
    T.StructField("found_rows", T.LongType()), T.StructField("found_checksum", T.LongType()),
])


def found_sums(prior_versions: DataFrame) -> DataFrame:
    """Per snapshot and replica partition of ``prior_versions``' VERSION rows: how many (``found_rows``) and their
    checksum (``found_checksum``, ``rows.checksum`` of ``version_hash``).

    Counted on Arrow batches with numpy (``arrow_checksum.state_sums``, equal to Spark's ``xxhash64`` bit for bit)
    in Spark's Python workers, each task's share added up by Spark (a few rows). Spark's own hash of every vector's
    sorted entries and a decimal sum cost several times more per carried version. Few rows, on the driver:
    ``found_sums_of_arrow``.
    """
    keys = ["snapshot_id", *REPLICA_PARTITION]
    versions = prior_versions.where(F.col("row_kind") == VERSION).select(*keys, *VERSION_COLUMNS)
    shares = versions.mapInArrow(partial(state_sums, columns=VERSION_COLUMNS), _FOUND)
    return shares.groupBy(*keys).agg(F.sum("found_rows").alias("found_rows"),
                                     checksum(F.col("found_checksum")).alias("found_checksum"))


def found_sums_of_arrow(state: pa.Table) -> dict[tuple, tuple[int, int]]:
    """``found_sums`` of ``replica_state`` rows on the driver (an Arrow table; its VERSION rows are counted), by
    (snapshot id, replica, topic, partition): (rows, checksum). No Spark job, no Python worker."""
    keys = ["snapshot_id", *REPLICA_PARTITION]
    rows = state.filter(pc.equal(state.column("row_kind"), VERSION)).select([*keys, *VERSION_COLUMNS])
    return {tuple(r[k] for k in keys): (r["found_rows"], r["found_checksum"])
            for batch in state_sums(rows.to_batches(), VERSION_COLUMNS) for r in batch.to_pylist()}


def found_sums_of_files(spark: SparkSession, files: dict[str, list[Any]]) -> DataFrame:
    """``found_sums`` of the VERSION rows in ``files`` (per snapshot id, its ``replica_state`` files as
    ``resources.filesystem.Location``s, ``DeltaStore.snapshot_files``): one Spark task per file reads it with pyarrow
    and counts its share (``arrow_checksum.file_state_sums``), Spark adds the shares up. Every replica partition of
    the files is counted; a check joins the ones it expects.

    The same counts as ``found_sums`` over Spark's read of those files, without the JVM converting each row (four
    vectors) into Arrow for the Python worker: about a third of the time at 300,000 carried versions.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    keys = ["snapshot_id", *REPLICA_PARTITION]
    listed = tuple((snapshot_id, location.fs, location.path)
                   for snapshot_id, locations in sorted(files.items()) for location in locations)
    struct = ReplicaState.to_structtype()
    schema = to_arrow_schema(T.StructType([struct[name] for name in (*keys, *VERSION_COLUMNS)]))
    count = partial(file_state_sums, files=listed, schema=schema, columns=VERSION_COLUMNS, kind_column="row_kind",
                    kind=VERSION)
    shares = spark.range(0, len(listed), 1, max(len(listed), 1)).mapInArrow(count, _FOUND)
    return shares.groupBy(*keys).agg(F.sum("found_rows").alias("found_rows"),
                                     checksum(F.col("found_checksum")).alias("found_checksum"))


def context_problems(
    prior_versions: DataFrame, prior_context: DataFrame,
    found: DataFrame | Mapping[tuple, tuple[int, int]] | None = None,
) -> list[dict[str, Any]]:
    """Every way the CONTEXT rows of ``prior_context`` disagree with their VERSION rows in ``prior_versions``.

    One dict per problem: the context's snapshot and replica partition, ``problem``
    (DUPLICATE_CONTEXT, STATE_ROWS or STATE_CHECKSUM), ``expected`` (what the context
    says) and ``found`` (what the VERSION rows give). Empty when the state can be used.
    ``found``: the VERSION rows' counts made otherwise (``found_sums_of_files``, or ``found_sums_of_arrow`` of rows
    already on the driver); ``prior_versions`` is then not read. Without it they are counted by ``found_sums``. The
    contexts and the counts are a few rows per replica partition: they are compared here.
    """
    keys = ("snapshot_id", *REPLICA_PARTITION)
    found = found_sums(prior_versions) if found is None else found
    if not isinstance(found, Mapping):
        found = {tuple(r[k] for k in keys): (r["found_rows"], r["found_checksum"]) for r in found.collect()}
    expected: dict[tuple, list[Any]] = {}
    for row in prior_context.where(F.col("row_kind") == CONTEXT).select(
            *keys, "state_rows", "state_checksum").collect():
        entry = expected.setdefault(tuple(row[k] for k in keys), [0, None, None])
        entry[0] += 1
        # Two contexts of one replica partition: the larger of each figure is checked (and the duplicate reported).
        entry[1] = _larger(entry[1], row["state_rows"])
        entry[2] = _larger(entry[2], row["state_checksum"])
    problems = []
    for key, (contexts, state_rows, state_checksum) in expected.items():
        found_rows, found_checksum = found.get(key, (0, 0))
        for problem, want, got in (("DUPLICATE_CONTEXT", 1, contexts), ("STATE_ROWS", state_rows, found_rows),
                                   ("STATE_CHECKSUM", state_checksum, found_checksum)):
            if want is None or int(want) != int(got):
                problems.append({**dict(zip(keys, key)), "problem": problem,
                                 "expected": None if want is None else int(want), "found": int(got)})
    return problems


def _larger(a: Any, b: Any) -> Any:
    return b if a is None else a if b is None else max(a, b)
