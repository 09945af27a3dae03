"""Steps side by side in one process (``replica_lens/executor.py``) and the evaluation mode they share.

What could go wrong: the executor running steps one after another anyway (no gain, silently),
or more at once than asked; a failed step taking its independent siblings down, or its
downstream steps running; the critical chain's priority ignored; Dagster's events of a step
lost; and two overlapping steps fighting over the session's evaluation settings (one step
switching the other's queries to interpreted evaluation in the middle).
"""
from __future__ import annotations

import threading
import time

import dagster as dg
import pytest
from dagster._core.execution.retries import RetryMode
from dagster._core.utils import make_new_run_id

from replica_lens.cli import EXIT_USAGE, main
from replica_lens.executor import ThreadedExecutor, execute_here, threaded_in_process_executor
from resources.session import INTERPRETED, code_generation

BARRIER_SECONDS = 20


def _job(ops_graph, name: str = "side_by_side") -> dg.JobDefinition:
    return dg.GraphDefinition(name=name, node_defs=ops_graph["ops"], dependencies=ops_graph["deps"]).to_job(
        executor_def=threaded_in_process_executor
    )


def _run(job: dg.JobDefinition, max_concurrent: int | None = None) -> dg.ExecuteInProcessResult:
    run_config = {"execution": {"config": {"max_concurrent": max_concurrent}}} if max_concurrent else {}
    return execute_here(job, partition_key=None, instance=dg.DagsterInstance.ephemeral(), run_config=run_config,
                        run_id=make_new_run_id())


def _fan_out(body_b, body_c, tags_b=None, tags_c=None):
    """start -> (b, c) -> after_b: b and c are independent once start has run."""

    @dg.op
    def start():
        return 1

    @dg.op(tags=tags_b or {})
    def b(x):
        return body_b(x)

    @dg.op(tags=tags_c or {})
    def c(x):
        return body_c(x)

    @dg.op
    def after_b(x):
        return x

    deps = {"b": {"x": dg.DependencyDefinition("start")}, "c": {"x": dg.DependencyDefinition("start")},
            "after_b": {"x": dg.DependencyDefinition("b")}}
    return {"ops": [start, b, c, after_b], "deps": deps}


def test_independent_steps_run_at_the_same_time():
    # Catches: steps run one after another (each would wait alone at the barrier until it breaks).
    barrier = threading.Barrier(2, timeout=BARRIER_SECONDS)

    def meet(x):
        barrier.wait()
        return x

    result = _run(_job(_fan_out(meet, meet)), max_concurrent=2)
    assert result.success
    assert result.output_for_node("after_b") == 1


def test_one_at_a_time_when_asked():
    # Catches: max_concurrent ignored (the steps would overlap).
    running, overlaps, lock = [0], [], threading.Lock()

    def busy(x):
        with lock:
            running[0] += 1
            overlaps.append(running[0])
        time.sleep(0.3)
        with lock:
            running[0] -= 1
        return x

    result = _run(_job(_fan_out(busy, busy)), max_concurrent=1)
    assert result.success
    assert max(overlaps) == 1


def test_a_failed_step_leaves_its_siblings_running_and_its_downstream_skipped():
    # Catches: a step's exception escaping its thread (the run would crash instead of failing the step), the
    # sibling abandoned, or the failed step's downstream run.
    def fail(_x):
        raise ValueError("b broke")

    def slow(x):
        time.sleep(0.5)
        return x

    result = _run(_job(_fan_out(fail, slow)), max_concurrent=2)
    assert not result.success
    by_step = {}
    for event in result.all_events:
        if event.step_key:
            by_step.setdefault(event.step_key, set()).add(event.event_type_value)
    assert "STEP_FAILURE" in by_step["b"]
    assert "STEP_SUCCESS" in by_step["c"]
    assert "STEP_SUCCESS" not in by_step.get("after_b", set())
    assert "b broke" in next(e for e in result.all_events if e.is_step_failure).step_failure_data.error.to_string()


def test_the_higher_priority_step_starts_first():
    # Catches: the dagster/priority tag of the critical chain (assets/partitions.py CRITICAL_PATH) ignored.
    order: list[str] = []

    def record(name):
        def body(x):
            order.append(name)
            return x
        return body

    job = _job(_fan_out(record("b"), record("c"), tags_c={"dagster/priority": "1"}))
    assert _run(job, max_concurrent=1).success
    assert order == ["c", "b"]


def test_max_concurrent_below_one_is_refused():
    # Catches: an executor with no slot accepted (the run would wait forever for a free one).
    with pytest.raises(ValueError, match="at least 1"):
        ThreadedExecutor(retries=RetryMode.ENABLED, max_concurrent=0)


def test_concurrent_steps_below_one_is_a_usage_error(tmp_path, capsys):
    # Catches: --concurrent-steps 0 accepted (the executor would run nothing and wait forever).
    with pytest.raises(SystemExit) as exited:
        main(["audit", "--landing", str(tmp_path), "--warehouse", str(tmp_path / "w"), "--concurrent-steps", "0"])
    assert exited.value.code == EXIT_USAGE
    assert "must be a whole number of at least 1" in capsys.readouterr().err


class _Conf:
    """The part of a session's RuntimeConfig that code_generation uses."""

    def __init__(self):
        self.values: dict[str, str] = {}

    def get(self, key, default=None):
        return self.values.get(key, default)

    def set(self, key, value):
        self.values[key] = value

    def unset(self, key):
        self.values.pop(key, None)


class _Session:
    def __init__(self):
        self.conf = _Conf()


def _in_thread(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_a_step_wanting_the_other_mode_waits_for_the_open_blocks():
    # Catches: a compiled step starting while an interpreted one runs (it would unset the settings under the
    # interpreted step's queries, or run its own large queries interpreted).
    session = _Session()
    entered, release, seen = threading.Event(), threading.Event(), {}

    def small_step():
        with code_generation(session, 10, 20_000) as chosen:
            seen["small"] = chosen
            entered.set()
            release.wait(BARRIER_SECONDS)

    def large_step():
        with code_generation(session, 1_000_000, 20_000) as chosen:
            seen["large"] = chosen
            seen["large_settings"] = dict(session.conf.values)

    small = _in_thread(small_step)
    assert entered.wait(BARRIER_SECONDS)
    large = _in_thread(large_step)
    time.sleep(0.3)
    assert "large" not in seen, "the compiled step must wait while the interpreted one is open"
    assert session.conf.values == INTERPRETED
    release.set()
    small.join(BARRIER_SECONDS)
    large.join(BARRIER_SECONDS)
    assert seen["small"] == "interpreted" and seen["large"] == "compiled"
    assert seen["large_settings"] == {}
    assert session.conf.values == {}


def test_a_small_step_beside_a_compiled_one_runs_compiled_without_waiting():
    # Catches: a small check waiting for a long compiled step to end (seen: a 0.3 s check took 7 s), or switching
    # the session to interpreted evaluation under the compiled step's queries.
    session = _Session()
    entered, release, seen = threading.Event(), threading.Event(), {}

    def large_step():
        with code_generation(session, 1_000_000, 20_000):
            entered.set()
            release.wait(BARRIER_SECONDS)

    large = _in_thread(large_step)
    assert entered.wait(BARRIER_SECONDS)
    small_done = threading.Event()

    def small_step():
        with code_generation(session, 10, 20_000) as chosen:
            seen["small"] = chosen
            seen["settings"] = dict(session.conf.values)
        small_done.set()

    _in_thread(small_step)
    assert small_done.wait(5), "the small step must not wait for the compiled one"
    assert seen == {"small": "compiled", "settings": {}}
    release.set()
    large.join(BARRIER_SECONDS)
    assert session.conf.values == {}


def test_steps_wanting_the_same_mode_overlap_and_the_last_one_out_restores():
    # Catches: the first step to finish restoring the settings while another interpreted step still runs.
    session = _Session()
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    during: list[dict] = []

    def first():
        with code_generation(session, 10, 20_000):
            first_in.set()
            second_in.wait(BARRIER_SECONDS)
        first_out.set()

    def second():
        first_in.wait(BARRIER_SECONDS)
        with code_generation(session, 20, 20_000):
            second_in.set()
            first_out.wait(BARRIER_SECONDS)
            during.append(dict(session.conf.values))

    threads = [_in_thread(first), _in_thread(second)]
    for thread in threads:
        thread.join(BARRIER_SECONDS)
    assert during == [INTERPRETED]
    assert session.conf.values == {}


def test_an_operators_setting_is_still_left_alone():
    # Catches: the mode bookkeeping overwriting (or unsetting) the user's own spark_config.
    session = _Session()
    session.conf.set("spark.sql.codegen.wholeStage", "true")
    with code_generation(session, 10, 20_000) as chosen:
        assert chosen == "as configured"
    assert session.conf.values == {"spark.sql.codegen.wholeStage": "true"}


@pytest.mark.parametrize("failing_mode_rows", [10, 1_000_000])
def test_a_failing_step_releases_its_mode(failing_mode_rows):
    # Catches: a step that raises inside its block leaving the mode held (every later step of the other mode
    # would wait forever).
    session = _Session()
    with pytest.raises(RuntimeError):
        with code_generation(session, failing_mode_rows, 20_000):
            raise RuntimeError("the step failed")
    done = threading.Event()

    def other():
        with code_generation(session, 1_000_000 if failing_mode_rows == 10 else 10, 20_000):
            done.set()

    _in_thread(other)
    assert done.wait(BARRIER_SECONDS)
    assert session.conf.values == {}


def test_an_interrupt_ends_the_run_while_a_step_still_runs():
    # Catches: Ctrl-C (or the UI's terminate, the same signal inside Dagster) swallowed until every running
    # step has ended by itself: under the in-process executor the step in the run's thread was interrupted.
    import os
    import signal

    release = threading.Event()

    def blocked(x):
        release.wait(BARRIER_SECONDS)
        return x

    threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    started = time.monotonic()
    try:
        result = _run(_job(_fan_out(blocked, blocked)), max_concurrent=2)
        took = time.monotonic() - started
    finally:
        release.set()
    assert not result.success
    assert took < BARRIER_SECONDS / 2, f"the run waited {took:.1f} s for its steps"
    assert any("Interrupted" in (e.message or "") for e in result.all_events)
