"""Incremental audits: the state carried from one snapshot of a stream to the next.

A snapshot whose dump of a (replica, topic, partition) starts mid-stream may continue a
dump audited earlier (a mid-stream dump taken later of the same version topic). Its
keys last written before it would then be invisible to the Leap Frog comparison. The
*state* after auditing a snapshot keeps, per replica partition, each key's last version
and one *commit context*: the rows of snapshot S's partition of ``replica_state``
(``pipelines/state/rows.py``: their kinds, columns and checksum).

This module is what the divergence stage does with the state: ``carry_over`` continues
S's watermarks from the state S continues, and ``next_state`` builds the state after S
(each key's last version and one context per replica partition, written in one Delta
commit). Which state S continues, verified and checked, and which states are kept
(retention) is ``pipelines/state/prior.py`` (the overlap's verification ``overlap.py``, the
commit-context check ``check.py``); their names stay importable from here.

What is carried
---------------
Only the divergence stage uses the state: the per-snapshot tables (segments, watermarks,
lag, exporters) keep describing the snapshot's own rows. For a continued replica
partition, ``carry_over`` rewrites S's ``reconstructed_watermarks`` and
``partition_watermarks`` as if the stream had been dumped as one (S's rows at or below
the state's ``last_offset``, a verified overlap, are left out):

- ``L'(p) = max(L(end) of the state, L(p))`` for S's rows, and likewise ``L'(end)`` and
  the reach ``M'`` (both are ``L`` at a later row).
- ``P`` and START_OF_PUSH are the stream's (its first dump's); when the stream's ``P``
  is still unknown, S's own first heartbeat vector is the stream's first one.
- ``U'(r) = max(P, key_touch of the carried version, {source_region: source_offset} of
  the key's rows in S up to r)``: ``key_touch`` is the per-key running max without ``P``,
  kept in the state so that ``U`` can be recomputed when ``P`` becomes known.
- The carried version of each key is added as a data row at its real (earlier) offset,
  with ``U = max(P, key_touch)`` and ``M = L'`` of the key's first row in S, or
  ``L'(end)`` when S does not write the key. Its ``applied_lower_bound`` is the stored
  ``first_lower_bound``, ``L`` of the key's first row in the stream: the Leap Frog reads
  ``applied_lower_bound`` only from a key's first row, as the reach of the pre-dump
  version ⊥, and ⊥ must keep the reach it had when the stream began. (Its own ``L``, or
  the state's ``L(end)``, would widen ⊥'s reach past writes of the key that the replica
  had already applied, and could prove a false divergence between ⊥ and them.)

The frames keep the schemas of ``reconstructed_watermarks`` and ``partition_watermarks``
(partition_watermarks' offsets and counts stay S's own), so ``compare_replicas`` runs on
them unchanged. A carried version counts as one version in ``versions_a/b``.

Limitation: only each key's last version is carried, so a proof that needs an older
version from an earlier snapshot is not found. Every version carried or read is a real
version with its real ``U`` and ``M``, so this can only miss a proof, never make one.
"""
from __future__ import annotations

from typing import Sequence

import pyarrow as pa
from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.frames import computed_once
from pipelines.state.absent import written_in_state
from pipelines.state.arrow_checksum import signed
from pipelines.state.check import PROBLEMS, context_problems
from pipelines.state.overlap import overlap_differences
from pipelines.state.prior import (
    MAX_LISTED,
    PriorState,
    StateRefused,
    no_prior_state,
    predecessors,
    prior_state,
    retained_states,
)
from pipelines.state.rows import (
    CARRIED_COLUMNS,
    CONTEXT,
    LAST_VERSION_COLUMNS,
    REPLICA_PARTITION,
    VECTOR_COLUMNS,
    VERSION,
    VERSION_COLUMNS,
    checksum,
    version_hash,
)
from pipelines.watermarks import bottom_reach
from pipelines.vectors import partition_regions, running_max_single, sparse, vector_max
from resources.tuning import BROADCAST_MAX_ROWS
from schemas.conform import conform, local_frame
from schemas.raw import VECTOR
from schemas.state import ReplicaState
from schemas.watermarks import PartitionWatermarks, ReconstructedWatermarks

__all__ = [
    "CARRIED_COLUMNS",
    "CONTEXT",
    "LAST_VERSION_COLUMNS",
    "MAX_LISTED",
    "PROBLEMS",
    "REPLICA_PARTITION",
    "VECTOR_COLUMNS",
    "VERSION",
    "VERSION_COLUMNS",
    "PriorState",
    "StateRefused",
    "carried_versions",
    "carry_over",
    "checksum",
    "context_problems",
    "kept_where_gapped",
    "last_versions_of",
    "next_state",
    "no_prior_state",
    "overlap_differences",
    "predecessors",
    "prior_state",
    "read_between",
    "retained_states",
    "state_contexts",
    "version_hash",
    "contexts_from_sums",
]


# ---------------------------------------------------------------- carry over
# What a carried row holds besides ``reconstructed_watermarks``' columns with ``carry_over(prior_payload=True)``: what
# the state kept of the version (its origin, stream position and per-key touch), for the next state.
PRIOR_PAYLOAD = T.StructType([
    T.StructField("is_prior", T.BooleanType()), T.StructField("prior_origin", T.StringType()),
    T.StructField("prior_missing", T.LongType()), T.StructField("prior_touch", VECTOR),
])

def read_between(skipped: DataFrame, partition_wm: DataFrame, prior_context: DataFrame) -> DataFrame:
    """Per continued replica partition (``read_between``): the positions between the state's last offset and S's
    first row that a snapshot read and skipped by rule (``raw_topic_skipped`` of S or of the predecessor: a value's
    chunks, control messages other than heartbeats). Read, they are not gaps (SPEC 3a): a chain of broker cuts
    (``replica-lens watch``) that ends one cut on a value's chunks, or on a control message, leaves no gap."""
    rp = list(REPLICA_PARTITION)
    bounds = partition_wm.select("snapshot_id", *rp, "first_offset").join(
        prior_context.where(F.col("row_kind") == CONTEXT).select(
            *rp, F.col("snapshot_id").alias("previous_snapshot_id"), F.col("last_offset").alias("prior_last_offset")),
        on=rp, how="inner")
    positions = skipped.select(F.col("snapshot_id").alias("skipped_in"), *rp, "offset")
    return (
        positions.join(F.broadcast(bounds), on=rp, how="inner")
        .where((F.col("skipped_in") == F.col("snapshot_id")) | (F.col("skipped_in") == F.col("previous_snapshot_id")))
        .where((F.col("offset") > F.col("prior_last_offset")) & (F.col("offset") < F.col("first_offset")))
        .groupBy(*rp).agg(F.countDistinct("offset").cast(T.LongType()).alias("read_between"))
    )


def _stream_facts(partition_wm: DataFrame, prior_context: DataFrame,
                  between: DataFrame | None = None) -> DataFrame:
    """The snapshot's continued replica partitions with their stream-wide P, START_OF_PUSH and L(end)."""
    ctx = prior_context.where(F.col("row_kind") == CONTEXT).select(
        *REPLICA_PARTITION,
        F.col("snapshot_id").alias("previous_snapshot_id"),
        F.col("pre_history_bound").alias("prior_pre_history"),
        F.col("starts_with_sop").alias("prior_sop"),
        F.col("end_lower_bound").alias("prior_end"),
        F.col("last_offset").alias("prior_last_offset"),
        F.coalesce(F.col("gap_positions"), F.lit(0).cast(T.LongType())).alias("prior_gap_positions"),
        F.col("first_gap_lower_bound").alias("prior_first_gap"),
    )
    # A stream whose P is still unknown takes the first heartbeat vector it meets: S's own P.
    pre_history = F.coalesce(F.col("prior_pre_history"), F.col("pre_history_bound"))
    # S starting past the state's last offset leaves a gap between them (SPEC 3a); a verified overlap none. The
    # positions there read and skipped by rule (``between``) are not missing.
    joined = partition_wm.join(ctx, on=list(REPLICA_PARTITION), how="inner")
    if between is not None:
        joined = joined.join(between, on=list(REPLICA_PARTITION), how="left")
    else:
        joined = joined.withColumn("read_between", F.lit(None).cast(T.LongType()))
    start_gap = F.greatest(
        F.col("first_offset") - F.col("prior_last_offset") - 1 - F.coalesce(F.col("read_between"), F.lit(0)),
        F.lit(0).cast(T.LongType()))
    joined = joined.withColumn("start_gap", start_gap).drop("read_between")
    # The stream's first gap: in an earlier dump, between the state and S (L there is the state's L(end)), or in S.
    first_gap = F.coalesce(
        F.col("prior_first_gap"),
        F.when(F.col("start_gap") > 0, F.col("prior_end")),
        F.when(F.col("first_gap_lower_bound").isNotNull(),
               vector_max(F.col("prior_end"), F.col("first_gap_lower_bound"))),
    )
    return joined.select(
        "*",
        pre_history.alias("stream_pre_history"),
        vector_max(F.col("prior_end"), F.col("end_lower_bound")).alias("stream_end"),
        (F.col("prior_gap_positions") + F.col("start_gap")).alias("missing_before_snapshot"),
        first_gap.alias("stream_first_gap"),
    )


def carry_over(
    row_wm: DataFrame, partition_wm: DataFrame, prior_versions: DataFrame, prior_context: DataFrame,
    between: DataFrame | None = None, cut_rows: int | None = None, prior_payload: bool = False,
) -> tuple[DataFrame, DataFrame]:
    """One snapshot's (``reconstructed_watermarks``, ``partition_watermarks``) continued from ``prior_context``.

    ``prior_context`` holds at most one CONTEXT row per replica partition (the chosen
    predecessors, e.g. ``PriorState.context``), ``prior_versions`` their VERSION rows
    (rows of other contexts are ignored). S's rows at or below a context's ``last_offset``
    (a verified overlap) are left out. Replica partitions without a context pass
    through unchanged. The output has exactly the input schemas (see the module docstring). ``between``
    (``read_between``): the positions between a state and S that were read and skipped, not gaps.

    ``cut_rows``: at most how many rows ``row_wm`` holds (the Delta log knows); at most ``BROADCAST_MAX_ROWS``, its
    per-key facts are sent to every task of the carried versions (broadcast joins), which are then neither shuffled
    nor sorted: an incremental audit of a small cut costs the carried versions one scan. Otherwise (or unknown) both
    sides are shuffled and sort-merged; never is the state broadcast (its Parquet files are small for their rows, so
    Spark's estimate would broadcast hundreds of megabytes). ``prior_payload``: the carried rows also hold what the
    state kept of them (``PRIOR_PAYLOAD``: ``is_prior``, ``prior_origin``, ``prior_missing``, ``prior_touch``; null on
    the snapshot's own rows), for the comparison's pass to write the next state from (``pipelines.leapfrog.compare``).
    """
    rp = list(REPLICA_PARTITION)
    # A row per continued replica partition, used by every branch below: computed once, then a local relation (its
    # broadcasts then run no Spark job each).
    facts = _stream_facts(partition_wm, prior_context, between)
    facts = local_frame(facts.sparkSession, [tuple(row) for row in facts.collect()], facts.schema)
    stream = facts.select(
        "snapshot_id", *rp, "previous_snapshot_id", "prior_end", "prior_last_offset", "stream_pre_history",
        "stream_end", "start_gap", "prior_gap_positions", "missing_before_snapshot",
        F.col("first_gap_lower_bound").alias("snapshot_first_gap"),
    )
    stream_wide = {
        "starts_with_sop": F.col("prior_sop"),
        "pre_history_bound": F.col("stream_pre_history"),
        "pre_history_known": F.col("stream_pre_history").isNotNull(),
        "end_lower_bound": F.col("stream_end"),
        # The stream's gaps: S's own, the one before S, and (as positions) the earlier dumps'.
        "gaps": F.col("gaps") + (F.col("start_gap") > 0).cast(T.LongType()),
        "gap_positions": F.col("gap_positions") + F.col("missing_before_snapshot"),
        "first_gap_lower_bound": F.col("stream_first_gap"),
    }
    parts = facts.select(
        *[stream_wide.get(f.name, F.col(f.name)).alias(f.name) for f in PartitionWatermarks.to_structtype().fields]
    )
    carried = (
        prior_versions.where(F.col("row_kind") == VERSION)
        .select(F.col("snapshot_id").alias("previous_snapshot_id"), *rp,
                *CARRIED_COLUMNS, "origin_snapshot_id")
        .join(F.broadcast(stream), on=["previous_snapshot_id", *rp], how="inner")
    )
    small_cut = cut_rows is not None and cut_rows <= BROADCAST_MAX_ROWS

    regions = partition_regions(parts)
    by_key = Window.partitionBy("snapshot_id", *rp, "key").orderBy("offset")
    upto = by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow)
    touched = running_max_single(F.col("source_region"), F.col("source_offset"), regions, upto)
    known = F.col("stream_pre_history").isNotNull()
    # A row of S with a gap before it in the stream (in S, between the state and S, or earlier) keeps the floor
    # S's own watermarks gave it (its run's P, or S's P, the first vector after the gap before S); the carried
    # touch joins it. Without a gap before it: the stream's P, as when the stream is dumped as one.
    after_gap = (F.col("missing_before") + F.col("missing_before_snapshot")) > 0
    own_touch = F.when(
        after_gap, F.when(F.col("touch_bound").isNotNull(), vector_max(F.col("touch_bound"), F.col("prior_touch")))
    ).when(known, vector_max(F.col("stream_pre_history"), vector_max(F.col("prior_touch"), touched)))
    continued = (
        row_wm.join(F.broadcast(stream), on=["snapshot_id", *rp], how="inner")
        # S's rows up to the state's last offset are the state's already (a verified overlap): S continues after it.
        .where(F.col("offset") > F.col("prior_last_offset"))
    )
    touches = carried.select(*rp, "key", F.col("key_touch").alias("prior_touch"))
    if small_cut:  # the carried versions of the keys S writes, found by a scan against S's keys, sent to S's rows
        # A key written twice is sent twice: a semi join's build side needs no distinct keys (no shuffle for them).
        written_keys = F.broadcast(continued.select(*rp, "key"))
        touches = F.broadcast(touches.join(written_keys, on=[*rp, "key"], how="left_semi"))
    else:
        touches = touches.hint("shuffle_merge")
    own = (
        continued.join(touches, on=[*rp, "key"], how="left")
        .select(
            "*",
            # L and M of S's rows only grow by what the stream had applied before S.
            vector_max(F.col("prior_end"), F.col("applied_lower_bound")).alias("stream_lower_bound"),
            own_touch.alias("stream_touch"),
            vector_max(F.col("prior_end"), F.col("reach")).alias("stream_reach"),
            (F.col("missing_before") + F.col("missing_before_snapshot")).alias("stream_missing"),
            (F.row_number().over(upto) == 1).alias("first_of_key"),
        )
    )
    if small_cut:  # read twice below (each key's first row, and the rows): a small cut's rows are computed once
        own = computed_once(own)
    renamed = {"applied_lower_bound": "stream_lower_bound", "touch_bound": "stream_touch", "reach": "stream_reach",
               "missing_before": "stream_missing"}
    row_struct = ReconstructedWatermarks.to_structtype()
    own_rows = own.select(*[F.col(renamed.get(f.name, f.name)).alias(f.name) for f in row_struct.fields])
    firsts = own.where(F.col("first_of_key")).select(
        *rp, "key", F.col("stream_lower_bound").alias("first_in_snapshot"),
        (F.col("missing_before") > 0).alias("first_after_gap"),
    )
    carried_missing = F.coalesce(F.col("missing_before"), F.lit(0).cast(T.LongType()))
    # Reach of a carried version: stopped by a gap after it in an earlier dump (its stored reach), or by the gap
    # before S, or by S's first gap when the key's first row in S lies after it (SPEC 3a).
    snapshot_gap = vector_max(F.col("prior_end"), F.col("snapshot_first_gap"))
    carried_reach = (
        F.when(F.col("prior_gap_positions") > carried_missing, F.col("reach"))
        .when(F.col("start_gap") > 0, F.col("prior_end"))
        .when(F.col("first_in_snapshot").isNotNull() & ~F.col("first_after_gap"), F.col("first_in_snapshot"))
        .when(F.col("snapshot_first_gap").isNotNull(), snapshot_gap)
        .otherwise(F.col("stream_end"))
    )
    firsts = F.broadcast(firsts) if small_cut else firsts.hint("shuffle_merge")
    payload = [
        F.lit(True).alias("is_prior"), F.col("origin_snapshot_id").alias("prior_origin"),
        F.col("missing_before").alias("prior_missing"), F.col("key_touch").alias("prior_touch"),
    ] if prior_payload else []
    carried_rows = carried.join(firsts, on=[*rp, "key"], how="left").select(
        *[c for c in carried.columns if c not in ("touch_bound", "reach", "missing_before", "origin_snapshot_id")],
        F.col("first_lower_bound").alias("applied_lower_bound"),
        # After a gap: the U it had (unknown stays unknown); else the stream's P and the key's touches.
        F.when(carried_missing > 0, F.col("touch_bound"))
        .when(known, vector_max(F.col("stream_pre_history"), F.col("key_touch"))).alias("touch_bound"),
        carried_reach.alias("reach"),
        # ⊥ of a carried key reaches its stored first_lower_bound: the carried row counts as before any gap.
        F.lit(0).cast(T.LongType()).alias("missing_before"),
        *payload,
    )
    untouched_rows = row_wm.join(F.broadcast(stream.select("snapshot_id", *rp)), on=["snapshot_id", *rp], how="left_anti")
    untouched_parts = partition_wm.join(stream.select("snapshot_id", *rp), on=["snapshot_id", *rp], how="left_anti")
    part_struct = PartitionWatermarks.to_structtype()
    if prior_payload:  # the snapshot's own rows hold none of it
        row_struct = T.StructType(row_struct.fields + PRIOR_PAYLOAD.fields)
        nulls = {f.name: F.lit(None).cast(f.dataType) for f in PRIOR_PAYLOAD.fields}
        own_rows, untouched_rows = conform(own_rows, row_struct, nulls), conform(untouched_rows, row_struct, nulls)
    return (
        conform(untouched_rows, row_struct)
        .unionByName(conform(own_rows, row_struct))
        .unionByName(conform(carried_rows, row_struct)),
        conform(untouched_parts, part_struct).unionByName(conform(parts, part_struct)),
    )


# ---------------------------------------------------------------- next state
def _as_state(df: DataFrame) -> DataFrame:
    """``df`` in ``replica_state``'s columns; the other row kind's columns are null."""
    struct = ReplicaState.to_structtype()
    present = set(df.columns)
    return conform(df, struct, {f.name: F.lit(None) for f in struct.fields if f.name not in present})


def kept_where_gapped(columns: dict[str, Column]) -> list[Column]:
    """Each of ``columns`` (name -> column) where the row's stream has a gap (its ``first_gap_lower_bound`` is
    set), else null.

    What a VERSION row keeps of its own ``U``, ``M`` and ``missing_before``: a stream without a
    gap recomputes them from the state's other columns, and a state without them keeps the
    columns (and the checksum) of one written before gaps were known.
    """
    gapped = F.col("first_gap_lower_bound").isNotNull()
    return [F.when(gapped, column).alias(name) for name, column in columns.items()]


def last_versions_of(row_wm: DataFrame, partition_wm: DataFrame, regions: Sequence[str]) -> DataFrame:
    """Every key's last version per replica partition of ``row_wm``, aggregated by Spark (``Comparison.last_versions``'s rows).

    ``pipelines.leapfrog.compare`` gives the same rows from the comparison's own pass; this
    aggregation (an exchange and sort of every row) serves a state built without it.
    """
    rp = list(REPLICA_PARTITION)
    # As the comparison keeps them: a last version's own bounds only where its stream has a gap.
    last = F.struct(*[F.col(c) for c in LAST_VERSION_COLUMNS],
                    *kept_where_gapped({c: F.col(c) for c in ("touch_bound", "reach", "missing_before")}))
    # ⊥'s reach stops at the dump's first gap (SPEC 3a), as in the comparison.
    gaps = partition_wm.select("snapshot_id", *rp, "first_gap_lower_bound")
    return row_wm.join(F.broadcast(gaps), on=["snapshot_id", *rp], how="inner").groupBy(
        "snapshot_id", *rp, "key"
    ).agg(
        F.max_by(last, "offset").alias("last"),
        # A carried version is its key's first row: its applied_lower_bound is the stored first_lower_bound.
        F.min_by(bottom_reach(), "offset").alias("first_lower_bound"),
        sparse([F.max(F.when(F.col("source_region") == F.lit(r), F.col("source_offset"))) for r in regions],
               regions).alias("touched"),
    ).select("snapshot_id", *rp, "key", "last.*", "first_lower_bound", "touched")


def _positive(count: Column) -> Column:
    """``count`` when above 0, else null: a state without gaps keeps the columns of one written before gaps were known."""
    return F.when(count > 0, count)


def carried_versions(prior_versions: DataFrame, prior_context: DataFrame) -> DataFrame:
    """The carried versions the state after S continues: per replica partition and key, what the state kept.

    Only the VERSION rows of each replica partition's chosen context (``prior_context``). Columns:
    ``replica``, ``topic``, ``partition``, ``key``, ``prior_offset``, ``prior_touch`` (its
    ``key_touch``), ``prior_origin`` (its ``origin_snapshot_id``), ``prior_missing``.
    """
    rp = list(REPLICA_PARTITION)
    ctx = prior_context.where(F.col("row_kind") == CONTEXT).select(F.col("snapshot_id").alias("previous_snapshot_id"), *rp)
    return (
        prior_versions.where(F.col("row_kind") == VERSION)
        .select(F.col("snapshot_id").alias("previous_snapshot_id"), *rp, "key",
                F.col("offset").alias("prior_offset"), F.col("key_touch").alias("prior_touch"),
                F.col("origin_snapshot_id").alias("prior_origin"), F.col("missing_before").alias("prior_missing"))
        .join(ctx, on=["previous_snapshot_id", *rp], how="inner")
        .drop("previous_snapshot_id")
    )


def next_state(
    row_wm: DataFrame,
    partition_wm: DataFrame,
    prior_versions: DataFrame,
    prior_context: DataFrame,
    regions: Sequence[str] | None = None,
    last_versions: DataFrame | None = None,
) -> DataFrame:
    """The ``replica_state`` rows after one snapshot: each key's last version, one context per replica partition.

    ``row_wm`` and ``partition_wm`` are ``carry_over``'s output (a carried version is
    the first row of its key there); ``prior_versions``/``prior_context`` its inputs,
    read again for the carried versions' ``key_touch`` and origin and the stream's
    first offset and predecessor. ``last_versions``: the comparison's
    (``Comparison.last_versions``) when the caller has it, else aggregated from ``row_wm``
    (``last_versions_of``). ``regions``: ``partition_regions(partition_wm)`` when the
    caller has it already (the comparison's layout), else read here (one small job).

    The audit has the comparison's pass write the VERSION rows itself (``pipelines.leapfrog.compare``
    with ``state``) and adds the contexts with ``contexts_from_sums``; this is the same state built
    by Spark, for a state made without that pass.
    """
    rp = list(REPLICA_PARTITION)
    prior = carried_versions(prior_versions, prior_context)
    # An absent replica partition (no rows in S, compared on its carried state) keeps its older state as the one to
    # continue: none of its rows is written again (``pipelines/state/absent.py``).
    written = partition_wm.where(written_in_state()).select("snapshot_id", *rp)
    if last_versions is None:
        last_versions = last_versions_of(
            row_wm, partition_wm, partition_regions(partition_wm) if regions is None else regions
        )
    carried = F.col("offset") == F.col("prior_offset")
    last_versions = last_versions.join(F.broadcast(written), on=["snapshot_id", *rp], how="left_semi")
    versions = computed_once(_as_state(
        last_versions.join(prior, on=[*rp, "key"], how="left").select(
            "snapshot_id",
            F.lit(VERSION).alias("row_kind"),
            *rp,
            "key",
            *LAST_VERSION_COLUMNS,
            vector_max(F.col("prior_touch"), F.col("touched")).alias("key_touch"),
            "first_lower_bound",
            F.when(carried, F.col("prior_origin")).otherwise(F.col("snapshot_id")).alias("origin_snapshot_id"),
            "touch_bound",
            "reach",
            # A carried version counts as before any gap in the comparison's rows; its stream position is the state's.
            _positive(F.when(carried, F.col("prior_missing")).otherwise(F.col("missing_before"))).alias("missing_before"),
        )
    ))
    stats = versions.groupBy("snapshot_id", *rp).agg(
        F.count(F.lit(1)).alias("state_rows"), checksum(version_hash()).alias("state_checksum")
    )
    return versions.unionByName(state_contexts(partition_wm, prior_context, stats))


def state_contexts(partition_wm: DataFrame, prior_context: DataFrame, stats: DataFrame) -> DataFrame:
    """The CONTEXT rows of the state after S, one per replica partition S read (``replica_state``'s columns).

    ``partition_wm``'s absent rows (``pipelines/state/absent.py``: compared on their carried state only) get none:
    their older context stays the one the next snapshot continues.

    ``stats``: per replica partition with VERSION rows (``snapshot_id``, ``replica``, ``topic``,
    ``partition``), how many (``state_rows``) and their checksum (``state_checksum``); one without
    any has 0 and 0.
    """
    rp = list(REPLICA_PARTITION)
    ctx = prior_context.where(F.col("row_kind") == CONTEXT).select(
        *rp,
        F.col("snapshot_id").alias("previous_snapshot_id"),
        F.col("stream_first_offset").alias("prior_stream_first_offset"),
    )
    zero = F.lit(0).cast(T.LongType())
    return _as_state(
        partition_wm.where(written_in_state()).join(ctx, on=rp, how="left")
        .join(stats, on=["snapshot_id", *rp], how="left")
        .select(
            "snapshot_id",
            F.lit(CONTEXT).alias("row_kind"),
            *rp,
            "previous_snapshot_id",
            "first_offset",
            F.coalesce(F.col("prior_stream_first_offset"), F.col("first_offset")).alias("stream_first_offset"),
            "last_offset",
            "starts_with_sop",
            "pre_history_bound",
            "end_lower_bound",
            F.coalesce(F.col("state_rows"), zero).alias("state_rows"),
            F.coalesce(F.col("state_checksum"), zero).alias("state_checksum"),
            "gap_positions",
            "first_gap_lower_bound",
        )
    )


_SUMS = T.StructType([
    T.StructField("snapshot_id", T.StringType()), T.StructField("replica", T.StringType()),
    T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()),
    T.StructField("state_rows", T.LongType()), T.StructField("state_checksum", T.LongType()),
])


def contexts_from_sums(
    partition_wm: DataFrame, prior_context: DataFrame, state_sums: DataFrame, more: Sequence[tuple] = (),
) -> pa.Table:
    """The CONTEXT rows of the state whose VERSION rows the comparison's pass wrote, as Arrow (a handful of rows).

    ``state_sums``: ``Comparison.state_sums``, each task's rows and checksum per replica partition,
    summed here (a few rows per task): the checksum is a sum modulo 2^64, so the tasks' shares add
    up to the one Spark's ``version_hash`` gives the whole partition (``arrow_checksum``). The
    divergence step writes them as one more file of the state's staged write. ``more``: shares written otherwise
    (``pipelines/state/settled.py``), as (snapshot_id, replica, topic, partition, state_rows, state_checksum).
    """
    rp = ("snapshot_id", *REPLICA_PARTITION)
    totals: dict[tuple, list[int]] = {}
    for row in [*(tuple(row[c] for c in (*rp, "state_rows", "state_checksum")) for row in state_sums.collect()),
                *more]:
        total = totals.setdefault(tuple(row[:4]), [0, 0])
        total[0] += row[4]
        total[1] += row[5]
    stats = local_frame(partition_wm.sparkSession, [(*k, n, signed(c)) for k, (n, c) in totals.items()], _SUMS)
    return state_contexts(partition_wm, prior_context, stats).toArrow()
