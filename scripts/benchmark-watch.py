"""Benchmark of continuous audits (issue 70 item 4): time to proof on live brokers, incremental against full audits.

**A. Time to proof** (``--part A``). Simulate a small store with injected faults (lost writes, corrupted values,
conflicting writes) as raw Venice records (3 regions, START_OF_PUSH first), start a single-node KRaft broker per
region (``replica_lens/brokers.py``), and let a producer thread write the records into them at a steady rate
(``--rate`` records per second per region; all regions' records merged in the simulator's time order, each
partition in offset order, every record at the offset the simulator gave it), while this process runs the watch's
tick (``watch_once``, as ``replica-lens watch`` does: one Spark session from ``kafka_session``, ``run_audit`` on one
Dagster instance) every ``--interval`` seconds, until the producer is done and a tick finds nothing new. Before
production starts, a small store of its own topic is dumped and audited once in the same JVM (a watch that runs
for hours is warm; ``--no-warmup`` leaves it out, and the first tick then pays the JVM's compilation).

*When a key becomes provable.* For each key that some snapshot's ``divergence_reports`` proves (DIVERGENT or
MISSING), take the first snapshot that proves it and, per replica pair it reports, the witness (v in replica a,
w in replica b, with their touch bounds ``U(v)``, ``U(w)``). The proof needs ``U(w) <= M(v)`` and ``U(v) <= M(w)``,
where ``M`` grows with the contributions each replica applied after its witness (SPEC 3: a heartbeat's vector, a
data row's ``{source_region: source_offset}``). The *enabling record* of side a is the first record of a's
partition, at or after v's offset (from the partition's start when v is the pre-dump version), after which the
running max of a's contributions covers ``U(w)``; likewise for b. The key is *provable* when the later of the two
enabling records was delivered to its broker (the producer's delivery callback); the earliest pair counts. The
contributions are read back from ``raw_topic_snapshots`` of the whole chain. Reported per key: the latency from
that delivery to the materialization of the ``divergence_reports`` that first reports the key (the event's
timestamp in the Dagster instance), its median and max, against the goal of two intervals plus one small audit
(``goal_s`` = 2 x ``--interval`` + the median audit seconds of one tick's snapshot).

**B. Incremental against full** (``--part B``). ``replica-lens benchmark``'s ``uniform`` history (``--rows``, JSONL,
3 regions, 4 partitions, 100k keys, seed 11), split per replica partition by offset (START_OF_PUSH in the first
part; an exporter report goes with the data row before it): a first part ``[0, f)`` and a continuing snapshot of
the next 1% ``[f, f + 0.01)``. All audits run as ``run_audit`` calls in this process's one JVM, one after another,
after a warm-up of both paths measured: the first 99% and then the last 1% incrementally, in a warehouse of their
own (so the JIT has compiled every audit path, the carried state's too, as in a watch that has ticked before; a
whole process would add the same start-up to both sides and flatter the ratio): the whole history in a fresh
warehouse (``full_s``), the first 99% (untimed figure) then the last 1% incrementally (``incremental_99_s``), the
first 50% then the 1% after it (``incremental_50_s``), and the last 1% alone in a fresh warehouse (``lone_1pct_s``:
the fixed cost of an audit, no carried state), then the whole history once more (``full_again_s``: the machine's
load moves within a run).
Ratios ``incremental / full`` (the mean of the two full audits) and ``incremental_99_to_first99`` (against the audit
of the first 99%, run just before it); goal: well under a third. Then (``--ticks N``, 5 by default) the last 1%
``N`` times more as a watch's ticks audit cuts: each under a new snapshot id, on the first 99%'s state
(``ticks_s``), and the median of the last three against the full audit (``tick_steady_s``,
``tick_steady_to_full``): the incremental cost from several audits instead of one.

    PYTHONPATH=$PWD .venv/bin/python scripts/benchmark-watch.py --json bench-results/watch.json
    # quick: a small history for B, a short production for A
    PYTHONPATH=$PWD .venv/bin/python scripts/benchmark-watch.py --rows 100000 --writes 6000 --json /tmp/watch.json
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
if str(PROJECT) not in sys.path:
    sys.path.insert(0, str(PROJECT))

REGIONS = ["dc-a", "dc-b", "dc-c"]
PROVEN = ("DIVERGENT", "MISSING")


# --------------------------------------------------------------------------- A. time to proof


class SteadyProducer(threading.Thread):
    """Writes ``records`` (region, partition, offset, row) in order at ``rate`` records/s in total, each at the
    offset the simulator gave it; ``delivered[(region, partition, offset)]`` = epoch seconds of its delivery."""

    def __init__(self, records: list, bootstrap_of: dict[str, str], topic: str, rate: float):
        super().__init__(name="steady-producer", daemon=True)
        self.records, self.bootstrap_of, self.topic, self.rate = records, bootstrap_of, topic, rate
        self.delivered: dict[tuple[str, int, int], float] = {}
        self.errors: list[str] = []
        self.started_at = self.finished_at = None
        self.done = threading.Event()

    def run(self) -> None:
        from confluent_kafka import Producer

        from replica_lens.brokers import _epoch_ms, producer_config

        producers = {r: Producer(producer_config(b)) for r, b in self.bootstrap_of.items()}
        self.started_at = time.time()
        start = time.monotonic()
        try:
            for i, (region, partition, offset, row) in enumerate(self.records):
                wait = start + i / self.rate - time.monotonic()
                if wait > 0:
                    time.sleep(wait)

                def delivered(err, msg, key=(region, partition, offset)):
                    if err is not None:
                        self.errors.append(str(err))
                    elif msg.offset() != key[2]:
                        self.errors.append(f"{key}: the broker gave offset {msg.offset()}")
                    else:
                        self.delivered[key] = time.time()

                headers = [(h["key"], h["value"]) for h in (row.get("headers") or [])]
                while True:
                    try:
                        producers[region].produce(self.topic, value=row["value"], key=row["key"], partition=partition,
                                                  timestamp=_epoch_ms(row.get("timestamp")) or 0,
                                                  headers=headers or None, on_delivery=delivered)
                        break
                    except BufferError:
                        producers[region].poll(0.01)
                for p in producers.values():
                    p.poll(0)
            for p in producers.values():
                if p.flush(60) != 0:
                    self.errors.append("records still unsent after 60 s")
        finally:
            self.finished_at = time.time()
            self.done.set()


def _vector(value) -> dict[str, int]:
    """A map column as delta-rs gives it (a list of pairs, or a dict) as a dict."""
    if value is None:
        return {}
    return dict(value) if isinstance(value, dict) else {k: v for k, v in value}


def _covers(lower: dict[str, int], bound: dict[str, int]) -> bool:
    return all(lower.get(region, -1) >= offset for region, offset in bound.items())


def _streams(warehouse: Path) -> dict[tuple[str, str, int], list[tuple[int, str, dict]]]:
    """Every replica partition's rows of the whole chain (offset, kind, contribution), in offset order."""
    from deltalake import DeltaTable

    table = DeltaTable(str(warehouse / "raw_topic_snapshots")).to_pyarrow_table(
        columns=["replica", "topic", "partition", "offset", "kind", "source_region", "source_offset", "hb_vector"])
    streams: dict[tuple[str, str, int], dict[int, tuple]] = {}
    for r in table.to_pylist():
        if r["offset"] is None or r["kind"] not in ("PUT", "DELETE", "HEARTBEAT"):
            continue
        contribution = _vector(r["hb_vector"]) if r["kind"] == "HEARTBEAT" else {}
        if not contribution and r["source_region"] is not None and r["source_offset"] is not None:
            contribution = {r["source_region"]: r["source_offset"]}
        streams.setdefault((r["replica"], r["topic"], r["partition"]), {})[r["offset"]] = (r["kind"], contribution)
    return {k: [(o, *v[o]) for o in sorted(v)] for k, v in streams.items()}


def _enabling(stream: list, witness_offset, bound: dict[str, int]):
    """The first row at or after ``witness_offset`` after which the stream's contributions cover ``bound``."""
    running: dict[str, int] = {}
    for offset, kind, contribution in stream:
        for region, value in contribution.items():
            running[region] = max(running.get(region, -1), value)
        if (witness_offset is None or offset >= witness_offset) and _covers(running, bound):
            return offset, kind
    return None, None


def time_to_proof(args, spark, settings: dict, work: Path) -> dict:
    import dagster as dg
    from deltalake import DeltaTable

    from assets.partitions import SNAPSHOTS
    from replica_lens.audit import audit_instance, run_audit
    from pipelines.venice.kafka_cut import DumpRequest
    from pipelines.venice.kafka_dump import dump
    from replica_lens.brokers import create_topic, kafka_files, partition_rows, produce_snapshot, start_clusters
    from replica_lens.simulator import SimulationConfig, simulate
    from replica_lens.watch import parse_stores, watch_once

    config = SimulationConfig(
        seed=args.seed, regions=3, partitions=args.partitions, keys=args.keys, writes=args.writes, exporters=0,
        lost_writes=args.faults, corrupted_values=args.faults, conflicting_writes=args.faults,
        file_format="venice-kafka", push_control_messages=True)
    simulate(str(work / "sim"), "store", config)
    truth = json.loads((work / "sim" / "store.ground_truth.json").read_text())
    venice = truth["venice"]
    files = kafka_files(str(work / "sim" / "store"))
    topic = sorted({t for _, t, _ in files})[0]
    records = []
    for (region, _, partition), paths in files.items():
        for row in partition_rows(paths):
            records.append((row["timestamp"], REGIONS.index(region), partition, int(row["offset"]), region, row))
    records.sort(key=lambda r: r[:4])  # the simulator's time, then each partition's offset order
    records = [(region, partition, offset, row) for _, _, partition, offset, region, row in records]
    per_region = {r: sum(1 for x in records if x[0] == r) for r in REGIONS}
    print(f"A: simulated {len(records):,} records ({per_region}), {len(truth['injected_faults'])} injected faults, "
          f"{len(truth['conflicting_writes'])} conflicting writes; producing at {args.rate}/s per region "
          f"(~{max(per_region.values()) / args.rate:.0f} s), a tick every {args.interval} s", flush=True)

    landing, warehouse = work / "landing", work / "warehouse"
    ticks: list[dict] = []
    audits: dict[str, dict] = {}
    with start_clusters(REGIONS, root=str(work)) as clusters:
        bootstrap = {r: n.bootstrap for r, n in clusters.nodes.items()}
        for region in REGIONS:
            create_topic(bootstrap[region], topic, args.partitions, {"retention.ms": "-1"})
        stores = parse_stores(
            f"interval_seconds = {args.interval}\n[stores.store]\ntopic_pattern = \"store_v[0-9]+\"\n"
            + "".join(f"[stores.store.regions.{r}]\nbootstrap_servers = \"{b}\"\n" for r, b in bootstrap.items()))
        producer = SteadyProducer(records, bootstrap, topic, args.rate * len(REGIONS))
        with audit_instance() as instance:
            if args.warmup:  # a long-running watch's JVM is warm: a small store, dumped and audited once first
                warm = dataclasses.replace(config, seed=config.seed + 1, writes=1_000, keys=100)
                simulate(str(work / "warm-sim"), "warm", warm)
                produce_snapshot(str(work / "warm-sim" / "warm"), bootstrap, rename={topic: "warmup_v1"},
                                 topic_config={"retention.ms": "-1"})
                started = time.monotonic()
                dump(DumpRequest(bootstrap, ("warmup_v1",)), str(work / "warm-landing"), "warm", spark=spark)
                warmed = run_audit("warm", str(work / "warm-landing"), str(work / "warm-warehouse"), instance=instance,
                                   log_level="ERROR", cluster_regions=venice["cluster_regions"],
                                   venice_clock_uncertainty_ms=venice["clock_uncertainty_ms"], **settings)
                print(f"  warm-up: a {warm.writes}-write store dumped and audited in "
                      f"{time.monotonic() - started:.1f} s ({'ok' if warmed.success else warmed.error})", flush=True)
            def audit(snapshot_id: str, scope: str):
                started = time.time()
                outcome = run_audit(snapshot_id, str(landing), str(warehouse), instance=instance, log_level="ERROR",
                                    scope=scope,
                                    cluster_regions=venice["cluster_regions"],
                                    venice_clock_uncertainty_ms=venice["clock_uncertainty_ms"], **settings)
                ended = time.time()
                event = instance.get_latest_materialization_event(dg.AssetKey("divergence_reports"))
                materialized = (event.timestamp if event is not None and event.dagster_event.partition == snapshot_id
                                else ended)
                audits[snapshot_id] = {"audit_s": round(ended - started, 2), "materialized_at": materialized,
                                       "success": outcome.success, "error": outcome.error,
                                       "proven": outcome.proven_divergent if outcome.success else None}
                return outcome

            def register(snapshot_id: str) -> None:
                if not instance.has_dynamic_partition(SNAPSHOTS, snapshot_id):
                    instance.add_dynamic_partitions(SNAPSHOTS, [snapshot_id])

            producer.start()
            deadline = time.monotonic() + args.max_minutes * 60
            while True:
                started, producer_was_done = time.monotonic(), producer.done.is_set()
                result = watch_once(spark, stores, str(landing), audit, register)[0]
                tick = {"at_s": round(time.time() - producer.started_at, 1), "action": result.action,
                        "snapshot_id": result.snapshot_id, "records": sum(r["records"] for r in result.regions.values()),
                        "seconds_cut_to_audited": result.seconds_cut_to_audited,
                        "tick_s": round(time.monotonic() - started, 1)}
                if result.snapshot_id in audits:
                    tick["audit_s"] = audits[result.snapshot_id]["audit_s"]
                ticks.append(tick)
                print(f"  tick {len(ticks)}: {tick}", flush=True)
                if result.failed:
                    raise SystemExit(f"benchmark-watch: the tick failed: {result.error}")
                if (producer_was_done and result.action == "none") or time.monotonic() > deadline:
                    break
                time.sleep(max(0.0, args.interval - (time.monotonic() - started)))
        producer.join()
    if producer.errors:
        raise SystemExit(f"benchmark-watch: {len(producer.errors)} records not produced as simulated: "
                         f"{producer.errors[0]}")

    # Which keys are proven, first where, and when each became provable.
    reports = DeltaTable(str(warehouse / "divergence_reports")).to_pyarrow_table().to_pylist()
    first: dict[tuple, str] = {}
    for r in reports:
        if r["verdict"] in PROVEN:
            k = (r["topic"], r["partition"], r["key"])
            first[k] = min(first.get(k, r["snapshot_id"]), r["snapshot_id"])
    streams = _streams(warehouse)
    injected = {(f["partition"], f["key"]) for f in truth["injected_faults"]}
    keys = []
    for (t, p, key), sid in sorted(first.items()):
        best = None
        for r in reports:
            if (r["snapshot_id"], r["topic"], r["partition"], r["key"]) != (sid, t, p, key) or r["verdict"] not in PROVEN:
                continue
            sides = []
            for me, other in (("a", "b"), ("b", "a")):
                offset, kind = _enabling(streams.get((r[f"replica_{me}"], t, p), []), r[f"witness_offset_{me}"],
                                         _vector(r[f"touch_bound_{other}"]))
                delivered = producer.delivered.get((r[f"replica_{me}"], p, offset)) if offset is not None else None
                sides.append((delivered, r[f"replica_{me}"], offset, kind))
            if any(s[0] is None for s in sides):
                continue
            enabling = max(sides)
            if best is None or enabling[0] < best[0]:
                best = enabling
        entry = {"topic": t, "partition": p, "key": key, "snapshot_id": sid, "injected": False}
        try:  # the simulator's keys are plain strings; the report shows a raw Venice key as base64
            text = base64.b64decode(key).decode("utf-8")
            entry.update(key_text=text, injected=(p, text) in injected)
        except ValueError:
            pass
        if best is not None:
            delivered, replica, offset, kind = best
            entry.update(enabling_record={"replica": replica, "offset": offset, "kind": kind},
                         latency_s=round(audits[sid]["materialized_at"] - delivered, 2))
        keys.append(entry)
    latencies = [k["latency_s"] for k in keys if "latency_s" in k]
    audit_seconds = [a["audit_s"] for a in audits.values()]
    median_audit = statistics.median(audit_seconds) if audit_seconds else None
    goal = round(2 * args.interval + median_audit, 1) if median_audit is not None else None
    return {
        "config": {"writes": args.writes, "keys": args.keys, "partitions": args.partitions, "faults_each": args.faults,
                   "seed": args.seed, "rate_per_region": args.rate, "interval_s": args.interval},
        "records": len(records), "injected_faults": len(truth["injected_faults"]),
        "conflicting_writes": len(truth["conflicting_writes"]),
        "production_s": round(producer.finished_at - producer.started_at, 1),
        "ticks": ticks, "snapshots_audited": len(audits),
        "audit_median_s": round(median_audit, 2) if median_audit is not None else None,
        "audit_max_s": max(audit_seconds, default=None),
        "keys_proven": len(keys), "injected_faults_proven": sum(k["injected"] for k in keys),
        "keys_located": len(latencies),
        "enabling_heartbeats": sum(1 for k in keys if k.get("enabling_record", {}).get("kind") == "HEARTBEAT"),
        "latency_median_s": round(statistics.median(latencies), 2) if latencies else None,
        "latency_max_s": max(latencies, default=None),
        "goal_s": goal, "within_goal": bool(latencies) and max(latencies) <= goal,
        "keys": keys,
    }


# --------------------------------------------------------------------------- B. incremental against full


def _partition_files(snapshot: Path) -> dict[str, list[Path]]:
    """The JSONL files of each replica partition (``<replica>.<topic>.p<N>.<seq>.jsonl``), in file order."""
    out: dict[str, list[Path]] = {}
    for path in sorted(snapshot.glob("*.jsonl")):
        out.setdefault(path.name.rsplit(".", 2)[0], []).append(path)
    return out


def write_part(snapshot: Path, target: Path, low: float, high: float) -> int:
    """A snapshot of each replica partition's offsets ``[low * n, high * n)`` (``n``: its last offset + 1), the lines
    kept as they are; an exporter report (no offset) goes with the data row before it. Returns the rows written."""
    target.mkdir(parents=True, exist_ok=True)
    written = 0
    for name, paths in _partition_files(snapshot).items():
        lines = [line for path in paths for line in path.read_text().splitlines() if line.strip()]
        offsets = [json.loads(line).get("offset") for line in lines]
        n = max(o for o in offsets if o is not None) + 1
        start, stop = int(low * n), int(high * n)
        kept, current = [], 0
        for line, offset in zip(lines, offsets):
            current = offset if offset is not None else current
            if start <= current < stop:
                kept.append(line)
        (target / f"{name}.00000.jsonl").write_text("".join(line + "\n" for line in kept))
        written += len(kept)
    (target / "_SUCCESS").write_text("")
    return written


def incremental_cost(args, spark, settings: dict, work: Path) -> dict:
    from replica_lens.audit import audit_instance, run_audit
    from replica_lens.benchmark.run import variant_config
    from replica_lens.simulator import simulate

    landing = work / "landing"
    simulate(str(landing), "full", variant_config("uniform", args.rows))
    rows = {"full": sum(1 for p in (landing / "full").glob("*.jsonl") for _ in p.open())}
    parts = {"first99": (0.0, 0.99), "last1": (0.99, 1.0), "first50": (0.0, 0.50), "after50": (0.50, 0.51)}
    for sid, (low, high) in parts.items():
        rows[sid] = write_part(landing / "full", landing / sid, low, high)
    print(f"B: {rows}", flush=True)
    figures: dict = {"rows": rows}

    with audit_instance() as instance:
        def timed(name: str, snapshot_id: str, warehouse: str) -> float:
            start = time.perf_counter()
            outcome = run_audit(snapshot_id, str(landing), str(work / warehouse), instance=instance,
                                log_level="ERROR", **settings)
            seconds = round(time.perf_counter() - start, 2)
            if not outcome.success:
                raise SystemExit(f"benchmark-watch: the audit of {snapshot_id} failed: {outcome.error}")
            figures[f"{name}_s"] = seconds
            figures[f"{name}_steps_s"] = {
                s.step_key: round(s.end_time - s.start_time, 1)
                for s in instance.get_run_step_stats(outcome.run_id) if s.start_time and s.end_time}
            div = outcome.metadata.get("divergence_reports", {})
            figures[f"{name}_carried_versions"] = div.get("carried_versions")
            print(f"  {name}: {snapshot_id} in {warehouse}: {seconds} s (carried versions: "
                  f"{div.get('carried_versions')}, keys compared {div.get('keys_compared')})", flush=True)
            return seconds

        # Warm-up: every path measured below runs once first (a watch's JVM has run both for hours): an audit of
        # almost the whole history (the full audit's path) and the incremental audit of the rest (the carried state's
        # path: its plans' generated code is compiled on their first run, about 6 s at 2M rows).
        timed("warmup_first99", "first99", "w-warmup")
        timed("warmup_last1", "last1", "w-warmup")
        full = timed("full", "full", "w-full")
        timed("first99", "first99", "w-99")
        inc99 = timed("incremental_99", "last1", "w-99")
        timed("first50", "first50", "w-50")
        inc50 = timed("incremental_50", "after50", "w-50")
        timed("lone_1pct", "last1", "w-lone")
        # The machine's load moves within a run: the full audit once more, last; the ratios take the mean of both.
        full = (full + timed("full_again", "full", "w-full-again")) / 2
        if args.ticks:
            figures["ticks_s"] = watch_ticks(args.ticks, spark, landing, work, "w-99", timed)
    figures["full_mean_s"] = round(full, 2)
    if args.ticks:
        steady = statistics.median(figures["ticks_s"][-TICKS_STEADY:])
        figures["tick_steady_s"] = round(steady, 2)
        figures["tick_steady_to_full"] = round(steady / full, 3)
    figures["incremental_99_to_full"] = round(inc99 / full, 3)
    figures["incremental_50_to_full"] = round(inc50 / full, 3)
    figures["incremental_99_to_first99"] = round(inc99 / figures["first99_s"], 3)
    figures["goal"] = "incremental_99_to_full well under 1/3"
    return figures


# The steady state of a watch's ticks: the median of the last ticks measured.
TICKS_STEADY = 3


def watch_ticks(count: int, spark, landing: Path, work: Path, warehouse: str, timed) -> list[float]:
    """The last 1% audited as a watch's ticks would audit it: ``count`` times, each under a new snapshot id (a
    folder holding links to ``last1``'s files) on the first 99%'s state in ``work / warehouse``, one JVM
    throughout, as a watch audits a cut every interval. Each tick's own state is dropped after it (untimed), and
    ``last1``'s before the first, so every tick continues the first 99%'s state, as ``incremental_99`` did. The
    seconds of each tick, in order.
    """
    from resources.delta_store import DeltaStore

    store = DeltaStore(warehouse_root=str(work / warehouse))
    store.delete_snapshots(spark, "replica_state", ["last1"])
    seconds = []
    for number in range(count):
        snapshot_id = f"tick{number:03d}"
        shutil.copytree(landing / "last1", landing / snapshot_id, copy_function=os.link)
        seconds.append(timed(snapshot_id, snapshot_id, warehouse))
        store.delete_snapshots(spark, "replica_state", [snapshot_id])
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("A", "B", "both"), default="both")
    parser.add_argument("--interval", type=int, default=60, help="A: seconds from the start of one tick to the next")
    parser.add_argument("--rate", type=float, default=200, help="A: records per second per region")
    parser.add_argument("--writes", type=int, default=36_000, help="A: simulated upstream writes")
    parser.add_argument("--keys", type=int, default=2_000, help="A: distinct keys")
    parser.add_argument("--partitions", type=int, default=2, help="A: partitions of the version topic")
    parser.add_argument("--faults", type=int, default=4, help="A: lost writes, corrupted values and conflicting "
                        "write pairs, this many of each")
    parser.add_argument("--seed", type=int, default=7, help="A: the simulation's seed")
    parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                        help="A: no warm-up dump and audit of a small store before the watch starts")
    parser.add_argument("--max-minutes", type=float, default=40, help="A: stop ticking after this long")
    parser.add_argument("--rows", type=int, default=2_000_000, help="B: rows of the uniform history")
    parser.add_argument("--ticks", type=int, default=5, help="B: the last 1%% audited this many times more, as a "
                        "watch's ticks (new snapshot ids on the first 99%%'s state); 0: none")
    parser.add_argument("--shuffle-partitions", type=int, default=None)
    parser.add_argument("--workdir", default=None, help="default: a temporary folder, removed at the end")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from pipelines.venice.kafka_dump import default_kafka_jars, kafka_session
    from resources.settings import delta_settings_from_environment
    from resources.tuning import DEFAULT_SHUFFLE_PARTITIONS

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-watch-"))
    work.mkdir(parents=True, exist_ok=True)
    delta = delta_settings_from_environment()
    shuffle = args.shuffle_partitions or DEFAULT_SHUFFLE_PARTITIONS
    spark = kafka_session("local[*]", default_kafka_jars(), shuffle_partitions=shuffle, delta_jars_dir=delta.jars_dir)
    settings = {"spark_master": "local[*]", "delta_jars_dir": delta.jars_dir, "delta_engine": delta.engine,
                "shuffle_partitions": shuffle}
    report: dict = {"cores": os.cpu_count()}
    try:
        if args.part in ("A", "both"):
            (work / "A").mkdir(exist_ok=True)
            report["time_to_proof"] = time_to_proof(args, spark, settings, work / "A")
            report["load_average_after_A"] = os.getloadavg()
        if args.part in ("B", "both"):
            (work / "B").mkdir(exist_ok=True)
            report["incremental"] = incremental_cost(args, spark, settings, work / "B")
            report["load_average_after_B"] = os.getloadavg()
        shown = json.loads(json.dumps(report))
        if "time_to_proof" in shown:
            shown["time_to_proof"]["keys"] = f"{len(shown['time_to_proof']['keys'])} keys (in --json)"
        print(json.dumps(shown, indent=1))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=1, default=str) + "\n")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
