"""Run the steps of one Dagster run in this process, several at a time, on threads.

Why: every step of an audit drives the same Spark session (one JVM per run, started
once), so Dagster's multiprocess executor, which starts a process (and a JVM) per step,
is out, and its in-process executor runs one step at a time. After the ingestion, an
audit has three independent branches (the stream pass -> divergence, the lag tables, the
exporter tables). Run one after another, the driver
spends much of a small audit analysing plans and waiting for one- or two-task jobs
while a core idles; run side by side, one step's planning overlaps another's tasks,
and Spark's scheduler shares the task slots between their jobs.

How: the loop of Dagster's in-process executor (``inner_plan_execution_iterator``), with
the step bodies on worker threads. The run's thread keeps Dagster's bookkeeping to
itself: it asks ``ActiveExecution`` for steps that are ready (their upstream steps
succeeded, at most ``max_concurrent`` running, highest ``dagster/priority`` tag first),
starts each on a thread, and receives the events the threads put on one queue, yielding
them in the order they arrive and handing each to ``ActiveExecution``. A step's events
are those of Dagster's own ``dagster_event_sequence_for_step``, so failures, retries,
asset checks and materializations mean what they mean under the in-process executor.

``max_concurrent`` = 1 is exactly the in-process executor's order of work.

Interrupts (Ctrl-C, or the UI's terminate, which Dagster turns into the same signal): the
run's thread checks for one at least every ``POLL_SECONDS``, cancels the session's running
Spark jobs (a thread cannot be stopped from outside; its step then fails) and ends the run
as interrupted, as the in-process executor does when the step in its own thread is
interrupted.

This uses Dagster internals that have no public equivalent (``ActiveExecution``,
``dagster_event_sequence_for_step``, the plan-execution context manager): they are those of
the ``dagster`` version pinned in ``constraints.txt``, and ``tests/test_executor.py``
runs a real job through them.

Spark: PySpark pins each Python thread to a JVM thread, so a step's jobs, observations
and local properties stay its own. The SQL settings are the session's, so steps that
overlap agree on one evaluation mode: a small step beside a compiled one runs compiled, a
large one waits for interpreted ones to end (``resources/session.py``, ``code_generation``).
"""
from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

import dagster as dg
from dagster._core.definitions.job_base import InMemoryJob
from dagster._core.errors import DagsterExecutionInterruptedError
from dagster._core.events import DagsterEvent, EngineEventData
from dagster._core.execution.compute_logs import create_compute_log_file_key
from dagster._core.execution.api import ExecuteRunWithPlanIterable
from dagster._core.execution.context.system import PlanExecutionContext, PlanOrchestrationContext
from dagster._core.execution.context_creation_job import PlanExecutionContextManager
from dagster._core.execution.execute_in_process import core_execute_in_process, merge_run_tags
from dagster._core.execution.plan.execute_plan import _trigger_hook, dagster_event_sequence_for_step
from dagster._core.execution.plan.instance_concurrency_context import InstanceConcurrencyContext
from dagster._core.execution.plan.plan import ExecutionPlan
from dagster._core.execution.retries import RetryMode, get_retries_config
from dagster._core.executor.base import Executor

from resources.tuning import DEFAULT_CONCURRENT_STEPS

# How often the run's thread looks up from the queue (interrupts, a step's thread dying).
POLL_SECONDS = 0.5
_DONE = object()


@dataclass
class _Running:
    thread: threading.Thread
    context: Any  # the step's StepExecutionContext
    events: list[DagsterEvent] = field(default_factory=list)
    error: Optional[tuple] = None  # exc_info of a failure outside Dagster's own step handling


def _run_step(step_context, events: "queue.Queue", running: _Running) -> None:
    key = step_context.step.key
    try:
        for event in dagster_event_sequence_for_step(step_context):
            events.put((key, event))
    except BaseException:  # noqa: BLE001 - handed to the run's thread, which raises it
        running.error = sys.exc_info()
    finally:
        events.put((key, _DONE))


def _cancel_spark_jobs() -> None:
    """Cancel every running Spark job of this process's session, if one is running (steps' threads then fail)."""
    pyspark = sys.modules.get("pyspark")
    context = getattr(getattr(pyspark, "SparkContext", None), "_active_spark_context", None)
    if context is not None:
        context.cancelAllJobs()


def threaded_plan_iterator(
    job_context: PlanExecutionContext, execution_plan: ExecutionPlan, max_concurrent: int
) -> Iterator[DagsterEvent]:
    """Dagster's in-process plan iteration with up to ``max_concurrent`` step bodies on threads."""
    compute_log_manager = job_context.instance.compute_log_manager
    step_keys = [step.key for step in execution_plan.get_steps_to_execute_in_topo_order()]
    events: "queue.Queue[tuple[str, Any]]" = queue.Queue()
    running: dict[str, _Running] = {}
    with InstanceConcurrencyContext(job_context.instance, job_context.dagster_run) as concurrency:
        with execution_plan.start(
            retry_mode=job_context.retry_mode,
            instance_concurrency_context=concurrency,
            step_dependency_config=job_context.step_dependency_config,
        ) as active:
            log_key = compute_log_manager.build_log_key_for_run(job_context.run_id, create_compute_log_file_key())
            with compute_log_manager.capture_logs(log_key) as log_context:
                yield DagsterEvent.capture_logs(job_context, step_keys, log_key, log_context)
                while not active.is_complete or running:
                    if active.check_for_interrupts():
                        # Ctrl-C, or a terminate from the UI (SIGTERM): a step's thread cannot be stopped from
                        # outside, but its Spark jobs can, which ends the step; the run ends at once.
                        yield DagsterEvent.engine_event(
                            job_context,
                            f"Interrupted: cancelling the Spark jobs of {', '.join(sorted(running)) or 'no step'}",
                            EngineEventData.interrupted(sorted(running)),
                        )
                        active.mark_interrupted()
                        _cancel_spark_jobs()
                        raise DagsterExecutionInterruptedError()
                    free = max_concurrent - len(running)
                    steps = active.get_steps_to_execute(limit=free) if free > 0 and not active.is_complete else []
                    yield from active.concurrency_event_iterator(job_context)
                    for step in steps:
                        step_context = job_context.for_step(step, active.get_known_state())
                        entry = _Running(thread=None, context=step_context)  # type: ignore[arg-type]
                        entry.thread = threading.Thread(
                            target=_run_step, args=(step_context, events, entry), name=f"step {step.key}", daemon=True
                        )
                        running[step.key] = entry
                        entry.thread.start()
                    if not running:
                        # Nothing runs and nothing is ready yet (a retry waiting for its delay).
                        active.sleep_til_ready()
                        continue
                    try:
                        key, event = events.get(timeout=POLL_SECONDS)
                    except queue.Empty:
                        continue
                    entry = running[key]
                    if event is not _DONE:
                        entry.events.append(event)
                        yield event
                        active.handle_event(event)
                        continue
                    entry.thread.join()
                    del running[key]
                    if entry.error is not None:
                        raise entry.error[1].with_traceback(entry.error[2])
                    active.verify_complete(job_context, key)
                    for plan_event in active.plan_events_iterator(job_context):
                        entry.events.append(plan_event)
                        yield plan_event
                    yield from _trigger_hook(entry.context, entry.events)


class ThreadedExecutor(Executor):
    """Dagster's in-process execution with up to ``max_concurrent`` steps on threads (see the module docstring)."""

    def __init__(self, retries: RetryMode, max_concurrent: int = DEFAULT_CONCURRENT_STEPS):
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        self._retries = retries
        self.max_concurrent = max_concurrent

    @property
    def retries(self) -> RetryMode:
        return self._retries

    def execute(self, plan_context: PlanOrchestrationContext, execution_plan: ExecutionPlan) -> Iterator[DagsterEvent]:
        step_keys = execution_plan.step_keys_to_execute
        yield DagsterEvent.engine_event(
            plan_context,
            f"Executing steps in process (pid: {os.getpid()}), up to {self.max_concurrent} at a time",
            event_specific_data=EngineEventData.in_process(os.getpid(), step_keys),
        )

        def iterate(job_context: PlanExecutionContext, execution_plan: ExecutionPlan) -> Iterator[DagsterEvent]:
            return threaded_plan_iterator(job_context, execution_plan, self.max_concurrent)

        yield from iter(
            ExecuteRunWithPlanIterable(
                execution_plan=plan_context.execution_plan,
                iterator=iterate,
                execution_context_manager=PlanExecutionContextManager(
                    job=plan_context.job,
                    retry_mode=plan_context.retry_mode,
                    execution_plan=plan_context.execution_plan,
                    run_config=plan_context.run_config,
                    dagster_run=plan_context.dagster_run,
                    instance=plan_context.instance,
                    raise_on_error=plan_context.raise_on_error,
                    output_capture=plan_context.output_capture,
                ),
            )
        )
        yield DagsterEvent.engine_event(
            plan_context,
            f"Finished steps in process (pid: {os.getpid()})",
            event_specific_data=EngineEventData.in_process(os.getpid(), step_keys),
        )


@dg.executor(
    name="threaded_in_process",
    config_schema={
        "retries": get_retries_config(),
        "max_concurrent": dg.Field(
            int,
            default_value=DEFAULT_CONCURRENT_STEPS,
            description="Steps run at once, on threads of the run's process (1: one after another).",
        ),
    },
)
def threaded_in_process_executor(init_context) -> ThreadedExecutor:
    """All steps in the run's process (one Spark session), up to ``max_concurrent`` at a time."""
    config = init_context.executor_config
    return ThreadedExecutor(
        retries=RetryMode.from_config(config["retries"]), max_concurrent=config["max_concurrent"]
    )


def execute_here(
    job: dg.JobDefinition,
    partition_key: str,
    instance: dg.DagsterInstance,
    run_config: dict,
    run_id: str,
    asset_selection: Optional[frozenset[dg.AssetKey]] = None,
) -> dg.ExecuteInProcessResult:
    """``job.execute_in_process`` (never raising on a failed run) that keeps the job's own executor.

    ``JobDefinition.execute_in_process`` swaps the job's executor for Dagster's serial
    in-process one; this runs the same in-process execution with the job's executor, so
    ``replica-lens audit`` runs the steps the way a run launched from the UI does.
    ``asset_selection``: the assets to materialize (None: every asset of the job), as a run
    of a selection started from the UI records it.
    """
    tags = merge_run_tags(
        job_def=job, partition_key=partition_key, tags=None, asset_selection=asset_selection, instance=instance,
        run_config=run_config,
    )
    return core_execute_in_process(
        run_config=run_config,
        job=InMemoryJob(job.get_subset(asset_selection=asset_selection) if asset_selection else job),
        instance=instance,
        output_capturing_enabled=True,
        raise_on_error=False,
        run_tags=tags,
        run_id=run_id,
        asset_selection=asset_selection,
    )
