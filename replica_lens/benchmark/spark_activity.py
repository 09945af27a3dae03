"""Spark activity: the jobs and stages of the driver JVM's status store, and what ran in a time window."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass


@dataclass
class SparkFigures:
    """What Spark ran in a time window: jobs and stages submitted in it, their shuffle and spill bytes."""

    jobs: int = 0
    stages: int = 0  # stages that ran (a stage whose shuffle output was reused is skipped: not counted)
    shuffle_read_bytes: int = 0
    shuffle_write_bytes: int = 0
    disk_spill_bytes: int = 0


class SparkActivity:
    """Every job and stage the JVM's status store holds, read in one call per list.

    The status store (``SparkContext.statusStore``) is filled by Spark's listener even with
    ``spark.ui.enabled=false``. Its lists are serialized to JSON inside the JVM (Jackson, on
    Spark's class path) so that reading thousands of jobs costs one py4j call, not one per
    field. A job or stage belongs to the window holding its submission time; a skipped
    stage has none and ran nothing.
    """

    def __init__(self, jobs: list[dict], stages: list[dict]):
        self.jobs = jobs
        self.stages = [s for s in stages if s.get("submissionTime") is not None and s.get("status") != "SKIPPED"]

    @classmethod
    def read(cls, spark) -> "SparkActivity":
        sc = spark.sparkContext._jsc.sc()  # noqa: SLF001 - the JVM's SparkContext
        try:
            sc.listenerBus().waitUntilEmpty(30_000)  # events of the last jobs reach the store asynchronously
        except Exception:  # noqa: BLE001 - a slow listener only makes the figures late, not wrong
            time.sleep(1.0)
        store = sc.statusStore()
        jvm = spark._jvm  # noqa: SLF001
        mapper = jvm.com.fasterxml.jackson.databind.ObjectMapper()
        mapper.registerModule(getattr(getattr(jvm.com.fasterxml.jackson.module.scala, "DefaultScalaModule$"), "MODULE$"))
        quantiles = getattr(store, "stageList$default$4")()
        jobs = json.loads(mapper.writeValueAsString(store.jobsList(None)))
        stages = json.loads(mapper.writeValueAsString(store.stageList(None, False, False, quantiles, None)))
        return cls(jobs, stages)

    def max_job_id(self) -> int:
        return max((j["jobId"] for j in self.jobs), default=-1)

    def between(self, start: float, end: float) -> SparkFigures:
        """Figures of the jobs and stages submitted between two ``time.time()`` instants."""
        lo, hi = start * 1000, end * 1000
        stages = [s for s in self.stages if lo <= s["submissionTime"] <= hi]
        return SparkFigures(
            jobs=sum(1 for j in self.jobs if j.get("submissionTime") is not None and lo <= j["submissionTime"] <= hi),
            stages=len(stages),
            shuffle_read_bytes=sum(s["shuffleReadBytes"] for s in stages),
            shuffle_write_bytes=sum(s["shuffleWriteBytes"] for s in stages),
            disk_spill_bytes=sum(s["diskBytesSpilled"] for s in stages),
        )

    def complete_after(self, job_id: int) -> bool:
        """Whether every job after ``job_id`` is still in the store (none evicted by its limits)."""
        later = {j["jobId"] for j in self.jobs if j["jobId"] > job_id}
        return not later or later == set(range(job_id + 1, max(later) + 1))
