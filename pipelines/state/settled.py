"""Settled keys: carried keys that a snapshot does not write and whose verdict cannot change, left out of its pass.

An incremental audit of a small cut continues a state that holds every key's last version per replica partition
(``carry.py``). Most of those keys are not written by the cut, and for most of them the comparison can only find
what it found before: every replica holds the same last value. Such a key is *settled* in snapshot S when, in a topic
partition T:

- every replica partition of T that S compares continues the state of one and the same snapshot P0, has rows in S
  (none absent), and its stream has no gap so far (SPEC 3a: no gap in an earlier dump, between P0 and S, or in S)
  and a known ``P`` (a heartbeat vector; the stream's ``P`` stays what it is once known);
- S writes the key in no replica of T;
- P0's state holds a VERSION row of the key for every replica partition of T, all of the same content (``kind`` and
  ``value_hash``), with none of the bounds a gap keeps and no value (a state written before values left it);
- no pre-dump version proves anything: for every replica A of T whose stream starts with START_OF_PUSH and every
  other replica B, ``U(last version of B) <= M(⊥ of A)`` does not hold, where ``U = max(P of B's stream, key_touch)``
  and ``M(⊥ of A)`` is A's ``first_lower_bound``, as ``carry_over`` gives them to the comparison.

Then S's comparison of the key (SPEC 4) sees, per replica, only ⊥ (where the stream starts with START_OF_PUSH) and the
carried last version. The last versions hold one content, so only a pair (⊥ of A, last version w of B) could prove a
divergence, and it needs ``U(w) <= M(⊥ of A)`` (``U(⊥) = {}`` is below every reach); both sides of that are fixed by
the state (``P`` known, no gap, the key untouched), and it does not hold. Every pair's verdict is CONSISTENT: the
key's last versions are equal and present on both sides. So S counts the key as compared and CONSISTENT in every
pair of T without passing it through the comparison, and its state rows are P0's rows unchanged (the pass would write
the same: ``key_touch`` and ``first_lower_bound`` as carried, ``origin_snapshot_id`` the carried one, no bounds
without a gap), with P0's share of the checksum for them.

The rule is decided per state file (``settle_files``: one Spark task per core reads its share of the files with
pyarrow): the comparison's pass writes every replica's VERSION row of a key into one file, and so does the copy, so
the rows a key needs are together. A key whose
rows a rewrite spread over several files is not settled there, and is compared as before: a missed settlement costs
time, never a verdict. Only the embedded Delta engine lists a state's files (``DeltaStore.snapshot_files``); with
delta-spark every carried key is compared.

That read is the carried state's only one where keys settle: it also counts every VERSION row of the states
continued for the commit-context check (``prior.check_state``, made before anything is committed), and hands the
settling topic partitions' other rows to ``carry_over`` as they are (``Settled.carried``), so Spark scans the state
only for topic partitions that settle nothing.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.arrow_vectors import dense_vectors
from pipelines.frames import computed_once
from pipelines.state.arrow_checksum import STATE_SUMS, signed, state_file, state_sums
from pipelines.state.rows import VERSION, VERSION_COLUMNS
from pipelines.stream_pass import task_number
from resources.staged_files import ArrowStage
from schemas.conform import local_frame


@dataclass(frozen=True)
class SettledPart:
    """A topic partition whose carried keys may be settled: every replica partition continues ``previous``."""

    topic: str
    partition: int
    previous: str  # the snapshot whose state every replica partition of the topic partition continues
    replicas: tuple[str, ...]  # sorted
    sop: tuple[bool, ...]  # per replica: its stream starts with START_OF_PUSH
    pre_history: tuple[tuple[tuple[str, int], ...], ...]  # per replica: its stream's P, as sorted items


def settled_parts(
    partitions: Sequence[Mapping[str, Any]], links: Sequence[Mapping[str, Any]], contexts: Sequence[Mapping[str, Any]],
) -> list[SettledPart]:
    """The topic partitions where S may settle keys (the module's first rule), from a handful of driver rows.

    ``partitions``: S's ``partition_watermarks`` rows (with the absent ones' rows); ``links``: ``PriorState.links``
    (a replica partition without one is not continued); ``contexts``: the chosen CONTEXT rows
    (``PriorState.context``). A stream's gap may be in an earlier dump (the context's), between the state and S (S
    starting past the state's last offset: counted as a gap here even where the positions between were read and
    skipped by rule, which only settles fewer keys), or in S.
    """
    link_of = {(l["replica"], l["topic"], l["partition"]): l for l in links}
    context_of = {(c["snapshot_id"], c["replica"], c["topic"], c["partition"]): c for c in contexts}
    by_part: dict[tuple, list] = {}
    for dump in partitions:
        by_part.setdefault((dump["topic"], dump["partition"]), []).append(dump)
    parts = []
    for (topic, partition), members in sorted(by_part.items()):
        members = sorted(members, key=lambda d: d["replica"])
        links_here = [link_of.get((d["replica"], topic, partition)) for d in members]
        if len(members) < 2 or any(link is None or link.get("absent") or link["previous_snapshot_id"] is None
                                   for link in links_here):
            continue
        previous = {link["previous_snapshot_id"] for link in links_here}
        if len(previous) != 1 or any(d["first_gap_lower_bound"] is not None
                                     or link["first_offset"] > link["previous_last_offset"] + 1
                                     for d, link in zip(members, links_here)):
            continue
        (p0,) = previous
        found = [context_of.get((p0, d["replica"], topic, partition)) for d in members]
        if any(c is None or c["pre_history_bound"] is None or c["first_gap_lower_bound"] is not None
               or (c["gap_positions"] or 0) > 0 for c in found):
            continue
        parts.append(SettledPart(
            topic=topic, partition=partition, previous=p0, replicas=tuple(d["replica"] for d in members),
            sop=tuple(bool(c["starts_with_sop"]) for c in found),
            pre_history=tuple(tuple(sorted(dict(c["pre_history_bound"]).items())) for c in found),
        ))
    return parts


# What ``settle_files`` returns, in ``replica_state``'s columns: the VERSION rows of the settling topic partitions
# that are not settled (as read), and per snapshot and replica partition, in ``state_rows`` and ``state_checksum``,
# this task's share of the settled rows written (SETTLED) and of every other VERSION row read (FOUND): together, the
# check's counts.
FOUND, SETTLED = "FOUND", "SETTLED"


def settled_in(rows: pa.Table, part: SettledPart, touched: pa.Array | None) -> np.ndarray:
    """Which of ``rows`` (VERSION rows of ``part``'s topic partition in the state of ``part.previous``) belong to
    settled keys (the module's rules but the first): a mask over ``rows``."""
    n, count = len(part.replicas), rows.num_rows
    replica = pc.index_in(rows["replica"], value_set=pa.array(part.replicas, pa.string()))
    usable = replica.is_valid().to_numpy(zero_copy_only=False)
    # A settled key's rows are copied as they are: none may hold what only a gap keeps, or a value.
    for name in ("touch_bound", "reach", "missing_before", "value"):
        usable &= rows[name].is_null().to_numpy(zero_copy_only=False)
    if touched is not None and len(touched):
        usable &= ~pc.is_in(rows["key"], value_set=touched).to_numpy(zero_copy_only=False)
    keys = pc.dictionary_encode(rows["key"]).combine_chunks().indices.to_numpy(zero_copy_only=False).astype(np.int64)
    replica = replica.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    at = np.flatnonzero(usable)
    at = at[np.lexsort((replica[at], keys[at]))]
    settled = np.zeros(count, bool)
    if not len(at):
        return settled
    starts = np.flatnonzero(np.r_[True, keys[at][1:] != keys[at][:-1]])
    sizes = np.diff(np.append(starts, len(at)))
    whole = starts[sizes == n]  # a row for every replica (one row per replica partition and key)
    if not len(whole):
        return settled
    group = at[whole[:, None] + np.arange(n)]  # (keys, n): each key's rows, by replica
    complete = (replica[group] == np.arange(n)).all(axis=1)
    content = pc.binary_join_element_wise(rows["kind"].fill_null(""), rows["value_hash"].fill_null(""), "\x00")
    token = pc.dictionary_encode(content).combine_chunks().indices.to_numpy(zero_copy_only=False)[group]
    same = (token == token[:, :1]).all(axis=1)
    # U of each last version (P of its stream and its key_touch) against M of each pre-dump version (its
    # first_lower_bound), over every region either names.
    names = {r for p in part.pre_history for r, _ in p}
    for name in ("key_touch", "first_lower_bound"):
        names.update(pc.unique(rows[name].combine_chunks().keys).to_pylist())
    listed = sorted(names)
    regions = pa.array(listed, pa.string())
    pre_history = np.full((n, len(listed)), -1, np.int64)
    for i, p in enumerate(part.pre_history):
        for region, offset in p:
            pre_history[i, listed.index(region)] = offset
    touch = np.maximum(dense_vectors(rows["key_touch"], regions)[group], pre_history[None, :, :])
    reach_of_bottom = dense_vectors(rows["first_lower_bound"], regions)[group]
    proof = np.zeros(len(group), bool)
    for a in range(n):
        if part.sop[a]:
            for b in range(n):
                if b != a:
                    proof |= (touch[:, b, :] <= reach_of_bottom[:, a, :]).all(axis=1)
    settled[group[complete & same & ~proof].ravel()] = True
    return settled


def settle_files(
    ids: Iterator[pa.RecordBatch], files: tuple[tuple[str, object, str], ...], parts: tuple[SettledPart, ...],
    touched: Mapping[tuple[str, int], pa.Array], schema: pa.Schema, stage: ArrowStage,
) -> Iterator[pa.RecordBatch]:
    """Per state file whose number ``ids`` hold: the settled keys' VERSION rows written into S's state (one file per
    task, ``settled-NNNNN``; SETTLED counts them), every other VERSION row counted (FOUND), and the other rows of
    ``parts``' replica partitions returned as they are, for the comparison. In ``schema`` (``replica_state``'s), see
    FOUND.

    ``files``: (snapshot id, pyarrow filesystem, path) of the states continued; ``touched``: per topic partition of
    ``parts``, the keys S writes there.
    """
    by_previous: dict[str, list[SettledPart]] = {}
    for part in parts:
        by_previous.setdefault(part.previous, []).append(part)
    file = stage.files(task_number(), name=f"settled-{task_number():05d}")
    written: list[pa.Table] = []
    try:
        for batch in ids:
            for number in batch.column(0).to_pylist():
                rows = state_file(files[number], schema, "row_kind", VERSION)
                # Each row is hashed once: the settled ones below (SETTLED), the others here (FOUND); the check
                # adds both up.
                unsettled = np.ones(rows.num_rows, bool)
                for part in by_previous.get(files[number][0], ()):
                    where = pc.and_(
                        pc.and_(pc.equal(rows["topic"], part.topic), pc.equal(rows["partition"], part.partition)),
                        pc.is_in(rows["replica"], value_set=pa.array(part.replicas, pa.string())))
                    at = np.flatnonzero(where.to_numpy(zero_copy_only=False))
                    if not len(at):
                        continue
                    here = rows.take(at)
                    mask = settled_in(here, part, touched.get((part.topic, part.partition)))
                    if mask.any():
                        chosen = here.filter(pa.array(mask))
                        for out in chosen.to_batches():
                            file.write(out)
                        written.append(chosen)
                        unsettled[at[mask]] = False
                    yield from here.filter(pa.array(~mask)).to_batches()
                yield from _sums(FOUND, rows.filter(pa.array(unsettled)).to_batches(), schema)
        file.close()
    except BaseException:
        file.abort()
        raise
    yield from _sums(SETTLED, (b for table in written for b in table.to_batches()), schema)


def _sums(kind: str, batches: Iterator[pa.RecordBatch], schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """``state_sums`` of ``batches`` as rows of kind ``kind`` in ``schema``: the count in ``state_rows``, the share of
    the checksum in ``state_checksum``."""
    for sums in state_sums(batches, VERSION_COLUMNS):
        count = sums.num_rows
        named = {"row_kind": pa.repeat(pa.scalar(kind), count), "state_rows": sums.column("found_rows"),
                 "state_checksum": sums.column("found_checksum"),
                 **{name: sums.column(name) for name in STATE_SUMS}}
        yield pa.RecordBatch.from_arrays(
            [named[f.name].cast(f.type) if f.name in named else pa.nulls(count, f.type) for f in schema],
            schema=schema)


@dataclass(frozen=True)
class Settled:
    """What one read of the continued states gave (``settle``): the carried rows the comparison still needs, the
    check's counts, and what settling wrote into S's state.

    ``versions``: the VERSION rows of ``parts``' replica partitions that were not settled (the rest of the carried
    versions are read from the state as usual: ``carried``); ``found``: every VERSION row read, per (snapshot,
    replica, topic, partition): (rows, checksum), what ``check_state`` checks the contexts against; ``counts``: per
    topic partition, its settled keys (compared and CONSISTENT in every pair); ``sums``: each task's rows and
    checksum share written, per replica partition (``contexts_from_sums`` adds them up).
    """

    versions: DataFrame
    parts: tuple[SettledPart, ...]
    found: dict[tuple[str, str, str, int], tuple[int, int]]
    counts: dict[tuple[str, int], int]
    sums: list[tuple[str, str, int, int, int]]  # replica, topic, partition, state_rows, state_checksum

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def carried(self, prior_versions: DataFrame, links: Sequence[Mapping[str, Any]]) -> DataFrame:
        """The carried VERSION rows for ``carry_over``: the ones read here, and ``prior_versions`` (the state as
        Spark reads it) only for the topic partitions of ``links`` (``PriorState.links``) that settle nothing."""
        mine = {(p.topic, p.partition) for p in self.parts}
        others = sorted({(link["topic"], link["partition"]) for link in links} - mine)
        if not others:
            return self.versions
        spark = self.versions.sparkSession
        rest = local_frame(spark, others, T.StructType([prior_versions.schema["topic"],
                                                        prior_versions.schema["partition"]]))
        return self.versions.unionByName(
            prior_versions.join(F.broadcast(rest), on=["topic", "partition"], how="left_semi"))


def settle(
    spark: SparkSession, stage: ArrowStage, files: Mapping[str, list[Any]], parts: Sequence[SettledPart],
    rows: DataFrame,
) -> Settled | None:
    """Read the continued states once (``files``: ``DeltaStore.snapshot_files`` of every state continued): count
    every VERSION row for the check, settle the carried keys of ``parts`` that S's ``rows`` (its
    ``reconstructed_watermarks``) do not write (their state rows go into ``stage``, S's ``replica_state``, and they
    leave the comparison), and keep the other rows of ``parts`` for the comparison. None: nothing to settle (no
    part) or no file listed.

    One Spark job reads the keys S writes (a small cut's rows), one (a task per core, each reading its share of the
    files; computed once) does the rest.
    """
    from pyspark.sql.pandas.types import to_arrow_schema

    from schemas.state import ReplicaState

    if not parts:
        return None
    # A small cut's rows (at most BROADCAST_MAX_ROWS): their keys come over as they are, made distinct here.
    written = rows.select("topic", "partition", "key").toArrow()
    touched = {}
    for part in parts:
        here = written.filter(pc.and_(pc.equal(written["topic"], part.topic),
                                      pc.equal(written["partition"], part.partition)))
        touched[(part.topic, part.partition)] = pc.unique(here["key"].combine_chunks())
    listed = tuple((snapshot_id, location.fs, location.path)
                   for snapshot_id in sorted(files) for location in files[snapshot_id])
    if not listed:
        return None
    struct = ReplicaState.to_structtype()
    run = partial(settle_files, files=listed, parts=tuple(parts), touched=touched, schema=to_arrow_schema(struct),
                  stage=stage)
    # A task per core, each reading its share of the files (a task costs more than a file's work).
    tasks = max(1, min(len(listed), spark.sparkContext.defaultParallelism))
    read = computed_once(spark.range(0, len(listed), 1, tasks).mapInArrow(run, struct))
    shares = read.where(F.col("row_kind").isin(FOUND, SETTLED)).select(
        "row_kind", *STATE_SUMS, "state_rows", "state_checksum").collect()
    found: dict[tuple[str, str, str, int], list[int]] = {}
    sums = []
    for share in shares:
        total = found.setdefault(tuple(share[k] for k in STATE_SUMS), [0, 0])
        total[0] += share["state_rows"]
        total[1] += share["state_checksum"]
        if share["row_kind"] == SETTLED:
            sums.append((share["replica"], share["topic"], share["partition"], share["state_rows"],
                         share["state_checksum"]))
    # Each settled key has one row per replica partition: a topic partition's keys are its first replica's rows.
    first = {(p.replicas[0], p.topic, p.partition) for p in parts}
    counts: dict[tuple[str, int], int] = {}
    for replica, topic, partition, rows_written, _ in sums:
        if (replica, topic, partition) in first:
            counts[(topic, partition)] = counts.get((topic, partition), 0) + rows_written
    return Settled(versions=read.where(F.col("row_kind") == VERSION), parts=tuple(parts),
                   found={k: (n, signed(c)) for k, (n, c) in found.items()}, counts=counts, sums=sums)


cloudpickle.register_pickle_by_value(sys.modules[__name__])
