"""The stage layer: tables are staged, validated by the job that writes them, and published together."""
from __future__ import annotations

import contextlib
from pathlib import Path

import dagster as dg
import pytest
from pyspark.sql import functions as F

from assets.tables import StepTables, first_rows_and_counts, matching_rows
from resources.delta_store import DeltaStore
from schemas.registry import struct_for
from tests.rows import raw_frame
from tests.spark_work import measure_work

TABLE = "raw_topic_snapshots"
QUARANTINE = "raw_topic_quarantine"


def _rows(n: int) -> list[dict]:
    return [
        {"replica": "dc-a", "topic": "t_v1", "partition": 0, "offset": i, "kind": "PUT", "key": f"k{i}",
         "value": f"v{i}", "source_region": "dc-a", "source_offset": i, "hb_vector": {"dc-a": i}}
        for i in range(n)
    ]


@pytest.fixture()
def store(tmp_path) -> DeltaStore:
    return DeltaStore(warehouse_root=str(tmp_path / "warehouse"), engine="embedded")


def _quarantine(spark, n: int):
    rows = [("s1", "f.jsonl", "dc-a", "orders", 0, 7, "{}", "MISSING_FIELD", "kind") for _ in range(n)]
    return spark.createDataFrame(rows, struct_for(QUARANTINE))


def _offsets(spark, store) -> list[int]:
    return sorted(r["offset"] for r in store.read_snapshot(spark, TABLE, "s1", struct_for(TABLE)).collect())


def test_a_step_that_passes_publishes_every_table_with_its_check(spark, store):
    """Catches: a table left staged (unpublished), a wrong row count, a check result missing or failed."""
    tables = StepTables(spark, store, "s1")
    tables.stage(raw_frame(spark, _rows(5), "s1"), TABLE)
    tables.stage(_quarantine(spark, 2), QUARANTINE)
    results = {r.asset_key.to_user_string(): r for r in tables.publish()}
    assert set(results) == {TABLE, QUARANTINE}
    assert results[TABLE].metadata["dagster/row_count"] == 5
    assert results[QUARANTINE].metadata["dagster/row_count"] == 2
    (check,) = results[TABLE].check_results
    assert check.passed and check.metadata["rows_checked"].value == 5
    assert _offsets(spark, store) == [0, 1, 2, 3, 4]


def test_a_later_table_of_a_step_reads_the_staged_rows_before_anything_is_published(spark, store):
    """Catches: ``frame`` reading the committed table (stale or absent) instead of the staged files."""
    tables = StepTables(spark, store, "s1")
    tables.stage(raw_frame(spark, _rows(4), "s1"), TABLE)
    assert not store.exists(TABLE) or store.read_snapshot(spark, TABLE, "s1", struct_for(TABLE)).count() == 0
    assert sorted(r["offset"] for r in tables.frame(TABLE).collect()) == [0, 1, 2, 3]
    list(tables.publish())


def test_a_table_that_breaks_its_schema_publishes_nothing_of_its_step(spark, store):
    """Catches: a table committed before its check, or its step's other tables committed anyway."""
    first = StepTables(spark, store, "s1")
    first.stage(raw_frame(spark, _rows(3), "s1"), TABLE)
    first.stage(_quarantine(spark, 1), QUARANTINE)
    list(first.publish())
    versions = {t: store.version(t) for t in (TABLE, QUARANTINE)}

    second = StepTables(spark, store, "s1")
    second.stage(raw_frame(spark, _rows(6), "s1"), TABLE)  # passes, but its step fails
    broken = _quarantine(spark, 2).withColumn("reason", F.lit("NOT_A_REASON"))
    second.stage(broken, QUARANTINE)
    emitted = []
    with pytest.raises(dg.Failure) as failure:
        for result in second.publish():
            emitted.append(result)
    assert "raw_topic_quarantine:matches_schema" in failure.value.description
    assert "reason" in failure.value.description
    (check,) = emitted
    assert isinstance(check, dg.AssetCheckResult) and not check.passed
    assert check.metadata["violations"].value == 1
    assert {t: store.version(t) for t in (TABLE, QUARANTINE)} == versions
    assert _offsets(spark, store) == [0, 1, 2]
    # The staged files of the failed step are gone, not left to be read or committed later.
    table_dir = store.table_uri(TABLE)
    import os

    live = {p.split("/", 1)[0] for p in _live_paths(store, TABLE)}
    assert {d for d in os.listdir(table_dir) if d.startswith("write-")} == live


def test_an_empty_table_is_staged_checked_and_published(spark, store):
    """Catches: an empty frame hanging on its observation or leaving the snapshot's old rows in place."""
    list(_publish(spark, store, raw_frame(spark, _rows(2), "s1")))
    (result,) = _publish(spark, store, raw_frame(spark, [], "s1"))
    assert result.metadata["dagster/row_count"] == 0
    assert result.check_results[0].passed
    assert _offsets(spark, store) == []


def test_a_table_known_empty_is_published_without_a_spark_job(spark, store):
    """Catches: ``stage_empty`` leaving the snapshot's old rows in place, touching another snapshot,
    writing files, or running a Spark job (the cost it exists to avoid)."""
    list(_publish(spark, store, raw_frame(spark, _rows(3), "s1")))
    other = StepTables(spark, store, "s2")
    other.stage(raw_frame(spark, _rows(2), "s2"), TABLE)
    list(other.publish())

    tracker = spark.sparkContext.statusTracker()
    jobs_before = len(tracker.getJobIdsForGroup(None))
    tables = StepTables(spark, store, "s1")
    staged = tables.stage_empty(TABLE)
    (result,) = tables.publish()
    assert len(tracker.getJobIdsForGroup(None)) == jobs_before
    assert result.metadata["dagster/row_count"] == 0 and result.metadata["files_written"] == 0
    assert result.check_results[0].passed
    assert _offsets(spark, store) == []
    assert store.read_snapshot(spark, TABLE, "s2", struct_for(TABLE)).count() == 2
    assert not any(p.startswith(staged.relative_dir) for p in _live_paths(store, TABLE))


def _publish(spark, store, df):
    tables = StepTables(spark, store, "s1")
    tables.stage(df, TABLE)
    return list(tables.publish())


def _live_paths(store, table) -> list[str]:
    from deltalake import DeltaTable
    import pyarrow as pa

    return pa.table(DeltaTable(store.table_uri(table)).get_add_actions(flatten=True)).column("path").to_pylist()


def test_a_steps_own_observations_come_from_the_job_that_writes_the_table(spark, store):
    """Catches: ``observe`` computed wrongly (by the wrong name, or only over part of the rows), a value
    forced into another type, or computed by a query of its own (reading the staged table back, as the
    anomaly step did)."""
    df = raw_frame(spark, _rows(7), "s1")
    tables = StepTables(spark, store, "s1")
    alone = StepTables(spark, store, "s1")
    with measure_work(spark) as plain:
        alone.stage(df, TABLE)
    alone.discard()
    with measure_work(spark) as counted:
        tables.stage(
            df, TABLE,
            observe={
                "even": F.count_if(F.col("offset") % 2 == 0), "none": F.count_if(F.col("offset") < 0),
                "offsets": F.array_sort(F.collect_set("offset")), "top": F.max("offset"),
            },
        )
    assert (counted.executions, counted.stages) == (plain.executions, plain.stages)
    offsets = sorted(r["offset"] for r in df.select("offset").collect())
    assert tables.observed(TABLE) == {"even": 4, "none": 0, "offsets": offsets, "top": offsets[-1]}
    (result,) = tables.publish()
    assert result.check_results[0].passed and result.metadata["dagster/row_count"] == 7


def test_first_rows_and_counts_are_one_query_and_count_every_match(spark):
    """Catches: the counts covering only the first rows kept (an observation placed after the limit),
    the first rows in the wrong order, or a second query for the counts (as the checks ran before)."""
    df = spark.createDataFrame([(i, "odd" if i % 2 else "even") for i in range(50)], "n int, parity string")
    with measure_work(spark) as work:
        rows, counts = first_rows_and_counts(
            df.where(F.col("n") >= 5), [F.desc("n")],
            {"matches": F.count(F.lit(1)), "odd": F.count_if(F.col("parity") == "odd")}, 3,
        )
    assert work.executions == 1
    assert [r["n"] for r in rows] == [49, 48, 47]
    assert counts == {"matches": 45, "odd": 23}


def test_a_check_of_a_table_the_log_knows_empty_runs_no_spark_job(spark, store):
    """Catches: ``matching_rows`` querying a snapshot that the Delta log says has no row (the healthy
    snapshot's divergence reports, whose check is the audit's last step), or answering from
    another snapshot's rows."""
    list(_publish(spark, store, raw_frame(spark, [], "s1")))
    other = StepTables(spark, store, "s2")
    other.stage(raw_frame(spark, _rows(3), "s2"), TABLE)
    list(other.publish())

    class Resource:  # SparkResource's two members that matching_rows uses
        spark_session = spark

        @staticmethod
        def sized_for(rows):
            return contextlib.nullcontext("compiled")

    everything, anything = F.lit(True), {"rows": F.count(F.lit(1))}
    with measure_work(spark) as work:
        found = matching_rows(Resource, store, TABLE, "s1", everything, [F.col("offset")], anything, 2)
    assert (work.executions, work.stages, found) == (0, 0, ([], {"rows": 0}))
    with measure_work(spark) as work:
        rows, counts = matching_rows(Resource, store, TABLE, "s2", everything, [F.col("offset")], anything, 2)
    assert work.executions == 1 and [r["offset"] for r in rows] == [0, 1] and counts == {"rows": 3}


WATERMARKS = "reconstructed_watermarks"


def _watermark_batch(offsets: list[int]):
    import pyarrow as pa

    from schemas.conform import to_arrow_schema

    rows = [{"replica": "dc-a", "topic": "t_v1", "partition": 0, "offset": o, "key": f"k{o}", "kind": "PUT",
             "value_hash": "h", "source_region": "dc-a", "source_offset": o, "applied_lower_bound": [("dc-a", o)],
             "touch_bound": [("dc-a", o)], "reach": [("dc-a", o + 1)], "missing_before": 0} for o in offsets]
    struct = struct_for(WATERMARKS)
    schema = to_arrow_schema(struct)
    return pa.RecordBatch.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows], schema=schema)


def test_a_table_a_pass_writes_from_arrow_is_checked_and_published_like_any(spark, store):
    """Catches: Arrow-staged files published without their schema rules counted, a wrong row count, an empty stage
    (no task had rows) leaving the snapshot's old rows in place, and a pass's files left behind by a step that fails."""
    tables = StepTables(spark, store, "s1")
    stage = tables.arrow_stage(WATERMARKS)
    file = stage.files(0)
    file.write(_watermark_batch([3, 4, 5]))
    file.close()
    tables.stage_arrow(stage)
    (result,) = tables.publish()
    assert result.metadata["dagster/row_count"] == 3 and result.check_results[0].metadata["rows_checked"].value == 3
    assert sorted(r["offset"] for r in store.read_snapshot(spark, WATERMARKS, "s1", struct_for(WATERMARKS)).collect()) \
        == [3, 4, 5]

    broken = StepTables(spark, store, "s1")
    stage = broken.arrow_stage(WATERMARKS)
    file = stage.files(0)
    file.write(_watermark_batch([-1, 6]))  # an offset below 0
    file.close()
    broken.stage_arrow(stage)
    pending = broken.arrow_stage("heartbeat_segments")  # filled by the pass, never staged: the step fails first
    Path(pending.path).mkdir(parents=True)
    (Path(pending.path) / "part-00000.parquet").write_bytes(b"a task's file")
    with pytest.raises(dg.Failure, match="reconstructed_watermarks:matches_schema"):
        list(broken.publish())
    assert not (Path(store.table_uri("heartbeat_segments")) / pending.relative_dir).exists()
    assert not (Path(store.table_uri(WATERMARKS)) / stage.relative_dir).exists()

    empty = StepTables(spark, store, "s1")
    empty.stage_arrow(empty.arrow_stage(WATERMARKS))
    (result,) = empty.publish()
    assert result.metadata["dagster/row_count"] == 0
    assert store.read_snapshot(spark, WATERMARKS, "s1", struct_for(WATERMARKS)).count() == 0
