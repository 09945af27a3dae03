"""Overlapping dumps: the offsets a snapshot re-reads of the state it continues, verified against the predecessor.

Dump tools re-read a little of what they dumped last time. ``prior.py`` chooses a predecessor
whose offsets a snapshot's dump starts inside of; before that state is continued, the two dumps'
rows of ``raw_topic_snapshots`` at the overlapping offsets must hold the same messages, offset by
offset (``overlap_differences``: a Spark join and aggregate, only the first difference per replica
partition reaching the driver). ``verify_overlaps`` turns the comparison into the verified
overlaps (``carried_from``'s ``overlap``) and the refusals naming the first offset that differs.
"""
from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.state.rows import REPLICA_PARTITION, partition_name
from schemas.raw import MESSAGE_FIELDS


def _message() -> Column:
    """A raw row's SPEC message fields but its replica partition and offset; vectors as their sorted entries."""
    skipped = {*REPLICA_PARTITION, "offset"}
    return F.struct(*[
        (F.array_sort(F.map_entries(F.col(name))) if isinstance(dtype, T.MapType) else F.col(name)).alias(name)
        for name, dtype in MESSAGE_FIELDS.items() if name not in skipped
    ])


def overlap_differences(raw: DataFrame, links: DataFrame) -> DataFrame:
    """The overlap of each replica partition with its predecessor, compared offset by offset in the raw rows.

    ``links`` are ``predecessors`` rows; those with ``overlap`` are compared: the raw rows
    (``raw_topic_snapshots``) of ``snapshot_id`` and of ``previous_snapshot_id`` at offsets
    ``first_offset..previous_last_offset`` of the replica partition. At each offset the two
    sides hold the same messages when their SPEC message fields are equal (vectors in any
    order; bookkeeping columns such as ``source_file`` and ``copies``, and unknown extra
    fields, are not compared). One row per compared link: ``offsets`` (offsets held by
    either side), ``rows`` and ``previous_rows`` (raw rows of each side there) and
    ``first_difference``, null when the sides are equal, else the lowest offset where they
    are not: its ``rows`` and ``previous_rows``, the ``kinds`` and ``previous_kinds`` there,
    and ``fields``, the message fields that differ when each side holds one message.
    """
    rp = list(REPLICA_PARTITION)
    ranges = links.where(F.col("overlap")).select(
        "snapshot_id", *rp, "previous_snapshot_id", "first_offset", "previous_last_offset"
    )
    in_range = F.col("offset").between(F.col("first_offset"), F.col("previous_last_offset"))

    def side(snapshot_column: str, name: str) -> DataFrame:
        bounds = ranges.select(
            F.col(snapshot_column).alias("raw_snapshot"), *rp, "first_offset", "previous_last_offset"
        )
        return (
            raw.withColumnRenamed("snapshot_id", "raw_snapshot")
            .join(F.broadcast(bounds), on=["raw_snapshot", *rp], how="inner")
            .where(in_range)
            .groupBy(*rp, "offset")
            .agg(F.array_sort(F.collect_list(_message())).alias(name))
        )

    def count(messages: str) -> Column:
        return F.when(F.col(messages).isNull(), F.lit(0)).otherwise(F.size(messages)).cast(T.LongType())

    names = [name for name in MESSAGE_FIELDS if name not in {*REPLICA_PARTITION, "offset"}]
    one_each = (count("own") == 1) & (count("previous") == 1)
    fields = F.filter(
        F.array(*[F.when(~F.col("own")[0][n].eqNullSafe(F.col("previous")[0][n]), F.lit(n)) for n in names]),
        lambda name: name.isNotNull(),
    )
    difference = F.struct(
        F.col("offset").alias("offset"),
        count("own").alias("rows"),
        count("previous").alias("previous_rows"),
        F.transform(F.col("own"), lambda m: m["kind"]).alias("kinds"),
        F.transform(F.col("previous"), lambda m: m["kind"]).alias("previous_kinds"),
        F.when(one_each, fields).alias("fields"),
    )
    differs = ~F.col("own").eqNullSafe(F.col("previous"))
    compared = (
        side("snapshot_id", "own").join(side("previous_snapshot_id", "previous"), on=[*rp, "offset"], how="full")
        .groupBy(*rp)
        .agg(
            F.count(F.lit(1)).alias("offsets"),
            F.sum(count("own")).alias("rows"),
            F.sum(count("previous")).alias("previous_rows"),
            # min_by skips rows whose ordering value is null: only the differing offsets compete.
            F.min_by(difference, F.when(differs, F.col("offset"))).alias("first_difference"),
        )
    )
    zero = F.lit(0).cast(T.LongType())
    return ranges.join(compared, on=rp, how="left").select(
        *ranges.columns,
        F.coalesce(F.col("offsets"), zero).alias("offsets"),
        F.coalesce(F.col("rows"), zero).alias("rows"),
        F.coalesce(F.col("previous_rows"), zero).alias("previous_rows"),
        "first_difference",
    )


def _difference(found: Any, snapshot_id: str, previous: str) -> str:
    """What differs at the first offset where two dumps' overlap differs, briefly."""
    if not found["rows"]:
        return f"only {previous} has a message ({', '.join(found['previous_kinds'])})"
    if not found["previous_rows"]:
        return f"only {snapshot_id} has a message ({', '.join(found['kinds'])})"
    if found["fields"]:
        return f"the messages differ in {', '.join(found['fields'])}"
    return (
        f"{snapshot_id} has {found['rows']} message(s) ({', '.join(found['kinds'])}), {previous} "
        f"{found['previous_rows']} ({', '.join(found['previous_kinds'])})"
    )


def verify_overlaps(
    raw: DataFrame, links: DataFrame, continued: list[Any], snapshot_id: str
) -> tuple[dict[tuple, dict[str, Any]], list[str]]:
    """The overlaps of ``continued`` links, compared in ``raw``: (verified overlaps by replica partition, refusals)."""
    overlapping = [link for link in continued if link["overlap"]]
    if not overlapping:
        return {}, []
    # Only the snapshots compared are read: the filter prunes the table's other partitions.
    ids = sorted({snapshot_id, *(link["previous_snapshot_id"] for link in overlapping)})
    checks = overlap_differences(raw.where(F.col("snapshot_id").isin(*ids)), links).collect()
    verified, refusals = {}, []
    for check in sorted(checks, key=lambda c: tuple(c[k] for k in REPLICA_PARTITION)):
        name, previous = partition_name(check), check["previous_snapshot_id"]
        first, last = check["first_offset"], check["previous_last_offset"]
        inside = (
            f"{name}: {snapshot_id} starts at offset {first}, inside the state of snapshot {previous} (up to {last})"
        )
        if not check["rows"] or not check["previous_rows"]:
            lacking = previous if not check["previous_rows"] else snapshot_id
            refusals.append(
                f"{inside}, but raw_topic_snapshots no longer holds {lacking}'s rows at offsets {first}..{last}, "
                "so the overlap cannot be verified"
            )
        elif check["first_difference"] is not None:
            found = check["first_difference"]
            refusals.append(
                f"{inside}, and the two dumps differ there: first at offset {found['offset']}, where "
                f"{_difference(found, snapshot_id, previous)}"
            )
        else:
            verified[tuple(check[k] for k in REPLICA_PARTITION)] = {
                "first_offset": first, "last_offset": last, "offsets": check["offsets"], "rows_verified": check["rows"],
            }
    return verified, refusals
