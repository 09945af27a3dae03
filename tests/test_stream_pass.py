"""The fused pass per stream against the window passes it replaced, row for row (issue 52).

The previous implementation (``annotate_segments``, ``summarize_segments``,
``partition_watermarks``, ``reconstruct_watermarks``: Spark windows and joins) is the oracle:
generated streams with every feature the pass reads (START_OF_PUSH or not, heartbeats with and
without vectors, gaps, positions read that hold no row, gaps ending at such a position, keys
written from several regions, timestamps out of order) give the same ``heartbeat_segments``,
``heartbeat_segment_summary``, ``reconstructed_watermarks`` and ``stream_anomalies`` rows both ways.
"""
from __future__ import annotations

import re
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipelines.anomalies import AnomalyBounds, find_stream_anomalies
from pipelines.segments import annotate_segments, summarize_segments
from pipelines.stream_pass import WRITTEN, anomaly_rows, segment_rows, stream_pass, summary_rows, watermark_rows
from pyspark.sql import functions as F
from pipelines.watermarks import reconstruct_watermarks
from schemas.operations import ANOMALIES
from schemas.raw import RawTopicSnapshots
from tests.examples import examples
from tests.reference_windows import window_anomalies, window_segments, window_watermarks
from tests.rows import plain, raw_frame

REGIONS = ("dc-a", "dc-b", "dc-c")
KEYS = ("k1", "k2", "k3", "k4")
SKIPPED = ("snapshot_id", "replica", "topic", "partition", "offset")


@st.composite
def streams(draw, replica: str, partition: int, topic: str = "t") -> tuple[list[dict], list[int]]:
    """One stream's rows and the positions read that hold no row."""
    rows, read, offset = [], [], draw(st.integers(0, 3))
    if draw(st.booleans()):
        rows.append({"offset": offset, "kind": "START_OF_PUSH"})
        offset += 1
    high = dict.fromkeys(REGIONS, 0)
    for _ in range(draw(st.integers(0, 14))):
        # A gap (positions missing), maybe with read positions inside it or right before the next row.
        step = draw(st.sampled_from((0, 0, 0, 0, 1, 2, 3)))
        for position in range(offset, offset + step):
            if draw(st.integers(0, 2)) == 0:
                read.append(position)
        offset += step
        region = draw(st.sampled_from(REGIONS))
        high[region] += draw(st.integers(0, 3))
        kind = draw(st.sampled_from(("PUT", "PUT", "DELETE", "HEARTBEAT")))
        row = {"offset": offset, "kind": kind, "source_region": region, "source_offset": high[region],
               "write_ts": draw(st.sampled_from((None, *range(0, 50, 3)))),
               "leader_epoch": draw(st.sampled_from((None, 1, 2)))}
        if kind == "HEARTBEAT":
            ts, applied = draw(st.integers(0, 40)), draw(st.integers(0, 40))
            row.update(origin_ts_min_ms=ts, origin_ts_max_ms=ts + draw(st.integers(0, 8)), applied_ts_min_ms=applied,
                       applied_ts_max_ms=applied + draw(st.integers(0, 8)))
            if draw(st.booleans()):
                named = draw(st.lists(st.sampled_from(REGIONS), unique=True, max_size=3))
                row["hb_vector"] = {r: high[r] + draw(st.integers(0, 2)) for r in named}
        else:
            row["key"] = draw(st.sampled_from(KEYS))
            row["value"] = None if kind == "DELETE" else draw(st.sampled_from(("x", "y")))
        rows.append(row)
        offset += 1
    for row in rows:
        row.update(replica=replica, topic=topic, partition=partition)
    return rows, read


@st.composite
def snapshots(draw, topics: int = 1) -> tuple[list[dict], list[tuple]]:
    """A snapshot of ``topics`` independent generated snapshots, each on a topic of its own (streams are per replica,
    topic and partition, so none sees another's rows): one Spark comparison checks them all."""
    rows, read = [], []
    for topic in (f"t{i}" for i in range(topics)):
        for replica in ("r1", "r2"):
            for partition in range(draw(st.integers(1, 3))):
                stream, positions = draw(streams(replica, partition, topic))
                rows += stream
                read += [("t", replica, topic, partition, p) for p in positions]
    return rows, read


# Small bounds, so that the generated clocks give HEARTBEAT_GAP and CLOCK_UNCERTAINTY anomalies.
BOUNDS = AnomalyBounds(heartbeat_gap_ms=10, clock_uncertainty_ms=4)


def _old(raw, read_positions):
    annotated = window_segments(raw, read_positions)
    return annotated, window_watermarks(annotated), window_anomalies(raw, BOUNDS)


def _tables(frame) -> Counter:
    return Counter(tuple(plain(v) for v in row) for row in frame.collect())


def _check(spark, rows, read, on_driver: bool) -> None:
    raw = raw_frame(spark, rows)
    read_positions = spark.createDataFrame(read, ",".join(f"{c} {t}" for c, t in zip(
        SKIPPED, ("string", "string", "string", "int", "bigint")))) if read else None
    old_segments, old_watermarks, old_anomalies = _old(raw, read_positions)
    passed = stream_pass(raw, read_positions, rows=len(rows) if on_driver else None, bounds=BOUNDS)
    segments, watermarks, anomalies = _tables(old_segments), _tables(old_watermarks), _tables(old_anomalies)
    assert _tables(segment_rows(passed)) == segments
    assert _tables(summary_rows(passed)) == _tables(summarize_segments(old_segments))
    assert _tables(watermark_rows(passed)) == watermarks
    assert _tables(anomaly_rows(passed)) == anomalies
    if not on_driver:
        # The same from segments computed earlier (a table read back), and through the modules' entry points.
        assert _tables(reconstruct_watermarks(old_segments)) == watermarks
        assert _tables(annotate_segments(raw, read_positions)) == segments
        assert _tables(find_stream_anomalies(raw, BOUNDS)) == anomalies
    return anomalies


# Each example checks TOPICS_PER_EXAMPLE generated snapshots at once: a comparison's cost is Spark's per-job
# start-up (a dozen jobs), not its few rows, so 3 examples of 4 check as many snapshots as 12 examples of 1, in
# about a third of the time (``examples``: ten times as many with the thorough profile).
TOPICS_PER_EXAMPLE = 4


@settings(max_examples=examples(3), deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(snapshot=snapshots(topics=TOPICS_PER_EXAMPLE))
def test_the_fused_pass_gives_the_window_passes_rows_on_generated_streams(spark, snapshot):
    # Catches any column of heartbeat_segments or reconstructed_watermarks that the fused pass computes otherwise
    # than the previous implementation: L (strictly before), a segment's opening columns, the resolved timestamp,
    # gap fields with read positions (a gap ending at one), P after START_OF_PUSH or from the first vector, U after a
    # gap (its run's floor, unknown without a vector after it), M stopping at the gap that ends a run; and any
    # anomaly found otherwise (its witness, bound, detail text, the earliest of equal witnesses).
    rows, read = snapshot
    _check(spark, rows, read, on_driver=True)


def test_the_fused_pass_in_spark_s_workers_gives_what_it_gives_on_the_driver(spark):
    # Catches the exchange by stream losing a stream's rows to another task (a stream cut in two would restart its
    # segments and L), and the Arrow batches of the workers decoded otherwise than on the driver.
    rows, read = _fixed_snapshot()
    anomalies = _check(spark, rows, read, on_driver=False)
    # Every kind of anomaly is among those compared.
    assert {row[5] for row in anomalies} == set(ANOMALIES)


def test_the_pass_returns_bounded_batches_whatever_a_stream_s_length(monkeypatch):
    # Catches a stream's rows returned as one Arrow batch (the JVM holds each batch whole, off its heap: a 20M-row
    # audit's driver went over 4 GiB), and rows lost or repeated where the batches are cut.
    import pyarrow as pa

    import pipelines.stream_pass as pass_module
    from schemas.conform import to_arrow_schema

    monkeypatch.setattr(pass_module, "OUTPUT_BATCH_ROWS", 100)
    rows = [{"snapshot_id": "t", "replica": "r1", "topic": "t", "partition": 0, "offset": o, "kind": "PUT", "key": f"k{o % 7}",
             "value_hash": "x", "source_region": "dc-a", "source_offset": o} for o in range(1, 1001)]
    rows.insert(0, {"snapshot_id": "t", "replica": "r1", "topic": "t", "partition": 0, "offset": 0, "kind": "START_OF_PUSH"})
    schema = to_arrow_schema(pass_module._SEGMENT_STRUCT)
    table = pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows], schema=schema)
    out = list(pass_module.stream_rows(iter(table.select(list(pass_module.INPUT_COLUMNS)).to_batches())))
    assert max(b.num_rows for b in out) == 100
    offsets = [o for b in out for o, k in zip(b.column("offset").to_pylist(), b.column("kind").to_pylist()) if k]
    assert sorted(offsets) == list(range(1001)) and len(offsets) == 1001


def _fixed_snapshot() -> tuple[list[dict], list[tuple]]:
    """A snapshot of several streams with gaps, read positions and vector heartbeats (deterministic)."""
    import random

    generator = random.Random(52)
    rows, read = [], []
    for replica in ("r1", "r2", "r3"):
        for partition in range(3):
            offset, high = 0, dict.fromkeys(REGIONS, 0)
            if partition != 1:
                rows.append({"replica": replica, "topic": "t", "partition": partition, "offset": 0,
                             "kind": "START_OF_PUSH"})
                offset = 1
            for _ in range(300):
                step = generator.choice((0, 0, 0, 0, 0, 1, 2))
                read += [("t", replica, "t", partition, p) for p in range(offset, offset + step)
                         if generator.random() < 0.3]
                offset += step
                region = generator.choice(REGIONS)
                high[region] += generator.randint(0, 3)
                kind = generator.choice(("PUT", "PUT", "PUT", "DELETE", "HEARTBEAT"))
                row = {"replica": replica, "topic": "t", "partition": partition, "offset": offset, "kind": kind,
                       "source_region": region, "source_offset": high[region],
                       "write_ts": generator.choice((None, generator.randint(0, 2**40))),
                       "leader_epoch": generator.choice((None, 1, 2))}
                if kind == "HEARTBEAT":
                    ts = generator.randint(0, 1000)
                    row.update(origin_ts_min_ms=ts, origin_ts_max_ms=ts + generator.randint(0, 6),
                               applied_ts_min_ms=ts + 5, applied_ts_max_ms=ts + 5 + generator.randint(0, 6))
                    if generator.random() < 0.6:
                        # Now and then a component below an earlier heartbeat's: a HEARTBEAT_REGRESSION.
                        row["hb_vector"] = {r: max(0, high[r] - generator.choice((0, 0, 0, 2)))
                                            for r in REGIONS if generator.random() < 0.8}
                else:
                    row["key"] = f"k{generator.randint(0, 40)}"
                    row["value"] = None if kind == "DELETE" else generator.choice(("x", "y", "z"))
                rows.append(row)
                offset += 1
    assert {f.name for f in RawTopicSnapshots.to_structtype().fields} >= set(rows[0])
    return rows, read


@settings(max_examples=60, deadline=None, derandomize=True)
@given(data=st.data(), huge=st.booleans())
def test_the_grouped_running_max_never_carries_a_max_across_keys(data, huge):
    # Catches a running max that leaks from one key into the next (U would then hold another key's writes), and the
    # lift overflowing: offsets near 2**63 take the ranked path, small ones the direct lift; both against a loop.
    import numpy as np

    from pipelines.stream_pass import MISSING, _grouped_cummax

    top = 2**63 - 2 if huge else 50
    n = data.draw(st.integers(1, 30))
    groups = np.sort(np.asarray(data.draw(st.lists(st.integers(0, 5), min_size=n, max_size=n)), dtype=np.int64))
    values = np.asarray(data.draw(st.lists(st.lists(st.one_of(st.just(MISSING), st.integers(0, top)), min_size=2,
                                                    max_size=2), min_size=n, max_size=n)), dtype=np.int64)
    expected = values.copy()
    for i in range(1, n):
        if groups[i] == groups[i - 1]:
            expected[i] = np.maximum(expected[i - 1], values[i])
    assert (_grouped_cummax(values, groups) == expected).all()


@pytest.mark.parametrize("on_driver", (True, False), ids=("driver", "workers"))
def test_the_pass_writes_its_per_row_tables_with_the_rows_it_would_return(spark, tmp_path, on_driver):
    # Catches rows of heartbeat_segments or reconstructed_watermarks lost, repeated or changed on their way into the
    # files the pass writes itself (a stream's rows written twice, a task's file put in place before its last rows,
    # rows that are not data rows among the watermarks, columns taken by position), stream rows still returned
    # through Spark, summaries or anomalies not returned, and a file left under its temporary name.
    from resources.delta_store import DeltaStore
    from schemas.registry import model_for, struct_for
    from schemas.validation import TableValidation

    rows, read = _fixed_snapshot()
    raw = raw_frame(spark, rows)
    read_positions = spark.createDataFrame(read, ",".join(f"{c} {t}" for c, t in zip(
        SKIPPED, ("string", "string", "string", "int", "bigint"))))
    store = DeltaStore(warehouse_root=str(tmp_path), engine="embedded")
    stages = {table: store.arrow_stage(table, "t", struct_for(table), TableValidation(model_for(table)).arrow_rules())
              for table in WRITTEN}
    count = len(rows) if on_driver else None
    passed = stream_pass(raw, read_positions, rows=count, bounds=BOUNDS, written=stages)
    returned = stream_pass(raw, read_positions, rows=count, bounds=BOUNDS)
    for table, selected in (("heartbeat_segments", segment_rows), ("reconstructed_watermarks", watermark_rows)):
        staged = store.stage_arrow(stages[table], struct_for(table))
        expected = _tables(selected(returned))
        assert _tables(store.read_staged(spark, staged)) == expected
        assert staged.row_count == sum(expected.values())
        # Counted as written: the rules' counts in the footers are the rows breaking them (here: none).
        assert staged.metrics["rule_counts"] == [0] * len(stages[table].rules) and stages[table].rules
        names = sorted(p.name for p in (tmp_path / table / stages[table].relative_dir / "snapshot_id=t").iterdir())
        assert names and all(re.fullmatch(r"part-\d{5}\.parquet", n) for n in names), names
        assert len(names) == 1 if on_driver else len(names) >= 1
    assert passed.where(F.col("kind").isNotNull()).count() == 0
    assert _tables(summary_rows(passed)) == _tables(summary_rows(returned))
    assert _tables(anomaly_rows(passed)) == _tables(anomaly_rows(returned))


def test_a_snapshot_staged_by_stream_is_read_file_by_file_with_the_same_rows(spark, tmp_path):
    # Catches the pass over raw_topic_snapshots' files (one task per file, pyarrow, no exchange) giving other rows than
    # the pass over Spark's exchange: EXPORTER_POSITION rows let in, the snapshot id lost (it is the folder's, not a
    # column), columns read by position or with other types, a file read twice or not at all. And DeltaStore naming
    # files as holding whole streams when they do not (a write not staged by stream, delta-spark's own files).
    from resources.delta_store import DeltaStore
    from schemas.raw import STREAM_COLUMNS
    from schemas.registry import model_for, struct_for
    from schemas.validation import TableValidation
    from pipelines.stream_pass import stream_pass_of_files

    rows, _ = _fixed_snapshot()
    exporter = {**rows[0], "kind": "EXPORTER_POSITION", "offset": None, "key": None, "value": None,
                "exporter": "x", "exported_offset": 3, "reported_at_ms": 5}
    raw = raw_frame(spark, rows + [exporter])
    store = DeltaStore(warehouse_root=str(tmp_path), engine="embedded")
    struct = struct_for("raw_topic_snapshots")
    store.commit(spark, store.stage(spark, raw.repartition(3, *STREAM_COLUMNS), "raw_topic_snapshots", "t", struct,
                                    whole_streams=True))
    files = store.stream_files(spark, "raw_topic_snapshots", "t")
    assert files and len(files) <= 3
    stages = {table: store.arrow_stage(table, "t", struct_for(table), TableValidation(model_for(table)).arrow_rules())
              for table in WRITTEN}
    by_file = stream_pass_of_files(spark, [(f.fs, f.path) for f in files], "t", BOUNDS, written=stages)
    returned = stream_pass(raw, None, bounds=BOUNDS)
    for table, selected in (("heartbeat_segments", segment_rows), ("reconstructed_watermarks", watermark_rows)):
        staged = store.stage_arrow(stages[table], struct_for(table))
        assert _tables(store.read_staged(spark, staged)) == _tables(selected(returned))
    assert _tables(summary_rows(by_file)) == _tables(summary_rows(returned))
    assert _tables(anomaly_rows(by_file)) == _tables(anomaly_rows(returned))
    # A snapshot written without the promise (or one of whose files lacks it) is read through Spark's exchange.
    store.commit(spark, store.stage(spark, raw, "raw_topic_snapshots", "u", struct))
    assert store.stream_files(spark, "raw_topic_snapshots", "u") is None
    assert store.stream_files(spark, "raw_topic_snapshots", "absent") is None


def test_which_passes_run_on_the_driver_is_a_setting(monkeypatch):
    # Catches REPLICA_LENS_DRIVER_MAX_ROWS ignored (a cluster's operator could not keep the passes off the driver, and
    # the cluster test would not run them in its workers), 0 refused, and a bad value read silently as the default.
    from resources.errors import InvalidSetting
    from resources.tuning import DRIVER_MAX_ROWS, DRIVER_MAX_ROWS_ENV, on_driver

    monkeypatch.delenv(DRIVER_MAX_ROWS_ENV, raising=False)
    assert on_driver(DRIVER_MAX_ROWS) and not on_driver(DRIVER_MAX_ROWS + 1) and not on_driver(None)
    monkeypatch.setenv(DRIVER_MAX_ROWS_ENV, "0")
    assert on_driver(0) and not on_driver(1)
    monkeypatch.setenv(DRIVER_MAX_ROWS_ENV, "ten")
    with pytest.raises(InvalidSetting, match=DRIVER_MAX_ROWS_ENV):
        on_driver(5)
