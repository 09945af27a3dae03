"""``replica-lens watch`` against real Kafka brokers (issue 70, SPEC 11): continuous, incremental audits of a live
store. One store (``live``) is written while it is watched, in parts, as an operator's store would be:

1. the first part of a version topic ``live_v1`` in every region, then a tick;
2. a second part, then a tick while dc-c's brokers do not answer (its store-file entry points at a dead port):
   dc-a and dc-b are read, dc-c is skipped, recorded and warned about;
3. the rest (more than the bound per cut), then ticks until one finds nothing new: dc-c resumes from its own last
   end, the first tick stops at the bound and the next ones read the backlog in order;
4. a new version topic ``live_v2`` appears and ``live_v1`` is deleted, then a tick of the ``watch_brokers`` job
   through Dagster: v2 starts its own chain at its log start, v1 is no longer cut and its audits stay;
5. more of v2, then ``replica-lens watch --once`` in a new process killed with SIGKILL in the middle of its audit,
   and the next tick: it resumes from the cursor and the tables equal those of a copy ticked without the kill.

The chain's verdicts are compared with one dump of the whole ``live_v1`` audited alone, and a secret consumer
setting (from an environment variable, as the store file names it) is looked for everywhere afterwards.
Skipped only where ``jvm/lib/kafka-broker`` is absent.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from pipelines.venice.kafka_cut import CUT_FILE, DumpRequest
from pipelines.venice.kafka_dump import dump
from replica_lens.audit import run_audit
from replica_lens.brokers import (
    BROKER_JARS, broker_jars_present, create_topic, free_ports, kafka_files, partition_rows, produce_rows,
    producer_config,
)
from replica_lens.simulator import SimulationConfig, simulate
from replica_lens.watch import (
    STORES_ENV, Cursor, parse_stores, read_cursor, watch_once, write_cursor,
)
from resources.errors import InvalidSetting
from tests.rows import OPERATIONS_TABLES

SETTINGS = {"spark_master": "local[2]", "delta_jars_dir": None, "shuffle_partitions": 4}
HISTORY = dict(
    seed=41, regions=3, partitions=1, keys=200, writes=300, heartbeat_every=12, exporters=0,
    conflicting_writes=2, lost_writes=3, corrupted_values=3, file_format="venice-kafka", compression="zstd-dict", chunk_above=64,
    push_control_messages=True,
)
SECRET = "w4tch-s3cr3t-Never-Logged-1729"
SECRET_ENV = "REPLICA_LENS_TEST_JAAS"
BOUND = 240  # offsets per partition and cut: the rest of v1 (about 314 and 471 offsets per region) in two cuts
PROVEN = {"DIVERGENT", "MISSING"}
REGIONS = ("dc-a", "dc-b", "dc-c")

needs_brokers = pytest.mark.skipif(not broker_jars_present(), reason=f"no Kafka broker jars in {BROKER_JARS}")


def store_file(bootstrap: dict[str, str], *, warn_after: int = 2, dead: str = "") -> str:
    """The live store's file; the ``dead`` region's brokers are given 3 s to answer (the others the default 30)."""
    regions = "\n".join(
        f'[stores.live.regions.{region}]\nbootstrap_servers = "{servers}"\n'
        f'options_from_env = {{ "sasl.jaas.config" = "{SECRET_ENV}" }}\n'
        + ("broker_timeout_seconds = 3\n" if region == dead else "")
        for region, servers in bootstrap.items()
    )
    return (f"interval_seconds = 5\n[stores.live]\nmax_offsets_per_partition = {BOUND}\n"
            f"warn_after_skipped_cuts = {warn_after}\naudit_scope = \"divergence\"\n\n{regions}")


# --------------------------------------------------------------------------- the store file (no broker)


def test_the_store_file_names_regions_and_keeps_secrets_out_of_itself(tmp_path, monkeypatch):
    """Catches a store file read with a default pattern that matches other stores' topics, a secret accepted as a
    plain option (it would sit in a file many can read), a secret variable read when the file is parsed (and so
    kept in the configuration) and a mistake that is not refused with where it is."""
    config = parse_stores(store_file({"dc-a": "h:1", "dc-b": "h:2"}))
    (live,) = config.stores
    assert config.interval_s == 5 and live.max_offsets_per_partition == BOUND and live.warn_after_skipped_cuts == 2
    assert live.audit_scope == "divergence"
    import re

    assert re.fullmatch(live.topic_pattern, "live_v12") and not re.fullmatch(live.topic_pattern, "livex_v1")
    assert not re.fullmatch(live.topic_pattern, "live_v1_rt")
    assert SECRET not in repr(config)
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(InvalidSetting, match=SECRET_ENV):
        live.request()
    monkeypatch.setenv(SECRET_ENV, SECRET)
    request = live.request()
    assert request.options_for("dc-a")["sasl.jaas.config"] == SECRET
    assert SECRET not in request.redact(f"failed: {SECRET}")
    for bad, where in [
        ('[stores.s.regions.a]\nbootstrap_servers = "h:1"\noptions = { "ssl.keystore.password" = "x" }', "a secret"),
        ('[stores.s]\nmax_offsets_per_partition = 0\n[stores.s.regions.a]\nbootstrap_servers = "h:1"', "at least 1"),
        ('[stores.s]\n', "at least one region"),
        ('[stores.s.regions.a]\nbootstrap = "h:1"', "unknown setting"),
        ('[stores.s]\ntopic_pattern = "("\n[stores.s.regions.a]\nbootstrap_servers = "h:1"', "regular expression"),
        ('[stores.s]\naudit_scope = "lag"\n[stores.s.regions.a]\nbootstrap_servers = "h:1"', "audit_scope: one of"),
        ("stores = 3", "stores"),
    ]:
        with pytest.raises(InvalidSetting, match=where):
            parse_stores(bad)


def test_the_cursor_is_replaced_whole_and_read_back(tmp_path):
    """Catches a cursor written in place (a kill mid-write would leave half a file) and one that loses a partition's
    end, log start or policy, the skipped-cut counts or the pending snapshot on its way through the file."""
    cursor = Cursor("live", sequence=4, published="live-000004", pending="live-000005",
                    partitions={("dc-a", "live_v1", 0): {"end": 90, "log_start": 0, "cleanup_policy": "delete"}},
                    skipped_cuts={"dc-c": 2})
    write_cursor(str(tmp_path), cursor)
    assert read_cursor(str(tmp_path), "live") == cursor
    assert sorted(p.name for p in (tmp_path / "_watch").iterdir()) == ["live.json"]
    assert read_cursor(str(tmp_path), "other") == Cursor("other")


def test_the_broker_watch_starts_one_run_at_a_time_and_its_cursor_shows_the_published_ends(tmp_path, monkeypatch):
    """Catches a sensor that starts a second watch run while one is under way (two ticks would land the same
    offsets), one that fails instead of skipping when no store file is set, and a cursor that does not show what
    each store published."""
    import dagster as dg

    from replica_lens.jobs import build_broker_watch_sensor
    from resources.landing import LandingZone

    write_cursor(str(tmp_path), Cursor("live", sequence=3, published="live-000003",
                                       partitions={("dc-a", "live_v1", 0): {"end": 240, "log_start": 0,
                                                                            "cleanup_policy": "delete"}}))
    sensor = build_broker_watch_sensor(60)
    with dg.instance_for_test() as instance:
        def evaluate():
            return sensor(dg.build_sensor_context(instance=instance, resources={"landing": LandingZone(root=str(tmp_path))}))

        monkeypatch.delenv(STORES_ENV, raising=False)
        assert STORES_ENV in evaluate().skip_reason.skip_message
        stores = tmp_path / "stores.toml"
        stores.write_text(store_file({"dc-a": "h:1"}))
        monkeypatch.setenv(STORES_ENV, str(stores))
        result = evaluate()
        assert len(result.run_requests) == 1 and result.run_requests[0].job_name in (None, "watch_brokers")
        assert json.loads(result.cursor) == {"live": {"published": "live-000003", "pending": None,
                                                      "ends": {"dc-a/live_v1/0": 240}}}
        from dagster._core.test_utils import create_run_for_test

        create_run_for_test(instance, job_name="watch_brokers", status=dg.DagsterRunStatus.STARTED)
        busy = evaluate()
        assert not busy.run_requests and "under way" in busy.skip_reason.skip_message


def test_the_landing_sensor_leaves_watched_snapshots_to_the_watch(tmp_path):
    """Catches the landing sensor auditing a watched snapshot on its own (out of the chain's order, and beside the
    watch's own audit of it) and the watch's cursor folder taken for a snapshot."""
    import dagster as dg

    from replica_lens.jobs import build_landing_sensor
    from resources.landing import LandingZone

    for name, cut in (("live-000001", {"watch": {"store": "live"}}), ("dumped", {"partitions": []})):
        (tmp_path / name).mkdir()
        (tmp_path / name / CUT_FILE).write_text(json.dumps(cut))
        (tmp_path / name / "_SUCCESS").write_text("")
    write_cursor(str(tmp_path), Cursor("live"))
    with dg.instance_for_test() as instance:
        result = build_landing_sensor()(dg.build_sensor_context(
            instance=instance, resources={"landing": LandingZone(root=str(tmp_path))}))
    assert [r.partition_key for r in result.run_requests] == ["dumped"]


# --------------------------------------------------------------------------- the watched store (brokers)


def _table(warehouse: Path, table: str, snapshot_id: str | None = None):
    data = DeltaTable(str(warehouse / table)).to_pyarrow_table()
    if snapshot_id is not None:
        data = data.filter(pc.equal(data["snapshot_id"], snapshot_id))
    return data.to_pylist()


def _verdicts(warehouse: Path, snapshot_id: str, topic: str) -> dict[tuple, str]:
    return {(r["replica_a"], r["replica_b"], r["key"]): r["verdict"]
            for r in _table(warehouse, "divergence_reports", snapshot_id) if r["topic"] == topic}


class Store:
    """The live store's history (simulated once), its producers, and the audit settings its truth gives."""

    def __init__(self, root: Path, bootstrap: dict[str, str]) -> None:
        from confluent_kafka import Producer

        simulate(str(root / "sim"), "v1", SimulationConfig(**HISTORY))
        simulate(str(root / "sim"), "v2", SimulationConfig(**{**HISTORY, "seed": 43, "writes": 120}))
        truth = json.loads((root / "sim" / "v1.ground_truth.json").read_text())["venice"]
        self.decode = {"cluster_regions": truth["cluster_regions"],
                       "venice_clock_uncertainty_ms": truth["clock_uncertainty_ms"]}
        self.rows = {v: {r: partition_rows(paths) for (r, _, _), paths in kafka_files(str(root / "sim" / v)).items()}
                     for v in ("v1", "v2")}
        self.bootstrap = bootstrap
        self.producers = {r: Producer(producer_config(bootstrap[r])) for r in REGIONS}
        self.written = Counter()

    def write(self, version: str, fraction: float) -> None:
        """Produce the history of ``version`` up to ``fraction`` of each region's records (in offset order)."""
        for region in REGIONS:
            rows = self.rows[version][region]
            upto = int(len(rows) * fraction)
            done = self.written[(version, region)]
            assert not produce_rows(self.producers[region], f"live_{version}", 0, rows[done:upto])
            self.written[(version, region)] = upto


@pytest.fixture(scope="module")
def live(kafka_clusters, spark, tmp_path_factory):
    """The watched store after steps 1-4 (the module's docstring): what each tick returned, and the folders."""
    os.environ[SECRET_ENV] = SECRET
    root = tmp_path_factory.mktemp("watch")
    landing, warehouse = root / "landing", root / "warehouse"
    bootstrap = {r: kafka_clusters.bootstrap(r) for r in REGIONS}
    for region in REGIONS:
        for topic in ("live_v1", "live_v2"):
            create_topic(bootstrap[region], topic, 1, {"retention.ms": "-1"})
    store = Store(root, bootstrap)
    config = parse_stores(store_file(bootstrap))
    dead_c = parse_stores(store_file({**bootstrap, "dc-c": f"127.0.0.1:{free_ports(1)[0]}"}, warn_after=1, dead="dc-c"))

    def audit(snapshot_id: str, scope: str):
        return run_audit(snapshot_id, str(landing), str(warehouse), scope=scope, **SETTINGS, **store.decode)

    (root / "stores.toml").write_text(store_file(bootstrap))
    ticks = {}
    store.write("v1", 0.25)
    ticks["first"] = watch_once(spark, config, str(landing), audit)[0]
    store.write("v1", 0.5)
    ticks["dc-c silent"] = watch_once(spark, dead_c, str(landing), audit)[0]
    store.write("v1", 1.0)
    ticks["bounded"] = watch_once(spark, config, str(landing), audit)[0]
    for i in range(4):  # the backlog, in bounded cuts, until a tick finds nothing new
        ticks[f"backlog {i}"] = tick = watch_once(spark, config, str(landing), audit)[0]
        if tick.action == "none":
            break
    # The whole v1 as one dump, audited alone (its own landing and warehouse).
    whole_landing, whole_warehouse = root / "whole-landing", root / "whole-warehouse"
    dump(DumpRequest(bootstrap, ("live_v1",)), str(whole_landing), "whole", spark=spark)
    whole = run_audit("whole", str(whole_landing), str(whole_warehouse), **SETTINGS, **store.decode)
    assert whole.success, whole.error
    v1 = [t.snapshot_id for t in ticks.values() if t.snapshot_id]
    return {"ticks": ticks, "landing": landing, "warehouse": warehouse, "store": store, "config": config,
            "whole": whole_warehouse, "root": root, "audit": audit, "v1_snapshots": v1, "last_v1": v1[-1],
            "next": f"live-{len(v1) + 1:06d}"}


def _cut(landing: Path, snapshot_id: str) -> dict:
    return json.loads((landing / snapshot_id / CUT_FILE).read_text())


def _by_region(document: dict) -> dict[str, dict]:
    return {p["region"]: p for p in document["partitions"] if p["topic"] == "live_v1"}


@needs_brokers
def test_each_tick_lands_one_chained_snapshot_and_audits_it(live):
    """Catches a tick that re-reads or skips offsets (a cut not starting at the previous end), a snapshot not chained
    to the previous one, an audit that fails on a continuing snapshot, and an idle tick that lands an empty one."""
    ticks, landing, v1 = live["ticks"], live["landing"], live["v1_snapshots"]
    actions = [t.action for t in ticks.values()]
    assert actions == ["audited"] * (len(actions) - 1) + ["none"], {k: (t.action, t.error) for k, t in ticks.items()}
    assert v1 == [f"live-{i:06d}" for i in range(1, len(v1) + 1)] and len(v1) >= 4
    cuts = [_cut(landing, s) for s in v1]
    assert [c["continues"] for c in cuts] == [None, *v1[:-1]]
    rows = live["store"].rows["v1"]
    for region in REGIONS:
        parts = [_by_region(c)[region] for c in cuts]
        assert parts[0]["start"] == 0
        for before, after in zip(parts, parts[1:]):
            assert after["start"] == before["end"], (region, before, after)
        assert parts[-1]["end"] == len(rows[region])  # every offset of the topic, each read once
        assert sum(p["delivered"] for p in parts) == len(rows[region])
    assert read_cursor(str(landing), "live").published == v1[-1]
    assert sorted(p.name for p in landing.iterdir() if p.name.startswith("live-")) == v1  # the idle tick landed none
    # The store's audit_scope = "divergence" reached every tick's audit: no lag or exporter table was computed (the
    # whole history's audit, of scope "all", wrote them).
    assert not [t for t in OPERATIONS_TABLES if (live["warehouse"] / t).exists()]
    assert all((live["whole"] / t).exists() for t in OPERATIONS_TABLES)


@needs_brokers
def test_a_silent_region_is_skipped_recorded_warned_about_and_resumes_from_its_own_end(live):
    """Catches a silent region that stops the others, one skipped without a record or a warning, and one that
    resumes from the other regions' ends (skipping its own unread offsets) or from the log start (reading twice)."""
    silent = live["ticks"]["dc-c silent"]
    assert silent.regions["dc-c"]["skipped"] and "dc-c" in silent.regions["dc-c"]["skipped"]
    assert silent.regions["dc-a"]["records"] > 0 and silent.regions["dc-b"]["records"] > 0
    first, skipped, resumed = (_by_region(_cut(live["landing"], s)) for s in live["v1_snapshots"][:3])
    assert skipped["dc-c"]["skipped"] and skipped["dc-c"]["start"] == skipped["dc-c"]["end"] == first["dc-c"]["end"]
    assert skipped["dc-c"]["delivered"] == 0
    assert resumed["dc-c"]["start"] == first["dc-c"]["end"] and resumed["dc-c"]["skipped"] is None
    table = _table(live["warehouse"], "broker_cuts", live["v1_snapshots"][1])
    assert {r["region"]: bool(r["skipped_reason"]) for r in table} == {"dc-a": False, "dc-b": False, "dc-c": True}
    # warn_after_skipped_cuts = 1 for that tick: the check warned; the next cut answered and it passed.
    assert "broker_cuts:regions_answering" in live["ticks"]["dc-c silent"].failed_checks
    assert "broker_cuts:regions_answering" not in live["ticks"]["bounded"].failed_checks


@needs_brokers
def test_a_backlog_is_read_in_bounded_cuts_in_order(live):
    """Catches a bound ignored (one cut reads the whole backlog), a backlog not recorded, and a second cut that does
    not start where the bounded one stopped."""
    after_silence = live["v1_snapshots"][2:]
    assert len(after_silence) >= 2, "the rest of the history should need more than one cut"
    cuts = [_by_region(_cut(live["landing"], s)) for s in after_silence]
    for region in REGIONS:
        for cut, following in zip(cuts, cuts[1:]):
            assert cut[region]["end"] - cut[region]["start"] <= BOUND
            assert following[region]["start"] == cut[region]["end"]
        assert cuts[0][region]["broker_end"] > cuts[0][region]["end"], region  # bounded: a backlog was left
        assert cuts[-1][region]["broker_end"] == cuts[-1][region]["end"]
    rows = [r for r in _table(live["warehouse"], "broker_cuts", after_silence[0]) if r["topic"] == "live_v1"]
    assert len(rows) == 3 and all(r["backlog_offsets"] > 0 for r in rows)
    assert live["ticks"]["bounded"].regions["dc-a"]["backlog"] > 0


def _latest_verdicts(warehouse: Path, snapshots: list[str], topic: str) -> tuple[dict[tuple, str], set[tuple]]:
    """Per key pair, its verdict in the latest snapshot of the chain that compared its two replicas (a snapshot in
    which a replica delivered nothing judges its pairs on that replica's carried state, docs/incremental.md, unless
    it has none yet); and the replica pairs whose latest comparison had both replicas read to the end of the
    topic."""
    latest: dict[tuple, str] = {}
    at_end: set[tuple] = set()
    landing = warehouse.parent / "landing"
    for snapshot_id in snapshots:
        pairs = {(r["replica_a"], r["replica_b"]) for r in _table(warehouse, "divergence_summary", snapshot_id)
                 if r["topic"] == topic}
        done = {p["region"] for p in _cut(landing, snapshot_id)["partitions"]
                if p["topic"] == topic and p["end"] == p["broker_end"] and not p["skipped"]}
        latest = {k: v for k, v in latest.items() if k[:2] not in pairs}
        latest.update(_verdicts(warehouse, snapshot_id, topic))
        at_end = {pair for pair in at_end if pair not in pairs} | {pair for pair in pairs if set(pair) <= done}
    return latest, at_end


@needs_brokers
def test_the_chain_proves_nothing_the_whole_topic_does_not_and_every_divergence_it_ends_with(live):
    """Catches carried state lost between cuts (a divergence of the keys' last versions, written before a later cut,
    no longer proven when both replicas are next compared), and a proof the whole history does not give.

    What the chain may miss (docs/incremental.md): an incremental audit carries each key's *last* version, so a
    transient divergence whose two witnesses straddle a cut, one of them overwritten before the cut, is proven by
    the whole history only; this history has such keys (lost writes that later writes cover). The keys whose last
    versions differ (corrupted values) end with the whole history's verdict in the chain."""
    whole = _verdicts(live["whole"], "whole", "live_v1")
    proven_whole = {k: v for k, v in whole.items() if v in PROVEN}
    assert proven_whole, "the history proves nothing: the comparison would be empty"
    ending = _ending_divergences(live["whole"])
    assert ending, "no divergence persists to the end of the history: the test would be vacuous"
    latest, judged_whole = _latest_verdicts(live["warehouse"], live["v1_snapshots"], "live_v1")
    # The chain's last cut reads every region to its end (the backlog's second cut), so every pair's last comparison
    # had both replicas read whole; dc-c, skipped in one cut, was judged there on its carried state
    # (docs/incremental.md). Every divergence the history ends with is the chain's last verdict for its pair.
    settled = {k for k in ending if k[:2] in judged_whole}
    assert settled == ending, sorted(ending - settled)
    assert {k: latest.get(k) for k in ending} == {k: whole[k] for k in ending}
    every = {}
    for snapshot_id in live["v1_snapshots"]:
        every.update({k: v for k, v in _verdicts(live["warehouse"], snapshot_id, "live_v1").items() if v in PROVEN})
    assert every and {k: whole.get(k) for k in every} == every


def _ending_divergences(warehouse: Path) -> set[tuple]:
    """The proven key pairs of the whole history whose witnesses are each replica's last version of the key."""
    rows = _table(warehouse, "reconstructed_watermarks", "whole")
    last = {}
    for r in rows:
        last[(r["replica"], r["key"])] = max(last.get((r["replica"], r["key"]), -1), r["offset"])
    return {(r["replica_a"], r["replica_b"], r["key"]) for r in _table(warehouse, "divergence_reports", "whole")
            if r["verdict"] in PROVEN and r["topic"] == "live_v1"
            and r["witness_offset_a"] == last.get((r["replica_a"], r["key"]))
            and r["witness_offset_b"] == last.get((r["replica_b"], r["key"]))}


@needs_brokers
def test_a_new_version_topic_starts_its_chain_and_a_deleted_one_keeps_its_audits_through_dagster(live, spark, monkeypatch):
    """The watch_brokers job (what the broker_watch sensor starts) on a Dagster instance. Catches a new push's topic
    read from the old chain's end instead of its log start, a deleted topic still cut (the tick would fail) or
    dropped from the published tables, and a secret in the run's config or event log."""
    import dagster as dg
    from confluent_kafka.admin import AdminClient

    from replica_lens.definitions import build_definitions

    store, landing, warehouse = live["store"], live["landing"], live["warehouse"]
    reports_of_v1 = len([r for r in _table(warehouse, "divergence_reports") if r["topic"] == "live_v1"])
    assert reports_of_v1
    store.write("v2", 1.0)
    for region in REGIONS:
        admin = AdminClient({"bootstrap.servers": store.bootstrap[region]})
        for future in admin.delete_topics(["live_v1"]).values():
            future.result(30)
    monkeypatch.setenv(STORES_ENV, str(live["root"] / "stores.toml"))
    defs = build_definitions(landing_root=str(landing), warehouse_root=str(warehouse), spark_master="local[2]",
                             delta_jars_dir=None, shuffle_partitions=4, **store.decode)
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def("watch_brokers").execute_in_process(instance=instance)
        assert result.success
        (tick,) = result.output_for_node("watch_tick")
        audit_runs = instance.get_runs(dg.RunsFilter(job_name="audit_snapshot"))
        text = json.dumps([r.run_config for r in instance.get_runs()], default=str)
        text += "".join(str(e) for run in instance.get_runs() for e in instance.all_logs(run.run_id))
        materialized = instance.get_latest_materialization_event(dg.AssetKey("broker_cuts"))
        observed = instance.fetch_observations(dg.AssetKey("divergence_reports"), limit=5).records
    assert SECRET not in text
    new = live["next"]
    assert tick["action"] == "audited" and tick["snapshot_id"] == new
    assert [r.tags.get("dagster/partition") for r in audit_runs] == [new]
    selected = {k.to_user_string() for k in audit_runs[0].asset_selection}  # the store's audit_scope
    assert "divergence_reports" in selected and not selected & OPERATIONS_TABLES
    assert materialized is not None
    # The freshness of the audit, on the asset (the Plots tab), for the snapshot's partition.
    (observation,) = [r.asset_observation for r in observed]
    assert observation.partition == new and observation.metadata["seconds_cut_to_audited"].value > 0
    cut = _cut(landing, new)
    assert {p["topic"] for p in cut["partitions"]} == {"live_v2"}
    assert all(p["start"] == 0 < p["end"] <= len(store.rows["v2"][p["region"]]) for p in cut["partitions"])
    assert {k[1] for k in read_cursor(str(landing), "live").partitions} == {"live_v2"}
    # v1's audits stay: its last snapshot's reports are still there; v2 is audited (it has faults of its own).
    assert len([r for r in _table(warehouse, "divergence_reports") if r["topic"] == "live_v1"]) == reports_of_v1
    assert _table(warehouse, "divergence_reports", new)


def _tables_of(warehouse: Path, snapshot_id: str) -> dict[str, list]:
    """Every table's rows of one snapshot, without the time of the cut (two cuts of the same offsets differ there)."""
    out = {}
    for table in ("raw_topic_snapshots", "broker_cuts", "divergence_reports", "replica_state", "divergence_summary",
                  "partition_watermarks"):
        # Not compared: when the cut was taken, and the landed file a row came from (Spark names its part files).
        rows = [{k: v for k, v in r.items() if k not in ("cut_at_ms", "source_file")}
                for r in _table(warehouse, table, snapshot_id)]
        out[table] = sorted(json.dumps(r, sort_keys=True, default=str) for r in rows)
    return out


@needs_brokers
def test_a_watch_killed_mid_audit_is_resumed_by_the_next_tick_with_the_tables_of_an_uninterrupted_one(live, spark):
    """``replica-lens watch --once`` in a new process (it continues from the cursor the earlier ticks left), killed
    with SIGKILL once its snapshot is landed and its audit under way; the next tick resumes it. Catches a killed
    snapshot skipped (its offsets lost), cut again on top of the landed one (read twice), a cursor advanced before
    the audit ended, and tables that differ from a copy of the same state ticked without the kill."""
    store, landing, warehouse, root = live["store"], live["landing"], live["warehouse"], live["root"]
    if not (landing / live["next"]).exists():
        pytest.skip("runs after the Dagster tick (the file's order)")
    published, killed = live["next"], f"live-{len(live['v1_snapshots']) + 2:06d}"
    more = store.rows["v2"]
    # More of v2: the same records again at new offsets (a second push of the same writes would look alike).
    for region in REGIONS:
        assert not produce_rows(store.producers[region], "live_v2", 0, more[region][-40:], offsets=False)
    ends = {(r, t, p): v["end"] for (r, t, p), v in read_cursor(str(landing), "live").partitions.items()}
    copy = root / "copy"
    shutil.copytree(landing, copy / "landing")
    shutil.copytree(warehouse, copy / "warehouse")
    stores = root / "stores.toml"
    env = {**os.environ, SECRET_ENV: SECRET, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    env.pop("DAGSTER_HOME", None)
    decode = ["--cluster-regions", store.decode["cluster_regions"],
              "--venice-clock-uncertainty-ms", str(store.decode["venice_clock_uncertainty_ms"])]
    command = [sys.executable, "-m", "replica_lens.cli", "watch", "--stores", str(stores), "--landing", str(landing),
               "--warehouse", str(warehouse), "--once", "--spark-master", "local[2]", "--shuffle-partitions", "4",
               "--delta-jars", "", *decode]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)
    deadline = time.monotonic() + 240
    marker = landing / killed / "_SUCCESS"
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.exists(), process.communicate()[0].decode()[-2000:]
    time.sleep(1.0)  # into the audit
    os.killpg(process.pid, signal.SIGKILL)
    output = process.communicate()[0].decode()
    cursor = read_cursor(str(landing), "live")
    assert cursor.pending == killed and cursor.published == published, output
    resumed = watch_once(spark, live["config"], str(landing), live["audit"])[0]
    assert resumed.action == "resumed" and resumed.snapshot_id == killed, (resumed.action, resumed.error)
    assert read_cursor(str(landing), "live").published == killed

    def copy_audit(snapshot_id: str, scope: str):
        return run_audit(snapshot_id, str(copy / "landing"), str(copy / "warehouse"), scope=scope, **SETTINGS,
                         **store.decode)

    reference = watch_once(spark, live["config"], str(copy / "landing"), copy_audit)[0]
    assert reference.action == "audited" and reference.snapshot_id == killed
    cut = _cut(landing, killed)
    assert all(p["start"] == ends[(p["region"], p["topic"], p["partition"])] for p in cut["partitions"])  # the cursor's
    assert _tables_of(warehouse, killed) == _tables_of(copy / "warehouse", killed)
    for folder in (landing, warehouse):
        for path in folder.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path
    assert SECRET not in output
