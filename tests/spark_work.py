"""How much work Spark really did while a block of code ran, read from Spark's own metrics.

A plan can hide what a computation costs: a frame that was checkpointed (``computed_once``,
``localCheckpoint``) shows up in later plans as a scan of the saved rows, whatever it took
to compute them. So a test that must know whether a computation is linear or quadratic
cannot read the plan of the result; it has to count what every job that ran did.

``measure_work()`` does so. Inside ``with measure_work(spark) as work:`` every SQL execution
and every stage that starts is counted, checkpoints included, and on leaving the block
``work`` holds:

``operator_rows``
    The sum of every physical operator's "number of output rows" over every SQL execution
    of the block (one per action: ``collect``, ``count``, a write, an eager checkpoint).
    This is the count that exposes pairing: a join that matches every version of a key
    with every version of the same key on the other side outputs their product, even when
    an aggregate right after it shrinks the result back to one row (the stage's shuffle
    or output then stays small, the join's output does not). It counts what operators
    emit, not what they look at: pairs that a join rejects in its own condition count for
    nothing, so an input meant to expose pairing must make most pairs pass any such
    condition (the hot-key test's does). Under adaptive execution each operator's metric
    is counted once, and those of plan versions that were replaced before running count
    nothing.
``stage_records``
    The records every stage of the block read (from sources and from cached or
    checkpointed blocks), shuffled (written and read) and wrote: the same work seen from
    the scheduler, which also covers jobs that run outside SQL (plain RDD operations).
``jobs``
    The Spark job ids submitted in the block (a job under adaptive execution may be one
    shuffle map stage of a query: the count tells whether more actions or stages crept in).
``window_frames``
    Every window frame of the executed physical plans that ends at ``unboundedfollowing``
    without starting at ``unboundedpreceding``. Spark evaluates an aggregate over such a
    frame again for every row (``UnboundedFollowingWindowFunctionFrame``): quadratic CPU in
    the window partition's size while every row count stays linear, so no row metric can
    see it. Rows are counted, not time: timings depend on the machine and its load.

Both counts come from the driver's status stores, the ones the Spark UI displays: the
application's (``SparkContext.statusStore``: jobs, stages and their task metrics) and the
SQL one (``SharedState.statusStore``: each execution's plan and SQL metrics). Spark keeps
both listeners when ``spark.ui.enabled`` is false (the project's sessions run so, and the
hot-key test's controls would fail on empty counts). Listener events arrive asynchronously:
the listener bus is drained before reading, and the SQL listener's end of execution (it
aggregates the metrics on a thread of its own) is waited for. Executions and stages are told apart by their ids,
which only grow: the block's are those above the largest id seen when it started; a gap
in them (the store evicted some: more than ``spark.ui.retainedStages`` stages or
``spark.sql.ui.retainedExecutions`` executions in one block) is an error, not a silent
undercount. One thread must run the block's Spark jobs alone (pytest runs tests one at a
time): jobs that another thread of the same application starts meanwhile are counted too.
"""
from __future__ import annotations

import re
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Iterator

from pyspark.sql import SparkSession

OUTPUT_ROWS = "number of output rows"
# The classes the status store keeps jobs, stages and SQL executions as (one KVStore holds all
# three), each with the id it sorts them by.
_JOBS = ("org.apache.spark.status.JobDataWrapper", lambda job: job.info().jobId())
_STAGES = ("org.apache.spark.status.StageDataWrapper", lambda stage: stage.info().stageId())
_EXECUTIONS = ("org.apache.spark.sql.execution.ui.SQLExecutionUIData", lambda execution: execution.executionId())
FINISH_WAIT_SECONDS = 30
# A frame ``(x, unboundedfollowing)`` with x anything but unboundedpreceding, as printed in a physical plan.
_UNBOUNDED_FOLLOWING_FRAME = re.compile(
    r"specifiedwindowframe\((?:RowFrame|RangeFrame), "
    r"(?!unboundedpreceding\$\(\))[^,()]+(?:\(\))?, "
    r"unboundedfollowing\$\(\)\)"
)


@dataclass
class Work:
    """What the SQL executions and stages of one measured block did (filled in when the block ends)."""

    operator_rows: int = 0
    stage_records: int = 0
    executions: int = 0
    stages: int = 0
    jobs: int = 0  # job ids submitted (under adaptive execution a shuffle map stage is a job of its own)
    window_frames: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        """The one number to compare across sizes: operators' output rows plus stages' records."""
        return self.operator_rows + self.stage_records

    def __str__(self) -> str:
        return (
            f"{self.rows:,} rows ({self.operator_rows:,} operator output rows, {self.stage_records:,} stage records; "
            f"{self.executions} SQL executions, {self.stages} stages)"
        )


def _seq(scala_seq) -> list:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


class _Stores:
    def __init__(self, spark: SparkSession):
        self.context = spark.sparkContext._jsc.sc()  # noqa: SLF001 - the JVM SparkContext
        self.app = self.context.statusStore()
        self.sql = spark._jsparkSession.sharedState().statusStore()  # noqa: SLF001
        self.gateway = spark.sparkContext._gateway  # noqa: SLF001

    def drain(self) -> None:
        """Wait until every listener has seen every event posted so far."""
        self.context.listenerBus().waitUntilEmpty()

    def above(self, kind: tuple, after: int, limit: int | None = None) -> list:
        """The status store's entries of ``kind`` (``_JOBS``, ``_STAGES``, ``_EXECUTIONS``) whose id is
        above ``after``, newest first, at most ``limit`` of them.

        The store keeps its entries sorted by id, so a reverse view reads only the block's own
        entries: listing every entry instead (what the status tracker and ``stageList`` do) costs
        a py4j call per entry the application ever ran, thousands late in the suite, on every
        measured block.
        """
        wrapper, key = kind
        jvm = self.gateway.jvm
        cls = jvm.java.lang.Class.forName(wrapper, True, jvm.java.lang.Thread.currentThread().getContextClassLoader())
        entries = self.app.store().view(cls).reverse().closeableIterator()
        found = []
        try:
            while entries.hasNext() and (limit is None or len(found) < limit):
                entry = entries.next()
                if key(entry) <= after:
                    break
                found.append(entry)
        finally:
            entries.close()
        return found

    def newest_id(self, kind: tuple) -> int:
        """The largest id of ``kind`` in the store (-1: none yet)."""
        newest = self.above(kind, -1, limit=1)
        return kind[1](newest[0]) if newest else -1

    def finished_executions(self, after: int) -> list:
        """The executions above id ``after``, once the store holds each one's end and final metrics.

        The SQL listener records an execution's end and aggregates its metrics on a thread of
        its own after the end event, so a drained listener bus is not enough: poll briefly.
        """
        deadline = time.monotonic() + FINISH_WAIT_SECONDS
        while True:
            executions = self.above(_EXECUTIONS, after)
            pending = [e.executionId() for e in executions if e.completionTime().isEmpty() or e.metricValues() is None]
            if not pending:
                return executions
            if time.monotonic() > deadline:
                raise RuntimeError(f"SQL executions {pending} have no end recorded: still running?")
            time.sleep(0.05)


def _output_rows(stores: _Stores, execution) -> int:
    # The list holds the metrics of every version of an adaptive plan, some more than once.
    accumulators = {m.accumulatorId() for m in _seq(execution.metrics()) if m.name() == OUTPUT_ROWS}
    values = stores.sql.executionMetrics(execution.executionId())
    total = 0
    for accumulator in accumulators:
        value = values.get(accumulator)
        if value.isDefined():  # operators of a plan version that adaptive execution replaced never ran
            total += int(str(value.get()).replace(",", ""))
    return total


def _stage_records(stage) -> int:
    return (
        stage.inputRecords() + stage.outputRecords() + stage.shuffleReadRecords() + stage.shuffleWriteRecords()
    )


def _contiguous(ids: list[int], after: int, what: str) -> None:
    if ids and sorted(ids) != list(range(after + 1, max(ids) + 1)):
        raise RuntimeError(f"the status store dropped some {what} of the measured block: saw ids {sorted(ids)}")


@contextmanager
def measure_work(spark: SparkSession) -> Iterator[Work]:
    """Count the work of every Spark job the block runs; ``Work`` is filled in when the block ends."""
    stores = _Stores(spark)
    stores.drain()
    last_execution = stores.newest_id(_EXECUTIONS)
    last_stage = stores.newest_id(_STAGES)
    last_job = stores.newest_id(_JOBS)
    work = Work()
    yield work
    stores.drain()
    work.jobs = len(stores.above(_JOBS, last_job))
    executions = stores.finished_executions(last_execution)
    stages = [wrapper.info() for wrapper in stores.above(_STAGES, last_stage)]  # every attempt, as StageData
    _contiguous([e.executionId() for e in executions], last_execution, "SQL executions")
    _contiguous(sorted({s.stageId() for s in stages}), last_stage, "stages")
    work.executions = len(executions)
    work.stages = len(stages)
    work.operator_rows = sum(_output_rows(stores, e) for e in executions)
    work.stage_records = sum(_stage_records(s) for s in stages)
    work.window_frames = sorted(
        {frame for e in executions for frame in _UNBOUNDED_FOLLOWING_FRAME.findall(e.physicalPlanDescription())}
    )
