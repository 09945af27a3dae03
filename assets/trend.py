"""Across snapshots: is replication getting better or worse?"""

import dagster as dg

from assets.tables import read_stage, schema_check, schema_check_spec, table_metadata
from pipelines.trend import audit_trend as build_trend
from resources.delta_store import DeltaStore
from resources.spark import SparkResource
from schemas.registry import struct_for

TREND_ROWS_SHOWN = 20
TREND_INPUTS = ("divergence_summary", "raw_topic_quarantine", "replication_lag", "stream_anomalies")


@dg.asset(
    name="audit_trend",
    group_name="trend",
    kinds={"spark", "delta"},
    deps=list(TREND_INPUTS),
    check_specs=[schema_check_spec("audit_trend")],
    description="Divergence, lag and quarantine counts per snapshot over time (not partitioned).",
)
def audit_trend(context: dg.AssetExecutionContext, spark: SparkResource, store: DeltaStore):
    session = spark.spark_session

    trend = build_trend(
        *(read_stage(session, store, table, None) for table in TREND_INPUTS),
    )
    result = store.write_table(session, trend, "audit_trend", struct_for("audit_trend"))
    written = store.read_all(session, "audit_trend", struct_for("audit_trend"))
    rows = written.orderBy("snapshot_id").collect()[-TREND_ROWS_SHOWN:]
    context.log.info("trend over %d snapshot(s)", len(rows))
    return dg.MaterializeResult(
        metadata={
            **table_metadata(result, "audit_trend"),
            "preview": dg.MetadataValue.md(trend_markdown(rows)),
        },
        check_results=[schema_check(session, store, "audit_trend", snapshot_id=None, rows=result.row_count)],
    )


def trend_markdown(rows) -> str:
    header = "| snapshot | divergent | missing | in flight | quarantined | anomalies | worst p99 lag (ms) |\n"
    header += "|---|---:|---:|---:|---:|---:|---:|\n"
    body = "".join(
        f"| {r['snapshot_id']} | {r['divergent']} | {r['missing']} | {r['in_flight']} | {r['rows_quarantined']}"
        f" | {r['stream_anomalies']} | {r['worst_lag_p99_ms'] if r['worst_lag_p99_ms'] is not None else '-'} |\n"
        for r in rows
    )
    return header + (body or "| (no snapshot audited yet) | | | | | | |\n")
