"""What ``replica-lens audit`` shows on the terminal while a run goes: one line per step as it ends
(``StepPrinter``) and, on a terminal only, a status line with Spark's progress (``status_line``)."""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Iterator, TextIO

import dagster as dg

from replica_lens.steps import STEP_INPUTS


def plain(value: Any) -> Any:
    """A Dagster metadata value as the plain value it holds."""
    return getattr(value, "value", value)


def spark_progress() -> str:
    """The running Spark stages' task counts, e.g. ``stage 12: 5/8 tasks`` (empty without a session)."""
    from pyspark import SparkContext

    context = SparkContext._active_spark_context  # noqa: SLF001 - the session the run started, if any
    if context is None:
        return ""
    tracker = context.statusTracker()
    parts = []
    for stage_id in sorted(tracker.getActiveStageIds())[:3]:
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            parts.append(f"stage {stage_id}: {info.numCompletedTasks}/{info.numTasks} tasks")
    return ", ".join(parts)


@contextmanager
def status_line(stream: TextIO, label: str, every: float = 1.0, enabled: bool = True) -> Iterator[None]:
    """While the block runs, rewrite one line of ``stream`` every ``every`` seconds: elapsed time and Spark's progress.

    Only for a terminal (``stream.isatty()``): piped or redirected output gets no control
    characters. The line is erased when the block ends.
    """
    if not (enabled and stream.isatty()):
        yield
        return
    started = time.monotonic()
    done = threading.Event()

    def show() -> None:
        while not done.wait(every):
            try:
                progress = spark_progress()
            except Exception:  # noqa: BLE001 - the status line never breaks the run
                progress = ""
            elapsed = int(time.monotonic() - started)
            text = f"{label}: {elapsed // 60}m{elapsed % 60:02d}s" + (f"  {progress}" if progress else "")
            with _OUTPUT:
                stream.write("\r\x1b[K" + text[:160])
                stream.flush()

    thread = threading.Thread(target=show, name="replica-lens-status", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        with _OUTPUT:
            stream.write("\r\x1b[K")
            stream.flush()


# One line at a time on the terminal: the status line's thread and the step lines share it.
_OUTPUT = threading.RLock()


def _count(rows: Any) -> str:
    return f"{rows:,}" if isinstance(rows, int) else "?"


def _highlights(step_key: str, metadata: dict[str, dict[str, Any]]) -> str:
    """What matters in one step's outcome, from its tables' metadata: quarantine, verdicts, anomalies, lag."""
    table = metadata.get(step_key, {})
    if step_key == "raw_topic_snapshots" and "rows_quarantined" in table:
        return f"quarantined {_count(table['rows_quarantined'])}"
    if step_key == "divergence_reports" and "keys_divergent" in table:
        return (f"DIVERGENT {table['keys_divergent']}, MISSING {table['keys_missing']}, "
                f"IN_FLIGHT {table['keys_in_flight']}")
    if step_key == "stream_pass" and metadata.get("stream_anomalies"):
        kinds = metadata["stream_anomalies"].get("by_anomaly") or {}
        return "anomalies: " + (", ".join(f"{k} {v}" for k, v in sorted(kinds.items())) or "none")
    if step_key == "replication_lag" and table:
        worst = table.get("worst_lag")
        if not worst:
            return "no heartbeat"
        return f"worst p99 <= {worst['p99_upper_ms']:.0f} ms ({worst['replica']} from {worst['origin_region']})"
    return ""


class StepPrinter:
    """Prints one line per step of a run as the step ends: seconds, status, rows in and out, what matters.

    Called with each event of the run (``DagsterInstance.watch_event_logs``): in the run's
    own thread for an ephemeral instance, from a file watcher's thread for one on disk
    (``DAGSTER_HOME``), which may deliver the last events after the run returned: ``finish``
    then prints what is missing from the run's step statistics. Each step is printed once.
    On a terminal the line replaces the status line, which comes back on its next tick.
    Rows in are the rows of the table the step reads (``STEP_INPUTS``; the ingestion's are
    the rows read from the landing files).
    """

    _ENDS = {"STEP_SUCCESS": "success", "STEP_FAILURE": "failure", "STEP_SKIPPED": "skipped"}

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.started: dict[str, float] = {}
        self.written: dict[str, list[str]] = {}  # step -> tables, in the order written
        self.metadata: dict[str, dict[str, Any]] = {}  # table -> its materialization's metadata
        self.printed: set[str] = set()

    def __call__(self, entry: Any, _cursor: Any = None) -> None:
        event = entry.dagster_event
        if event is None or event.step_key is None:
            return
        kind = event.event_type_value
        if kind == "STEP_START":
            self.started[event.step_key] = entry.timestamp
        elif kind == "ASSET_MATERIALIZATION":
            self._record(event.step_key, event.event_specific_data.materialization)
        elif kind in self._ENDS:
            seconds = entry.timestamp - self.started.get(event.step_key, entry.timestamp)
            self._print(event.step_key, seconds, self._ENDS[kind])

    def finish(self, instance: dg.DagsterInstance, run_id: str) -> None:
        """Print the steps whose end was not delivered (yet), in the order they ran."""
        stats = sorted(instance.get_run_step_stats(run_id), key=lambda s: s.start_time or 0)
        if all(s.step_key in self.printed for s in stats):
            return
        with _OUTPUT:
            for record in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION):
                materialization = record.dagster_event.event_specific_data.materialization if record.dagster_event else None
                if materialization and materialization.asset_key.to_user_string() not in self.metadata:
                    self._record(record.step_key, materialization)
            for step in stats:
                seconds = (step.end_time or step.start_time or 0) - (step.start_time or 0)
                self._print(step.step_key, seconds, step.status.value.lower() if step.status else "unknown")

    def _record(self, step_key: str, materialization: Any) -> None:
        table = materialization.asset_key.to_user_string()
        self.metadata[table] = {k: plain(v) for k, v in materialization.metadata.items()}
        self.written.setdefault(step_key, []).append(table)

    def _print(self, step_key: str, seconds: float, status: str) -> None:
        with _OUTPUT:
            if step_key in self.printed:
                return
            self.printed.add(step_key)
            parts = [f"  step {step_key:<44} {seconds:7.1f} s  {status}"]
            if step_key in STEP_INPUTS:
                source = STEP_INPUTS[step_key]
                rows_in = (self.metadata.get("raw_topic_snapshots", {}).get("rows_read") if source is None
                           else self.metadata.get(source, {}).get("dagster/row_count"))
                parts.append(f"in {_count(rows_in)}")
            out = [f"{t} {_count(self.metadata[t].get('dagster/row_count'))}" for t in self.written.get(step_key, [])]
            if out:
                parts.append("out: " + ", ".join(out))
            highlights = _highlights(step_key, self.metadata)
            if highlights:
                parts.append(f"[{highlights}]")
            erase = "\r\x1b[K" if self.stream.isatty() else ""
            self.stream.write(erase + "  ".join(parts) + "\n")
            self.stream.flush()
