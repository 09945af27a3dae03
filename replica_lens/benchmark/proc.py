"""Processes read from ``/proc``, nothing running inside them: resident memory, and a JVM's CPU time split by thread kind."""
from __future__ import annotations

import bisect
import os
import threading
import time
from dataclasses import dataclass
from typing import Optional


def _rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _stat_fields(stat_path: str) -> Optional[list[str]]:
    """The fields of a ``/proc`` stat file after the command name (which may hold spaces and ")"): state, ppid, ...

    None when the process or thread is gone.
    """
    try:
        with open(stat_path) as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _jvm_pid(parent: Optional[int] = None) -> Optional[int]:
    """The Spark driver JVM started by ``parent`` (default: this process; PySpark launches it as a child)."""
    parent = parent or os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat_fields(f"/proc/{entry}/stat")
            if fields and int(fields[1]) == parent:
                with open(f"/proc/{entry}/cmdline", "rb") as cmd:
                    if b"java" in cmd.read():
                        return int(entry)
        except (OSError, IndexError, ValueError):
            continue
    return None


# The JVM's own threads by what they do (Linux names a thread by its first 15 characters):
# HotSpot's just-in-time compilers ("C1 CompilerThread0", "C2 CompilerThread0") and its
# garbage collector's workers ("GC Thread#0"; "G1 ..." for G1's concurrent threads).
JIT_THREADS = ("C1 CompilerThre", "C2 CompilerThre")
GC_THREADS = ("GC Thread#", "G1 ")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")  # the unit of the CPU times in /proc


def _cpu_seconds(stat_path: str) -> Optional[float]:
    """User + system CPU seconds from a ``/proc/<pid>/stat`` or ``/proc/<pid>/task/<tid>/stat`` file."""
    fields = _stat_fields(stat_path)
    try:
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS if fields else None
    except (IndexError, ValueError):
        return None


@dataclass(frozen=True)
class JvmCpu:
    """CPU seconds a JVM has used since it started: in all, in its JIT compilers, in its garbage collector."""

    total: float = 0.0
    jit: float = 0.0
    gc: float = 0.0

    def __sub__(self, other: "JvmCpu") -> "JvmCpu":
        return JvmCpu(self.total - other.total, self.jit - other.jit, self.gc - other.gc)

    def rounded(self) -> dict[str, float]:
        return {"jvm_cpu_seconds": round(self.total, 2), "jit_cpu_seconds": round(self.jit, 2), "gc_cpu_seconds": round(self.gc, 2)}


class JvmThreads:
    """Reads a JVM's CPU time, split by thread kind, from ``/proc`` (nothing runs inside the JVM).

    The process total includes threads that have ended; a compiler or GC thread that ends
    (HotSpot adds and retires compiler threads as the queue grows and shrinks) keeps the
    last value read for it.
    """

    def __init__(self, pid: int, proc: str = "/proc"):
        self.root = f"{proc}/{pid}"
        self._kind: dict[str, str] = {}  # thread id -> "jit", "gc" or "" (any other)
        self._last: dict[str, float] = {}  # thread id -> CPU seconds when last read

    def _kind_of(self, tid: str) -> str:
        kind = self._kind.get(tid)
        if kind is None:
            try:
                with open(f"{self.root}/task/{tid}/comm") as comm:
                    name = comm.read().strip()
            except OSError:
                name = ""
            kind = "jit" if name.startswith(JIT_THREADS) else "gc" if name.startswith(GC_THREADS) else ""
            self._kind[tid] = kind
        return kind

    def read(self) -> Optional[JvmCpu]:
        total = _cpu_seconds(f"{self.root}/stat")
        if total is None:
            return None
        try:
            tids = os.listdir(f"{self.root}/task")
        except OSError:
            tids = []
        for tid in tids:
            if self._kind_of(tid):
                seconds = _cpu_seconds(f"{self.root}/task/{tid}/stat")
                if seconds is not None:
                    self._last[tid] = seconds
        by_kind = {"jit": 0.0, "gc": 0.0}
        for tid, seconds in self._last.items():
            by_kind[self._kind[tid]] += seconds
        return JvmCpu(total, by_kind["jit"], by_kind["gc"])


class ProcessSampler:
    """Samples a Python process and its Spark JVM every 100 ms: resident memory of both, the JVM's CPU time.

    ``pid`` is the Python process (default: this one); its JVM is found among its children.
    The JVM's CPU is split into its JIT compilers' and its garbage collector's threads
    (``JvmThreads``): a cold JVM spends a large part of an audit compiling.
    """

    def __init__(self, pid: Optional[int] = None, interval_s: float = 0.1):
        self.pid = pid or os.getpid()
        self.interval_s = interval_s
        self.samples: list[tuple[float, int, int]] = []  # (time, python KiB, jvm KiB)
        self.cpu_samples: list[tuple[float, JvmCpu]] = []  # (time, the JVM's CPU so far)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._jvm: Optional[int] = None
        self._threads: Optional[JvmThreads] = None

    def _run(self) -> None:
        while not self._stop.is_set():
            if self._jvm is None:
                self._jvm = _jvm_pid(self.pid)
                self._threads = JvmThreads(self._jvm) if self._jvm else None
            jvm = _rss_kib(self._jvm) if self._jvm else 0
            now = time.time()
            self.samples.append((now, _rss_kib(self.pid), jvm))
            cpu = self._threads.read() if self._threads else None
            if cpu is not None:
                self.cpu_samples.append((now, cpu))
            self._stop.wait(self.interval_s)

    def __enter__(self) -> "ProcessSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def peak_bytes(self, start: float = 0.0, end: float = float("inf")) -> tuple[float, float]:
        """(Python, JVM) peak resident MiB between two ``time.time()`` instants."""
        window = [s for s in self.samples if start <= s[0] <= end] or self.samples[-1:]
        return (max(s[1] for s in window) / 1024, max(s[2] for s in window) / 1024) if window else (0.0, 0.0)

    def cpu_at(self, instant: float) -> JvmCpu:
        """The JVM's CPU so far at ``instant``, interpolated between the samples around it."""
        samples = self.cpu_samples
        if not samples:
            return JvmCpu()
        after = bisect.bisect_left([t for t, _ in samples], instant)
        if after == 0:
            return samples[0][1]
        if after == len(samples):
            return samples[-1][1]
        (t0, a), (t1, b) = samples[after - 1], samples[after]
        share = (instant - t0) / (t1 - t0) if t1 > t0 else 1.0
        return JvmCpu(*(x + (y - x) * share for x, y in ((a.total, b.total), (a.jit, b.jit), (a.gc, b.gc))))

    def cpu_between(self, start: float, end: float) -> JvmCpu:
        """CPU the JVM used between two ``time.time()`` instants."""
        return self.cpu_at(end) - self.cpu_at(start)

    def last_cpu(self) -> JvmCpu:
        """The JVM's CPU at the last sample (for a JVM that has exited: up to one interval short)."""
        return self.cpu_samples[-1][1] if self.cpu_samples else JvmCpu()


def _cores() -> int:
    """The machine's cores, as the report's ``machine.cpus`` gives them."""
    return os.cpu_count() or 1
