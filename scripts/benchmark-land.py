"""Benchmark of one watch tick's landing (``land_cut`` as ``replica-lens watch`` calls it) against a plain read of
the same cut, in one warm Spark session.

Simulate a store as raw Venice records with chunked, dictionary-compressed values (3 regions, ``--partitions``
partitions, ``--writes`` upstream writes, 2,000 keys, seed 7: ``scripts/benchmark-watch.py`` part A's store, whose
cuts a tick lands), start a single-node KRaft broker per region (``replica_lens/brokers.py``), produce the records
once, take every region's cut of the whole topic, and then time, alternated ``--runs`` times after one untimed
warm-up of each (medians reported):

- ``land``: ``land_cut(..., whole_values=True)``, what a tick does: the read of exactly the cut, the check that no
  partition's read ends among a value's chunks (the tick's cut then ends before them), the landing of each region's
  files, ``_cut.json`` counted from the landed files, ``_SUCCESS``;
- ``plain``: per region, Spark's Kafka source reading the same offsets (``read_region``) written once as Parquet:
  the least any program must do to read the brokers and land the records.

Reported: ``land / plain`` and the records each moves per second.

    PYTHONPATH=$PWD .venv/bin/python scripts/benchmark-land.py --writes 36000 --runs 3 --json bench-results/land.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parent.parent
if str(PROJECT) not in sys.path:
    sys.path.insert(0, str(PROJECT))

REGIONS = ("dc-a", "dc-b", "dc-c")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=36_000, help="simulated upstream writes")
    parser.add_argument("--partitions", type=int, default=2, help="partitions of the version topic")
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each, alternated")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args(argv)

    from pipelines.venice.kafka_cut import DumpRequest, take_cut
    from pipelines.venice.kafka_dump import kafka_session, land_cut, read_region
    from replica_lens.brokers import produce_snapshot, start_clusters
    from replica_lens.simulator import SimulationConfig, simulate

    work = Path(tempfile.mkdtemp(prefix="benchmark-land-"))
    try:
        simulate(str(work / "sim"), "store", SimulationConfig(
            seed=7, regions=3, partitions=args.partitions, keys=2_000, writes=args.writes, exporters=0,
            file_format="venice-kafka", push_control_messages=True, compression="zstd-dict", chunk_above=64))
        with start_clusters(REGIONS, root=str(work)) as clusters:
            bootstrap = {r: n.bootstrap for r, n in clusters.nodes.items()}
            produced = produce_snapshot(str(work / "sim" / "store"), bootstrap, topic_config={"retention.ms": "-1"})
            records = sum(produced.values())
            spark = kafka_session("local[*]")
            request = DumpRequest(bootstrap, tuple(sorted({t for _, t, _ in produced})))

            def land(name: str) -> int:
                cuts = {r: take_cut(spark, request, r, {}) for r in REGIONS}
                out = land_cut(spark, request, cuts, str(work / "landing"), name, dt.datetime.now(dt.timezone.utc),
                               whole_values=True)
                return sum(out["records"].values())

            def plain(name: str) -> int:
                cuts = {r: take_cut(spark, request, r, {}) for r in REGIONS}
                for region, cut in cuts.items():
                    read_region(spark, request, region, cut).write.parquet(str(work / "plain" / name / region))
                return records

            times: dict[str, list[float]] = {"land": [], "plain": []}
            for run in range(args.runs + 1):  # run 0 warms both up, untimed
                for name, fn in (("land", land), ("plain", plain)):
                    started = time.perf_counter()
                    moved = fn(f"{name}-{run}")
                    seconds = time.perf_counter() - started
                    assert moved == records, (name, moved, records)
                    if run:
                        times[name].append(round(seconds, 3))
                    print(f"run {run}{' (warm-up)' if not run else ''}: {name} {seconds:.2f} s", flush=True)
        medians = {name: statistics.median(values) for name, values in times.items()}
        report = {
            "records": records, "writes": args.writes, "partitions": args.partitions, "runs": args.runs,
            "land_s": times["land"], "plain_s": times["plain"],
            "land_median_s": medians["land"], "plain_median_s": medians["plain"],
            "land_over_plain": round(medians["land"] / medians["plain"], 3),
            "land_records_per_s": round(records / medians["land"]),
            "plain_records_per_s": round(records / medians["plain"]),
        }
        print(json.dumps(report, indent=1))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        return report
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
