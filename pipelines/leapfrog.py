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
5. Counts and last versions of every key come from the same pass; the verdict follows. So do the
   keys of each topic partition per worst verdict over its pairs (SPEC 10: a key counts once): a
   key's rows of every replica are in one task, so each task counts its keys and the counts add up.

The whole comparison is one pass (``compare_keys``): one exchange puts every data row of
a key in a topic partition, of every replica, into one Spark partition, and a vectorized
function (numpy, in Spark's Python workers through Arrow) does steps 1-5 for every pair of
replicas and every key of the partition at once: versions in offset order with their runs
of equal content, ⊥, the rank queries of step 2 with a few sorts and binary searches over
the whole partition (never one key at a time), the first proof per key, the counts and
last versions. It returns one row per (pair, key) seen in either replica; Spark then
names the pairs, decides the verdicts, counts them and looks up the values of the few
witnesses. The same pass also knows, per key and replica, the key's last version there
(with the reach of its ⊥ and its highest source offset per region): the replica state
(``pipelines/state/carry.py``). The audit has the pass write the state's VERSION rows itself
(``state``: each task one Parquet file of the staged write; the carried versions the snapshot
continues are rows of their keys that also hold what the state kept of them) and return only
each replica partition's row count and checksum share (``pipelines/state/arrow_checksum.py``, equal to Spark's ``xxhash64``);
without ``state`` it returns the last versions (``Comparison.last_versions``) for ``next_state``.
Either way, no other exchange and sort-based aggregation of every row. Written as Spark windows, joins
and aggregates instead (an ordering per region and rank problem, a full join of the two
sides' keys, four exchanges and checkpoints), the comparison cost more (docs/performance.md,
the levers table): Spark's window operator copies every row into each ordering's buffer. A partition's rows are held in the Python worker while it is
solved; adaptive execution keeps partitions near 32 MB of shuffled data, and one key of a
topic partition cannot be split anyway.

Every step sorts each partition's rows a fixed number of times (2 x regions + 3 per
pair); the rows grow with versions x (replicas - 1), never with versions squared.

A small comparison (at most ``DRIVER_MAX_ROWS`` rows, when the caller knows the count from
the Delta log) runs the same function once on the driver instead: the rows come over as
Arrow (``toArrow``), every key's rows are then together, and the output goes back as a
local relation. No exchange, no checkpoint, and no Python worker to start: in a fresh JVM
the first worker costs more than the pass over that many rows (docs/performance.md).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial, reduce

from pyspark import cloudpickle
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.frames import computed_once
from pipelines.state.absent import written_in_state
from pipelines.state.carry import kept_where_gapped
from pipelines.watermarks import bottom_reach
from pipelines.vectors import MISSING, dense, sparse
from resources.staged_files import ArrowStage
from resources.tuning import on_driver, pass_tasks
from schemas.conform import conform, local_batches, local_frame
from schemas.raw import VECTOR
from schemas.divergence import DivergenceReports, DivergenceSummary

from pipelines.leapfrog_kernel import (  # noqa: F401 - earliest_proofs re-exported
    ABSENT,
    KEY_VERDICTS,
    LAST_VERSION,
    PAIR,
    PART,
    PairPlan,
    REPLICA_PARTITION,
    SIDES,
    StateFiles,
    _PAYLOAD,
    compare_columns,
    compare_keys,
    earliest_proofs,
)


# The pass runs in Spark's Python workers; they receive it by value, so executors need
# numpy and pyarrow (PySpark's own requirements for Arrow) but not this project.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ------------------------------------------------------------------- Spark side
@dataclass(frozen=True)
class ComparisonLayout:
    """The replica partitions (a handful of rows, on the driver): regions, ids, and the pairs."""

    regions: list[str]
    # (snapshot_id, replica, topic, partition, part_id, replica_id, first_gap_lower_bound)
    replica_partitions: list[tuple]
    pairs: list[tuple]  # (*PAIR, pair_id, sop_a, sop_b)
    plans: list[PairPlan]
    # (part_id, replica_id) of the replica partitions compared on their carried state only (no rows in the snapshot:
    # pipelines/state/absent.py), whose state the pass does not write again.
    absent: frozenset = frozenset()

    @property
    def gaps(self) -> bool:
        """Whether any stream compared has a gap (SPEC 3a): only then are the last versions' bounds kept."""
        return any(rp[-1] is not None for rp in self.replica_partitions)


def _bottom_end(dump) -> dict:
    """The reach of ⊥ of a key the replica never writes: L(end), or L at the dump's first gap (SPEC 3a)."""
    gap = dump["first_gap_lower_bound"]
    return gap if gap is not None else dump["end_lower_bound"]


def comparison_layout(partition_wm: DataFrame) -> ComparisonLayout:
    """Every pair of replicas holding the same topic partition, from one collect of ``partition_wm``."""
    dumps = partition_wm.select(
        *REPLICA_PARTITION, "starts_with_sop", "end_lower_bound", "pre_history_bound", "first_gap_lower_bound",
        (~written_in_state()).alias("absent"),
    ).collect()
    # Every region some U can name: the keys of L(end) and P (a superset is safe: a region no
    # vector names compares -1 <= anything).
    regions = sorted({r for d in dumps for v in (d["end_lower_bound"], d["pre_history_bound"]) if v for r in v})
    by_part: dict[tuple, list] = {}
    for dump in dumps:
        by_part.setdefault(tuple(dump[c] for c in PART), []).append(dump)
    replica_partitions, pairs, plans, absent = [], [], [], set()
    for part_id, (part, members) in enumerate(sorted(by_part.items())):
        members.sort(key=lambda d: d["replica"])
        for replica_id, dump in enumerate(members):
            replica_partitions.append(
                (*(dump[c] for c in REPLICA_PARTITION), part_id, replica_id, dump["first_gap_lower_bound"])
            )
            if dump["absent"]:
                absent.add((part_id, replica_id))
        for i, a in enumerate(members):
            for j in range(i + 1, len(members)):
                b = members[j]
                pair_id = len(pairs)
                pairs.append((*part, a["replica"], b["replica"], pair_id, a["starts_with_sop"], b["starts_with_sop"]))
                plans.append(PairPlan(
                    pair_id=pair_id, part_id=part_id, replica_ids=(i, j),
                    sop=(a["starts_with_sop"], b["starts_with_sop"]),
                    end=tuple(tuple(_bottom_end(d).get(r, MISSING) for r in regions) for d in (a, b)),
                ))
    return ComparisonLayout(regions, replica_partitions, pairs, plans, frozenset(absent))


_REPLICA_PARTITION_IDS = T.StructType([
    T.StructField("snapshot_id", T.StringType()), T.StructField("replica", T.StringType()),
    T.StructField("topic", T.StringType()), T.StructField("partition", T.IntegerType()),
    T.StructField("part_id", T.IntegerType()), T.StructField("replica_id", T.IntegerType()),
    T.StructField("first_gap_lower_bound", VECTOR),
])
_PAIRS = T.StructType([
    T.StructField("snapshot_id", T.StringType()), T.StructField("topic", T.StringType()),
    T.StructField("partition", T.IntegerType()), T.StructField("replica_a", T.StringType()),
    T.StructField("replica_b", T.StringType()), T.StructField("pair_id", T.LongType()),
    T.StructField("sop_a", T.BooleanType()), T.StructField("sop_b", T.BooleanType()),
])


_PARTS = T.StructType([
    T.StructField("snapshot_id", T.StringType()), T.StructField("topic", T.StringType()),
    T.StructField("partition", T.IntegerType()), T.StructField("part_id", T.IntegerType()),
])


def _replica_partition_ids(spark, layout: ComparisonLayout) -> DataFrame:
    return local_frame(spark, layout.replica_partitions, _REPLICA_PARTITION_IDS)


def _compared(
    row_watermarks: DataFrame, layout: ComparisonLayout, ids: DataFrame, driver: bool, state: StateFiles | None = None,
    tasks: int | None = None,
) -> DataFrame:
    """``compare_keys`` over every key: one exchange by (topic partition, key), then the pass.

    ``ids``: ``_replica_partition_ids`` of ``layout``, which name each row's replica partition by number.
    ``driver``: the rows are few (``DRIVER_MAX_ROWS``): collect them through Arrow and run
    the pass once, here, over all of them (it needs only a key's rows together, and all are),
    its output a local relation; no exchange, and no Python worker to start.
    ``tasks``: the exchange's partitions (``pass_tasks``: one per core for a few hundred thousand rows, which adaptive
    execution would merge into one task); None: adaptive execution's.
    ``state``: the pass writes the replica state's VERSION rows (``compare_keys``); the carried versions among the
    rows (``carry_over(prior_payload=True)``) hold what the state kept of them, which the pass continues.
    """
    regions = layout.regions
    # ⊥'s reach stops at the dump's first gap (SPEC 3a): a row after it gives that gap's L, not its own.
    dense_of = {"u": dense(F.col("touch_bound"), regions), "m": dense(F.col("reach"), regions),
                "l": dense(bottom_reach(), regions)}
    prior: dict[str, Column] = {}  # what the state kept of each carried version, as the pass reads it (``_prior_of``)
    if state is not None and "is_prior" in row_watermarks.columns:
        touch = dense(F.col("prior_touch"), regions)
        prior = {name: F.col(name) for name in ("is_prior", "prior_origin", "prior_missing")} | {
            f"prior_touch_{r}": F.coalesce(touch[r], F.lit(MISSING).cast(T.LongType())) for r in range(len(regions))}
    flat = row_watermarks.join(F.broadcast(ids), on=list(REPLICA_PARTITION), how="inner").select(
        "part_id", "replica_id", "key", "offset", F.col("value_hash").alias("token"),
        F.col("touch_bound").isNotNull().alias("known"), F.col("missing_before").alias("missing"),
        *[dense_of[v].alias(v) for v in dense_of], *_PAYLOAD, *[column.alias(name) for name, column in prior.items()],
    ).select(
        "part_id", "replica_id", "key", "offset", "token", "known", "missing",
        *[F.coalesce(F.col(v)[r], F.lit(MISSING).cast(T.LongType())).alias(f"{v}_{r}")
          for v in dense_of for r in range(len(regions))],
        *_PAYLOAD, *prior,
    )
    schema = compare_columns(len(regions))
    kernel = partial(compare_keys, pairs=layout.plans, region_names=tuple(regions), gaps=layout.gaps, state=state)
    if driver:
        return local_batches(row_watermarks.sparkSession, kernel(iter(flat.toArrow().to_batches())), schema)
    exchanged = flat.repartition("part_id", "key") if tasks is None else flat.repartition(tasks, "part_id", "key")
    return exchanged.mapInArrow(kernel, schema)


def _verdicts(compared: DataFrame, pairs: DataFrame, regions: list[str]) -> DataFrame:
    """Every pair key with its verdict, version counts and (when proven) witness vectors, named by its pair."""
    rows_a, rows_b = F.col("rows_a"), F.col("rows_b")
    versions_a = rows_a + F.col("sop_a").cast(T.LongType())
    versions_b = rows_b + F.col("sop_b").cast(T.LongType())
    proven = F.col("proven")

    def last_hash(s: str) -> Column:
        return F.coalesce(F.col(f"last_hash_{s}"), F.when(F.col(f"sop_{s}"), F.lit(ABSENT)))

    verdict = (
        F.when(proven & ((rows_a == 0) | (rows_b == 0)), F.lit("MISSING"))
        .when(proven, F.lit("DIVERGENT"))
        .when((versions_a == 0) | (versions_b == 0) | (last_hash("a") != last_hash("b")), F.lit("IN_FLIGHT"))
        .otherwise(F.lit("CONSISTENT"))
    )
    # A proof needs a version on both sides, so a side without data rows holds only ⊥.
    missing_in = F.when(proven & (rows_a == 0), F.col("replica_a")).when(proven & (rows_b == 0), F.col("replica_b"))
    vectors = [
        F.when(proven, sparse([F.col(f"{v}_{s}_{r}") for r in range(len(regions))], regions)).alias(f"{name}_{s}")
        for s in SIDES for v, name in (("touch", "touch_bound"), ("reach", "reach"))
    ]
    return compared.join(F.broadcast(pairs), on="pair_id", how="inner").select(
        *PAIR, "key", verdict.alias("verdict"), missing_in.alias("missing_in"),
        *[F.col(f"{c}_{s}") for c in ("witness_offset", "witness_hash", "last_offset") for s in SIDES],
        last_hash("a").alias("last_hash_a"), last_hash("b").alias("last_hash_b"),
        versions_a.alias("versions_a"), versions_b.alias("versions_b"), *vectors,
    )


def _with_values(reports: DataFrame, values: DataFrame | None) -> DataFrame:
    """The value of each witness, looked up by its position in ``values`` (``raw_topic_snapshots``' rows).

    The values travel nowhere else: the comparison carries each version's token (``value_hash``). One join of the
    few witnesses against ``values``; ⊥ has no value, and a witness ``values`` does not hold (a version carried from
    an earlier snapshot, whose value is in that snapshot's ``raw_topic_snapshots``) keeps a null value beside its
    hash. ``values`` None: every witness's value is left null.
    """
    if values is None:
        return reports.select("*", *[F.lit(None).cast(T.StringType()).alias(f"witness_value_{s}") for s in SIDES])
    wanted = reports.select(
        *PART, "key", F.inline(F.array(*[
            F.struct(F.col(f"replica_{s}").alias("replica"), F.col(f"witness_offset_{s}").alias("offset"))
            for s in SIDES
        ]))
    ).where(F.col("offset").isNotNull()).distinct()
    # The values never go into a broadcast (a few witnesses can hold gigabytes): the positions wanted are broadcast
    # to the scan of the values, and the values found are joined to the reports by a sort-merge join, which spills.
    found = values.where(F.col("kind") == "PUT").join(
        F.broadcast(wanted), on=[*REPLICA_PARTITION, "key", "offset"], how="inner"
    ).select(*REPLICA_PARTITION, "key", "offset", "value")
    for s in SIDES:
        side = found.select(
            *PART, F.col("replica").alias(f"replica_{s}"), "key",
            F.col("offset").alias(f"witness_offset_{s}"), F.col("value").alias(f"witness_value_{s}"),
        )
        reports = reports.join(
            side.hint("shuffle_merge"), on=[*PART, f"replica_{s}", "key", f"witness_offset_{s}"], how="left"
        )
    return reports


PARTITION_KEY_COUNTS = ("partition_keys_compared", *(f"partition_keys_{v.lower()}" for v in KEY_VERDICTS))


def _partition_keys(compared: DataFrame, layout: ComparisonLayout) -> DataFrame:
    """Per topic partition: its keys, each counted once under its worst verdict over the partition's pairs.

    The pass counted them per task (``_key_counts``); this adds the tasks' few rows up (one per topic partition and
    task), named by the partition.
    """
    spark = compared.sparkSession
    parts = local_frame(spark, sorted({(rp[0], rp[2], rp[3], rp[4]) for rp in layout.replica_partitions}), _PARTS)
    counted = compared.where(F.col("pair_id").isNull() & F.col("replica_id").isNull() & F.col("part_id").isNotNull())
    sums = counted.groupBy("part_id").agg(*[
        F.sum(f"part_keys_{v.lower()}").alias(f"partition_keys_{v.lower()}") for v in KEY_VERDICTS
    ])
    return parts.join(sums, on="part_id", how="inner").select(
        *PART, (reduce(lambda x, y: x + y, [F.col(f"partition_keys_{v.lower()}") for v in KEY_VERDICTS]))
        .alias("partition_keys_compared"), *[f"partition_keys_{v.lower()}" for v in KEY_VERDICTS],
    )


_SETTLED_COUNTS = T.StructType([
    T.StructField("snapshot_id", T.StringType()), T.StructField("topic", T.StringType()),
    T.StructField("partition", T.IntegerType()), T.StructField("settled", T.LongType()),
])


def _summary(pairs: DataFrame, verdicts: DataFrame, partition_keys: DataFrame,
             settled: DataFrame | None = None) -> DataFrame:
    """Per replica pair and topic partition: its key pairs per verdict, and the topic partition's keys per verdict
    (``partition_keys_*``, each key once under its worst verdict over the partition's pairs; the same on every pair
    row of the partition). ``settled``: per topic partition, its settled keys (``pipelines/state/settled.py``), not
    compared by the pass: compared and CONSISTENT in every pair of the partition."""
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
    summary = pairs.select(*PAIR).join(counts, on=list(PAIR), how="left").join(
        partition_keys, on=list(PART), how="left"
    ).select(*PAIR, *[F.coalesce(F.col(c), zero).alias(c) for c in (*counted, *PARTITION_KEY_COUNTS)])
    if settled is None:
        return summary
    more = F.coalesce(F.col("settled"), zero)
    grown = ("keys_compared", "consistent", "partition_keys_compared", "partition_keys_consistent")
    return summary.join(F.broadcast(settled), on=list(PART), how="left").select(
        *PAIR, *[(F.col(c) + more).alias(c) if c in grown else F.col(c) for c in (*counted, *PARTITION_KEY_COUNTS)])


def _gap_bounds(regions: list[str], gaps: bool) -> list[Column]:
    """A last version's ``touch_bound``, ``reach`` and ``missing_before`` where its stream has a gap, else nulls.

    Without a gap the next snapshot recomputes both bounds from the state's other columns
    (section 3), so they are not kept (``kept_where_gapped``); without any gap in the
    comparison the pass does not even return them.
    """
    if not gaps:
        return [F.lit(None).cast(VECTOR).alias("touch_bound"), F.lit(None).cast(VECTOR).alias("reach"),
                F.lit(None).cast(T.LongType()).alias("missing_before")]
    return kept_where_gapped({
        "touch_bound": F.when(F.col("last_known"), sparse([F.col(f"last_touch_{r}") for r in range(len(regions))],
                                                           regions)),
        "reach": sparse([F.col(f"last_reach_{r}") for r in range(len(regions))], regions),
        "missing_before": F.col("last_missing"),
    })


@dataclass(frozen=True)
class Comparison:
    """What the pass gives: ``divergence_reports``, ``divergence_summary``, and every key's last version per replica.

    ``last_versions``: one row per (snapshot, replica, topic, partition, key) with the last
    version's ``LAST_VERSION`` columns, its ``touch_bound``, ``reach`` and ``missing_before``,
    ``first_lower_bound`` (the reach of ⊥: ``L`` of the key's first row, or ``L`` at the first
    gap before it) and ``touched`` (the highest ``source_offset`` per region of the key's rows), which
    ``pipelines.state.carry.next_state`` turns into the replica state. None when the pass wrote the
    state's VERSION rows itself (``state``): then ``state_sums`` gives, per replica partition, the rows
    it wrote and their checksum (``state_rows``, ``state_checksum``), which the contexts keep.
    """

    reports: DataFrame
    summary: DataFrame
    last_versions: DataFrame | None
    state_sums: DataFrame | None = None


def state_files(stage: ArrowStage, layout: ComparisonLayout) -> StateFiles:
    """Where the pass writes the replica state's VERSION rows, and the replica partitions it names (the absent ones
    are compared, not written: ``StateFiles.absent``)."""
    return StateFiles(stage, tuple(
        (part_id, replica_id, replica, topic, partition, gap is not None)
        for _, replica, topic, partition, part_id, replica_id, gap in layout.replica_partitions
    ), layout.absent)


def compare(
    row_watermarks: DataFrame, partition_wm: DataFrame, layout: ComparisonLayout | None = None, rows: int | None = None,
    values: DataFrame | None = None, state: StateFiles | None = None, settled: dict[tuple[str, int], int] | None = None,
) -> Comparison:
    """Leap Frog over every replica pair, and every key's last version per replica, from one pass.

    ``layout`` is ``comparison_layout(partition_wm)`` when the caller has it already, else it
    is read here. The pass's output is computed once (a local checkpoint, or a local relation
    when it ran on the driver); the reports, the summary and the last versions each read it.
    ``rows``: at most how many rows ``row_watermarks`` holds, when the caller knows (the Delta
    log does); at most ``DRIVER_MAX_ROWS`` the pass runs on the driver. ``values``: the snapshot's
    ``raw_topic_snapshots`` rows, where the witnesses' values are looked up (``_with_values``).
    ``state``: the pass writes the replica state's VERSION rows there (``state_files``), the rows
    ``next_state`` makes of ``last_versions`` and the carried versions (the rows of ``row_watermarks`` that
    ``carry_over(prior_payload=True)`` marks ``is_prior``); they are written when this returns. ``settled``: per
    (topic, partition), the keys left out of ``row_watermarks`` as settled (``pipelines/state/settled.py``), counted
    as compared and CONSISTENT in every pair of the partition.
    """
    layout = comparison_layout(partition_wm) if layout is None else layout
    spark = row_watermarks.sparkSession
    pairs = local_frame(spark, layout.pairs, _PAIRS)
    ids = _replica_partition_ids(spark, layout)
    driver = on_driver(rows)
    compared = _compared(row_watermarks, layout, ids, driver, state,
                         tasks=pass_tasks(rows, spark.sparkContext.defaultParallelism))
    compared = compared if driver else computed_once(compared)
    per_pair = compared.where(F.col("pair_id").isNotNull())
    verdicts = _verdicts(per_pair, pairs, layout.regions)
    reports = _with_values(verdicts.where(F.col("verdict") != "CONSISTENT"), values)
    regions = layout.regions
    per_replica = compared.where(F.col("pair_id").isNull() & F.col("replica_id").isNotNull()).join(
        F.broadcast(ids), on=["part_id", "replica_id"], how="inner"
    )
    settled_counts = None
    if settled:
        snapshot_id = layout.replica_partitions[0][0]
        settled_counts = local_frame(spark, [(snapshot_id, topic, partition, n)
                                             for (topic, partition), n in sorted(settled.items())], _SETTLED_COUNTS)
    last_versions = state_sums = None
    if state is None:
        last_versions = per_replica.select(
            *REPLICA_PARTITION, "key", *[F.col(f"last_{name}").alias(name) for name, _ in LAST_VERSION],
            sparse([F.col(f"first_lower_{r}") for r in range(len(regions))], regions).alias("first_lower_bound"),
            sparse([F.col(f"touched_{r}") for r in range(len(regions))], regions).alias("touched"),
            *_gap_bounds(regions, layout.gaps),
        )
    else:
        state_sums = per_replica.select(*REPLICA_PARTITION, "state_rows", "state_checksum")
    return Comparison(
        reports=conform(reports, DivergenceReports.to_structtype()),
        summary=conform(_summary(pairs, verdicts, _partition_keys(compared, layout), settled_counts),
                        DivergenceSummary.to_structtype()),
        last_versions=last_versions,
        state_sums=state_sums,
    )


def compare_replicas(
    row_watermarks: DataFrame, partition_wm: DataFrame, layout: ComparisonLayout | None = None, rows: int | None = None,
    values: DataFrame | None = None,
) -> tuple[DataFrame, DataFrame]:
    """Leap Frog over every replica pair: (``divergence_reports``, ``divergence_summary``) of ``compare``."""
    comparison = compare(row_watermarks, partition_wm, layout, rows, values)
    return comparison.reports, comparison.summary
