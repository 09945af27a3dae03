"""The one ``Definitions`` of the Replica Lens code location (loaded by workspace.yaml).

Paths and Spark settings come from the environment through ``EnvVar`` when a run
starts, never at import time (``dagster dev`` reads them from ``.env``). The CLI builds
the same definitions with explicit values through ``build_definitions``. The one setting
read when the definitions are built is the landing sensor's interval: Dagster schedules a
sensor from its definition.
"""
from __future__ import annotations

import os
from typing import Optional, Union

import dagster as dg

from assets import divergence, ingest, operations, trend, watermarks
from replica_lens.executor import threaded_in_process_executor
from replica_lens.jobs import (
    LANDING_SENSOR_INTERVAL_ENV,
    audit_snapshot,
    build_broker_watch_sensor,
    build_landing_sensor,
    explain_key_job,
    landing_sensor_interval,
    reaudit_newest_snapshot,
    refresh_trend,
    trend_after_audit,
    trend_catch_up,
    vacuum_warehouse,
    vacuum_warehouse_daily,
    watch_brokers,
    watch_interval,
)
from pipelines.venice.kafka_dump import kafka_spark_config
from replica_lens.watch import WATCH_INTERVAL_ENV
from resources.delta_store import DeltaStore
from resources.landing import LandingZone
from resources.reports import ReportSettings
from resources.session import INTERPRETED_MAX_ROWS
from resources.spark import SparkResource
from resources.tuning import DEFAULT_SHUFFLE_PARTITIONS

Setting = Union[str, dg.EnvVar]


def build_definitions(
    landing_root: Setting = dg.EnvVar("REPLICA_LENS_LANDING"),
    warehouse_root: Setting = dg.EnvVar("REPLICA_LENS_WAREHOUSE"),
    spark_master: Setting = dg.EnvVar("REPLICA_LENS_SPARK_MASTER"),
    delta_jars_dir: Optional[Setting] = dg.EnvVar("REPLICA_LENS_DELTA_JARS"),
    cluster_regions: Optional[str] = None,
    venice_clock_uncertainty_ms: Optional[int] = None,
    venice_push_settings: Optional[str] = None,
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS,
    delta_engine: Optional[str] = None,
    spark_log_level: str = "ERROR",
    interpreted_max_rows: int = INTERPRETED_MAX_ROWS,
    landing_sensor_interval_s: Optional[int] = None,
    watch_interval_s: Optional[int] = None,
) -> dg.Definitions:
    """The code location's definitions. ``landing_sensor_interval_s`` (None: the environment's
    ``REPLICA_LENS_LANDING_SENSOR_INTERVAL_S``, else 30) is read here, when the definitions are
    built: Dagster schedules a sensor's evaluations from its definition."""
    if landing_sensor_interval_s is None:
        landing_sensor_interval_s = landing_sensor_interval(os.environ.get(LANDING_SENSOR_INTERVAL_ENV))
    if watch_interval_s is None:
        watch_interval_s = watch_interval(os.environ.get(WATCH_INTERVAL_ENV))
    return dg.Definitions(
        assets=dg.load_assets_from_modules([ingest, watermarks, divergence, operations, trend]),
        asset_checks=[divergence.no_proven_divergence, operations.lag_within_bounds, operations.exporters_within_bounds],
        jobs=[audit_snapshot, refresh_trend, vacuum_warehouse, explain_key_job, watch_brokers],
        schedules=[reaudit_newest_snapshot, vacuum_warehouse_daily],
        sensors=[build_landing_sensor(landing_sensor_interval_s), trend_after_audit, trend_catch_up,
                 build_broker_watch_sensor(watch_interval_s)],
        resources={
            "spark": SparkResource(
                master=spark_master,
                delta_jars_dir=delta_jars_dir,
                shuffle_partitions=shuffle_partitions,
                log_level=spark_log_level,
                interpreted_max_rows=interpreted_max_rows,
                # The Kafka source's jars (when resolved) and the redaction of consumer settings: the broker watch
                # reads the brokers in the session its audits then use.
                spark_config=kafka_spark_config(),
            ),
            "store": DeltaStore(warehouse_root=warehouse_root, engine=delta_engine),
            # None: the landing resource reads REPLICA_LENS_CLUSTER_REGIONS,
            # REPLICA_LENS_VENICE_CLOCK_UNCERTAINTY_MS and REPLICA_LENS_VENICE_PUSH_SETTINGS when it is used.
            "landing": LandingZone(
                root=landing_root,
                cluster_regions=cluster_regions,
                venice_clock_uncertainty_ms=venice_clock_uncertainty_ms,
                venice_push_settings=venice_push_settings,
            ),
            # Redaction unset: REPLICA_LENS_REDACT_VALUES decides when the page is written.
            "reports": ReportSettings(),
        },
        # Materializations launched from the UI also run every step in one process (one JVM per run),
        # independent steps side by side.
        executor=threaded_in_process_executor,
    )


defs = build_definitions()
