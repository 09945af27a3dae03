"""What the ``replica-lens`` commands share: their exit codes, argument types and an audit run's settings."""
from __future__ import annotations

import argparse
import os

from resources.tuning import DEFAULT_SHUFFLE_PARTITIONS

EXIT_RUN_FAILED = 1
EXIT_USAGE = 2
EXIT_DIVERGENCE = 3
EXIT_INTERNAL = 70  # sysexits' EX_SOFTWARE: a bug, not the user's mistake


def state_retention(text: str) -> int:
    """``--state-retention``: a whole number, checked by the divergence step's own rule."""
    from assets.divergence import check_state_retention
    from resources.errors import InvalidSetting

    try:
        return check_state_retention(int(text))
    except (ValueError, InvalidSetting):
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 2, got {text!r}") from None


def at_least_one(text: str) -> int:
    """A whole number of at least 1 (``--concurrent-steps``)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return value


def clock_uncertainty(text: str) -> int:
    """``--venice-clock-uncertainty-ms``: checked by the landing resource's own rule."""
    from resources.errors import InvalidSetting
    from resources.landing import parse_clock_uncertainty

    try:
        return parse_clock_uncertainty(text)
    except InvalidSetting as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_audit_settings(audit: argparse.ArgumentParser) -> None:
    """The settings of an audit run (Spark, Delta, how raw Venice records decode): `audit` and `watch`."""
    audit.add_argument(
        "--spark-master", default=os.environ.get("REPLICA_LENS_SPARK_MASTER", "local[*]"), help="Spark master URL"
    )
    audit.add_argument(
        "--delta-jars",
        default=os.environ.get("REPLICA_LENS_DELTA_JARS"),
        metavar="DIR",
        help="folder with the Delta Lake jars, loaded for the native engine; naming one makes the engine auto "
        "(default: $REPLICA_LENS_DELTA_JARS, else jvm/lib/delta when it holds them; empty: none)",
    )
    audit.add_argument(
        "--delta-engine",
        default=os.environ.get("REPLICA_LENS_DELTA_ENGINE"),
        choices=("embedded", "native", "auto"),
        help="who writes the Delta tables: embedded (staged files committed by delta-rs), native (delta-spark), auto "
        "(native where the jars are loaded) (default: $REPLICA_LENS_DELTA_ENGINE, else auto when --delta-jars names "
        "a folder, else embedded)",
    )
    audit.add_argument("--shuffle-partitions", type=int, default=DEFAULT_SHUFFLE_PARTITIONS, help="spark.sql.shuffle.partitions (upper bound; adaptive execution merges small partitions)")
    audit.add_argument(
        "--cluster-regions",
        default=os.environ.get("REPLICA_LENS_CLUSTER_REGIONS") or None,
        metavar="ID=REGION,...",
        help="raw Venice records: upstream Kafka cluster id -> region name, e.g. 0=dc-a,1=dc-b "
        "(default: $REPLICA_LENS_CLUSTER_REGIONS)",
    )
    audit.add_argument(
        "--venice-clock-uncertainty-ms",
        type=clock_uncertainty,
        metavar="MS",
        help="raw Venice records: widen each heartbeat's origin and applied time points by MS on each side into "
        "intervals (default: $REPLICA_LENS_VENICE_CLOCK_UNCERTAINTY_MS, else 0)",
    )
    audit.add_argument(
        "--venice-push-settings",
        default=os.environ.get("REPLICA_LENS_VENICE_PUSH_SETTINGS") or None,
        metavar="FILE",
        help="raw Venice records: a JSON file naming the compression and chunking of version topics the snapshot "
        "holds no START_OF_PUSH of, e.g. a dump that starts mid-stream (docs/venice-input.md; default: "
        "$REPLICA_LENS_VENICE_PUSH_SETTINGS)",
    )
