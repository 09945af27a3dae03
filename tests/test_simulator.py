"""The seeded simulator behind ``replica-lens simulate`` (SPEC sections 1, 3-7, 9).

Every check reads the files back and recomputes what it asserts from the rows alone (final
states, watermarks, stream anomalies), so the ground truth is checked against the data, not
against the simulator's own bookkeeping.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
from collections import Counter, defaultdict
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from replica_lens import simulator
from replica_lens.simulator import SimulationConfig, SnapshotExistsError, add_arguments, config_from_args, simulate
from schemas.raw import KINDS, MESSAGE_FIELDS, NON_NEGATIVE, REQUIRED_ALWAYS, REQUIRED_BY_KIND

SMALL = dict(writes=3000, keys=200)
DATA = ("PUT", "DELETE")
STRING_FIELDS = {"replica", "topic", "kind", "key", "value", "source_region", "exporter"}


# --------------------------------------------------------------------------- reading a snapshot back


def read_rows(folder: Path) -> list[dict]:
    rows = []
    for path in sorted(folder.iterdir()):
        if path.name.endswith(".jsonl"):
            with open(path, encoding="utf-8") as fh:
                rows += [json.loads(line) for line in fh]
        elif path.name.endswith(".jsonl.gz"):
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                rows += [json.loads(line) for line in fh]
        elif path.name.endswith(".parquet"):
            for row in pq.read_table(path).to_pylist():
                row = {k: v for k, v in row.items() if v is not None}
                if "hb_vector" in row:
                    row["hb_vector"] = dict(row["hb_vector"])
                rows.append(row)
    return rows


def run(tmp_path: Path, snapshot_id: str = "snap", **options) -> tuple[Path, dict, list[dict]]:
    summary = simulate(tmp_path, snapshot_id, SimulationConfig(**options))
    truth = json.loads(Path(summary["ground_truth"]).read_text())
    return Path(summary["snapshot_dir"]), truth, read_rows(Path(summary["snapshot_dir"]))


def streams(rows: list[dict]) -> dict[tuple, list[dict]]:
    """VT rows per (replica, topic, partition), in offset order."""
    out = defaultdict(list)
    for row in rows:
        if row["kind"] != "EXPORTER_POSITION":
            out[(row["replica"], row["topic"], row["partition"])].append(row)
    return {k: sorted(v, key=lambda r: r["offset"]) for k, v in out.items()}


def final_states(stream: list[dict]) -> dict[str, tuple]:
    state = {}
    for row in stream:
        if row["kind"] == "PUT":
            state[row["key"]] = ("VALUE", row["value"])
        elif row["kind"] == "DELETE":
            state[row["key"]] = ("TOMBSTONE",)
    return state


def differing_keys(rows: list[dict]) -> set[tuple]:
    """(topic, partition, key) whose final state is not the same in every replica."""
    per_tp = defaultdict(dict)
    for (replica, topic, partition), stream in streams(rows).items():
        per_tp[(topic, partition)][replica] = final_states(stream)
    out = set()
    for (topic, partition), by_replica in per_tp.items():
        for key in set().union(*by_replica.values()):
            if len({states.get(key, ("ABSENT",)) for states in by_replica.values()}) > 1:
                out.add((topic, partition, key))
    return out


def stream_anomalies(rows: list[dict], gap_bound_ms: int, width_bound_ms: int) -> set[tuple]:
    """SPEC section 5 and 7 anomalies recomputed from the rows: (anomaly, replica, topic, partition, offset)."""
    found = set()
    for (replica, topic, partition), stream in streams(rows).items():
        where = (replica, topic, partition)
        seen: dict[str, int] = {}
        hb_max: dict[str, int] = {}
        key_ts: dict[str, int] = {}
        previous_hb = None
        pending_data: list[dict] = []
        for row in stream:
            if row["kind"] in DATA:
                src, soff = row["source_region"], row["source_offset"]
                if src in seen and soff <= seen[src]:
                    found.add(("DUPLICATE_OR_REWIND", *where, row["offset"]))
                if row["key"] in key_ts and row["write_ts"] < key_ts[row["key"]]:
                    found.add(("WRITE_TS_REGRESSION", *where, row["offset"]))
                key_ts[row["key"]] = max(key_ts.get(row["key"], row["write_ts"]), row["write_ts"])
                seen[src] = max(seen.get(src, soff), soff)
                pending_data.append(row)
            elif row["kind"] == "HEARTBEAT":
                vector = row["hb_vector"]
                if any(c in hb_max and o < hb_max[c] for c, o in vector.items()):
                    found.add(("HEARTBEAT_REGRESSION", *where, row["offset"]))
                for data in pending_data:
                    if data["source_offset"] > vector.get(data["source_region"], float("inf")):
                        found.add(("DATA_BEYOND_HEARTBEAT", *where, data["offset"]))
                pending_data = []
                for c, o in vector.items():
                    hb_max[c] = max(hb_max.get(c, o), o)
                    seen[c] = max(seen.get(c, o), o)
                mid = (row["applied_ts_min_ms"] + row["applied_ts_max_ms"]) // 2
                if previous_hb is not None and mid - previous_hb > gap_bound_ms:
                    found.add(("HEARTBEAT_GAP", *where, row["offset"]))
                previous_hb = mid
                widths = (row["applied_ts_max_ms"] - row["applied_ts_min_ms"],
                          row["origin_ts_max_ms"] - row["origin_ts_min_ms"])
                if max(widths) > width_bound_ms:
                    found.add(("CLOCK_UNCERTAINTY", *where, row["offset"]))
    reports = defaultdict(list)
    for row in rows:
        if row["kind"] == "EXPORTER_POSITION":
            reports[(row["exporter"], row["replica"], row["topic"], row["partition"])].append(row)
    for (exporter, replica, topic, partition), rs in reports.items():
        highest = -1
        for r in sorted(rs, key=lambda r: r["reported_at_ms"]):
            if r["exported_offset"] < highest:
                found.add(("EXPORTER_REGRESSION", replica, topic, partition, (exporter, r["reported_at_ms"])))
            highest = max(highest, r["exported_offset"])
    return found


def truth_anomalies(truth: dict) -> set[tuple]:
    out = set()
    for a in truth["anomalies"]:
        where = (a["replica"], a["topic"], a["partition"])
        if a["anomaly"] == "EXPORTER_REGRESSION":
            out.add((a["anomaly"], *where, (a["exporter"], a["reported_at_ms"])))
        else:
            for offset in a.get("offsets", [a["offset"]]):
                out.add((a["anomaly"], *where, offset))
    return out


def recomputed(truth: dict, rows: list[dict]) -> set[tuple]:
    bounds = truth["bounds"]
    return stream_anomalies(rows, bounds["natural_max_heartbeat_gap_ms"], bounds["natural_clock_interval_width_ms"])


# --------------------------------------------------------------------------- determinism and format


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "parquet", "venice-kafka"])
def test_same_seed_gives_byte_identical_files_and_another_seed_does_not(tmp_path, fmt):
    options = dict(SMALL, file_format=fmt, lost_writes=1, duplicate_deliveries=1, conflicting_writes=1)
    a = Path(simulate(tmp_path / "a", "s", SimulationConfig(seed=3, **options))["snapshot_dir"])
    b = Path(simulate(tmp_path / "b", "s", SimulationConfig(seed=3, **options))["snapshot_dir"])
    c = Path(simulate(tmp_path / "c", "s", SimulationConfig(seed=4, **options))["snapshot_dir"])
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    assert (tmp_path / "a" / "s.ground_truth.json").read_bytes() == (tmp_path / "b" / "s.ground_truth.json").read_bytes()
    assert any((a / n).read_bytes() != (c / n).read_bytes() for n in names if n != "_SUCCESS")


def test_every_row_conforms_to_section_1(tmp_path):
    _, _, rows = run(tmp_path, **SMALL, exporters=2, exporter_report_every=100, duplicate_deliveries=2, rewind=1)
    assert rows
    for row in rows:
        assert set(row) <= set(MESSAGE_FIELDS), row
        assert row["kind"] in KINDS
        for name in REQUIRED_ALWAYS + REQUIRED_BY_KIND[row["kind"]]:
            assert name in row, (name, row)
        for name, value in row.items():
            if name == "hb_vector":
                assert all(isinstance(c, str) and isinstance(o, int) and o >= 0 for c, o in value.items())
            elif name in STRING_FIELDS:
                assert isinstance(value, str) and value
            else:
                assert isinstance(value, int) and not isinstance(value, bool), (name, row)
        assert all(row[name] >= 0 for name in NON_NEGATIVE if name in row)
        if row["kind"] == "EXPORTER_POSITION":
            assert "offset" not in row
        if row["kind"] == "HEARTBEAT":
            assert row["origin_ts_min_ms"] <= row["origin_ts_max_ms"]
            assert row["applied_ts_min_ms"] <= row["applied_ts_max_ms"]
            assert row["hb_vector"][row["source_region"]] == row["source_offset"]
    by_stream = streams(rows)
    assert set(by_stream) == {(r, "store_v1", p) for r in ("dc-a", "dc-b", "dc-c") for p in (0, 1)}
    for stream in by_stream.values():
        assert [r["offset"] for r in stream] == list(range(len(stream)))
        assert stream[0]["kind"] == "START_OF_PUSH"
        assert all(r["kind"] != "START_OF_PUSH" for r in stream[1:])
    assert Counter(r["kind"] for r in rows)["EXPORTER_POSITION"] > 0


def test_each_file_format_round_trips_the_same_rows(tmp_path):
    options = dict(SMALL, lost_writes=1, corrupted_values=1, heartbeat_under_report=1, exporter_regression=1)
    canon = {}
    for fmt in ("jsonl", "jsonl.gz", "parquet"):
        folder, _, rows = run(tmp_path / fmt.replace(".", "_"), **options, file_format=fmt)
        assert all(p.name == "_SUCCESS" or p.name.endswith("." + fmt) for p in folder.iterdir())
        canon[fmt] = Counter(json.dumps(r, sort_keys=True) for r in rows)
    assert canon["jsonl"] == canon["jsonl.gz"] == canon["parquet"]
    assert sum(canon["jsonl"].values()) > 3000


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_files_rotate_at_rows_per_file_without_changing_rows(tmp_path, fmt):
    folder, _, rows = run(tmp_path / "small", **SMALL, file_format=fmt, rows_per_file=400)
    _, _, whole = run(tmp_path / "whole", **SMALL, file_format=fmt)
    files = [p for p in folder.iterdir() if p.name != "_SUCCESS"]
    assert len(files) > 6
    for path in files:
        n = pq.read_metadata(path).num_rows if fmt == "parquet" else len(path.read_text().splitlines())
        assert 0 < n <= 400
    assert Counter(json.dumps(r, sort_keys=True) for r in rows) == Counter(json.dumps(r, sort_keys=True) for r in whole)


# --------------------------------------------------------------------------- the snapshot folder


def test_success_is_written_last_and_ground_truth_sits_outside_the_folder(tmp_path, monkeypatch):
    published = []
    real_replace = os.replace

    def recording_replace(src, dst):
        published.append(Path(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(simulator.os, "replace", recording_replace)
    summary = simulate(tmp_path, "snap", SimulationConfig(**SMALL, rows_per_file=1000))
    folder = tmp_path / "snap"
    assert published[-1] == folder / "_SUCCESS"
    assert (folder / "_SUCCESS").read_bytes() == b""
    assert published[-2] == tmp_path / "snap.ground_truth.json"
    assert Path(summary["ground_truth"]) == tmp_path / "snap.ground_truth.json"
    assert not (folder / "snap.ground_truth.json").exists()
    assert sorted(folder.iterdir()) == sorted(published[:-2] + [folder / "_SUCCESS"])
    assert not any(p.name.endswith(".inprogress") for p in folder.iterdir())
    assert summary["files"] == len(published) - 2
    assert summary["rows_total"] == sum(sum(kinds.values()) for kinds in summary["rows"].values())


@pytest.mark.parametrize("bad", ["", ".hidden", "-x", "a/b", "../escape", "a b", "x\n", "é", "a" * 129, None])
def test_invalid_snapshot_ids_are_refused(tmp_path, bad):
    with pytest.raises(ValueError, match="snapshot id"):
        simulate(tmp_path, bad, SimulationConfig(**SMALL))
    assert list(tmp_path.iterdir()) == []


def test_an_existing_snapshot_is_not_overwritten_unless_asked(tmp_path):
    simulate(tmp_path, "snap", SimulationConfig(**SMALL, seed=1))
    before = (tmp_path / "snap.ground_truth.json").read_text()
    with pytest.raises(SnapshotExistsError):
        simulate(tmp_path, "snap", SimulationConfig(**SMALL, seed=2))
    assert (tmp_path / "snap.ground_truth.json").read_text() == before
    simulate(tmp_path, "snap", SimulationConfig(**SMALL, seed=2), overwrite=True)
    assert json.loads((tmp_path / "snap.ground_truth.json").read_text())["config"]["seed"] == 2
    assert (tmp_path / "snap" / "_SUCCESS").exists()


def test_bad_options_are_refused():
    with pytest.raises(ValueError):
        SimulationConfig(regions=0)
    with pytest.raises(ValueError, match="lagging_replica"):
        SimulationConfig(regions=2, lagging_replica="dc-c")
    with pytest.raises(ValueError, match="file_format"):
        SimulationConfig(file_format="csv")
    with pytest.raises(ValueError):
        SimulationConfig(hot_key_fraction=1.5)
    with pytest.raises(ValueError, match="heartbeat_vector must be own"):
        SimulationConfig(file_format="venice-kafka", heartbeat_vector="full")
    with pytest.raises(ValueError, match="wide_clock_interval"):
        SimulationConfig(file_format="venice-kafka", wide_clock_interval=1)
    with pytest.raises(ValueError, match="heartbeat_under_report"):
        SimulationConfig(heartbeat_vector="own", heartbeat_under_report=1)
    with pytest.raises(ValueError, match="heartbeat_under_report"):
        SimulationConfig(file_format="venice-kafka", heartbeat_under_report=1)


# --------------------------------------------------------------------------- replication semantics


def test_healthy_replicas_converge_despite_conflicts_duplicates_and_rewinds(tmp_path):
    _, truth, rows = run(tmp_path, **SMALL, regions=4, conflicting_writes=6, duplicate_deliveries=3, rewind=2)
    assert differing_keys(rows) == set()
    assert truth["keys_differing_at_end"] == []
    # Every conflict was injected, and some replica held the losing value for a while.
    assert len(truth["conflicting_writes"]) == 6
    transient = 0
    for c in truth["conflicting_writes"]:
        assert len({w["write_ts"] >> 18 for w in c["writes"]}) <= 2
        assert abs(c["writes"][0]["write_ts"] - c["writes"][1]["write_ts"]) < (50 << 18)
        loser = next(w for w in c["writes"] if w["source_region"] != c["winner"]["source_region"])
        for stream in streams(rows).values():
            positions = {(r["source_region"], r["source_offset"]): r["offset"] for r in stream if r["kind"] in DATA}
            mine = positions.get((loser["source_region"], loser["source_offset"]))
            theirs = positions.get((c["winner"]["source_region"], c["winner"]["source_offset"]))
            transient += mine is not None and theirs is not None and mine < theirs
    assert transient > 0


def test_lost_and_corrupted_writes_explain_exactly_the_keys_whose_final_states_differ(tmp_path):
    _, truth, rows = run(tmp_path, writes=3000, keys=2000, lost_writes=5, corrupted_values=5, duplicate_deliveries=2)
    expected = {(d["topic"], d["partition"], d["key"]) for d in truth["keys_differing_at_end"]}
    assert expected == differing_keys(rows)
    assert expected  # some faults do change a final state
    faults = truth["injected_faults"]
    assert Counter(f["fault"] for f in faults) == {"lost_write": 5, "corrupted_value": 5, "duplicate_delivery": 2}
    assert truth["warnings"] == []
    assert {(f["topic"], f["partition"], f["key"]) for f in faults if f.get("final_state_differs")} == expected
    by_stream = streams(rows)
    for f in faults:
        stream = by_stream[(f["replica"], f["topic"], f["partition"])]
        sources = [(r["source_region"], r["source_offset"]) for r in stream if r["kind"] in DATA]
        if f["fault"] == "lost_write":
            assert (f["source_region"], f["source_offset"]) not in sources
            assert f["vt_offset"] is None
        elif f["fault"] == "corrupted_value":
            row = stream[f["vt_offset"]]
            assert (row["key"], row["source_region"], row["source_offset"]) == (f["key"], f["source_region"], f["source_offset"])
            assert row["value"] == f["written_value"] != f["value"]
        else:
            assert stream[f["vt_offset"]] == {**stream[f["original_vt_offset"]], "offset": f["vt_offset"]}
            assert 1 <= f["vt_offset"] - f["original_vt_offset"] <= 4


def test_heartbeat_vectors_are_the_applied_watermark(tmp_path):
    _, truth, rows = run(tmp_path, **SMALL, lost_writes=2, conflicting_writes=2, lagging_replica="dc-c", lag_messages=40)
    by_stream = streams(rows)
    for (replica, topic, partition), stream in by_stream.items():
        lower: dict[str, int] = {}
        for i, row in enumerate(stream):
            if row["kind"] == "HEARTBEAT":
                vector = row["hb_vector"]
                assert vector[row["source_region"]] == row["source_offset"]
                # At least what the rows before it prove applied, and below the next message seen
                # from each source (messages in between lost last-writer-wins and left no row).
                assert set(lower) <= set(vector)
                assert all(lower[c] <= vector[c] for c in lower)
                for c, o in vector.items():
                    later = next((r["source_offset"] for r in stream[i + 1:] if r.get("source_region") == c), None)
                    assert later is None or later > o
                for c, o in vector.items():
                    lower[c] = max(lower.get(c, o), o)
            elif row["kind"] in DATA:
                src = row["source_region"]
                lower[src] = max(lower.get(src, row["source_offset"]), row["source_offset"])
    # Healthy replicas end on the same watermark; the lagging one is below it by lag_messages.
    for partition in (0, 1):
        finals = {}
        for replica in ("dc-a", "dc-b", "dc-c"):
            hbs = [r for r in by_stream[(replica, "store_v1", partition)] if r["kind"] == "HEARTBEAT"]
            finals[replica] = hbs[-1]["hb_vector"]
        assert finals["dc-a"] == finals["dc-b"]
        behind = sum(finals["dc-a"][c] - finals["dc-c"].get(c, -1) for c in finals["dc-a"])
        assert behind >= 40
    assert {(lag["replica"], lag["missing_messages"]) for lag in truth["lagging"]} == {("dc-c", 40)}


def test_own_heartbeats_are_the_same_history_without_vectors(tmp_path):
    """Catches an own-mode heartbeat that still writes hb_vector (an empty map would claim an empty
    pre-history), or a mode switch that changes anything else of the history."""
    options = dict(SMALL, lost_writes=2, rewind=1, lagging_replica="dc-c", lag_messages=40)
    _, _, full = run(tmp_path / "full", **options)
    _, truth, own = run(tmp_path / "own", **options, heartbeat_vector="own")
    heartbeats = [r for r in own if r["kind"] == "HEARTBEAT"]
    assert heartbeats and all("hb_vector" not in r for r in heartbeats)
    without = [{k: v for k, v in r.items() if k != "hb_vector"} for r in full]
    assert Counter(json.dumps(r, sort_keys=True) for r in own) == Counter(json.dumps(r, sort_keys=True) for r in without)
    assert SimulationConfig(file_format="venice-kafka").full_heartbeat_vectors is False
    assert SimulationConfig().full_heartbeat_vectors is True


def test_venice_kafka_writes_kafka_source_files_and_exporter_positions_beside_them(tmp_path):
    """Catches a Venice file the ingestion would not recognize (wrong columns or types), exporter positions
    lost for want of a Venice record, or a ground truth without the settings its audit needs."""
    from pipelines.ingest import is_venice_schema
    from pipelines.venice.values import PushSettings
    from pipelines.venice.push_settings import parse_push_settings

    summary = simulate(tmp_path, "v", SimulationConfig(**SMALL, file_format="venice-kafka"))
    folder = Path(summary["snapshot_dir"])
    kafka = sorted(folder.glob("*.kafka.parquet"))
    exporters = sorted(folder.glob("*.exporters.*.parquet"))
    assert len(kafka) == len(exporters) == 6
    assert all(is_venice_schema(pq.read_schema(p)) for p in kafka)
    assert not any(is_venice_schema(pq.read_schema(p)) for p in exporters)
    records = sum(pq.read_metadata(p).num_rows for p in kafka)
    positions = pq.read_table(exporters[0]).column("kind").to_pylist()
    assert positions and set(positions) == {"EXPORTER_POSITION"}
    counts = Counter()
    for kinds in summary["rows"].values():
        counts.update(kinds)
    assert records == summary["rows_total"] - counts["EXPORTER_POSITION"]
    truth = json.loads((tmp_path / "v.ground_truth.json").read_text())
    assert truth["venice"] == {"cluster_regions": "0=dc-a,1=dc-b,2=dc-c", "clock_uncertainty_ms": 3,
                               "push_settings": "NO_OP", "push_settings_file": "v.venice_push_settings.json",
                               "records_without_rows": {}}
    # The settings file reads back as what every START_OF_PUSH declares.
    assert parse_push_settings(str(tmp_path / "v.venice_push_settings.json")) == {
        t: PushSettings() for t in truth["topics"]}
    assert summary["audit_with"] == "--cluster-regions 0=dc-a,1=dc-b,2=dc-c --venice-clock-uncertainty-ms 3"


def test_hot_keys_take_their_share_of_writes(tmp_path):
    _, _, rows = run(tmp_path, writes=12000, keys=1000, hot_key_fraction=0.01, hot_write_share=0.5)
    messages = {(r["topic"], r["partition"], r["source_region"], r["source_offset"]): r["key"]
                for r in rows if r["kind"] in DATA}
    per_key = Counter(messages.values())
    hot = {f"k{i:04d}" for i in range(10)}
    share = sum(per_key[k] for k in hot) / len(messages)
    assert 0.45 <= share <= 0.55
    assert {k for k, _ in per_key.most_common(10)} == hot


def test_mid_stream_dump_drops_the_first_rows(tmp_path):
    _, _, rows = run(tmp_path, **SMALL, mid_stream_from=25)
    for stream in streams(rows).values():
        assert [r["offset"] for r in stream] == list(range(25, 25 + len(stream)))
        assert all(r["kind"] != "START_OF_PUSH" for r in stream)


# --------------------------------------------------------------------------- stream anomalies


def test_faults_that_are_not_anomalies_leave_the_streams_clean(tmp_path):
    _, truth, rows = run(tmp_path, **SMALL, lost_writes=3, corrupted_values=3, conflicting_writes=3,
                         lagging_replica="dc-b", lag_messages=30)
    assert truth["anomalies"] == []
    assert recomputed(truth, rows) == set()


ALL_ANOMALIES = dict(
    writes=6000, keys=300, failover_clock_behind=2, heartbeat_under_report=2, rewind=2, stalled_heartbeat=2,
    wide_clock_interval=2, exporter_regression=2, duplicate_deliveries=2, exporter_report_every=100,
)


@pytest.fixture(scope="module")
def anomalous(tmp_path_factory):
    _, truth, rows = run(tmp_path_factory.mktemp("anomalies"), **ALL_ANOMALIES)
    return truth, rows


def test_every_anomaly_is_listed_exactly_where_it_occurs(anomalous):
    truth, rows = anomalous
    assert truth["warnings"] == []
    assert recomputed(truth, rows) == truth_anomalies(truth)
    causes = Counter(a["cause"] for a in truth["anomalies"] if a["anomaly"] != "DATA_BEYOND_HEARTBEAT")
    assert causes == {cause: 2 for cause in (
        "failover_clock_behind", "heartbeat_under_report", "rewind", "stalled_heartbeat", "wide_clock_interval",
        "exporter_regression", "duplicate_delivery")}


def test_failover_regresses_write_ts_across_a_leader_epoch_change(anomalous):
    truth, rows = anomalous
    by_stream = streams(rows)
    for a in (a for a in truth["anomalies"] if a["cause"] == "failover_clock_behind"):
        stream = by_stream[(a["replica"], a["topic"], a["partition"])]
        row, before = stream[a["offset"]], stream[a["previous_offset"]]
        assert row["key"] == before["key"] == a["key"]
        assert not any(r.get("key") == a["key"] for r in stream[a["previous_offset"] + 1:a["offset"]])
        assert row["write_ts"] == a["write_ts"] < before["write_ts"] == a["previous_write_ts"]
        assert row["leader_epoch"] == stream[a["offset"] - 1]["leader_epoch"] + 1 == before["leader_epoch"] + 1
        assert row.get("value") == before.get("value")  # a retry of the current value: replicas still agree
    assert differing_keys(rows) == set()


def test_under_reported_heartbeat_and_stall_and_wide_interval_rows(anomalous):
    truth, rows = anomalous
    by_stream = streams(rows)
    bounds = truth["bounds"]
    for a in truth["anomalies"]:
        stream = by_stream.get((a["replica"], a["topic"], a["partition"]))
        if a["anomaly"] == "HEARTBEAT_REGRESSION":
            row = stream[a["offset"]]
            earlier = [r["hb_vector"][a["component"]] for r in stream[:a["offset"]]
                       if r["kind"] == "HEARTBEAT" and a["component"] in r["hb_vector"]]
            assert row["hb_vector"][a["component"]] == a["reported"] < max(earlier) == a["earlier"]
        elif a["anomaly"] == "HEARTBEAT_GAP":
            row, before = stream[a["offset"]], stream[a["previous_offset"]]
            assert row["kind"] == before["kind"] == "HEARTBEAT"
            assert not any(r["kind"] == "HEARTBEAT" for r in stream[a["previous_offset"] + 1:a["offset"]])
            assert row["applied_ts_min_ms"] - before["applied_ts_max_ms"] >= truth["config"]["stall_ms"] - 10
            assert bounds["natural_max_heartbeat_gap_ms"] < truth["config"]["stall_ms"] / 10
        elif a["anomaly"] == "CLOCK_UNCERTAINTY":
            row = stream[a["offset"]]
            assert row["applied_ts_max_ms"] - row["applied_ts_min_ms"] == a["width_ms"]
            assert a["width_ms"] > 10 * bounds["natural_clock_interval_width_ms"]
        elif a["anomaly"] == "DUPLICATE_OR_REWIND" and a["cause"] == "rewind":
            assert len(a["offsets"]) == truth["config"]["rewind_span"]
            for item in a["rewound"]:
                row = stream[item["offset"]]
                assert (row["key"], row["source_region"], row["source_offset"]) == (
                    item["key"], item["source_region"], item["source_offset"])
                assert any(r.get("source_region") == row["source_region"] and r["source_offset"] >= row["source_offset"]
                           for r in stream[:item["offset"]] if r["kind"] in DATA)


def test_exporter_regression_reports_a_lower_position_later(anomalous):
    truth, rows = anomalous
    for a in (a for a in truth["anomalies"] if a["anomaly"] == "EXPORTER_REGRESSION"):
        reports = sorted(
            (r for r in rows if r["kind"] == "EXPORTER_POSITION" and r["exporter"] == a["exporter"]
             and (r["replica"], r["topic"], r["partition"]) == (a["replica"], a["topic"], a["partition"])),
            key=lambda r: r["reported_at_ms"],
        )
        i = next(i for i, r in enumerate(reports) if r["reported_at_ms"] == a["reported_at_ms"])
        assert reports[i]["exported_offset"] == a["exported_offset"] < a["previous_exported_offset"]
        assert max(r["exported_offset"] for r in reports[:i]) == a["previous_exported_offset"]
        assert all(r["exported_offset"] >= a["previous_exported_offset"] for r in reports[i + 1:])


# --------------------------------------------------------------------------- command line


def test_every_option_has_a_flag_and_parses_into_the_config():
    parser = add_arguments(argparse.ArgumentParser())
    assert config_from_args(parser.parse_args([])) == SimulationConfig()
    ns = parser.parse_args([
        "--seed", "3", "--regions", "4", "--format", "parquet", "--hot-key-fraction", "0.02",
        "--lagging-replica", "dc-b", "--lost-writes", "2", "--mid-stream-from", "10", "--failover-clock-behind", "1",
    ])
    config = config_from_args(ns)
    assert (config.seed, config.regions, config.file_format, config.hot_key_fraction) == (3, 4, "parquet", 0.02)
    assert (config.lagging_replica, config.lost_writes, config.mid_stream_from) == ("dc-b", 2, 10)
    assert config.failover_clock_behind == 1
    venice = config_from_args(parser.parse_args(["--format", "venice-kafka", "--heartbeat-vector", "own"]))
    assert (venice.file_format, venice.heartbeat_vector) == ("venice-kafka", "own")
    flags = {opt for action in parser._actions for opt in action.option_strings}
    for f in simulator.dataclasses.fields(SimulationConfig):
        assert f.metadata.get("flag", "--" + f.name.replace("_", "-")) in flags
    assert "--lagging-replica" in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--format", "csv"])


# --------------------------------------------------------------------------- damage (SPEC section 3a)


DAMAGE = dict(writes=3000, keys=1000, lost_writes=3, corrupted_values=2, duplicate_deliveries=1, exporter_report_every=200)


def kafka_key(row: dict):
    """The Kafka key of a SPEC row: its record key, one key for all heartbeats, START_OF_PUSH its own."""
    if row["kind"] in DATA:
        return ("data", row["key"])
    if row["kind"] == "HEARTBEAT":
        return ("heartbeat",)
    return ("unique", row["offset"])


def compacted(stream: list[dict], fraction: float) -> list[dict]:
    """Kafka's compaction of a complete stream (offsets 0..n-1) below floor(fraction * n)."""
    cut = int(fraction * len(stream))
    newest = {kafka_key(r): r["offset"] for r in stream}
    return [r for r in stream if r["offset"] >= cut or newest[kafka_key(r)] == r["offset"]]


def proven(rows: list[dict]) -> set[tuple]:
    from replica_lens.reference import reference_verdicts

    return {(t, p, a, b, k, f.verdict) for (t, p, a, b, k), f in reference_verdicts(rows).items()
            if f.verdict in ("DIVERGENT", "MISSING")}


@pytest.mark.parametrize("fmt", ["jsonl", "jsonl.gz", "parquet"])
def test_compaction_keeps_the_newest_record_of_each_kafka_key_below_the_cut(tmp_path, fmt):
    """Catches compaction that keeps an older version below the cut, drops a record at or after the cut,
    drops the newest record of a key (a DELETE too), keeps several heartbeats below the cut, drops
    START_OF_PUSH, renumbers offsets, or counts rows that were not written."""
    _, _, whole = run(tmp_path / "whole", **DAMAGE, file_format=fmt)
    folder, truth, rows = run(tmp_path / "damaged", **DAMAGE, file_format=fmt, compact_below=0.6)
    complete, damaged = streams(whole), streams(rows)
    assert set(damaged) == set(complete)
    removed = tombstones = 0
    for where, stream in complete.items():
        expected = compacted(stream, 0.6)
        assert damaged[where] == expected
        cut = int(0.6 * len(stream))
        below = [r for r in damaged[where] if r["offset"] < cut]
        assert sum(r["kind"] == "HEARTBEAT" for r in below) <= 1
        assert len({kafka_key(r) for r in below}) == len(below)
        assert damaged[where][0]["kind"] == "START_OF_PUSH" and damaged[where][0]["offset"] == 0
        tombstones += sum(r["kind"] == "DELETE" for r in below)
        removed += len(stream) - len(expected)
    assert removed > 0
    assert tombstones > 0  # a DELETE that is its key's newest record is kept below the cut
    # Exporter positions are not Kafka records of the version topic: all kept.
    assert [r for r in rows if r["kind"] == "EXPORTER_POSITION"] == [r for r in whole if r["kind"] == "EXPORTER_POSITION"]
    damage = truth["damage"]
    assert (damage["compact_below"], damage["lose_records"], damage["lost"]) == (0.6, None, 0)
    assert damage["compacted"] == removed == sum(d["compacted"] for d in damage["partitions"])
    for d in damage["partitions"]:
        stream = complete[(d["replica"], d["topic"], d["partition"])]
        assert (d["offsets"], d["compaction_cut"]) == (len(stream), int(0.6 * len(stream)))
        assert d["compacted"] == len(stream) - len(damaged[(d["replica"], d["topic"], d["partition"])])
    summary = simulate(tmp_path / "again", "snap", SimulationConfig(**DAMAGE, file_format=fmt, compact_below=0.6))
    written = Counter()
    for kinds in summary["rows"].values():
        written.update(kinds)
    assert +written == Counter(r["kind"] for r in rows)
    assert summary["damage"]["compacted"] == removed


def test_venice_kafka_records_are_compacted_by_their_kafka_keys(tmp_path):
    """Catches a venice-kafka dump compacted by anything but its records' Kafka keys (heartbeats share
    one, data records use the record key), or damage the Venice files do not carry."""
    options = dict(DAMAGE, file_format="venice-kafka")
    whole = Path(simulate(tmp_path / "whole", "v", SimulationConfig(**options))["snapshot_dir"])
    summary = simulate(tmp_path / "damaged", "v", SimulationConfig(**options, compact_below=0.5))
    damaged = Path(summary["snapshot_dir"])
    files = sorted(p.name for p in whole.glob("*.kafka.parquet"))
    assert files == sorted(p.name for p in damaged.glob("*.kafka.parquet"))
    removed = 0
    for name in files:
        complete = pq.read_table(whole / name, columns=["key", "offset"]).to_pylist()
        kept = pq.read_table(damaged / name, columns=["key", "offset"]).to_pylist()
        assert [r["offset"] for r in complete] == list(range(len(complete)))
        cut = int(0.5 * len(complete))
        newest = {r["key"]: r["offset"] for r in complete}
        assert kept == [r for r in complete if r["offset"] >= cut or newest[r["key"]] == r["offset"]]
        assert kept[0]["offset"] == 0  # START_OF_PUSH
        below = [r["key"] for r in kept if r["offset"] < cut]
        assert len(set(below)) == len(below)
        removed += len(complete) - len(kept)
    assert removed == summary["damage"]["compacted"] > 0
    records = sum(pq.read_metadata(damaged / n).num_rows for n in files)
    assert records == summary["rows_total"] - sum(k["EXPORTER_POSITION"] for k in summary["rows"].values())


def test_lost_records_are_dropped_at_the_rate_asked_the_same_way_for_the_same_seed(tmp_path):
    """Catches loss that is not seeded, drops START_OF_PUSH or exporter positions, moves offsets,
    ignores the rate, or is not applied after compaction."""
    _, _, whole = run(tmp_path / "whole", **DAMAGE)
    a_folder, truth, lost = run(tmp_path / "a", **DAMAGE, lose_records=0.1)
    b_folder, _, _ = run(tmp_path / "b", **DAMAGE, lose_records=0.1)
    c_folder, _, _ = run(tmp_path / "c", **DAMAGE, lose_records=0.1, seed=8)
    names = sorted(p.name for p in a_folder.iterdir())
    assert all((a_folder / n).read_bytes() == (b_folder / n).read_bytes() for n in names)
    assert any((a_folder / n).read_bytes() != (c_folder / n).read_bytes() for n in names if n != "_SUCCESS")
    complete, damaged = streams(whole), streams(lost)
    dropped = records = 0
    for where, stream in complete.items():
        by_offset = {r["offset"]: r for r in stream}
        assert all(by_offset[r["offset"]] == r for r in damaged[where])
        assert damaged[where][0]["kind"] == "START_OF_PUSH"
        dropped += len(stream) - len(damaged[where])
        records += len(stream) - 1
    assert dropped == truth["damage"]["lost"] == sum(d["lost"] for d in truth["damage"]["partitions"])
    assert 0.08 <= dropped / records <= 0.12
    assert truth["damage"]["compacted"] == 0
    assert Counter(r["kind"] for r in lost)["EXPORTER_POSITION"] == Counter(r["kind"] for r in whole)["EXPORTER_POSITION"]
    # Both: loss draws among what compaction left.
    _, both_truth, both = run(tmp_path / "both", **DAMAGE, compact_below=0.5, lose_records=0.1)
    for where, stream in streams(both).items():
        survivors = {r["offset"] for r in compacted(complete[where], 0.5)}
        assert {r["offset"] for r in stream} <= survivors
    assert both_truth["damage"]["compacted"] > 0 and both_truth["damage"]["lost"] > 0


def test_complete_topic_proofs_are_what_the_reference_proves_on_the_undamaged_topic(tmp_path):
    """Catches proofs computed over the damaged rows, proofs left out, or healthy keys listed."""
    options = dict(writes=3000, keys=60, lost_writes=6, corrupted_values=4)
    _, plain_truth, whole = run(tmp_path / "whole", **options)
    _, truth, _ = run(tmp_path / "damaged", **options, compact_below=0.7, lose_records=0.2)
    assert "damage" not in plain_truth and "compact_below" not in plain_truth["config"]
    listed = {(p["topic"], p["partition"], p["replica_a"], p["replica_b"], p["key"], p["verdict"])
              for p in truth["damage"]["complete_topic_proofs"]}
    assert listed == proven(whole)
    assert listed, "the injected lost writes should give proofs"
    faulted = {(f["topic"], f["partition"], f["key"]) for f in truth["injected_faults"]}
    assert {(t, p, k) for t, p, _, _, k, _ in listed} <= faulted


@pytest.mark.parametrize("seed, compact_below, lose_records", [
    (1, 0.3, None), (2, 0.5, None), (3, 0.3, 0.01), (4, 0.4, 0.02), (5, None, 0.01), (6, 0.6, 0.2),
])
def test_a_damaged_dump_proves_nothing_the_complete_topic_does_not(tmp_path, seed, compact_below, lose_records):
    """SPEC section 3a's safety property through the reference: whatever compaction and loss remove,
    the damaged dump's proofs are among the complete topic's. Catches a reference (or a simulator)
    that reads a damaged dump by section 3 alone: on these runs it "proves" about a hundred healthy keys."""
    options = dict(writes=3000, keys=40, lost_writes=4, corrupted_values=3, seed=seed, heartbeat_every=20,
                   compact_below=compact_below, lose_records=lose_records)
    _, truth, rows = run(tmp_path, **options)
    complete = {(p["topic"], p["partition"], p["replica_a"], p["replica_b"], p["key"])
                for p in truth["damage"]["complete_topic_proofs"]}
    found = {proof[:5] for proof in proven(rows)}
    assert found <= complete
    if lose_records is None or lose_records < 0.1:
        assert found, "a lightly damaged dump still proves some of the injected faults"


def test_damage_options_are_validated_and_parsed():
    """Catches out-of-range fractions or rates accepted, or a flag missing from the command line."""
    for bad in (dict(compact_below=-0.1), dict(compact_below=1.5), dict(lose_records=1.0), dict(lose_records=-0.5)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SimulationConfig(**bad)
    parser = add_arguments(argparse.ArgumentParser())
    config = config_from_args(parser.parse_args(["--compact-below", "0.5", "--lose-records", "0.01"]))
    assert (config.compact_below, config.lose_records, config.damaged) == (0.5, 0.01, True)
    assert not config_from_args(parser.parse_args([])).damaged
    help_text = parser.format_help()
    assert "--compact-below" in help_text and "--lose-records" in help_text
