"""Leap Frog divergence detection with heartbeats (SPEC section 4), in near-linear Spark.

What is decided
---------------
For every pair of replicas A < B that both hold a (topic, partition), and every key k
seen in either, the *versions* of k in a replica are its data rows in offset order,
preceded by the pre-dump version ⊥ (content ABSENT, ``U = {}``, ``M = L`` of the key's
first row, or ``L(end)`` when the key never appears) when the dump starts with
START_OF_PUSH. Each version carries a content token (sha256 of the value, TOMBSTONE,
ABSENT), its touch bound ``U`` (what made it) and its reach ``M`` (what the replica had
applied while it was current); ``pipelines/watermarks.py`` computes both.

A key is DIVERGENT when some v of A and w of B hold different content although
``U(w) <= M(v)`` and ``U(v) <= M(w)``: each replica had applied everything that made
the other's version while holding its own. Healthy replicas with deterministic conflict
resolution can never show that, so it is a proof. A proven key that one replica (whose
dump starts at START_OF_PUSH) never holds at all is MISSING in that replica. An unproven
key whose last versions differ, or that one side (a mid-stream dump) never saw, is
IN_FLIGHT. The rest are CONSISTENT and only counted. A version whose ``U`` is unknown (a
mid-stream dump without a heartbeat vector) takes part in no proof.

How it stays near-linear
------------------------
Pairing every version of A with every version of B is quadratic in a hot key's versions.
Instead:

1. Along the versions of one key in one replica, ``U`` and ``M`` only grow (``U`` is a
   running max, ``M`` is ``L`` at a later and later row). So for a fixed w of B, the
   versions v of A with ``U(v) <= M(w)`` form a *prefix* of A's versions, and those with
   ``U(w) <= M(v)`` form a *suffix*. The versions of A that overlap w are one index
   range ``[s(w), a(w))``.
2. Vectors become dense arrays over the region universe, ``-1`` for a missing component,
   which turns the SPEC order into plain componentwise ``<=``. Per region r,
   ``a_r(w) = #{v : U_r(v) <= M_r(w)}`` and ``s_r(w) = #{v : M_r(v) < U_r(w)}`` are rank
   queries: order the versions of both sides of one (pair, key) by A's value and B's
   query value for region r and take a running count of A's entries. All these
   orderings share one window partition (one exchange, a local sort each). Then
   ``a(w) = min_r a_r(w)`` and ``s(w) = max_r s_r(w)``.
3. w proves divergence iff its range is non-empty and not all of A's tokens in it equal
   w's token. Each version of A knows where the run of equal consecutive tokens it
   starts ends (``run_end``). So: look up A's version at index ``s`` (an equi-join on key
   and index); w is a proof iff ``token(v_s) != token(w)`` or ``run_end(s) < a(w)``. The
   witness v is ``v_s`` in the first case, else the version at ``run_end(s)``: the first
   version of the range whose content differs from w's.
4. One witness per key: the earliest proving w (⊥ first), with its v.
5. Last versions, counts and verdicts come from per-key aggregates and equi-joins.

Every step is a sort-based window, an aggregate or an equi-join; the rows grow with
versions x regions x (replicas - 1), never with versions squared.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.frames import computed_once
from pipelines.vectors import conform, dense, empty_vector, partition_regions
from schemas.divergence import DivergenceReports, DivergenceSummary

ABSENT = "ABSENT"
PART = ("snapshot_id", "topic", "partition")
PAIR = (*PART, "replica_a", "replica_b")
PAIR_ID = "pair_id"
SIDES = ("a", "b")

# The two rank problems of step 2.
PREFIX = "a"  # A's U_r against w's M_r, counting ties: #{v : U_r(v) <= M_r(w)}
SUFFIX = "s"  # A's M_r against w's U_r, not counting ties: #{v : M_r(v) < U_r(w)}


def _replica_pairs(partition_wm: DataFrame) -> DataFrame:
    """Every pair of replicas holding the same topic partition, with what each side's dump knows."""

    def side(s: str) -> DataFrame:
        return partition_wm.select(
            *PART,
            F.col("replica").alias(f"replica_{s}"),
            F.col("starts_with_sop").alias(f"sop_{s}"),
            F.col("end_lower_bound").alias(f"end_{s}"),
        )

    pairs = side("a").join(side("b"), on=list(PART), how="inner").where(F.col("replica_a") < F.col("replica_b"))
    # A small number standing for the pair in the comparison's wide frames, so that the rows
    # sorted there carry one long instead of the pair's five columns.
    return pairs.select("*", F.row_number().over(Window.orderBy(*PAIR)).cast(T.LongType()).alias(PAIR_ID))


# Per (replica, key) totals, carried on the key's first data row only (null on the others).
TOTALS = ("data_rows", "last_offset", "last_hash", "first_lower_bound")


def _data_versions(row_watermarks: DataFrame) -> DataFrame:
    """Per replica and key: its data rows in offset order, with position and run end, and the key's totals.

    One window partition per (replica, key) computes everything. The totals sit on the
    key's first row (``pos`` 0) only, so the frame stays as narrow as the versions
    themselves; values stay behind (only witnesses need them).
    """
    in_order = Window.partitionBy(*PART, "replica", "key").orderBy("offset")
    whole = in_order.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    indexed = row_watermarks.select(
        *PART,
        "replica",
        "key",
        "offset",
        F.col("value_hash").alias("token"),
        F.col("touch_bound").alias("touch"),
        "reach",
        "applied_lower_bound",
        (F.row_number().over(in_order.rowsBetween(Window.unboundedPreceding, Window.currentRow)) - 1).alias("pos"),
        F.lag("value_hash", 1).over(in_order.rowsBetween(-1, -1)).alias("previous_token"),
        F.count(F.lit(1)).over(whole).alias("data_rows"),
        F.last("offset").over(whole).alias("last_offset"),
        F.last("value_hash").over(whole).alias("last_hash"),
    )
    run_starts = F.when(F.col("previous_token").isNull() | (F.col("previous_token") != F.col("token")), F.col("pos"))
    first = F.col("pos") == 0
    totals = {
        "data_rows": F.col("data_rows"),
        "last_offset": F.col("last_offset"),
        "last_hash": F.col("last_hash"),
        "first_lower_bound": F.col("applied_lower_bound"),
    }
    # Where the content next changes after this row (the end of the run this row is in):
    # the next run start. A lead that skips nulls finds it in one pass; a min over the frame
    # "1 following to unbounded following" would be recomputed for every row (quadratic in
    # a key's versions).
    next_run_start = F.expr("lead(run_start, 1) IGNORE NULLS").over(in_order)
    return indexed.select("*", run_starts.alias("run_start")).select(
        *PART,
        "replica",
        "key",
        "offset",
        "token",
        "touch",
        "reach",
        "pos",
        F.coalesce(next_run_start, F.col("data_rows")).alias("run_end_pos"),
        *[F.when(first, column).alias(name) for name, column in totals.items()],
    )


def _paired_versions(data_versions: DataFrame, pairs: DataFrame) -> DataFrame:
    """Every data version once per pair its replica is in, as side a or b, indexed after ⊥ when there is one.

    The pair is named by its ``pair_id`` alone, here and in every frame of the comparison.

    ``pairs`` is a handful of rows (replica pairs per partition): the join broadcasts it.
    """
    as_side = F.explode(
        F.array(*[F.struct(F.col(f"replica_{s}").alias("replica"), F.lit(s).alias("side")) for s in SIDES])
    )
    pair_sides = pairs.select(*PART, PAIR_ID, "sop_a", "sop_b", as_side.alias("as")).select(
        *PART, PAIR_ID, "sop_a", "sop_b", "as.replica", "as.side"
    )
    shift = F.when(F.col("side") == "a", F.col("sop_a")).otherwise(F.col("sop_b")).cast(T.LongType())
    return data_versions.join(F.broadcast(pair_sides), on=[*PART, "replica"], how="inner").select(
        PAIR_ID,
        "key",
        "side",
        (F.col("pos") + shift).alias("idx"),
        "offset",
        "token",
        "touch",
        "reach",
        (F.col("run_end_pos") + shift).alias("run_end"),
    )


def _pair_keys(data_versions: DataFrame, pairs: DataFrame) -> DataFrame:
    """Per pair, every key seen in either replica, with both sides' totals and what each side's dump knows."""

    def side(s: str) -> DataFrame:
        totals = data_versions.where(F.col("pos") == 0).select(
            *PART, F.col("replica").alias(f"replica_{s}"), "key", *[F.col(c).alias(f"{c}_{s}") for c in TOTALS]
        )
        return totals.join(F.broadcast(pairs.select(*PAIR)), on=[*PART, f"replica_{s}"], how="inner")

    keys = side("a").join(side("b"), on=[*PAIR, "key"], how="full")
    return keys.join(F.broadcast(pairs), on=list(PAIR), how="inner")


def _bottoms(pair_keys: DataFrame) -> DataFrame:
    """⊥ of every pair key on each side whose dump starts with START_OF_PUSH: index 0, content ABSENT."""
    candidates = F.array(
        *[
            F.struct(
                F.lit(s).alias("side"),
                F.col(f"sop_{s}").alias("has_bottom"),
                F.coalesce(F.col(f"first_lower_bound_{s}"), F.col(f"end_{s}")).alias("reach"),
            )
            for s in SIDES
        ]
    )
    return (
        pair_keys.select(PAIR_ID, "key", F.inline(candidates))
        .where(F.col("has_bottom"))
        .select(
            PAIR_ID,
            "key",
            "side",
            F.lit(0).cast(T.LongType()).alias("idx"),
            F.lit(None).cast(T.LongType()).alias("offset"),
            F.lit(ABSENT).alias("token"),
            empty_vector().alias("touch"),
            "reach",
            # Data tokens are hashes or TOMBSTONE, never ABSENT: the run of ⊥ ends right after it.
            F.lit(1).cast(T.LongType()).alias("run_end"),
        )
    )


def _overlap_ranges(versions: DataFrame, regions: list[str]) -> DataFrame:
    """For every w of B with a known U: the index range ``[s, a)`` of A's versions overlapping it.

    Both sides of one (pair, key) stay in one window partition; per region, two orderings
    of the same rows answer the two rank problems as running counts of A's entries. A
    entry equal to a query sorts before it in the prefix problem (``<=``) and after it in
    the suffix problem (``<``). Every ordering shares one exchange; nothing is exploded.
    """
    if not regions:
        # No region appears in any U: there is no data version to compare.
        return versions.where(F.lit(False)).select(
            PAIR_ID, "key", F.col("idx").alias("w_idx"), F.lit(0).cast(T.LongType()).alias("s"),
            F.lit(0).cast(T.LongType()).alias("a"), F.col("token").alias("w_token"),
        )
    is_a = F.col("side") == "a"
    # U is unknown for all versions of a dump or for none (it hinges on the dump's P), so
    # the versions kept are still indexed 0..n-1 and the counts below are indices.
    known = versions.where(F.col("touch").isNotNull()).select(
        # The key's hash leads the sort: most comparisons end at its 8-byte prefix.
        F.xxhash64("key").alias("key_hash"), PAIR_ID, "key", "side", "idx", "token",
        dense(F.col("touch"), regions).alias("u"), dense(F.col("reach"), regions).alias("m"),
    )
    by_key = Window.partitionBy("key_hash", PAIR_ID, "key")
    a_entries = F.sum(is_a.cast(T.LongType()))

    def rank(value_a: Column, query_b: Column, a_ties_first: bool) -> Column:
        tie = F.when(is_a, 0 if a_ties_first else 1).otherwise(1 if a_ties_first else 0)
        ordered = by_key.orderBy(F.when(is_a, value_a).otherwise(query_b), tie)
        return a_entries.over(ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow))

    u = [F.col("u")[i] for i in range(len(regions))]
    m = [F.col("m")[i] for i in range(len(regions))]
    prefix = [rank(u[i], m[i], a_ties_first=True).alias(f"{PREFIX}_{i}") for i in range(len(regions))]
    suffix = [rank(m[i], u[i], a_ties_first=False).alias(f"{SUFFIX}_{i}") for i in range(len(regions))]

    def combine(fn, names: list[str]) -> Column:
        return F.col(names[0]) if len(names) == 1 else fn(*[F.col(n) for n in names])

    ranked = known.select(PAIR_ID, "key", "side", "idx", "token", *prefix, *suffix).where(~is_a)
    return ranked.select(
        PAIR_ID,
        "key",
        F.col("idx").alias("w_idx"),
        combine(F.greatest, [f"{SUFFIX}_{i}" for i in range(len(regions))]).alias("s"),
        combine(F.least, [f"{PREFIX}_{i}" for i in range(len(regions))]).alias("a"),
        F.col("token").alias("w_token"),
    )


def _witnesses(versions: DataFrame, pairs: DataFrame, row_watermarks: DataFrame, regions: list[str]) -> DataFrame:
    """Per (pair, key) with a proof: the earliest proving w of B and the first differing v of A (steps 3-4).

    Values travel with the few witnesses only: they are looked up in ``row_watermarks`` at
    the end (⊥ has none).
    """
    ranges = _overlap_ranges(versions, regions).where(F.col("s") < F.col("a"))
    at_s = versions.where(F.col("side") == "a").select(
        PAIR_ID, "key", F.col("idx").alias("s"), F.col("token").alias("s_token"), F.col("run_end").alias("s_run_end")
    )
    checked = ranges.join(at_s, on=[PAIR_ID, "key", "s"], how="inner")
    differs_at_s = F.col("s_token") != F.col("w_token")
    proving = checked.where(differs_at_s | (F.col("s_run_end") < F.col("a"))).select(
        PAIR_ID, "key", "w_idx", F.when(differs_at_s, F.col("s")).otherwise(F.col("s_run_end")).alias("v_idx")
    )
    first = proving.groupBy(PAIR_ID, "key").agg(F.min(F.struct("w_idx", "v_idx")).alias("first"))
    # One row per proven pair key, read three times below: computed once. Its size is known
    # when it is joined, so adaptive execution broadcasts it when it is small (no hint: a
    # replica that lost everything proves every key).
    witnesses = computed_once(
        first.select(PAIR_ID, "key", F.col("first.w_idx").alias("w_idx"), F.col("first.v_idx").alias("v_idx"))
    )
    wanted = witnesses.select(
        PAIR_ID, "key", F.inline(F.array(*[
            F.struct(F.lit(s).alias("side"), F.col(c).alias("idx")) for s, c in (("a", "v_idx"), ("b", "w_idx"))
        ]))
    )
    named = F.broadcast(pairs.select(PAIR_ID, *PAIR))
    picked = (
        versions.join(wanted, on=[PAIR_ID, "key", "side", "idx"], how="inner")
        .join(named, on=PAIR_ID, how="inner")
        .select(
            PAIR_ID, "key", "side", "offset", "token", "touch", "reach", *PART,
            F.when(F.col("side") == "a", F.col("replica_a")).otherwise(F.col("replica_b")).alias("replica"),
        )
    )
    # ⊥ has no row (and no value); a data version's value is the row's at its offset.
    values = row_watermarks.join(
        picked.where(F.col("offset").isNotNull()).select(*PART, "replica", "key", "offset").distinct(),
        on=[*PART, "replica", "key", "offset"],
        how="inner",
    ).select(*PART, "replica", "key", "offset", "value")
    picked = picked.join(values, on=[*PART, "replica", "key", "offset"], how="left")

    def side(s: str) -> DataFrame:
        return picked.where(F.col("side") == s).select(
            PAIR_ID,
            "key",
            F.col("offset").alias(f"witness_offset_{s}"),
            F.col("token").alias(f"witness_hash_{s}"),
            F.col("touch").alias(f"touch_bound_{s}"),
            F.col("reach").alias(f"reach_{s}"),
            F.col("value").alias(f"witness_value_{s}"),
        )

    return (
        witnesses.join(side("a"), on=[PAIR_ID, "key"], how="inner")
        .join(side("b"), on=[PAIR_ID, "key"], how="inner")
        .join(named, on=PAIR_ID, how="inner")
        .drop(PAIR_ID)
    )


def _verdicts(pair_keys: DataFrame, witnesses: DataFrame) -> DataFrame:
    """Every pair key with its verdict, version counts, last versions and (when proven) witness."""

    def side(s: str) -> tuple[Column, Column, Column]:
        data_rows = F.coalesce(F.col(f"data_rows_{s}"), F.lit(0).cast(T.LongType()))
        versions = data_rows + F.col(f"sop_{s}").cast(T.LongType())
        last_hash = F.coalesce(F.col(f"last_hash_{s}"), F.when(F.col(f"sop_{s}"), F.lit(ABSENT)))
        return data_rows, versions, last_hash

    rows_a, versions_a, last_a = side("a")
    rows_b, versions_b, last_b = side("b")
    proven = F.col("w_idx").isNotNull()
    verdict = (
        F.when(proven & ((rows_a == 0) | (rows_b == 0)), F.lit("MISSING"))
        .when(proven, F.lit("DIVERGENT"))
        .when((versions_a == 0) | (versions_b == 0) | (last_a != last_b), F.lit("IN_FLIGHT"))
        .otherwise(F.lit("CONSISTENT"))
    )
    # A proof needs a version on both sides, so a side without data rows holds only ⊥.
    missing_in = F.when(proven & (rows_a == 0), F.col("replica_a")).when(proven & (rows_b == 0), F.col("replica_b"))
    keep = [c for c in pair_keys.columns if c not in ("last_hash_a", "last_hash_b")]
    return pair_keys.select(*keep, last_a.alias("last_hash_a"), last_b.alias("last_hash_b")).join(
        witnesses, on=[*PAIR, "key"], how="left"
    ).select(
        "*",
        verdict.alias("verdict"),
        missing_in.alias("missing_in"),
        versions_a.alias("versions_a"),
        versions_b.alias("versions_b"),
    )


def _summary(pairs: DataFrame, verdicts: DataFrame) -> DataFrame:
    def count_of(verdict: str) -> Column:
        return F.sum((F.col("verdict") == verdict).cast(T.LongType()))

    counted = ("keys_compared", "consistent", "divergent", "missing", "in_flight")
    counts = verdicts.groupBy(*PAIR).agg(
        F.count(F.lit(1)).alias("keys_compared"),
        count_of("CONSISTENT").alias("consistent"),
        count_of("DIVERGENT").alias("divergent"),
        count_of("MISSING").alias("missing"),
        count_of("IN_FLIGHT").alias("in_flight"),
    )
    zero = F.lit(0).cast(T.LongType())
    # A pair whose partition holds no data rows still gets its row, all zeros.
    return pairs.select(*PAIR).join(counts, on=list(PAIR), how="left").select(
        *PAIR, *[F.coalesce(F.col(c), zero).alias(c) for c in counted]
    )


def compare_replicas(row_watermarks: DataFrame, partition_wm: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Leap Frog over every replica pair: (``divergence_reports``, ``divergence_summary``)."""
    # Every region some U can name (a superset is safe: a region no U names compares -1 <= anything).
    regions = partition_regions(partition_wm)
    pairs = computed_once(_replica_pairs(partition_wm))
    # Later steps read the indexed versions (once per pair their replica is in, through a
    # broadcast join with the few pairs) and the pair keys several times, and reports and
    # summary both derive from the verdicts: each is computed once (a local checkpoint).
    data_versions = computed_once(_data_versions(row_watermarks))
    pair_keys = computed_once(_pair_keys(data_versions, pairs))
    versions = _paired_versions(data_versions, pairs).unionByName(_bottoms(pair_keys))
    verdicts = computed_once(_verdicts(pair_keys, _witnesses(versions, pairs, row_watermarks, regions)))
    reports = verdicts.where(F.col("verdict") != "CONSISTENT")
    return (
        conform(reports, DivergenceReports.to_structtype()),
        conform(_summary(pairs, verdicts), DivergenceSummary.to_structtype()),
    )
