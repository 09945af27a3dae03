"""Shared fixtures: one Spark session for the whole suite (JVM start-up is paid once)."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)


@pytest.fixture(scope="session")
def spark():
    from resources.session import STATUS_RETENTION, build_spark_session

    # The tests that count Spark's work read the JVM's status stores, late in a run of thousands of jobs.
    session = build_spark_session(
        master="local[2]", shuffle_partitions=4, app_name="replica-lens-tests", extra=STATUS_RETENTION
    )
    yield session
    session.stop()
