"""Exporter positions, regressions and compaction bounds (SPEC 7)."""
from __future__ import annotations

import pytest
from pyspark.sql import functions as F

from pipelines.exporters import compaction_bounds, exporter_inputs, exporter_positions, exporter_regressions
from pipelines.frames import computed_once
from schemas.operations import CompactionBounds, ExporterPositions, ExporterRegressions
from schemas.validation import validation_errors
from tests.rows import raw_frame


def frame(spark, rows):
    return raw_frame(spark, [{"source_file": "x", **r} for r in rows])


# Heartbeats of (dc-a, t, 0) and the applied time (max) each was written at.
HEARTBEATS = {5: 1000, 12: 1700, 18: 2500}


def vt_row(replica, partition, offset, epoch=1):
    base = {"replica": replica, "topic": "t", "partition": partition, "offset": offset, "leader_epoch": epoch}
    if offset == 0:
        return {**base, "kind": "START_OF_PUSH"}
    if replica == "dc-a" and partition == 0 and offset in HEARTBEATS:
        applied = HEARTBEATS[offset]
        return {
            **base, "kind": "HEARTBEAT", "source_region": "dc-b", "source_offset": offset,
            "origin_ts_min_ms": applied - 50, "origin_ts_max_ms": applied - 40,
            "applied_ts_min_ms": applied - 10, "applied_ts_max_ms": applied,
        }
    return {**base, "kind": "PUT", "key": f"k{offset % 4}", "value": f"v{offset}", "source_region": "dc-b",
            "source_offset": offset}


def report(replica, partition, exporter, reported_at_ms, exported_offset):
    return {"replica": replica, "topic": "t", "partition": partition, "kind": "EXPORTER_POSITION",
            "exporter": exporter, "reported_at_ms": reported_at_ms, "exported_offset": exported_offset}


ROWS = (
    # (dc-a, t, 0): offsets 0..20; the leader failed over at offset 15 (epoch 1 -> 2).
    [vt_row("dc-a", 0, o, epoch=1 if o < 15 else 2) for o in range(21)]
    # e1 moves to 15, then goes back to 11 and 12 (two regressions); latest 12, on a heartbeat.
    + [report("dc-a", 0, "e1", t, o) for t, o in [(100, 8), (200, 15), (300, 11), (400, 12)]]
    # e2 is past the last heartbeat (18).
    + [report("dc-a", 0, "e2", t, o) for t, o in [(150, 4), (250, 19)]]
    # e3 reports twice at the same instant: ordered by position, no regression; it holds compaction back.
    + [report("dc-a", 0, "e3", t, o) for t, o in [(500, 3), (500, 6)]]
    # (dc-b, t, 0): read, but no exporter reports on it.
    + [vt_row("dc-b", 0, o) for o in range(4)]
    # (dc-a, t, 1): read up to offset 4, while its exporter reports 9: the audit is behind.
    + [vt_row("dc-a", 1, o) for o in range(5)]
    + [report("dc-a", 1, "e1", 100, 9)]
    # (dc-c, t, 0): an exporter report and no version-topic rows at all.
    + [report("dc-c", 0, "e1", 100, 7)]
)


@pytest.fixture(scope="module")
def tables(spark):
    raw = frame(spark, ROWS).cache()
    inputs = exporter_inputs(raw)
    positions = exporter_positions(inputs).cache()
    bounds = compaction_bounds(inputs)
    yield {
        "positions": positions,
        "regressions": exporter_regressions(inputs),
        "bounds": bounds,
        "positions_by": {(r["replica"], r["partition"], r["exporter"]): r for r in positions.collect()},
        "bounds_by": {(r["replica"], r["partition"]): r for r in bounds.collect()},
    }
    positions.unpersist()
    raw.unpersist()


def test_latest_position_reports_and_regressions(tables):
    p = tables["positions_by"]
    assert set(p) == {("dc-a", 0, "e1"), ("dc-a", 0, "e2"), ("dc-a", 0, "e3"), ("dc-a", 1, "e1"), ("dc-c", 0, "e1")}
    e1 = p[("dc-a", 0, "e1")]
    assert (e1["exported_offset"], e1["reported_at_ms"], e1["reports"], e1["max_exported_offset_seen"],
            e1["regressions"]) == (12, 400, 4, 15, 2)
    e3 = p[("dc-a", 0, "e3")]
    assert (e3["exported_offset"], e3["reported_at_ms"], e3["reports"], e3["regressions"]) == (6, 500, 2, 0)


def test_lag_in_positions_and_time(tables):
    p = tables["positions_by"]
    e1 = p[("dc-a", 0, "e1")]
    # Last offset 20; the heartbeat at exactly the exported offset 12 (applied 1700) counts,
    # against the last heartbeat at 18 (applied 2500).
    assert (e1["last_offset"], e1["lag_positions"]) == (20, 8)
    assert (e1["first_heartbeat_offset"], e1["last_heartbeat_offset"], e1["lag_ms"]) == (12, 18, 800)
    e3 = p[("dc-a", 0, "e3")]
    assert (e3["lag_positions"], e3["first_heartbeat_offset"], e3["lag_ms"]) == (14, 12, 800)
    # Past the last heartbeat: nothing to measure against.
    e2 = p[("dc-a", 0, "e2")]
    assert (e2["lag_positions"], e2["first_heartbeat_offset"], e2["last_heartbeat_offset"], e2["lag_ms"]) == (
        1, None, 18, None,
    )
    # Reported ahead of what the dump holds; and a partition with no rows read at all.
    ahead = p[("dc-a", 1, "e1")]
    assert (ahead["last_offset"], ahead["lag_positions"], ahead["lag_ms"]) == (4, -5, None)
    unread = p[("dc-c", 0, "e1")]
    assert (unread["last_offset"], unread["lag_positions"]) == (None, None)


def test_exporter_regressions_rows(tables):
    got = sorted(
        (r["exporter"], r["reported_at_ms"], r["exported_offset"], r["previous_exported_offset"],
         r["previous_reported_at_ms"], r["max_earlier_exported_offset"])
        for r in tables["regressions"].collect()
    )
    assert got == [("e1", 300, 11, 15, 200, 15), ("e1", 400, 12, 11, 300, 15)]


def test_compaction_bound_and_reexport_exposure_after_fail_over(tables):
    b = tables["bounds_by"][("dc-a", 0)]
    assert (b["exporters"], b["min_exported_offset"], b["max_exported_offset"], b["holding_back_exporter"]) == (
        3, 6, 19, "e3",
    )
    assert (b["processed_offset"], b["compaction_bound"], b["bound_reason"]) == (20, 6, "EXPORTERS")
    # A new leader re-exports from e3's 6: offsets 7..19 are exported again for e2 (13 rows),
    # of which the heartbeats 12 and 18 are not data.
    assert (b["reexport_exposure_rows"], b["reexport_exposure_data_rows"]) == (13, 11)


def test_every_partition_listed_and_bound_never_above_processed(tables):
    bounds = tables["bounds_by"]
    assert set(bounds) == {("dc-a", 0), ("dc-b", 0), ("dc-a", 1), ("dc-c", 0)}
    no_exporter = bounds[("dc-b", 0)]
    assert (no_exporter["exporters"], no_exporter["compaction_bound"], no_exporter["bound_reason"],
            no_exporter["processed_offset"], no_exporter["reexport_exposure_rows"]) == (0, None, "NO_EXPORTER", 3, 0)
    behind = bounds[("dc-a", 1)]
    assert (behind["min_exported_offset"], behind["processed_offset"], behind["compaction_bound"],
            behind["bound_reason"], behind["reexport_exposure_rows"]) == (9, 4, 4, "PROCESSED", 0)
    unread = bounds[("dc-c", 0)]
    assert (unread["exporters"], unread["processed_offset"], unread["compaction_bound"], unread["bound_reason"],
            unread["reexport_exposure_rows"]) == (1, None, None, "NOT_PROCESSED", None)
    for row in bounds.values():
        if row["compaction_bound"] is not None:
            assert row["compaction_bound"] <= row["processed_offset"]
            assert row["compaction_bound"] <= row["min_exported_offset"]


@pytest.mark.parametrize(
    ("table", "model", "column", "broken"),
    [
        ("positions", ExporterPositions, "reports", 0),
        ("regressions", ExporterRegressions, "exported_offset", -1),
        ("bounds", CompactionBounds, "bound_reason", "SOMETIMES"),
    ],
)
def test_models_pass_and_fail(tables, table, model, column, broken):
    df = tables[table]
    assert validation_errors(model, df) == []
    bad = df.withColumn(column, F.lit(broken).cast(df.schema[column].dataType))
    assert any(e.column == column for e in validation_errors(model, bad))


def test_the_tables_read_the_raw_rows_in_two_passes_only(spark, tmp_path):
    """Catches a table planned on the raw rows again: a third pass over every row of a snapshot."""
    path = str(tmp_path / "raw")
    frame(spark, ROWS).write.parquet(path)
    raw = spark.read.parquet(path)
    passes = []

    def once(df):
        passes.append(df)
        return computed_once(df)

    inputs = exporter_inputs(raw, once=once)
    assert len(passes) == 2
    for table in (exporter_positions(inputs), exporter_regressions(inputs), compaction_bounds(inputs)):
        plan = table._jdf.queryExecution().optimizedPlan().toString()  # noqa: SLF001 - the plan Spark runs
        assert path not in plan, plan
    # The same rows as without keeping the passes.
    plain = exporter_inputs(raw)
    for build in (exporter_positions, exporter_regressions, compaction_bounds):
        assert sorted(build(inputs).collect()) == sorted(build(plain).collect())
