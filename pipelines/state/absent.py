"""Replica partitions a broker cut lists but the snapshot holds no rows of: compared on their carried state.

A broker snapshot (``replica-lens watch``, ``dump-kafka``) is a cut of every region's version
topics, listed in ``broker_cuts``. A region may hold no rows in it: its brokers did not answer
(``skipped_reason``), or it had nothing new while another region's backlog was still being
read (``s = e``). Such a replica partition is *absent*: ``partition_watermarks`` has no row of
it, so without this module the pairs with it would not be judged in that snapshot at all, and a
chain could end with a pair IN_FLIGHT that its history proves DIVERGENT.

SPEC 11: pairs with a replica not read in a cut are judged on what has been read of it so far,
its carried state. So an absent replica partition whose stream has a state (a CONTEXT of
another snapshot) joins the comparison with it:

- ``absent_dumps`` lists them, shaped for the predecessor rule (``prior.predecessors``): the
  first offset is the cut's ``s``, nothing is read (``last_offset = s - 1``), so the predecessor
  is the context with the greatest ``last_offset`` below ``s``, as for a dump that starts there,
  whatever later snapshots have written since (re-materializing gives the same tables);
- ``absent_watermarks`` makes its ``partition_watermarks`` row from the chosen context: a dump
  right after the state that read nothing (``rows = 0``, no bound of its own), so ``carry_over``
  gives its carried versions the reach it gives carried keys a snapshot does not write, the
  state's ``L(end)`` (or the reach a gap stored), and the comparison sees a consistent frame.

Its state is not written again: the state after S has no CONTEXT and no VERSION row of it
(``written_in_state``), so the next snapshot that reads it still continues the older context
(a second context ending at the same offset would be refused). Safe: every version carried is
a real version with its real ``U`` and ``M``, so using it can add true proofs, never a false one.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.state.rows import CONTEXT, REPLICA_PARTITION
from schemas.conform import conform
from schemas.watermarks import PartitionWatermarks

ABSENT_ROWS = 0  # an absent dump's ``rows``: a real partition_watermarks row has at least one


def written_in_state() -> Column:
    """True for a ``partition_watermarks`` row whose replica partition the state after the snapshot keeps: every row
    the snapshot read; not an absent one (``absent_watermarks``), whose older state stays the one to continue."""
    return F.col("rows") != F.lit(ABSENT_ROWS)


def absent_dumps(cuts: DataFrame, partition_wm: DataFrame) -> DataFrame:
    """The replica partitions ``cuts`` lists at a topic partition ``partition_wm`` holds rows of, but not themselves.

    ``cuts``: the snapshot's ``broker_cuts`` (a region is a replica); ``partition_wm``: its
    ``partition_watermarks``. Columns are those ``predecessors`` reads: ``snapshot_id``, the replica
    partition, ``first_offset`` (the cut's ``s``), ``last_offset`` (``s - 1``: nothing read),
    ``starts_with_sop`` (false: a cut never starts a stream it did not read) and ``absent`` (true).
    A topic partition of which the snapshot holds no rows at all is left out: nothing new to judge.
    """
    rp = list(REPLICA_PARTITION)
    held = partition_wm.select("snapshot_id", "topic", "partition").distinct()
    listed = cuts.select(
        "snapshot_id", F.col("region").alias("replica"), "topic", "partition", F.col("start_offset").alias("first_offset")
    )
    return (
        listed.join(held, on=["snapshot_id", "topic", "partition"], how="left_semi")
        .join(partition_wm.select("snapshot_id", *rp), on=["snapshot_id", *rp], how="left_anti")
        .groupBy("snapshot_id", *rp).agg(F.min("first_offset").alias("first_offset"))
        .select("snapshot_id", *rp, "first_offset", (F.col("first_offset") - 1).alias("last_offset"),
                F.lit(False).alias("starts_with_sop"), F.lit(True).alias("absent"))
    )


def absent_watermarks(absent: DataFrame, prior_context: DataFrame) -> DataFrame:
    """The ``partition_watermarks`` rows of the absent replica partitions that continue a state, from its context.

    ``absent``: ``absent_dumps`` (or any frame with ``snapshot_id`` and the replica partition);
    ``prior_context``: the chosen CONTEXT rows (``PriorState.context``), one per replica partition.
    Each row is a dump right after the state that read nothing: ``first_offset`` the context's
    ``last_offset + 1`` (no gap before it), ``last_offset`` the context's, ``rows`` 0, no ``P``, an
    empty ``L(end)``, no gap. ``carry_over`` then gives it the stream's ``P``, START_OF_PUSH and
    ``L(end)``, and its carried versions their stored bounds; partitions without a context drop out.
    """
    rp = list(REPLICA_PARTITION)
    ctx = prior_context.where(F.col("row_kind") == CONTEXT).select(*rp, "last_offset")
    zero = F.lit(0).cast(T.LongType())
    values = {
        "first_offset": F.col("last_offset") + 1,
        "starts_with_sop": F.lit(False),
        "pre_history_known": F.lit(False),
        "end_lower_bound": F.create_map().cast(T.MapType(T.StringType(), T.LongType())),
        "rows": F.lit(ABSENT_ROWS).cast(T.LongType()),
        **{name: zero for name in ("puts", "deletes", "heartbeats", "gaps", "gap_positions")},
    }
    struct = PartitionWatermarks.to_structtype()
    kept = {"snapshot_id", *rp, "last_offset", *values}
    found = absent.select("snapshot_id", *rp).join(ctx, on=rp, how="inner")
    return conform(found, struct, {**values, **{f.name: F.lit(None) for f in struct.fields if f.name not in kept}})
