"""Shared fixtures: one Spark session for the whole suite (JVM start-up is paid once)."""
from __future__ import annotations

import os

import pytest

os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)


@pytest.fixture(scope="session")
def spark():
    from resources.spark import build_spark_session

    session = build_spark_session(master="local[2]", shuffle_partitions=4, app_name="replica-lens-tests")
    yield session
    session.stop()
