"""The Spark session: one per process, started once per run.

Every job of the code location runs its steps in one process (Dagster's in-process
executor), so the JVM starts once per run, not once per asset step. The session is
local by default; pointing ``master`` at a cluster runs the same code there.

Delta Lake natively: when ``delta_jars_dir`` names a folder holding the delta-spark
jars (``delta-spark_*.jar`` and ``delta-storage-*.jar``), they are put on the class
path and the Delta SQL extension and catalog are configured, and the Delta store
writes through delta-spark. Without them (as on a machine that can reach only the
package registry) the store uses the embedded delta-rs writer instead.

Code generation sized to the step (``SparkResource.sized_for``): Spark compiles Java
source for every plan it runs, hundreds of classes for one audit, whose compilation and JIT
warm-up are a large part of a small snapshot's audit (docs/performance.md). An asset step whose input is at most
``interpreted_max_rows`` rows runs with Spark's interpreted evaluation instead (whole-stage
code generation off, expressions interpreted): the same operators and results, no
compiler. Larger inputs keep code generation, which wins from some ten thousand rows on.
"""
from __future__ import annotations

from typing import Optional

from dagster_pyspark import PySparkResource
from pydantic import Field

# The session's settings and start-up live in resources/session.py, which imports no Dagster.
from resources.session import INTERPRETED_MAX_ROWS, build_spark_session, code_generation
from resources.tuning import DEFAULT_DRIVER_MEMORY, DEFAULT_SHUFFLE_PARTITIONS


class SparkResource(PySparkResource):
    """The run's Spark session, configured from fields (dagster-pyspark's resource, extended)."""

    spark_config: dict = Field(default_factory=dict, description="Extra Spark settings, applied last.")
    master: str = Field(default="local[*]", description="Spark master URL; local[*] runs embedded.")
    shuffle_partitions: int = Field(
        default=DEFAULT_SHUFFLE_PARTITIONS,
        description="spark.sql.shuffle.partitions, an upper bound: adaptive execution merges partitions to ~32 MB each.",
    )
    driver_memory: str = Field(
        default=DEFAULT_DRIVER_MEMORY, description="Driver heap (only applies when this process starts the JVM); the JVM's RSS stays under ~4 GiB."
    )
    delta_jars_dir: Optional[str] = Field(
        default=None,
        description="Folder with the delta-spark and delta-storage jars; when set and present, Delta is written natively.",
    )

    log_level: str = Field(default="ERROR", description="Spark's log level (its log4j output on stderr).")
    interpreted_max_rows: int = Field(
        default=INTERPRETED_MAX_ROWS,
        description=(
            "A step whose input has at most this many rows runs with Spark's interpreted evaluation instead of "
            "compiling code for every plan (the compiler is about a third of a small snapshot's audit). 0: always compile."
        ),
    )

    def setup_for_execution(self, context) -> None:  # noqa: ARG002 - Dagster's hook signature
        self._spark_session = build_spark_session(
            log_level=self.log_level,
            master=self.master,
            shuffle_partitions=self.shuffle_partitions,
            driver_memory=self.driver_memory,
            delta_jars_dir=self.delta_jars_dir,
            extra={str(k): str(v) for k, v in self.spark_config.items()},
        )

    def sized_for(self, rows: Optional[int]):
        """``code_generation`` for a step reading ``rows`` rows (None: unknown, compiled)."""
        return code_generation(self.spark_session, rows, self.interpreted_max_rows)
