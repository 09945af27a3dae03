"""Shared fixtures: one Spark session for the whole suite (JVM start-up is paid once)."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)


@pytest.fixture(scope="session")
def spark():
    from resources.spark import build_spark_session

    # The suite runs thousands of Spark jobs in one session; tests that measure work read the JVM's
    # status stores, which by default keep only the last 1,000 jobs, stages and SQL executions and
    # would drop part of a measured block late in the run.
    retain = {
        key: "1000000"
        for key in ("spark.ui.retainedJobs", "spark.ui.retainedStages", "spark.sql.ui.retainedExecutions")
    }
    session = build_spark_session(
        master="local[2]", shuffle_partitions=4, app_name="replica-lens-tests", extra=retain
    )
    yield session
    session.stop()
