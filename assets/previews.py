"""Short Markdown previews for the materialization page, where a person would rather read than query."""
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from explain.markdown import md_text

ROWS_SHOWN = 10


def markdown_table(rows, columns: list[tuple[str, str]], empty: str) -> str:
    """``columns`` are (field, heading) pairs; ``rows`` are Spark Rows or dicts. Every cell is data, escaped
    (``md_text``: a replica, topic or exporter name with ``|``, ``_`` or ``*`` renders as itself)."""
    if not rows:
        return f"_{md_text(empty)}_"
    head = "| " + " | ".join(md_text(h) for _, h in columns) + " |\n|" + "---|" * len(columns) + "\n"
    body = "".join(
        "| " + " | ".join("-" if r[f] is None else md_text(r[f]) for f, _ in columns) + " |\n" for r in rows
    )
    return head + body


def divergence_by_pair(summary_rows) -> str:
    """Key pairs per verdict for each replica pair (its keys, over topics and partitions), the most proven first.

    ``summary_rows`` are ``divergence_summary``'s rows, collected once by the step (one row per
    topic partition and pair: small), which also totals them (``assets.divergence.verdict_totals``).
    """
    counted = ("keys_compared", "divergent", "missing", "in_flight")
    by_pair: dict[tuple[str, str], dict[str, int]] = {}
    for row in summary_rows:
        pair = by_pair.setdefault((row["replica_a"], row["replica_b"]), dict.fromkeys(counted, 0))
        for name in counted:
            pair[name] += int(row[name] or 0)
    rows = [
        {"replica_a": a, "replica_b": b, "compared": c["keys_compared"], "divergent": c["divergent"],
         "missing": c["missing"], "in_flight": c["in_flight"]}
        for (a, b), c in by_pair.items()
    ]
    rows.sort(key=lambda r: (-(r["divergent"] + r["missing"]), r["replica_a"], r["replica_b"]))
    return markdown_table(
        rows[:ROWS_SHOWN],
        [("replica_a", "replica A"), ("replica_b", "replica B"), ("compared", "key pairs compared"),
         ("divergent", "DIVERGENT key pairs"), ("missing", "MISSING key pairs"), ("in_flight", "IN_FLIGHT key pairs")],
        "no replica pair shares a partition in this snapshot",
    )


WORST_LAG_FIELDS = ("replica", "origin_region", "p99_upper_ms", "max_upper_ms", "staleness_ms")


def worst_lag(rows) -> dict | None:
    """The worst-lagging (replica, origin region) of ``worst_lagging``'s rows, as plain values (None without heartbeats)."""
    return {name: rows[0][name] for name in WORST_LAG_FIELDS} if rows else None


def lagging_rows(replication_lag: DataFrame) -> list:
    """Every (replica, origin region) row (one per pair of regions: a few), worst first: by 99th percentile lag, then
    staleness."""
    return replication_lag.orderBy(F.desc_nulls_last("p99_upper_ms"), F.desc_nulls_last("staleness_ms")).collect()


def lag_trends(rows) -> dict[str, float]:
    """p50 and p99 lag per (replica, origin region) as numbers, which Dagster's Plots tab draws across runs."""
    out: dict[str, float] = {}
    for row in rows:
        for stat in ("p50", "p99"):
            value = row[f"{stat}_upper_ms"]
            if value is not None:
                out[f"lag_{stat}_ms {row['replica']}<-{row['origin_region']}"] = float(value)
    return out


def worst_lagging(rows) -> str:
    """``lagging_rows`` as a markdown table (the worst ``ROWS_SHOWN``)."""
    return markdown_table(
        rows[:ROWS_SHOWN],
        [("replica", "replica"), ("origin_region", "from"), ("heartbeats", "heartbeats"),
         ("p99_upper_ms", "p99 lag ≤ (ms)"), ("max_upper_ms", "max lag ≤ (ms)"), ("staleness_ms", "staleness (ms)"),
         ("stalest_topic", "stalest topic"), ("stalest_partition", "partition")],
        "no heartbeat in this snapshot",
    )


def compaction_holdbacks(bounds: DataFrame) -> str:
    rows = (
        bounds.where(F.col("holding_back_exporter").isNotNull())
        .orderBy(F.desc_nulls_last("reexport_exposure_rows"), "replica", "topic", "partition")
        .limit(ROWS_SHOWN)
        .collect()
    )
    return markdown_table(
        rows,
        [("replica", "replica"), ("topic", "topic"), ("partition", "partition"),
         ("holding_back_exporter", "held back by"), ("compaction_bound", "compact below"),
         ("processed_offset", "processed to"), ("reexport_exposure_rows", "re-export exposure (rows)")],
        "no exporter reports in this snapshot",
    )
