"""The thin layer between assets and the Delta store: read a stage, stage its tables, validate, publish.

An asset step builds its tables and hands them to a ``StepTables``: each is written as
staged Parquet files that no reader sees (``DeltaStore.stage``), and the table's pandera
model, compiled into aggregates (``schemas/validation.py``), is evaluated by the same Spark
job that writes it. Only when every table of the step passes is each committed, one Delta
commit per table; otherwise nothing of the step is published (every table keeps its
previous version), the step fails naming the check and its violations, and, since the
asset's blocking ``matches_schema`` check did not pass, no downstream step runs.

A table that a pass writes itself from Arrow batches (``arrow_stage``, ``stage_arrow``) is
judged by the same rules in their Arrow form, counted by the pass as it writes each file and
read from the files' footers (``schemas/arrow_rules.py``): no Spark job.

A small step (its input at most ``REPLICA_LENS_DRIVER_MAX_ROWS`` rows, ``resources.tuning.on_driver``)
stages its tables the same way: each is collected to the driver as Arrow (``toArrow``) and
written there with pyarrow, its rules counted on the Arrow rows. A Spark write job (its plan,
the Parquet writer's and the commit protocol's fixed costs) costs more than the rows it writes at
that size; a table holding values, or with counts of its own to observe, keeps Spark's writer.

A table built from another table of the same step reads that table's staged files
(``StepTables.frame``): nothing is read back from Delta for it, and nothing is published
before the whole step has been validated. A step's own counts for its metadata ride on the
same job (``StepTables.stage(..., observe=)``).

Asset checks read a table through ``matching_rows``: the first rows that break a bound and
their count in one query, and no query at all when the Delta log says the snapshot is empty.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Iterator

import dagster as dg
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from resources.delta_reader import PARTITION_COLUMN
from resources.delta_staging import StagedWrite, WriteResult, holds_values
from resources.delta_store import DeltaStore
from resources.staged_files import ArrowStage
from resources.tuning import on_driver
from schemas.conform import conform
from schemas.registry import model_for, required_columns, struct_for
from schemas.validation import SchemaViolation, TableValidation, dagster_table_schema

if TYPE_CHECKING:
    from resources.spark import SparkResource

SCHEMA_CHECK = "matches_schema"
MAX_LISTED_ERRORS = 20
OBSERVED_PREFIX = "__observed_"  # the step's own ``observe`` values among a staged write's metrics


def read_stage(spark: SparkSession, store: DeltaStore, table: str, snapshot_id: str | None) -> DataFrame:
    """One snapshot of ``table``, or every snapshot when ``snapshot_id`` is None.

    A snapshot written before one of the model's non-nullable columns existed is refused
    (``OutdatedSnapshot``), naming the table and snapshot to materialize again.
    """
    required = required_columns(table)
    if snapshot_id is None:
        return store.read_all(spark, table, struct_for(table), required)
    return store.read_snapshot(spark, table, snapshot_id, struct_for(table), required)


def first_rows_and_counts(
    frame: DataFrame, order: list[Column], counts: dict[str, Column], limit: int, columns: list[str] | None = None,
) -> tuple[list, dict[str, int]]:
    """The first ``limit`` rows of ``frame`` in ``order``, and the aggregates ``counts`` over all of ``frame``: one query.

    The counts ride along as an observation (``DataFrame.observe``) under the sort: keeping
    the first rows reads every row of ``frame``, so the counts are complete. A count and a
    query for the examples apart were two queries of a few Spark jobs each.
    """
    observation = Observation()
    observed = frame.observe(observation, *[c.alias(name) for name, c in counts.items()])
    first = observed.orderBy(*order).limit(limit)
    rows = (first if columns is None else first.select(*columns)).collect()
    return rows, {name: int(value or 0) for name, value in observation.get.items()}


def matching_rows(
    spark: "SparkResource", store: DeltaStore, table: str, snapshot_id: str, where: Column, order: list[Column],
    counts: dict[str, Column], limit: int, columns: list[str] | None = None,
) -> tuple[list, dict[str, int]]:
    """``first_rows_and_counts`` of a snapshot's rows of ``table`` that match ``where`` (what an asset check reports).

    ``columns``: the columns the first rows keep (None: all), so that a report does not bring its values to the
    driver only to show its keys.

    When the Delta log says the snapshot has no row (a healthy snapshot's
    ``divergence_reports``), the answer is known without Spark: no rows, every count 0.
    """
    rows = store.snapshot_rows(table, [snapshot_id])
    if rows == 0:
        return [], dict.fromkeys(counts, 0)
    with spark.sized_for(rows):
        frame = read_stage(spark.spark_session, store, table, snapshot_id).where(where)
        return first_rows_and_counts(frame, order, counts, limit, columns)


def table_metadata(result: WriteResult, table: str) -> dict[str, Any]:
    return {
        "dagster/row_count": result.row_count,
        "dagster/column_schema": dagster_table_schema(struct_for(table)),
        "dagster/uri": dg.MetadataValue.path(result.table_uri),
        "dagster/table_name": table,
        "delta_version": result.version,
        "delta_engine": result.engine,
        "files_written": result.files,
    }


def schema_check_spec(table: str) -> dg.AssetCheckSpec:
    return dg.AssetCheckSpec(
        name=SCHEMA_CHECK,
        asset=table,
        blocking=True,
        description=(
            f"The {table} rows pass their pandera schema, checked on the staged files before they are "
            "committed (blocking: a table that fails is not published and downstream waits)."
        ),
    )


class SchemaCheckFailed(Exception):
    """A staged table broke its schema: nothing of the step was published."""

    def __init__(self, failures: dict[str, list[SchemaViolation]]):
        self.failures = failures
        parts = [
            f"{table}:{SCHEMA_CHECK} failed with {len(errors)} violation(s): "
            + "; ".join(e.error for e in errors[:3])
            for table, errors in failures.items()
        ]
        super().__init__(" | ".join(parts) + ". Nothing of this step was committed: every table keeps its previous version.")


@dataclass
class _Staged:
    staged: StagedWrite
    violations: list[SchemaViolation]
    stage_seconds: float
    rules: int
    extra_metadata: dict[str, Any] = field(default_factory=dict)


class StepTables:
    """The tables one asset step writes: staged and validated one by one, published together."""

    def __init__(
        self, spark: SparkSession, store: DeltaStore, snapshot_id: str | None, evaluation: str | None = None,
        rows: int | None = None,
    ):
        self.spark = spark
        self.store = store
        self.snapshot_id = snapshot_id
        # The step's input rows when known (the Delta log): a small step's tables are written on the driver.
        self.on_driver = snapshot_id is not None and on_driver(rows)
        # How Spark evaluated the step (``SparkResource.sized_for``), shown on each table's materialization.
        self.evaluation = evaluation
        self._staged: dict[str, _Staged] = {}
        self._pending: dict[str, ArrowStage] = {}  # filled by a pass, not yet staged

    def stage(
        self, df: DataFrame, table: str, extra_metadata: dict[str, Any] | None = None,
        observe: dict[str, Column] | None = None, whole_streams: bool = False,
    ) -> StagedWrite:
        """Write ``df`` as ``table``'s staged files, its schema rules counted by the same job.

        ``observe``: more aggregates over the written rows (counts for the step's metadata, the
        region universe the step goes on with), computed by that job too, with no read-back of the
        staged files; ``observed(table)`` returns them by name, as Spark computed them.
        ``whole_streams``: ``df`` is hash-partitioned by stream (``DeltaStore.stage``).

        A small step's table without values or ``observe`` is collected and written on the driver
        (the module docstring), judged by the same rules.
        """
        struct = struct_for(table)
        if self.on_driver and not observe and not holds_values(table, struct):
            stage = self.arrow_stage(table)
            rows = conform(df.withColumn(PARTITION_COLUMN, F.lit(self.snapshot_id)), struct)
            self.store.write_arrow(stage, rows.toArrow())
            return self.stage_arrow(stage, extra_metadata)
        validation = TableValidation(model_for(table))
        aggregates = (
            validation.aggregates(struct)
            + [c.alias(f"{OBSERVED_PREFIX}{n}") for n, c in (observe or {}).items()]
        )
        return self._checked(
            table, validation,
            lambda: self.store.stage(self.spark, df, table, self.snapshot_id, struct, observe=aggregates,
                                     whole_streams=whole_streams),
            extra_metadata,
        )

    def arrow_stage(self, table: str) -> ArrowStage:
        """A staged write of ``table`` that a pass fills with Arrow batches where it makes them (``stage_arrow`` then).

        Its files count the rows breaking each of the table's schema rules as they are written.
        Discarded with the step's other staged tables if the step does not publish.
        """
        rules = TableValidation(model_for(table)).arrow_rules()
        stage = self.store.arrow_stage(table, self.snapshot_id, struct_for(table), rules)
        self._pending[table] = stage
        return stage

    def stage_arrow(self, stage: ArrowStage, extra_metadata: dict[str, Any] | None = None) -> StagedWrite:
        """``stage``'s files, written: judged like ``stage``'s tables, by the rule counts in their footers."""
        self._pending.pop(stage.table, None)
        validation = TableValidation(model_for(stage.table))

        def staging() -> StagedWrite:
            staged = self.store.stage_arrow(stage, struct_for(stage.table))
            return replace(staged, metrics=validation.arrow_metrics(staged.row_count, staged.metrics["rule_counts"]))

        return self._checked(stage.table, validation, staging, extra_metadata)

    def _checked(
        self, table: str, validation: TableValidation, staging: Callable[[], StagedWrite],
        extra_metadata: dict[str, Any] | None,
    ) -> StagedWrite:
        """Stage ``table`` by ``staging`` (which computes the counts of ``validation``'s rules) and judge them."""
        started = time.perf_counter()
        staged = staging()
        self._staged[table] = _Staged(
            staged=staged,
            violations=validation.violations(struct_for(table), staged.metrics),
            stage_seconds=round(time.perf_counter() - started, 2),
            rules=len(validation.rules),
            extra_metadata=dict(extra_metadata or {}),
        )
        return staged

    def stage_empty(self, table: str, extra_metadata: dict[str, Any] | None = None) -> StagedWrite:
        """Stage ``table`` with no rows, known empty beforehand: no Spark job, nothing for a data rule to fail."""
        return self._checked(
            table, TableValidation(model_for(table)),
            lambda: self.store.stage_empty(table, self.snapshot_id, struct_for(table)), extra_metadata,
        )

    def observed(self, table: str) -> dict[str, Any]:
        """The ``observe`` aggregates given to ``stage`` for ``table``, as computed by the job that wrote it."""
        metrics = self._staged[table].staged.metrics
        return {k[len(OBSERVED_PREFIX):]: v for k, v in metrics.items() if k.startswith(OBSERVED_PREFIX)}

    def frame(self, table: str) -> DataFrame:
        """The rows staged for ``table`` in this step (not yet published)."""
        return self.store.read_staged(self.spark, self._staged[table].staged)

    def add_metadata(self, table: str, metadata: dict[str, Any]) -> None:
        self._staged[table].extra_metadata.update(metadata)

    def discard(self) -> None:
        for entry in self._staged.values():
            self.store.discard(entry.staged)
        self._staged.clear()
        for stage in self._pending.values():
            self.store.discard_arrow_stage(stage)
        self._pending.clear()

    def publish(self, after_commit: dict[str, Callable[[], dict[str, Any]]] | None = None) -> Iterator[dg.MaterializeResult]:
        """Commit every staged table when all passed their checks; else discard them all and fail the step.

        ``after_commit``: per table, a function run once every table is committed (so it can read
        them as any reader would) whose metadata joins that table's materialization.
        """
        failures = {t: e.violations for t, e in self._staged.items() if e.violations}
        if failures:
            self.discard()
            error = SchemaCheckFailed(failures)
            for table, errors in failures.items():
                yield dg.AssetCheckResult(
                    asset_key=table,
                    check_name=SCHEMA_CHECK,
                    passed=False,
                    severity=dg.AssetCheckSeverity.ERROR,
                    metadata={
                        "violations": len(errors),
                        "errors": dg.MetadataValue.json([v.as_dict() for v in errors[:MAX_LISTED_ERRORS]]),
                        "published": False,
                    },
                    description=f"{len(errors)} schema violation(s) in the staged {table}: {errors[0].error}",
                )
            raise dg.Failure(
                description=str(error),
                metadata={
                    f"{table}.violations": dg.MetadataValue.json(
                        [v.as_dict() for v in errors[:MAX_LISTED_ERRORS]]
                    )
                    for table, errors in failures.items()
                },
                allow_retries=False,
            ) from error
        results = []
        try:
            for table in list(self._staged):
                started = time.perf_counter()
                written = self.store.commit(self.spark, self._staged[table].staged)
                # Committed: its files belong to the table now and must never be discarded.
                entry = self._staged.pop(table)
                results.append((table, entry, written, round(time.perf_counter() - started, 2)))
        except BaseException:
            self.discard()
            raise
        for table, entry, written, commit_seconds in results:
            if after_commit and table in after_commit:
                entry.extra_metadata.update(after_commit[table]())
            check = dg.AssetCheckResult(
                asset_key=table,
                check_name=SCHEMA_CHECK,
                passed=True,
                severity=dg.AssetCheckSeverity.ERROR,
                metadata={"violations": 0, "rows_checked": entry.staged.row_count, "rules_checked": entry.rules},
            )
            yield dg.MaterializeResult(
                asset_key=table,
                metadata={
                    **table_metadata(written, table),
                    # Spark is lazy: staging includes computing the frame (the stage's own work) and its checks.
                    "write_seconds": entry.stage_seconds,
                    "commit_seconds": commit_seconds,
                    **({"spark_evaluation": self.evaluation} if self.evaluation else {}),
                    **entry.extra_metadata,
                },
                check_results=[check],
            )
