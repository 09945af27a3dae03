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
   queries: binary searches of w's query values in A's sorted values. Then
   ``a(w) = min_r a_r(w)`` and ``s(w) = max_r s_r(w)``.
3. w proves divergence iff its range is non-empty and not all of A's tokens in it equal
   w's token. Each version of A knows where the run of equal consecutive tokens it
   starts ends (``run_end``). So: look at A's version at index ``s``; w is a proof iff
   ``token(v_s) != token(w)`` or ``run_end(s) < a(w)``. The witness v is ``v_s`` in the
   first case, else the version at ``run_end(s)``: the first version of the range whose
   content differs from w's.
4. One witness per key: the earliest proving w (⊥ first), with its v.
5. Last versions, counts and verdicts come from per-key aggregates and equi-joins.

Steps 2-4 run in one pass (``first_proofs``): one exchange puts all versions of a
(pair, key) into one Spark partition, and a vectorized function (numpy, in Spark's Python
workers through Arrow) solves every (pair, key) of the partition at once, with a few sorts
and binary searches over the whole partition, and returns only the proven keys. Written
as Spark windows instead (one ordering per region and rank problem, then an equi-join
for the version at ``s`` and an aggregate for the first proof), the whole comparison
took about 1.5 times as long (2M and 600k rows, warm): Spark's window operator copies
every row into each ordering's buffer (docs/performance.md). A partition's rows are held
in the Python worker while it is solved; adaptive execution keeps partitions near 32 MB
of shuffled data, and one (pair, key) cannot be split anyway.

Every other step is a sort-based window, an aggregate or an equi-join; the rows grow with
versions x (replicas - 1), never with versions squared, and the proof search sorts each
partition's rows a fixed number of times (2 x regions + 3).
"""
from __future__ import annotations

import sys
from functools import partial
from typing import Iterator

from pyspark import cloudpickle
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
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


PROOFS_SCHEMA = "pair_id long, key string, w_idx long, v_idx long"


def first_proofs(batches: Iterator[pa.RecordBatch], regions: int) -> Iterator[pa.RecordBatch]:
    """Steps 2-4 for every (pair, key) of one Spark partition, vectorized: its first proof, if any.

    Input rows: every version with a known ``U`` of every (pair, key) whose rows are all in
    this partition: ``pair_id, key, is_a, idx, token, run_end, u_0.., m_0..`` (dense vectors,
    one column per region). Output: one row per proven (pair, key): the earliest proving
    ``w_idx`` of B and the ``v_idx`` of A it differs from.

    All groups are solved at once with sorts and binary searches over the whole partition
    (numpy), never one group at a time: a group is a run of rows after sorting by (pair, key),
    and a per-region value becomes ``group * span + rank of the value`` so that one sorted
    array answers every group's rank queries.
    """
    received = list(batches)
    if not received:
        return
    table = pa.Table.from_batches(received).combine_chunks()
    if table.num_rows == 0:
        return
    pair = table["pair_id"].to_numpy()
    key_code = pc.dictionary_encode(table["key"]).combine_chunks().indices.to_numpy()
    is_b = ~table["is_a"].to_numpy(zero_copy_only=False)
    idx = table["idx"].to_numpy()
    # Sorted by group, then A's versions before B's, each in index order.
    order = np.lexsort((idx, is_b, key_code, pair))
    pair, key_code, is_b, idx = pair[order], key_code[order], is_b[order], idx[order]
    new_group = np.ones(len(order), dtype=bool)
    new_group[1:] = (pair[1:] != pair[:-1]) | (key_code[1:] != key_code[:-1])
    group = np.cumsum(new_group) - 1
    a_rows, b_rows = np.flatnonzero(~is_b), np.flatnonzero(is_b)
    if len(a_rows) == 0 or len(b_rows) == 0:
        return
    group_a, group_b = group[a_rows], group[b_rows]
    first_a = np.searchsorted(group_a, group_b, side="left")  # where w's group starts among A's rows
    span = 2 * len(order) + 1
    upper = np.full(len(b_rows), np.iinfo(np.int64).max)  # a(w) = min_r a_r(w)
    lower = np.zeros(len(b_rows), dtype=np.int64)  # s(w) = max_r s_r(w)
    for r in range(regions):
        u = table[f"u_{r}"].to_numpy()[order]
        m = table[f"m_{r}"].to_numpy()[order]
        # Ranks of every U_r and M_r value of the partition, so that (group, value) fits one int64.
        _, rank = np.unique(np.concatenate([u, m]), return_inverse=True)
        u_rank, m_rank = rank[: len(order)], rank[len(order):]
        a_u = np.sort(group_a * span + u_rank[a_rows])
        a_m = np.sort(group_a * span + m_rank[a_rows])
        # a_r(w) = #{v of A : U_r(v) <= M_r(w)}; s_r(w) = #{v of A : M_r(v) < U_r(w)}
        upper = np.minimum(upper, np.searchsorted(a_u, group_b * span + m_rank[b_rows], side="right") - first_a)
        lower = np.maximum(lower, np.searchsorted(a_m, group_b * span + u_rank[b_rows], side="left") - first_a)
    in_range = lower < upper
    # A's version at index s (A's indices in a group are 0..n-1: U is known for all or none).
    at_s = a_rows[np.minimum(first_a + lower, len(a_rows) - 1)]
    token = pc.dictionary_encode(table["token"]).combine_chunks().indices.to_numpy()[order]
    run_end = pc.fill_null(table["run_end"], -1).to_numpy()[order]  # null on B's rows
    differs = token[at_s] != token[b_rows]
    proving = in_range & (differs | (run_end[at_s] < upper))
    if not proving.any():
        return
    # The earliest proving w of each group (B's rows are in index order within a group).
    proven = np.flatnonzero(proving)
    _, first = np.unique(group_b[proven], return_index=True)
    chosen = proven[first]
    w_rows = b_rows[chosen]
    v_idx = np.where(differs[chosen], idx[at_s[chosen]], run_end[at_s[chosen]])
    yield pa.RecordBatch.from_arrays(
        [
            pa.array(pair[w_rows]),
            table["key"].take(pa.array(order[w_rows])).combine_chunks(),
            pa.array(idx[w_rows]),
            pa.array(v_idx.astype(np.int64)),
        ],
        names=["pair_id", "key", "w_idx", "v_idx"],
    )


# The proof search runs in Spark's Python workers; they receive it by value, so executors
# need numpy and pyarrow (PySpark's own requirements for Arrow) but not this project.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _proofs(versions: DataFrame, regions: list[str]) -> DataFrame:
    """Per (pair, key) with a proof: the earliest proving ``w_idx`` of B and its ``v_idx`` of A (steps 2-4).

    One exchange puts every version of a (pair, key) into one partition; ``first_proofs``
    solves all of a partition's groups at once. Only proven keys leave it.
    """
    if not regions:
        # No region appears in any U: there is no data version to compare.
        return versions.sparkSession.createDataFrame([], PROOFS_SCHEMA)
    known = versions.where(F.col("touch").isNotNull()).select(
        PAIR_ID, "key", (F.col("side") == "a").alias("is_a"), "idx", "token",
        F.when(F.col("side") == "a", F.col("run_end")).alias("run_end"),
        dense(F.col("touch"), regions).alias("u"), dense(F.col("reach"), regions).alias("m"),
    )
    flat = known.select(
        PAIR_ID, "key", "is_a", "idx", "token", "run_end",
        *[F.col("u")[i].alias(f"u_{i}") for i in range(len(regions))],
        *[F.col("m")[i].alias(f"m_{i}") for i in range(len(regions))],
    )
    return flat.repartition(PAIR_ID, "key").mapInArrow(partial(first_proofs, regions=len(regions)), PROOFS_SCHEMA)


def _witnesses(versions: DataFrame, pairs: DataFrame, row_watermarks: DataFrame, regions: list[str]) -> DataFrame:
    """Per (pair, key) with a proof: the earliest proving w of B and the first differing v of A (steps 3-4).

    Values travel with the few witnesses only: they are looked up in ``row_watermarks`` at
    the end (⊥ has none).
    """
    # One row per proven pair key, read three times below: computed once. Its size is known
    # when it is joined, so adaptive execution broadcasts it when it is small (no hint: a
    # replica that lost everything proves every key).
    witnesses = computed_once(_proofs(versions, regions))
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
