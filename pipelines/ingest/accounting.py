"""Accounting of one ingested snapshot: how many rows were read, and where each of them went.

Precisely:

    rows_read = non-blank JSONL lines + Parquet rows + one per unreadable file (or unreadable tail)
              = rows_accepted (sum of ``copies``) + rows_quarantined (rows of the quarantine)
                + rows_skipped (raw Venice records skipped by rule: rows of ``raw_topic_skipped``)

The first line is what ``pipelines.ingest.reading`` reads (a blank line is not a row); the second is
what ``accounting_from_tables`` counts from the tables of ``pipelines.ingest.judging``'s
``Judgement`` (the skipped records from ``Judgement.skipped_by_reason``), in all and per
replica. A quarantined row names a position lost to the quarantine, a gap of one position:
``quarantined_positions`` counts the distinct ones.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines.ingest.judging import QUARANTINE_POSITION

UNKNOWN_REPLICA = "<unknown>"


def accounting_from_tables(
    accepted_df: DataFrame,
    quarantined_df: DataFrame | None,
    skipped_by_reason: dict[str, int] | None = None,
    skipped_df: DataFrame | None = None,
) -> dict:
    """Row accounting of one snapshot from its accepted and quarantined tables: one aggregation each.

    rows_read = rows_accepted (sum of copies) + rows_quarantined + rows_skipped (raw Venice
    records skipped by rule, ``Judgement.skipped_by_reason``, as many as ``raw_topic_skipped``
    holds); rows_stored
    counts the accepted table's rows (exact duplicates stored once). Per replica the same split; a
    quarantined row counts under the replica it names, or "<unknown>". ``quarantined_positions``:
    the distinct positions (``QUARANTINE_POSITION``) the quarantined rows name, by the same query.
    ``quarantined_df`` None: the quarantine is known to be empty (no Spark job for it; in a fresh JVM even an
    aggregation of no rows is not free). ``skipped_df`` (the staged ``raw_topic_skipped``, None when
    nothing was skipped) splits the skipped records per replica and kind (``skipped_kind``):
    ``by_replica`` then counts them too (read = accepted + quarantined + skipped) and
    ``skipped_by_kind`` lists them.
    """
    accepted = accepted_df.groupBy("replica").agg(
        F.sum("copies").alias("accepted"), F.count(F.lit(1)).alias("stored")
    ).collect()
    # One query: rows per (replica, reason) and, over all of them (the rollup's total, which also yields a row per
    # replica, unused), the distinct positions quarantined rows name.
    quarantined = (
        []
        if quarantined_df is None
        else quarantined_df.select(
            F.coalesce(F.col("replica"), F.lit(UNKNOWN_REPLICA)).alias("counted_as"), "reason", *QUARANTINE_POSITION
        )
        .rollup("counted_as", "reason")
        .agg(
            F.count(F.lit(1)).alias("rows"),
            F.count_distinct(*QUARANTINE_POSITION).alias("positions"),
            F.grouping("counted_as").alias("all_replicas"),
            F.grouping("reason").alias("all_reasons"),
        )
        .collect()
    )
    by_replica: dict[str, dict[str, int]] = {}

    def replica_counts(name: str) -> dict[str, int]:
        return by_replica.setdefault(name, {"read": 0, "accepted": 0, "stored": 0, "quarantined": 0, "skipped": 0})

    skipped_by_kind: dict[str, dict[str, int]] = {}
    if skipped_df is not None:
        for row in skipped_df.groupBy("replica", skipped_kind().alias("kind")).count().collect():
            counts = replica_counts(row["replica"])
            counts["skipped"] += int(row["count"])
            counts["read"] += int(row["count"])
            skipped_by_kind.setdefault(row["replica"], {})[row["kind"]] = int(row["count"])

    for row in accepted:
        counts = replica_counts(row["replica"])
        counts["accepted"] += int(row["accepted"])
        counts["stored"] += int(row["stored"])
        counts["read"] += int(row["accepted"])
    by_reason: dict[str, int] = {}
    positions = 0
    for row in quarantined:
        if row["all_replicas"]:
            positions = int(row["positions"])
        if row["all_reasons"]:
            continue
        counts = replica_counts(row["counted_as"])
        counts["quarantined"] += int(row["rows"])
        counts["read"] += int(row["rows"])
        by_reason[row["reason"]] = by_reason.get(row["reason"], 0) + int(row["rows"])

    rows_accepted = sum(c["accepted"] for c in by_replica.values())
    rows_quarantined = sum(by_reason.values())
    skipped = {r: int(n) for r, n in sorted((skipped_by_reason or {}).items())}
    rows_skipped = sum(skipped.values())
    return {
        "rows_read": rows_accepted + rows_quarantined + rows_skipped,
        "rows_skipped": rows_skipped,
        "skipped_by_reason": skipped,
        "rows_accepted": rows_accepted,
        "rows_stored": sum(c["stored"] for c in by_replica.values()),
        "rows_quarantined": rows_quarantined,
        "quarantined_positions": positions,
        "by_reason": dict(sorted(by_reason.items())),
        "by_replica": dict(sorted(by_replica.items())),
        "skipped_by_kind": {r: dict(sorted(k.items())) for r, k in sorted(skipped_by_kind.items())},
    }


def skipped_kind() -> Column:
    """What a skipped record was, for counting: the control message's type name (START_OF_SEGMENT,
    DOL_STAMP, END_OF_PUSH, ...), else the rule that skipped it (VALUE_CHUNK, CHUNK_CLEANUP)."""
    return F.coalesce(F.col("control_message"), F.col("reason"))

