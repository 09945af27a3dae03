"""Across snapshots: is replication getting better or worse?"""

import dagster as dg

from assets.tables import StepTables, read_stage, schema_check_spec
from explain.markdown import md_text
from pipelines.trend import audit_trend as build_trend
from resources.delta_store import DeltaStore
from resources.spark import SparkResource

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
    # The table spans snapshots: it is staged and replaced whole (snapshot None).
    tables = StepTables(session, store, None)
    tables.stage(trend, "audit_trend")
    rows = tables.frame("audit_trend").orderBy("snapshot_id").collect()[-TREND_ROWS_SHOWN:]
    context.log.info("trend over %d snapshot(s)", len(rows))
    tables.add_metadata("audit_trend", {"preview": dg.MetadataValue.md(trend_markdown(rows))})
    yield from tables.publish()


def trend_markdown(rows) -> str:
    header = ("| snapshot | DIVERGENT keys | MISSING keys | IN_FLIGHT keys | rows quarantined | stream anomalies "
              "| worst p99 lag (ms) |\n")
    header += "|---|---:|---:|---:|---:|---:|---:|\n"

    def cell(value) -> str:
        return "-" if value is None else str(value)  # null: audited before keys were counted

    body = "".join(
        f"| {md_text(r['snapshot_id'])} | {cell(r['divergent'])} | {cell(r['missing'])} | {cell(r['in_flight'])}"
        f" | {r['rows_quarantined']} | {r['stream_anomalies']} | {cell(r['worst_lag_p99_ms'])} |\n"
        for r in rows
    )
    return header + (body or "| (no snapshot audited yet) | | | | | | |\n")
