"""``replica-lens dump-kafka`` and ``replica-lens watch``: the commands that read Kafka brokers (SPEC section 11)."""
from __future__ import annotations

import argparse
import os
import sys

from replica_lens.cli_args import EXIT_RUN_FAILED, add_audit_settings, at_least_one


def dump_kafka_command(args: argparse.Namespace) -> int:
    from pipelines.venice.kafka_cut import BrokerUnavailable, DumpRequest, options_file, parse_pairs
    from pipelines.venice.kafka_dump import default_kafka_jars, dump
    from resources.errors import UsageError

    options = options_file(args.kafka_options_file)
    for name, value in parse_pairs(args.kafka_option, "--kafka-option").items():
        options[name] = value
    request = DumpRequest(
        regions=parse_pairs(args.region, "--region"),
        topics=tuple(dict.fromkeys(args.topic)),
        isolation_level=args.isolation_level,
        kafka_options=options,
        continue_from=args.continue_from,
        timeout_s=args.broker_timeout,
    )
    try:
        summary = dump(
            request, args.landing, args.snapshot_id, spark_master=args.spark_master,
            kafka_jars_dir=args.kafka_jars or default_kafka_jars(), overwrite=args.overwrite,
        )
    except BrokerUnavailable as error:  # the cut failed before anything was written: one line, exit 1
        print(f"replica-lens: {request.redact(str(error))}; nothing was written", file=sys.stderr)
        return EXIT_RUN_FAILED
    except UsageError as error:  # a consumer setting quoted back never reaches the terminal or a log
        raise UsageError(request.redact(str(error))) from None
    except Exception as error:  # noqa: BLE001 - the same for anything else, still reported as a bug
        raise RuntimeError(request.redact(f"{type(error).__name__}: {error}")) from None
    print(f"snapshot {args.snapshot_id} written to {summary['snapshot_dir']}")
    cut = summary["cut"]
    for region, counts in summary["regions"].items():
        parts = [p for p in cut["partitions"] if p["region"] == region]
        missing = sum(p["not_delivered"] for p in parts)
        print(f"  {region}: {counts.get('records', 0):,} records in {counts['files']} files; "
              f"{len(parts)} partitions cut at {cut['cut_at']} ({cut['isolation_level']}), "
              f"{missing:,} offsets of the cut delivered no record (gaps)")
    print("audit it with: replica-lens audit --landing ... --snapshot-id ... --cluster-regions ID=REGION,...")
    return 0


def watch_command(args: argparse.Namespace) -> int:
    from pipelines.venice.kafka_dump import default_kafka_jars, kafka_session
    from replica_lens.audit import audit_instance, run_audit
    from replica_lens.watch import load_stores, tick_lines, watch_forever
    from resources.settings import delta_settings

    config = load_stores(args.stores)
    delta = delta_settings(args.delta_jars, args.delta_engine)
    spark = kafka_session(args.spark_master, args.kafka_jars or default_kafka_jars(),
                          shuffle_partitions=args.shuffle_partitions, delta_jars_dir=delta.jars_dir)
    failed = []

    def report(result) -> None:
        print("\n".join(tick_lines(result)), flush=True)
        if result.failed:
            failed.append(result.store)

    with audit_instance(from_dagster_home=True) as instance:
        def audit(snapshot_id: str, scope: str):
            return run_audit(
                snapshot_id, args.landing, args.warehouse, instance=instance, log_level="ERROR", scope=scope,
                spark_master=args.spark_master, delta_jars_dir=delta.jars_dir, delta_engine=delta.engine,
                shuffle_partitions=args.shuffle_partitions, cluster_regions=args.cluster_regions,
                venice_clock_uncertainty_ms=args.venice_clock_uncertainty_ms,
                venice_push_settings=args.venice_push_settings,
            )

        def register(snapshot_id: str) -> None:
            from assets.partitions import SNAPSHOTS

            if not instance.has_dynamic_partition(SNAPSHOTS, snapshot_id):
                instance.add_dynamic_partitions(SNAPSHOTS, [snapshot_id])

        try:
            watch_forever(spark, config, args.landing, audit, report, interval_s=args.interval,
                          ticks=1 if args.once else None, register=register)
        except KeyboardInterrupt:
            print("stopped; the next watch continues from each store's cursor", file=sys.stderr)
    return EXIT_RUN_FAILED if failed else 0


def add_broker_commands(commands, common: argparse.ArgumentParser) -> None:
    """The ``dump-kafka`` and ``watch`` subcommands, added to ``commands`` (``common``: every command's options)."""
    dump = commands.add_parser(
        "dump-kafka",
        parents=[common],
        help="read Venice version topics from the brokers into a snapshot folder of raw Venice records",
    )
    dump.add_argument(
        "--region", action="append", default=[], metavar="REGION=HOST:PORT[,...]", required=True,
        help="a region and the bootstrap servers of its Kafka cluster (repeat per region)",
    )
    dump.add_argument(
        "--topic", action="append", default=[], required=True, metavar="TOPIC",
        help="a version topic to read in every region, e.g. store_v3 (repeat per topic)",
    )
    dump.add_argument("--landing", required=True, help="landing folder to write the snapshot folder into")
    dump.add_argument("--snapshot-id", required=True, help="name of the snapshot folder")
    dump.add_argument(
        "--isolation-level", choices=("read_committed", "read_uncommitted"), default="read_committed",
        help="read_committed (default): the cut ends at each partition's last stable offset and aborted records are "
        "gaps; read_uncommitted reads records of open and aborted transactions too (docs/venice-input.md)",
    )
    dump.add_argument(
        "--continue-from", metavar="SNAPSHOT_ID", default=None,
        help="a broker snapshot in the same landing folder: each partition starts at the end of its cut",
    )
    dump.add_argument(
        "--kafka-option", action="append", default=[], metavar="NAME=VALUE",
        help="a Kafka consumer setting, passed as kafka.NAME (security.protocol, sasl.*, ssl.*); repeatable; "
        "never written to a file, a table or a log",
    )
    dump.add_argument(
        "--kafka-options-file", metavar="FILE", default=os.environ.get("REPLICA_LENS_KAFKA_OPTIONS_FILE") or None,
        help="consumer settings as NAME=VALUE lines (for secrets; default: $REPLICA_LENS_KAFKA_OPTIONS_FILE); "
        "--kafka-option wins over the file",
    )
    dump.add_argument(
        "--broker-timeout", type=float, default=30.0, metavar="SECONDS",
        help="how long each region's brokers have to answer the cut (default: 30)",
    )
    dump.add_argument(
        "--kafka-jars",
        default=None,
        help="folder with the spark-sql-kafka jars and their dependencies (default: $REPLICA_LENS_KAFKA_JARS, "
        "else the project's jvm/lib/kafka-source when ./scripts/setup-jvm.sh resolved it)",
    )
    dump.add_argument(
        "--spark-master", default=os.environ.get("REPLICA_LENS_SPARK_MASTER", "local[*]"), help="Spark master URL"
    )
    dump.add_argument("--overwrite", action="store_true", help="replace an existing snapshot folder")
    dump.set_defaults(handler=dump_kafka_command)

    watch = commands.add_parser(
        "watch",
        parents=[common],
        help="cut every watched store's version topics at its brokers, land the new offsets and audit them "
        "incrementally; once (--once) or every interval",
    )
    watch.add_argument(
        "--stores", required=not os.environ.get("REPLICA_LENS_STORES"), default=os.environ.get("REPLICA_LENS_STORES"),
        metavar="FILE",
        help="the stores to watch, their regions' brokers and consumer settings (TOML, docs/operations.md)",
    )
    watch.add_argument("--landing", required=True, help="landing folder: the snapshots and each store's cursor (_watch/)")
    watch.add_argument("--warehouse", required=True, help="folder for the Delta tables, one per asset")
    watch.add_argument("--once", action="store_true", help="one tick of every store, then exit (for cron and scripts)")
    watch.add_argument(
        "--interval", type=at_least_one, metavar="SECONDS",
        help="seconds from the start of one tick to the next (default: the store file's interval_seconds, else 60)",
    )
    watch.add_argument(
        "--kafka-jars", default=None,
        help="folder with the spark-sql-kafka jars and their dependencies (default: $REPLICA_LENS_KAFKA_JARS, "
        "else the project's jvm/lib/kafka-source)",
    )
    add_audit_settings(watch)
    watch.set_defaults(handler=watch_command)
