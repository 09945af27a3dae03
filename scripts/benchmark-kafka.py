"""Benchmark of ``replica-lens dump-kafka`` (issue 68 item 5) against a plain Spark Kafka read of the same topics.

One run: simulate the benchmark's 2M-row store (``replica-lens benchmark``'s ``uniform`` variant: 3 regions,
4 partitions, 100,000 keys, seed 11) as raw Venice records, start a single-node KRaft broker per region
(``replica_lens/brokers.py``, with the JIT's optimizing tier and a 1 GiB heap), produce the records into them
once, then time as whole processes, alternated ``--runs`` times (medians reported):

- ``dump``: ``replica-lens dump-kafka`` of every region into a fresh landing folder (the cut, the read of
  exactly it, the landing, ``_cut.json``);
- ``plain``: a Python process that starts a Spark session with the same settings and jars and, per region,
  reads the topic with Spark's Kafka source (``subscribe``, earliest to latest) and writes it once as Parquet:
  the least any program must do to read the brokers and land the records.

Both are timed from process start to exit (interpreter and JVM start-up included). Reported: the ratio
``dump / plain`` and the records per second each read from the brokers (records / process seconds).

    PYTHONPATH=$PWD .venv/bin/python scripts/benchmark-kafka.py --rows 2000000 --runs 3 --json bench-results/kafka-2m.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PLAIN = r"""
import sys, json
from pyspark.sql import functions as F
from resources.session import build_spark_session
from pipelines.venice.kafka_dump import default_kafka_jars, kafka_jars
regions, topic, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
spark = build_spark_session(master="local[*]", extra={"spark.jars": ",".join(kafka_jars(default_kafka_jars()))})
for region, bootstrap in regions.items():
    (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", topic)
     .option("startingOffsets", "earliest").option("endingOffsets", "latest").option("includeHeaders", "true")
     .load().withColumn("region", F.lit(region)).write.mode("overwrite").parquet(f"{out}/{region}"))
"""


def _timed(command: list[str], env: dict) -> float:
    start = time.monotonic()
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"benchmark-kafka: {command[:4]} failed ({done.returncode}): {done.stderr.strip()[-400:]}")
    return seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from replica_lens.benchmark.run import variant_config
    from replica_lens.brokers import produce_snapshot, start_clusters
    from replica_lens.simulator import simulate

    project = Path(__file__).resolve().parent.parent
    work = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
    env = {**os.environ, "PYTHONPATH": str(project)}
    try:
        config = variant_config("uniform", args.rows)
        config = dataclasses.replace(config, file_format="venice-kafka", exporters=0)
        t = time.monotonic()
        summary = simulate(str(work / "sim"), "s", config)
        print(f"simulated {summary.get('rows_total', '?')} rows in {time.monotonic() - t:.1f} s",
              flush=True)
        with start_clusters(["dc-a", "dc-b", "dc-c"], root=str(work),
                            jvm_options=("-Xms256m", "-Xmx1g", "-XX:+UseG1GC")) as clusters:
            bootstrap = {r: n.bootstrap for r, n in clusters.nodes.items()}
            t = time.monotonic()
            produced = produce_snapshot(str(work / "sim" / "s"), bootstrap, topic_config={"retention.ms": "-1"})
            records = sum(produced.values())
            print(f"produced {records:,} records in {time.monotonic() - t:.1f} s", flush=True)
            topic = sorted({t for _, t, _ in produced})[0]
            dump_s, plain_s = [], []
            for run in range(args.runs):
                landing = work / f"landing-{run}"
                dump_s.append(_timed([sys.executable, "-m", "replica_lens.cli", "dump-kafka",
                                      *clusters.regions_arg(), "--topic", topic, "--landing", str(landing),
                                      "--snapshot-id", "d"], env))
                shutil.rmtree(landing, ignore_errors=True)
                out = work / f"plain-{run}"
                plain_s.append(_timed([sys.executable, "-c", PLAIN, json.dumps(bootstrap), topic, str(out)], env))
                shutil.rmtree(out, ignore_errors=True)
                print(f"run {run + 1}: dump {dump_s[-1]:.2f} s, plain read {plain_s[-1]:.2f} s", flush=True)
        dump_m, plain_m = statistics.median(dump_s), statistics.median(plain_s)
        report = {
            "rows": args.rows, "records": records, "runs": args.runs, "dump_seconds": dump_s,
            "plain_seconds": plain_s, "dump_median_s": round(dump_m, 2), "plain_median_s": round(plain_m, 2),
            "dump_to_plain": round(dump_m / plain_m, 3),
            "dump_records_per_s": round(records / dump_m), "plain_records_per_s": round(records / plain_m),
            "load_average": os.getloadavg(), "cores": os.cpu_count(),
        }
        print(json.dumps(report, indent=1))
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
