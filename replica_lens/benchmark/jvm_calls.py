"""Calls from Python to the JVM while a block runs: a small audit's fixed cost, counted instead of timed.

Every PySpark call that reaches the JVM is a py4j command over a socket, about 0.2 ms each on
the 2-core development machine, and a small audit makes tens of thousands: building columns,
shaping frames, reading schemas, and py4j's own messages releasing the JVM objects Python no
longer holds. Unlike seconds, the count hardly moves with the machine's load, so the benchmark
reports it (``VariantFigures.jvm_calls``) as the fixed cost's steadiest figure.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator


class CallCount:
    """How many commands Python sent to the JVM, from any thread (py4j's garbage collection included)."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def add(self) -> None:
        with self._lock:
            self.calls += 1


@contextmanager
def counting_jvm_calls() -> Iterator[CallCount]:
    """Count the py4j commands sent while the block runs (PySpark's pinned-thread client, its default)."""
    import py4j.clientserver as clientserver

    count = CallCount()
    original = clientserver.ClientServerConnection.send_command

    def counted(self, command, *args, **kwargs):
        count.add()
        return original(self, command, *args, **kwargs)

    clientserver.ClientServerConnection.send_command = counted
    try:
        yield count
    finally:
        clientserver.ClientServerConnection.send_command = original
