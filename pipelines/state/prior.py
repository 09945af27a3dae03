"""Which state a snapshot continues (the predecessor rule), checked and verified; which states are kept.

An incremental audit (``pipelines/state/carry.py``) continues a snapshot S from the state an
earlier snapshot left in ``replica_state`` (its rows: ``pipelines/state/rows.py``). This
module chooses that state (``predecessors``), has the overlap of the two dumps verified
(``pipelines/state/overlap.py``) and the state checked against its commit context
(``pipelines/state/check.py``), and refuses rather than guess (``prior_state``, ``StateRefused``);
``retained_states`` decides which states are kept for later snapshots to continue.

The predecessor rule
--------------------
For each (replica, topic, partition) of S whose dump does not start with START_OF_PUSH,
the predecessor is the CONTEXT row, among the ``replica_state`` partitions of the other
snapshots, with the greatest ``last_offset`` below S's first offset of that replica
partition. A dump starting with START_OF_PUSH starts a fresh stream; no predecessor
means a fresh mid-stream start, audited as a lone snapshot. S's own partition of the
state is never read: re-materializing S uses the state before S, so it is idempotent.
The offsets between the predecessor's ``last_offset`` and S's first offset are taken to
hold no version-topic row (version-topic offsets may skip); the dumps are trusted to be
of one log when their (replica, topic, partition) match.

Absent replica partitions. A broker snapshot's cut may list a replica partition S holds no
rows of (``pipelines/state/absent.py``): its "dump" starts at the cut's ``s`` and reads nothing,
and the same rule chooses its predecessor (the greatest ``last_offset`` below ``s``), so later
snapshots' states (from ``s`` on) never change the choice. One without a predecessor is not
compared and refuses nothing: S read nothing of it.

Overlapping dumps. Dump tools re-read a little of what they dumped last time. When S's
offsets intersect exactly one context's ``first_offset..last_offset``, and S starts
inside it and ends past it (``first_offset < S's first <= last_offset < S's last``),
that context is the predecessor, *once the overlap is verified* (``overlap_differences``):
S's rows of ``raw_topic_snapshots`` at offsets S's first..``last_offset`` must be the
predecessor snapshot's rows there, the same offsets and at each offset the same messages
(every SPEC message field, vectors as their sorted entries; ``source_file``, ``copies``
and unknown extra fields are bookkeeping, not compared). The comparison is a Spark join
and aggregate: only its first difference per replica partition reaches the driver.
``carry_over`` then leaves S's rows up to the predecessor's ``last_offset`` out (they
are the state's already). What the overlap adds to ``L`` and ``P`` of S's later rows,
the state's ``L(end)`` and ``P`` hold already (they come from the same messages), so
the comparison and the state written after S are those of S trimmed by hand, but for
the CONTEXT row's ``first_offset``: it keeps S's own first offset. A snapshot's raw rows
cover every offset of its context, so a later dump that starts inside S's offsets (after
S's first) is verified against S's raw rows.

The audit refuses (``StateRefused``, which fails the run) rather than guess when:

- S's offsets of the replica partition intersect other snapshots' contexts in a way S
  cannot continue: more than one context; one that starts at or after S's first offset
  (S re-dumps all of it: does S continue that state or replace it?); or one that S lies
  within (S adds no offset to that state, and its verdicts would be the earlier ones);
- an overlap is not verified: S and the predecessor differ at some overlapping offset
  (the message names the lowest, and which side lacks it or which fields differ), or the
  predecessor's raw rows there are no longer in ``raw_topic_snapshots``;
- two snapshots' contexts end at the same greatest offset below S;
- the chosen context does not match its stored VERSION rows: their count
  (``state_rows``) or their order-independent checksum (``state_checksum``, see
  ``pipelines/state/rows.py``); or the snapshot holds two contexts for the replica
  partition.

A context row is the index of its state: deleting it (with or without its VERSION rows)
leaves nothing to continue, and the next snapshot starts fresh, which is safe.

What a step reads (bounded)
---------------------------
The predecessor rule needs only the CONTEXT rows of the other snapshots (a few per
snapshot). The divergence asset reads those alone (a filter on ``row_kind`` pushed into
the Parquet scan skips the VERSION rows) and hands them to ``prior_state`` as ``state``;
``prior_state`` then reads, through ``read_states``, only the partitions of
``replica_state`` of the chosen predecessors (usually one snapshot) for their VERSION
rows and contexts. A step's work on the state therefore does not grow with the number of
snapshots audited (before, every snapshot's VERSION rows were read, one union branch per
snapshot, and joined with the choice). The contexts read with the VERSION rows must be
the ones chosen (same replica partition and ``last_offset``): a predecessor re-written or
dropped by a concurrent audit between the two reads is refused ("changed while ... was
read"), never half used. Called with a whole ``replica_state`` and no ``read_states``,
``prior_state`` filters it to the chosen snapshots itself: the same result.

Retention. ``retained_states`` decides which states to keep under ``state_retention = N``:
per replica partition, the N contexts ending furthest along the log (greatest
``last_offset``; a context tied with the last kept one is kept too, so that a tie stays
a refusal rather than becoming a choice); a snapshot's partition of ``replica_state`` is
kept when any of its contexts is, and dropped otherwise. A later dump normally continues
the newest state; one that would have continued a dropped state (a late dump of older
offsets) finds no predecessor and starts fresh, or is refused if it overlaps a kept
state it cannot continue: both safe (a fresh start can only miss proofs). N is at least
2, so the state the newest snapshot continued is kept and re-auditing that snapshot (the
hourly schedule does) starts from the same state. The asset drops the states after its
own tables are committed (``DeltaStore.delete_snapshots``, one Delta commit); unset, every
state is kept, as before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, NoReturn

import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.state.check import PROBLEMS, context_problems, found_sums_of_arrow, found_sums_of_files
from pipelines.state.overlap import verify_overlaps
from pipelines.state.rows import CONTEXT, REPLICA_PARTITION, VERSION, partition_name
from resources.tuning import on_driver
from schemas.conform import local_batches, local_frame
from schemas.state import ReplicaState

MAX_LISTED = 20


class StateRefused(RuntimeError):
    """The prior state cannot be trusted or its predecessor is ambiguous: the snapshot is not audited."""


@dataclass(frozen=True)
class PriorState:
    """The state a snapshot continues: the chosen CONTEXT rows, their VERSION rows, and a small description."""

    versions: DataFrame
    context: DataFrame
    links: list[dict[str, Any]]  # per continued replica partition: ids and offsets (a handful of rows)
    unchecked: bool = False  # the contexts are yet to be checked against their VERSION rows (``check_state``)

    @property
    def previous_snapshot_ids(self) -> list[str]:
        return sorted({link["previous_snapshot_id"] for link in self.links})

    @property
    def carried_versions(self) -> int:
        return sum(int(link["state_rows"]) for link in self.links)

    @property
    def absent(self) -> list[dict[str, Any]]:
        """The links of replica partitions compared on their carried state only (no rows in the snapshot)."""
        return [link for link in self.links if link.get("absent")]


def no_prior_state(spark: SparkSession) -> PriorState:
    """The prior state of a snapshot when no other snapshot has one: nothing carried (empty frames, no Spark job).

    What ``prior_state`` finds when ``replica_state`` holds no other snapshot's rows: no
    context can be a predecessor, so every stream starts fresh and nothing is refused.
    """
    empty = local_frame(spark, [], ReplicaState.to_structtype())
    return PriorState(versions=empty, context=empty, links=[])


# -------------------------------------------------------------- predecessors
_CONFLICT = T.StructType(
    [T.StructField("snapshot_id", T.StringType()), T.StructField("first_offset", T.LongType()),
     T.StructField("last_offset", T.LongType()), T.StructField("state_rows", T.LongType())]
)


def predecessors(partition_wm: DataFrame, contexts: DataFrame) -> DataFrame:
    """Per mid-stream replica partition of one snapshot: its predecessor (when there is one) and any conflicts.

    ``contexts`` are the CONTEXT rows of the other snapshots. Columns: ``snapshot_id``,
    the replica partition, its ``first_offset`` and ``last_offset``,
    ``previous_snapshot_id`` (null when there is none or it is ambiguous),
    ``previous_last_offset``, ``overlap`` (the predecessor's offsets reach into the
    snapshot's: its rows from ``first_offset`` to ``previous_last_offset`` are to be
    verified), ``candidates`` (the snapshots whose context ends at the greatest offset
    below the snapshot's) and ``overlapping`` (contexts whose ``first_offset..last_offset``
    intersects the snapshot's). A context the snapshot overlaps is its predecessor when it
    is the only one and the snapshot starts after its first offset and ends after its last.
    ``absent``: ``partition_wm``'s column of that name (``absent_dumps`` rows), else false.
    ``previous_state_rows``: the chosen context's ``state_rows`` (how many VERSION rows it says it has), for the
    reader to know whether they are few before reading them.
    """
    rp = list(REPLICA_PARTITION)
    # ``absent`` (``pipelines/state/absent.py``): a replica partition the cut lists but the snapshot has no rows of.
    absent = F.col("absent") if "absent" in partition_wm.columns else F.lit(False)
    mid = partition_wm.where(~F.col("starts_with_sop")).select(
        "snapshot_id", *rp, "first_offset", "last_offset", absent.alias("absent"))
    others = contexts.where(F.col("row_kind") == CONTEXT).select(
        *rp,
        F.col("snapshot_id").alias("c_snapshot"),
        F.col("first_offset").alias("c_first"),
        F.col("last_offset").alias("c_last"),
        F.col("state_rows").alias("c_rows"),
    )
    candidates = mid.join(others, on=rp, how="inner")
    before = F.col("c_last") < F.col("first_offset")
    best = candidates.groupBy(*rp).agg(F.max(F.when(before, F.col("c_last"))).alias("previous_last_offset"))
    at_best = before & (F.col("c_last") == F.col("previous_last_offset"))
    overlaps = (F.col("c_first") <= F.col("last_offset")) & (F.col("c_last") >= F.col("first_offset"))
    conflict = F.struct(
        F.col("c_snapshot").alias("snapshot_id"), F.col("c_first").alias("first_offset"),
        F.col("c_last").alias("last_offset"), F.col("c_rows").alias("state_rows"),
    )
    links = candidates.join(best, on=rp, how="inner").groupBy(*rp).agg(
        F.max("previous_last_offset").alias("previous_last_offset"),
        F.max(F.when(at_best, F.col("c_rows"))).alias("best_rows"),
        # A set: two context rows of one snapshot are the commit-context check's to report.
        F.array_sort(F.collect_set(F.when(at_best, F.col("c_snapshot")))).alias("candidates"),
        F.array_sort(F.collect_list(F.when(overlaps, conflict))).alias("overlapping"),
    )
    overlapping = F.coalesce(F.col("overlapping"), F.array().cast(T.ArrayType(_CONFLICT)))
    tied = F.coalesce(F.col("candidates"), F.array().cast(T.ArrayType(T.StringType())))
    only = F.get(overlapping, 0)
    # S starts inside the one context it overlaps and goes past its end: S continues it.
    continues_inside = (
        (F.size(overlapping) == 1)
        & (only["first_offset"] < F.col("first_offset"))
        & (only["last_offset"] < F.col("last_offset"))
    )
    below = (F.size(overlapping) == 0) & (F.size(tied) == 1)
    return mid.join(links, on=rp, how="left").select(
        "snapshot_id",
        *rp,
        "first_offset",
        "last_offset",
        F.when(continues_inside, only["snapshot_id"]).when(below, F.get(tied, 0)).alias("previous_snapshot_id"),
        F.when(continues_inside, only["last_offset"]).otherwise(F.col("previous_last_offset"))
        .alias("previous_last_offset"),
        F.coalesce(continues_inside, F.lit(False)).alias("overlap"),
        F.when(continues_inside, only["state_rows"]).when(below, F.col("best_rows")).alias("previous_state_rows"),
        tied.alias("candidates"),
        overlapping.alias("overlapping"),
        "absent",
    )


def _conflict(link: Any, snapshot_id: str) -> str:
    """Why the contexts overlapping a snapshot's dump of a replica partition give it no predecessor."""
    name, first, last = partition_name(link), link["first_offset"], link["last_offset"]
    others = link["overlapping"]
    if len(others) > 1:
        listed = ", ".join(f"{o['snapshot_id']} ({o['first_offset']}..{o['last_offset']})" for o in others)
        return (
            f"{name}: {snapshot_id} starts mid-stream at offset {first} (up to {last}), and the states of snapshots "
            f"{listed} all cover some of its offsets, so which state {snapshot_id} continues is ambiguous"
        )
    other = others[0]
    covers = (
        f"the state of snapshot {other['snapshot_id']} covers offsets {other['first_offset']}..{other['last_offset']}"
    )
    if other["first_offset"] >= first:
        return (
            f"{name}: {snapshot_id} starts mid-stream at offset {first} (up to {last}), but {covers}, from that "
            f"offset or later, so whether {snapshot_id} continues that state or replaces it is ambiguous"
        )
    return (
        f"{name}: {snapshot_id} starts mid-stream at offset {first} and ends at {last}, but {covers}: "
        f"{snapshot_id} adds no offset to that state"
    )


def prior_state(
    state: DataFrame,
    partition_wm: DataFrame,
    snapshot_id: str,
    raw: DataFrame,
    read_states: Callable[[list[str]], DataFrame] | None = None,
    absent: DataFrame | None = None,
    state_files: Callable[[list[str]], dict[str, list[Any]] | None] | None = None,
    defer_check: bool = False,
) -> PriorState:
    """The state ``snapshot_id`` continues, chosen by the predecessor rule and checked; raises ``StateRefused``.

    ``state`` is ``replica_state`` (any snapshots; ``snapshot_id``'s own rows are
    ignored): its CONTEXT rows choose the predecessors, and only they are needed there
    when ``read_states`` is given. ``read_states(ids)`` returns the ``replica_state`` rows
    (both kinds) of the snapshots ``ids``, the chosen predecessors: only their partitions
    are read for VERSION rows and the contexts carried (partition pruning; by default
    ``state`` filtered to them). ``partition_wm`` is the snapshot's
    ``partition_watermarks``, ``raw`` ``raw_topic_snapshots`` (any snapshots: only the rows
    of the snapshot and of the predecessors its dumps overlap are read, to verify the
    overlaps). Only a handful of rows reach the driver: one per mid-stream replica
    partition, per overlap, and the problems.

    ``absent``: the replica partitions the snapshot's broker cut lists without rows of them
    (``pipelines/state/absent.py``, ``absent_dumps``). Each with a predecessor (the same rule,
    from the cut's ``s``) is continued too, its link marked ``absent``; one without (none, or an
    ambiguous one) is simply not compared, as before: the snapshot read nothing of it to refuse.

    ``state_files(ids)``: the files of the snapshots ``ids`` in ``replica_state`` (``DeltaStore.snapshot_files``), or
    None where a file is not simply its rows. Given, and the carried versions too many for the driver, the check
    counts them from the files (``found_sums_of_files``) instead of Spark's read of the rows. It lists them just after
    the chosen contexts were read: a state re-written in between (a concurrent re-materialization, retention) can
    only fail the check (refused, audit again), never pass one it should not.

    ``defer_check``: where the carried versions are too many for the driver and nothing else is refused, the check
    is left to the caller (``PriorState.unchecked``), who counts the rows while reading them for another purpose and
    calls ``check_state`` before using any of them (``pipelines/state/settled.py``: one read of the state).
    """
    rp = list(REPLICA_PARTITION)
    others = state.where(F.col("snapshot_id") != snapshot_id)
    contexts = others.where(F.col("row_kind") == CONTEXT)
    dumps = partition_wm.select("snapshot_id", *rp, "first_offset", "last_offset", "starts_with_sop",
                                F.lit(False).alias("absent"))
    if absent is not None:
        dumps = dumps.unionByName(absent.select(*dumps.columns))
    # One job: the links are a row per replica partition, sorted and kept here as a local relation.
    chosen_links = predecessors(dumps, contexts)
    session = chosen_links.sparkSession
    link_rows = sorted(chosen_links.collect(), key=lambda link: tuple(link[c] for c in rp))
    links = local_frame(session, link_rows, chosen_links.schema)
    # The chosen replica partitions, from the rows just read (a local relation: no job to broadcast it).
    chosen = local_frame(
        session, [(link["previous_snapshot_id"], *(link[c] for c in rp))
                  for link in link_rows if link["previous_snapshot_id"] is not None],
        T.StructType([T.StructField("snapshot_id", T.StringType()), *(links.schema[c] for c in rp)]),
    )
    refusals = []
    for link in link_rows:
        if link["previous_snapshot_id"] is not None or link["absent"]:
            continue
        if link["overlapping"]:
            refusals.append(_conflict(link, snapshot_id))
        elif len(link["candidates"]) > 1:
            refusals.append(
                f"{partition_name(link)}: the states of snapshots {', '.join(link['candidates'])} all end at offset "
                f"{link['previous_last_offset']}, below {snapshot_id}'s first offset {link['first_offset']}, "
                f"so which one {snapshot_id} continues is ambiguous"
            )
    continued = [link for link in link_rows if link["previous_snapshot_id"] is not None]
    # Only the chosen predecessors' partitions are read whole: the state's cost does not grow with its history.
    ids = sorted({link["previous_snapshot_id"] for link in continued})
    if not ids:
        read = others.where(F.lit(False))
    elif read_states is None:
        read = others.where(F.col("snapshot_id").isin(*ids))
    else:
        read = read_states(ids).where(F.col("snapshot_id").isin(*ids))
    # The chosen replica partitions (a handful) go to the scan of the state, never the reverse: the state's Parquet
    # files are small for their rows, and Spark's estimate would broadcast every carried version.
    both = read.join(F.broadcast(chosen), on=["snapshot_id", *rp], how="inner")
    context = both.where(F.col("row_kind") == CONTEXT)
    versions = both.where(F.col("row_kind") == VERSION)
    # The chosen contexts say how many VERSION rows they have: few, both kinds are read here in one job.
    few = bool(continued) and on_driver(sum(int(link["previous_state_rows"] or 0) for link in continued))

    verified, differing = verify_overlaps(raw, links, continued, snapshot_id)
    refusals.extend(differing)
    # The chosen contexts (a row per replica partition) are read once, here: every later use (the carry, the next
    # state's contexts, the checks) reads this local copy instead of the state's files again.
    found = {}
    read_versions = None
    if continued:
        if few:
            read_both = both.toArrow()
            kinds = read_both.column("row_kind")
            read_contexts = read_both.filter(pc.equal(kinds, CONTEXT))
            read_versions = read_both.filter(pc.equal(kinds, VERSION))
        else:
            read_contexts = context.toArrow()
        context = local_batches(session, read_contexts.to_batches(), context.schema)
        # The contexts read with their VERSION rows must be the ones chosen: a partition re-written or dropped
        # (retention) by a concurrent audit between the two reads is refused, never half used.
        found = {(r["replica"], r["topic"], r["partition"], r["last_offset"]): r["state_rows"]
                 for r in read_contexts.select([*rp, "last_offset", "state_rows"]).to_pylist()}
    for link in continued:
        if (link["replica"], link["topic"], link["partition"], link["previous_last_offset"]) not in found:
            refusals.append(
                f"{partition_name(link)}: the state of snapshot {link['previous_snapshot_id']} changed while "
                f"{snapshot_id} was read (re-materialized or dropped by state retention meanwhile); audit again"
            )
    # The carried versions are counted on the driver when their contexts say they are few (``on_driver``).
    carried_rows = sum(int(rows or 0) for rows in found.values())
    found_counts = None
    deferred = False
    if continued and on_driver(carried_rows):
        # Few: read once (with the contexts when they said so), kept here for the check's checksum, counted here, and
        # for the carry (each would scan the state's files again).
        read_versions = versions.toArrow() if read_versions is None else read_versions
        versions = local_batches(session, read_versions.to_batches(), versions.schema)
        found_counts = found_sums_of_arrow(read_versions)
    elif continued and defer_check and not refusals:
        deferred = True  # the caller counts them as it reads them (check_state)
    elif continued and state_files is not None:
        # Too many for the driver: counted from the state's files themselves where the store can list them.
        files = state_files(ids)
        found_counts = found_sums_of_files(session, files) if files is not None else None
    if continued and not deferred:
        refusals.extend(_check_refusals(versions, context, found_counts))
    if refusals:
        _refuse(snapshot_id, refusals)
    # The contexts matched their VERSION rows (or are checked by check_state): their state_rows is what will be
    # carried.
    described = []
    for link in continued:
        key = (link["replica"], link["topic"], link["partition"])
        described.append({
            **{c: link[c] for c in (*rp, "previous_snapshot_id", "previous_last_offset", "first_offset")},
            "state_rows": found[(*key, link["previous_last_offset"])],
            "overlap": verified.get(key),
            "absent": bool(link["absent"]),
        })
    return PriorState(versions=versions, context=context, links=described, unchecked=deferred)


def check_state(
    prior: PriorState, snapshot_id: str, found: Mapping[tuple, tuple[int, int]] | None = None,
    state_files: Callable[[list[str]], dict[str, list[Any]] | None] | None = None,
) -> None:
    """The check ``prior_state(defer_check=True)`` left (nothing when it made it): raises ``StateRefused`` when a
    chosen context does not match its VERSION rows. ``found``: the rows' counts made while reading them (per snapshot
    and replica partition: rows, checksum); else counted from ``state_files`` (as ``prior_state`` would) or Spark's
    read of ``prior.versions``."""
    if not prior.unchecked:
        return
    if found is None and state_files is not None:
        files = state_files(prior.previous_snapshot_ids)
        found = found_sums_of_files(prior.context.sparkSession, files) if files is not None else None
    refusals = _check_refusals(prior.versions, prior.context, found)
    if refusals:
        _refuse(snapshot_id, refusals)


def _check_refusals(versions: DataFrame, context: DataFrame, found: Any) -> list[str]:
    """A refusal per chosen context that ``context_problems`` finds wrong, naming each problem."""
    problems = sorted(
        context_problems(versions, context, found=found),
        key=lambda p: (p["replica"], p["topic"], p["partition"], p["snapshot_id"], PROBLEMS.index(p["problem"])),
    )
    by_context: dict[tuple, list[str]] = {}
    for problem in problems:
        by_context.setdefault((partition_name(problem), problem["snapshot_id"]), []).append(
            f"{problem['problem']}: the context says {problem['expected']}, its VERSION rows give {problem['found']}"
        )
    return [
        f"{name}: the state of snapshot {previous} does not match its commit context "
        f"({'; '.join(found_problems)}); it was changed outside an audit"
        for (name, previous), found_problems in by_context.items()
    ]


def _refuse(snapshot_id: str, refusals: list[str]) -> NoReturn:
    listed = refusals[:MAX_LISTED]
    if len(refusals) > MAX_LISTED:
        listed.append(f"... and {len(refusals) - MAX_LISTED} more")
    raise StateRefused(
        f"refusing to audit snapshot {snapshot_id} with carried state:\n  - "
        + "\n  - ".join(listed)
        + f"\nNo divergence report of {snapshot_id} was written. Re-materialize (or remove from replica_state) "
        "the snapshot named, so that the predecessor is unambiguous and its state matches its context; a dump "
        "whose overlap with its predecessor differs is not of the same log, or one of the two was changed."
    )


# ----------------------------------------------------------------- retention
def retained_states(contexts: Iterable[Any], keep: int | None) -> tuple[list[str], list[str]]:
    """(kept, dropped) snapshot ids of ``replica_state`` under ``state_retention = keep``, from CONTEXT rows.

    ``contexts`` are CONTEXT rows (``snapshot_id``, the replica partition, ``last_offset``)
    of every snapshot's state, the one just written included. Per replica partition the
    ``keep`` contexts that end furthest along the log (greatest ``last_offset``) are kept,
    and any context tied with the last kept one (dropping one of two tied states would
    turn a refusal into a choice). A snapshot's partition is kept when any of its contexts
    is, else dropped. ``keep`` None keeps every state.
    """
    by_partition: dict[tuple, list[tuple[int, str]]] = {}
    snapshots = set()
    for row in contexts:
        snapshots.add(row["snapshot_id"])
        key = (row["replica"], row["topic"], row["partition"])
        by_partition.setdefault(key, []).append((int(row["last_offset"]), row["snapshot_id"]))
    if keep is None:
        return sorted(snapshots), []
    kept = set()
    for ends in by_partition.values():
        offsets = sorted((offset for offset, _ in ends), reverse=True)
        floor = offsets[min(keep, len(offsets)) - 1]
        kept.update(snapshot for offset, snapshot in ends if offset >= floor)
    return sorted(kept), sorted(snapshots - kept)
