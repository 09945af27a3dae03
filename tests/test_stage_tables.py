"""The stage layer: every written table is read back and validated, on Spark or from a local copy."""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from assets.tables import materialize_stage, schema_check
from resources.delta_store import DeltaStore
from tests.rows import raw_frame

TABLE = "raw_topic_snapshots"


def _rows(n: int) -> list[dict]:
    return [
        {"replica": "dc-a", "topic": "t_v1", "partition": 0, "offset": i, "kind": "PUT", "key": f"k{i}",
         "value": f"v{i}", "source_region": "dc-a", "source_offset": i, "hb_vector": {"dc-a": i}}
        for i in range(n)
    ]


@pytest.fixture()
def store(tmp_path) -> DeltaStore:
    return DeltaStore(warehouse_root=str(tmp_path / "warehouse"), engine="embedded")


# rows=None validates the table in Spark; a small count validates a local copy of it.
@pytest.mark.parametrize("rows", [None, 3], ids=["spark", "local"])
def test_a_table_that_matches_its_schema_passes_on_either_path(spark, store, rows):
    store.write_snapshot(spark, raw_frame(spark, _rows(3), "s1"), TABLE, "s1", _struct())
    result = schema_check(spark, store, TABLE, "s1", rows=rows)
    assert result.passed
    assert result.metadata["violations"].value == 0


@pytest.mark.parametrize("rows", [None, 3], ids=["spark", "local"])
def test_a_table_that_breaks_its_schema_fails_on_either_path(spark, store, rows):
    broken = raw_frame(spark, _rows(3), "s1").withColumn("offset", F.lit(-1).cast("bigint"))
    store.write_snapshot(spark, broken, TABLE, "s1", _struct())
    result = schema_check(spark, store, TABLE, "s1", rows=rows)
    assert not result.passed
    errors = result.metadata["errors"].value
    assert any(e["column"] == "offset" for e in errors), errors


def test_materialize_stage_records_where_its_time_went_and_validates_what_it_wrote(spark, store):
    result = materialize_stage(spark, store, raw_frame(spark, _rows(5), "s1"), TABLE, "s1")
    assert result.metadata["dagster/row_count"] == 5
    assert {"write_seconds", "check_seconds"} <= set(result.metadata)
    (check,) = result.check_results
    assert check.passed


def test_an_empty_table_is_written_and_passes_its_check(spark, store):
    result = materialize_stage(spark, store, raw_frame(spark, [], "s1"), TABLE, "s1")
    assert result.metadata["dagster/row_count"] == 0
    assert result.check_results[0].passed


def _struct():
    from schemas.registry import struct_for

    return struct_for(TABLE)
