"""Stream anomalies (SPEC 5): each found at the row where it was injected, none in a clean stream."""
from __future__ import annotations

import json

import pytest
from pyspark.sql import types as T

from pipelines.anomalies import AnomalyBounds, find_stream_anomalies
from schemas.operations import StreamAnomalies
from schemas.validation import validation_errors
from tests.rows import EXAMPLES, raw_frame

EXAMPLE = EXAMPLES / "two-regions" / "part-0.jsonl"


def frame(spark, rows):
    return raw_frame(spark, [{"source_file": "x", **r} for r in rows])


def hlc(physical_ms: int, logical: int = 0) -> int:
    return physical_ms << 18 | logical


def data(offset, key, region, source_offset, physical_ms, kind="PUT", epoch=1, replica="dc-a"):
    row = {
        "replica": replica, "topic": "t", "partition": 0, "offset": offset, "kind": kind, "key": key,
        "source_region": region, "source_offset": source_offset, "write_ts": hlc(physical_ms), "leader_epoch": epoch,
    }
    if kind == "PUT":
        row["value"] = f"v{offset}"
    return row


def hb(offset, region, source_offset, vector, origin, applied, epoch=1, replica="dc-a"):
    return {
        "replica": replica, "topic": "t", "partition": 0, "offset": offset, "kind": "HEARTBEAT",
        "source_region": region, "source_offset": source_offset, "hb_vector": vector,
        "origin_ts_min_ms": origin[0], "origin_ts_max_ms": origin[1],
        "applied_ts_min_ms": applied[0], "applied_ts_max_ms": applied[1], "leader_epoch": epoch,
    }


def clean_stream(replica="dc-a") -> list[dict]:
    """Two regions, offsets spaced by 10 so a test can slip a row in between.

    dc-a's RT: 1 data, 2 heartbeat, 3 data, 4 data, 5 heartbeat; dc-b's RT: 1 data, 2 data, 3 heartbeat.
    """
    return [
        {"replica": replica, "topic": "t", "partition": 0, "offset": 0, "kind": "START_OF_PUSH", "leader_epoch": 1},
        data(10, "k1", "dc-a", 1, 1000, replica=replica),
        data(20, "k2", "dc-b", 1, 1001, replica=replica),
        hb(30, "dc-a", 2, {"dc-a": 2, "dc-b": 1}, (1000, 1010), (1100, 1110), replica=replica),
        data(40, "k1", "dc-b", 2, 1200, replica=replica),
        data(50, "k2", "dc-a", 3, 1300, kind="DELETE", replica=replica),
        hb(60, "dc-b", 3, {"dc-a": 3, "dc-b": 3}, (1300, 1310), (1400, 1410), replica=replica),
        data(70, "k1", "dc-a", 4, 1500, replica=replica),
        hb(80, "dc-a", 5, {"dc-a": 5, "dc-b": 3}, (1500, 1510), (1600, 1610), replica=replica),
    ]


def replace(rows: list[dict], offset: int, **changes) -> list[dict]:
    return [{**r, **changes} if r["offset"] == offset else r for r in rows]


def as_replica(rows: list[dict], replica: str) -> list[dict]:
    return [{**r, "replica": replica} for r in rows]


def sorted_rows(df):
    return sorted(df.collect(), key=lambda r: (r["replica"], r["offset"], r["anomaly"], r["source_region"] or ""))


def positions(rows):
    return [(r["offset"], r["anomaly"]) for r in rows]


# Each case is one replica's stream: the clean stream with one fault injected. All of them
# (and the clean stream itself) are audited in one frame, so the windows must keep them apart.
CASES: dict[str, list[dict]] = {
    "clean": clean_stream(),
    # dc-a goes back from 5 (heartbeat 80) to 4; dc-b moves on from 3 to 4.
    "hb-regression": clean_stream() + [hb(90, "dc-b", 4, {"dc-a": 4, "dc-b": 4}, (1700, 1710), (1750, 1760))],
    # A vectorless heartbeat from dc-b's RT offset 2 after dc-b:3 was claimed at 60 (and again at 80).
    "hb-regression-no-vector": clean_stream() + [hb(90, "dc-b", 2, None, (1700, 1710), (1750, 1760))],
    # dc-a's RT offset 6 is written before the heartbeat at 80 that claims dc-a only up to 5.
    "beyond": clean_stream() + [data(75, "k3", "dc-a", 6, 1550)],
    # Heartbeat 60 names no dc-b, yet the replica had applied dc-b's offset 2 at row 40.
    "beyond-missing": replace(clean_stream(), 60, hb_vector={"dc-a": 3}),
    "duplicate": clean_stream() + [data(45, "k1", "dc-b", 2, 1200)],
    # dc-b's RT offset 3 is its heartbeat at 60; a write from dc-b's RT offset 2 after it went
    # back in dc-b's RT, though no data row from dc-b above 2 was written.
    "rewind-below-heartbeat": clean_stream() + [data(75, "k3", "dc-b", 2, 1200)],
    # A new leader (epoch 2) writes k1 with a clock 100 ms behind the old leader's last write of k1.
    "write-ts-epoch": clean_stream() + [data(90, "k1", "dc-a", 6, 1400, epoch=2)],
    # k3's first write is older than k1's latest: different keys never compare.
    "write-ts-other-key": clean_stream() + [data(90, "k3", "dc-a", 6, 900)],
}


@pytest.fixture(scope="module")
def found(spark):
    rows = [row for name, case in CASES.items() for row in as_replica(case, name)]
    by_case: dict[str, list] = {name: [] for name in CASES}
    for row in sorted_rows(find_stream_anomalies(frame(spark, rows))):
        by_case[row["replica"]].append(row)
    return by_case


def test_clean_stream_has_no_anomaly(found):
    assert found["clean"] == []
    assert found["write-ts-other-key"] == []


def test_example_has_only_its_duplicate_deliveries(spark):
    rows = [json.loads(line) for line in EXAMPLE.read_text().splitlines() if line.strip()]
    df = find_stream_anomalies(frame(spark, rows))
    got = {(r["replica"], r["offset"], r["anomaly"]) for r in df.collect()}
    # The five rows that repeat the (source_region, source_offset) of the row just before them.
    assert got == {
        ("dc-a", 20, "DUPLICATE_OR_REWIND"),
        ("dc-a", 30, "DUPLICATE_OR_REWIND"),
        ("dc-a", 40, "DUPLICATE_OR_REWIND"),
        ("dc-b", 24, "DUPLICATE_OR_REWIND"),
        ("dc-b", 43, "DUPLICATE_OR_REWIND"),
    }


def witness(row):
    return (row["source_region"], row["observed"], row["expected"], row["reference_offset"])


def test_heartbeat_regression_per_component(found):
    got = found["hb-regression"]
    assert positions(got) == [(90, "HEARTBEAT_REGRESSION")]
    assert witness(got[0]) == ("dc-a", 4, 5, 80)


def test_heartbeat_regression_against_any_earlier_heartbeat_and_without_vector(found):
    got = found["hb-regression-no-vector"]
    assert positions(got) == [(90, "HEARTBEAT_REGRESSION")]
    # Compared with the highest earlier claim, witnessed by the first heartbeat that made it.
    assert witness(got[0]) == ("dc-b", 2, 3, 60)


def test_data_beyond_next_heartbeat(found):
    got = found["beyond"]
    assert positions(got) == [(75, "DATA_BEYOND_HEARTBEAT")]
    assert witness(got[0]) == ("dc-a", 6, 5, 80)
    assert got[0]["key"] == "k3"


def test_data_beyond_heartbeat_whose_vector_lacks_the_source(found):
    got = found["beyond-missing"]
    # Row 40 (from dc-b) is judged by heartbeat 60; row 20 by heartbeat 30, which names dc-b.
    assert positions(got) == [(40, "DATA_BEYOND_HEARTBEAT")]
    assert witness(got[0]) == ("dc-b", 2, None, 60)
    assert "no dc-b component" in got[0]["detail"]


def test_duplicate_of_an_earlier_data_row(found):
    got = found["duplicate"]
    assert positions(got) == [(45, "DUPLICATE_OR_REWIND")]
    assert witness(got[0]) == ("dc-b", 2, 2, 40)


def test_rewind_below_a_heartbeat_of_the_same_source(found):
    got = found["rewind-below-heartbeat"]
    assert positions(got) == [(75, "DUPLICATE_OR_REWIND")]
    assert witness(got[0]) == ("dc-b", 2, 3, 60)
    assert "HEARTBEAT at offset 60" in got[0]["detail"]


def test_write_ts_regression_across_leader_epoch_change(found):
    got = found["write-ts-epoch"]
    assert positions(got) == [(90, "WRITE_TS_REGRESSION")]
    row = got[0]
    assert (row["key"], row["observed"], row["expected"], row["reference_offset"]) == ("k1", hlc(1400), hlc(1500), 70)
    assert (row["leader_epoch"], row["previous_leader_epoch"]) == (2, 1)
    assert "leader_epoch change 1 -> 2" in row["detail"]


@pytest.mark.parametrize(("bound", "expected"), [(289, [60]), (290, []), (189, [60, 80])])
def test_heartbeat_gap_uses_this_min_minus_previous_max(spark, bound, expected):
    # Gaps: heartbeat 60 applied from 1400, previous ends at 1110 -> 290; heartbeat 80: 1600 - 1410 = 190.
    got = sorted_rows(find_stream_anomalies(frame(spark, clean_stream()), AnomalyBounds(heartbeat_gap_ms=bound)))
    assert positions(got) == [(o, "HEARTBEAT_GAP") for o in expected]
    gaps = {60: (290, 30), 80: (190, 60)}
    assert [(r["observed"], r["expected"], r["reference_offset"]) for r in got] == [
        (gaps[o][0], bound, gaps[o][1]) for o in expected
    ]


@pytest.mark.parametrize(("bound", "expected"), [(1000, [(60, 1010), (80, 1100)]), (1010, [(80, 1100)]), (1100, [])])
def test_clock_uncertainty_on_origin_or_applied_interval(spark, bound, expected):
    rows = replace(clean_stream(), 60, origin_ts_min_ms=300)  # origin width 1010
    rows = replace(rows, 80, applied_ts_max_ms=2700)  # applied width 1100
    got = sorted_rows(find_stream_anomalies(frame(spark, rows), AnomalyBounds(clock_uncertainty_ms=bound)))
    # The bound is strict: a width equal to it is accepted.
    assert [(r["offset"], r["anomaly"], r["observed"], r["expected"]) for r in got] == [
        (o, "CLOCK_UNCERTAINTY", width, bound) for o, width in expected
    ]


def test_stream_anomalies_model_passes_and_fails(spark):
    rows = clean_stream() + [data(45, "k1", "dc-b", 2, 1200)]
    good = find_stream_anomalies(frame(spark, rows))
    assert good.count() == 1
    assert validation_errors(StreamAnomalies, good) == []
    struct = StreamAnomalies.to_structtype()
    bad_row = {f.name: None for f in struct.fields} | {
        "snapshot_id": "t", "replica": "dc-a", "topic": "t", "partition": 0, "offset": 1,
        "anomaly": "NOT_AN_ANOMALY", "observed": 1, "detail": "x",
    }
    bad = spark.createDataFrame([tuple(bad_row[f.name] for f in struct.fields)], struct)
    errors = validation_errors(StreamAnomalies, bad)
    assert any(e.column == "anomaly" for e in errors)


def test_output_matches_model_struct(spark):
    df = find_stream_anomalies(frame(spark, clean_stream()))
    assert [(f.name, f.dataType) for f in df.schema.fields] == [
        (f.name, f.dataType) for f in StreamAnomalies.to_structtype().fields
    ]
    assert df.schema["observed"].dataType == T.LongType()
