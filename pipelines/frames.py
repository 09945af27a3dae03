"""Frames that several later steps read: computed once, kept on local disk; and what an observation of a frame saw.

``computed_once`` is a local checkpoint stored DISK_ONLY: the rows are computed by one
Spark job and later plans read them back instead of recomputing (and re-shuffling) their
lineage. Kept off the JVM heap on purpose: cached blocks in memory shrink what sorts and
aggregations may use before they spill, and at tens of millions of rows that ran a sort's
spill merge out of heap (measured: a 20-million-row audit failed so with in-memory
checkpoints). The operating system's page cache still keeps recent blocks in RAM.
"""
from __future__ import annotations

from pyspark import StorageLevel
from pyspark.sql import DataFrame, Observation


def computed_once(df: DataFrame) -> DataFrame:
    """``df`` computed now, its rows kept on local disk for every later use (lineage truncated)."""
    return df.localCheckpoint(eager=True, storageLevel=StorageLevel.DISK_ONLY)


def observed(observation: Observation) -> dict | None:
    """The values an observation (``DataFrame.observe``) took, once its query has run; None if Spark dropped it.

    Spark drops an observation with the plan around it when it finds that plan's rows are none:
    before running anything (the lines of a snapshot folder without data files are an empty
    local relation), or after running it, when adaptive execution replaces the plan above a
    stage that produced no rows (every line of a snapshot quarantined: no candidate reaches the
    exchange above the observation that counted them). The query then reports an empty row,
    which ``Observation.get`` refuses with a bare assertion error. The rows that went through
    are unknown then, not none: callers must find out another way, never read it as zero.
    """
    metrics = observation._jo.get()  # noqa: SLF001 - the JVM's row, to tell a dropped observation apart
    return observation.get if metrics.size() > 0 else None
