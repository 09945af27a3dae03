"""Stage 4: Leap Frog divergence reports between every pair of replicas (SPEC 4), with carried state.

A snapshot whose dumps continue earlier ones is compared with the state carried over
from them (``pipelines/state/carry.py``); the state after it is written last, in one commit.
The state it continues is chosen and checked first, and a dump that overlaps it is verified
against the predecessor's raw rows (``pipelines/state/prior.py``, ``overlap.py``, ``check.py``); ``carried_from`` says,
per replica partition, which overlap was verified. A replica partition the snapshot's broker cut
lists without rows in it (``broker_cuts``; ``pipelines/state/absent.py``) is compared on its
carried state, and its state is not written again (``absent_partitions``, ``absent`` in
``carried_from``); a snapshot of files has no such rows, and reads nothing more.

Reading the state stays bounded: only the CONTEXT rows of every snapshot's state are read
to choose the predecessors (a Parquet filter skips the VERSION rows), then only the chosen
predecessors' partitions of ``replica_state`` (``load_prior_state``). ``state_retention``
(run config; ``replica-lens audit --state-retention``) then drops, in one Delta commit
after the step's tables are published, the states no later snapshot is meant to continue.

What the step skips, since every Spark job has a fixed cost in a fresh JVM and the steps run
side by side with others: when the Delta log of ``replica_state`` names no other snapshot,
no state is read at all (``no_prior_state``: nothing can be continued); the written summary
is read once, for the totals and the preview; and when it counts every key CONSISTENT the
reports are committed empty without running their plan (it looks the witnesses' values up
in every row). The comparison's pass writes the replica state's VERSION rows itself (each
key's last version per replica, from the rows it holds anyway, as Parquet from its Arrow
batches) and counts their checksums as it writes them; the step adds one small file of
contexts (``contexts_from_sums``): no exchange, checkpoint or Spark write of the state's rows.
The Delta log's row counts bound the rows the comparison reads (``comparison_rows``): a few
(``resources.tuning.DRIVER_MAX_ROWS``) are compared on the driver, without Python workers.
"""

from functools import partial, reduce
from typing import Callable, Optional

import dagster as dg
from pydantic import Field
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from assets.partitions import CRITICAL_PATH, snapshot_partitions
from assets.previews import divergence_by_pair
from assets.tables import StepTables, matching_rows, read_stage, schema_check_spec
from pipelines.frames import computed_once
from pipelines.leapfrog import compare, comparison_layout, state_files
from pipelines.state.absent import absent_dumps, absent_watermarks
from pipelines.state.carry import carry_over, contexts_from_sums, read_between
from pipelines.state.prior import (
    PriorState, StateRefused, check_state, no_prior_state, prior_state, retained_states,
)
from pipelines.state.rows import CONTEXT, REPLICA_PARTITION
from pipelines.state.settled import Settled, settle, settled_parts
from resources.delta_store import DeltaStore
from resources.errors import InvalidSetting
from resources.reports import ReportSettings
from resources.session import parquet_batches
from resources.staged_files import ArrowStage
from resources.spark import SparkResource
from resources.tuning import BROADCAST_MAX_ROWS, parquet_batch_rows

GROUP = "divergence"
KINDS = {"spark", "delta"}
PROVEN = ("DIVERGENT", "MISSING")
EXAMPLE_KEYS = 10
STATE = "replica_state"
MIN_STATE_RETENTION = 2
MAX_LISTED_DROPPED = 20


class DivergenceConfig(dg.Config):
    state_retention: Optional[int] = Field(
        default=None,
        description=(
            "States of replica_state to keep per replica partition: the N ending furthest along the log; a "
            "snapshot's state is dropped (one Delta delete) when none of its replica partitions' is kept. At least "
            f"{MIN_STATE_RETENTION}: the newest state and the one it continued, so re-auditing the newest snapshot "
            "starts from the same state. Unset: keep every state."
        ),
    )


def state_contexts(session: SparkSession, store: DeltaStore) -> DataFrame:
    """The CONTEXT rows of every snapshot's ``replica_state``, computed once (a few rows per snapshot).

    The filter on ``row_kind`` is pushed into the Parquet scan, whose row-group statistics
    skip the VERSION rows (a snapshot's contexts are written by their own tasks).
    """
    return computed_once(read_stage(session, store, STATE, None).where(F.col("row_kind") == CONTEXT))


def read_states(session: SparkSession, store: DeltaStore, snapshot_ids: list[str]) -> DataFrame:
    """The ``replica_state`` partitions of ``snapshot_ids`` only (each read by its partition alone)."""
    return reduce(DataFrame.unionByName, [read_stage(session, store, STATE, i) for i in snapshot_ids])


def state_file_lists(session: SparkSession, store: DeltaStore) -> Callable[[list[str]], Optional[dict]]:
    """The live files of given snapshots' ``replica_state`` partitions (``DeltaStore.snapshot_files``), for the
    check's and the settling read's own readers: None where only Spark may read the table."""
    return partial(store.snapshot_files, session, STATE)


def load_prior_state(
    session: SparkSession, store: DeltaStore, partitions: DataFrame, snapshot_id: str, contexts: DataFrame | None = None,
    absent: DataFrame | None = None, defer_check: bool = False,
) -> PriorState:
    """``prior_state`` of ``snapshot_id`` from the store: every state's contexts, the chosen predecessors' rows.

    ``absent``: ``absent_dumps`` of the snapshot's broker cut (``cut_absences``), continued too. ``defer_check``: the
    contexts are checked by ``check_carried`` (``prior_state``'s ``defer_check``)."""
    return prior_state(
        state_contexts(session, store) if contexts is None else contexts,
        partitions,
        snapshot_id,
        read_stage(session, store, "raw_topic_snapshots", None),
        read_states=lambda ids: read_states(session, store, ids),
        absent=absent,
        state_files=state_file_lists(session, store),
        defer_check=defer_check,
    )


def settle_carried(
    session: SparkSession, store: DeltaStore, stage: ArrowStage, partitions: DataFrame, prior: PriorState,
    rows: DataFrame, own_rows: Optional[int],
) -> Optional[Settled]:
    """The carried keys a small cut settles (``pipelines/state/settled.py``), their state rows written into ``stage``,
    from one read of the continued states that also counts them for the check and keeps the rest for the comparison;
    None when no topic partition may settle: nothing carried, a cut too large to send its keys to the state's files
    (or of unknown size), or a Delta engine that does not list the state's files."""
    if not prior.links or not small_cut(own_rows):
        return None
    dumps = partitions.select(*REPLICA_PARTITION, "first_gap_lower_bound").collect()
    parts = settled_parts(dumps, prior.links, prior.context.collect())
    if not parts:
        return None
    files = state_file_lists(session, store)(prior.previous_snapshot_ids)
    return settle(session, stage, files, parts, rows) if files is not None else None


def small_cut(own_rows: Optional[int]) -> bool:
    """A cut whose keys go to the state's files and scans (``BROADCAST_MAX_ROWS``): it may settle keys."""
    return own_rows is not None and own_rows <= BROADCAST_MAX_ROWS


def check_carried(
    session: SparkSession, store: DeltaStore, tables: StepTables, prior: PriorState, snapshot_id: str,
    settled: Optional[Settled],
) -> None:
    """``check_state`` of a state loaded with ``defer_check``: with the counts settling made while reading it, else
    counted from its files. A refusal discards what the step staged and fails it."""
    try:
        check_state(prior, snapshot_id, found=settled.found if settled else None,
                    state_files=state_file_lists(session, store))
    except StateRefused as refused:
        tables.discard()
        raise dg.Failure(description=str(refused), allow_retries=False) from refused


def cut_absences(session: SparkSession, store: DeltaStore, partitions: DataFrame, snapshot_id: str) -> DataFrame | None:
    """The replica partitions the snapshot's broker cut lists without rows in it (``absent_dumps``), or None for a
    snapshot of files: the Delta log says whether ``broker_cuts`` holds rows of it, so a file snapshot reads nothing."""
    if not store.snapshot_rows("broker_cuts", [snapshot_id]):
        return None
    return computed_once(absent_dumps(read_stage(session, store, "broker_cuts", snapshot_id), partitions))


def retention_plan(contexts: DataFrame, written: DataFrame, snapshot_id: str, keep: int) -> tuple[list[str], dict]:
    """The snapshots whose states to drop once ``snapshot_id``'s state (``written``) is published, and metadata."""
    rp = list(REPLICA_PARTITION)
    others = contexts.where(F.col("snapshot_id") != snapshot_id).select("snapshot_id", *rp, "last_offset")
    own = written.where(F.col("row_kind") == CONTEXT).select("snapshot_id", *rp, "last_offset")
    kept, dropped = retained_states(others.unionByName(own).collect(), keep)
    return dropped, {
        "state_retention": keep,
        "states_kept": len(kept),
        "states_dropped": len(dropped),
        "dropped_snapshot_ids": dg.MetadataValue.json(dropped[:MAX_LISTED_DROPPED]),
    }


def check_state_retention(keep: Optional[int]) -> Optional[int]:
    if keep is not None and keep < MIN_STATE_RETENTION:
        raise InvalidSetting(
            f"state_retention must be at least {MIN_STATE_RETENTION} (the newest state and the one it continued, so "
            f"that re-auditing the newest snapshot starts from the same state), or unset to keep every state; got {keep}"
        )
    return keep


@dg.multi_asset(
    specs=[
        dg.AssetSpec(
            "divergence_reports",
            group_name=GROUP,
            kinds=KINDS,
            # raw_topic_snapshots: a dump that overlaps the state it continues is verified against it.
            # broker_cuts: a replica partition the cut lists without rows in the snapshot is compared on its state.
            deps=["reconstructed_watermarks", "partition_watermarks", "raw_topic_snapshots", "broker_cuts"],
            description="Every key that is not CONSISTENT between two replicas, with its verdict and witness (SPEC 4).",
            owners=["team:replication"],
        ),
        dg.AssetSpec(
            "divergence_summary",
            group_name=GROUP,
            kinds=KINDS,
            deps=["reconstructed_watermarks", "partition_watermarks", "broker_cuts"],
            description="Keys per verdict for each replica pair, topic and partition.",
        ),
        dg.AssetSpec(
            "replica_state",
            group_name=GROUP,
            kinds=KINDS,
            deps=["reconstructed_watermarks", "partition_watermarks", "raw_topic_snapshots", "broker_cuts"],
            description="Each key's last version and a commit context per replica partition, for the next snapshot.",
        ),
    ],
    check_specs=[
        schema_check_spec("divergence_reports"),
        schema_check_spec("divergence_summary"),
        schema_check_spec("replica_state"),
    ],
    partitions_def=snapshot_partitions,
    # The longest chain of the audit (segments -> watermarks -> divergence) starts first.
    op_tags=CRITICAL_PATH,
)
def divergence_reports(
    context: dg.AssetExecutionContext, config: DivergenceConfig, spark: SparkResource, store: DeltaStore,
    reports: ReportSettings,
):
    snapshot_id = context.partition_key
    keep = check_state_retention(config.state_retention)
    session = spark.spark_session
    own_rows = store.snapshot_rows("reconstructed_watermarks", [snapshot_id])
    most_rows = comparison_rows(store, own_rows)
    with spark.sized_for(most_rows) as evaluation:
        rows = read_stage(session, store, "reconstructed_watermarks", snapshot_id)
        partitions = read_stage(session, store, "partition_watermarks", snapshot_id)
        # Which snapshots have a state, from the Delta log (no Spark job): when no other snapshot has one, nothing can
        # be continued, and neither the contexts nor the predecessors are read.
        others_with_state = [i for i in store.snapshot_ids(STATE) if i != snapshot_id]
        contexts = state_contexts(session, store) if others_with_state else None
        try:
            # Every snapshot's contexts but this one's: re-materializing it starts from the state before it. Only the
            # chosen predecessors' partitions are read whole. The raw rows are read only where a dump overlaps the
            # state it continues, to verify the overlap.
            # A replica partition the broker cut lists without rows here is compared on its carried state.
            absent = cut_absences(session, store, partitions, snapshot_id) if contexts is not None else None
            prior = (
                load_prior_state(session, store, partitions, snapshot_id, contexts, absent,
                                 defer_check=small_cut(own_rows))
                if contexts is not None else no_prior_state(session)
            )
        except StateRefused as refused:
            raise dg.Failure(description=str(refused), allow_retries=False) from refused
        if prior.absent:
            # Their partition_watermarks rows, made from the state each continues (rows 0: nothing read here).
            partitions = partitions.unionByName(absent_watermarks(absent, prior.context))
        tables = StepTables(session, store, snapshot_id, evaluation=evaluation, rows=most_rows)
        state = tables.arrow_stage(STATE)
        # A small cut's carried keys that it does not write and whose verdict cannot change are settled: their state
        # rows are copied into this snapshot's state, and they leave the comparison (pipelines/state/settled.py). The
        # same read counts the state for its check (before anything is committed) and keeps the other carried rows.
        settled = settle_carried(session, store, state, partitions, prior, rows, own_rows)
        check_carried(session, store, tables, prior, snapshot_id, settled)
        if prior.links:
            # The positions between each state and this dump read and skipped by rule (chunks, control messages),
            # in this snapshot or its predecessors: not gaps.
            skipped = None
            for sid in [snapshot_id, *prior.previous_snapshot_ids]:
                part = read_stage(session, store, "raw_topic_skipped", sid)
                skipped = part if skipped is None else skipped.unionByName(part)
            # A small cut's per-key facts go to the carried versions' scan (no shuffle of the state); the carried rows
            # hold what the state kept of them, for the pass to write the next state.
            versions = settled.carried(prior.versions, prior.links) if settled else prior.versions
            carried_rows, carried_partitions = carry_over(rows, partitions, versions, prior.context,
                                                          read_between(skipped, partitions, prior.context),
                                                          cut_rows=own_rows, prior_payload=True)
        else:  # a fresh stream everywhere: nothing to carry, the snapshot's own tables are the stream's
            carried_rows, carried_partitions = rows, partitions
        carried = {
            "carried_partitions": len(prior.links),
            "carried_versions": prior.carried_versions,
            # Of those, the replica partitions without rows here, compared on their carried state only.
            "absent_partitions": len(prior.absent),
            "previous_snapshot_ids": dg.MetadataValue.json(prior.previous_snapshot_ids),
            "carried_from": dg.MetadataValue.json(prior.links),
        }
        # The replica partitions' layout (a handful of rows, one collect) serves the comparison and the state.
        layout = comparison_layout(carried_partitions)
        # The witnesses' values are looked up in the snapshot's raw rows, by position (the only read of its values).
        raw = read_stage(session, store, "raw_topic_snapshots", snapshot_id)
        # The comparison's pass writes the state's VERSION rows itself (each key's last version per replica, from
        # the rows it holds anyway), with their checksums; the contexts follow from its sums and the settled rows'.
        comparison = compare(carried_rows, carried_partitions, layout, rows=most_rows, values=raw,
                             state=state_files(state, layout), settled=settled.counts if settled else None)
        store.write_arrow(state, contexts_from_sums(carried_partitions, prior.context, comparison.state_sums,
                                                    more=[(snapshot_id, *s) for s in settled.sums] if settled else ()),
                          name="contexts")
        carried["settled_keys"] = settled.total if settled else 0
        tables.stage_arrow(state, extra_metadata=carried)
        tables.stage(comparison.summary, "divergence_summary")
        # One row per topic partition and replica pair: read once for the totals and the preview.
        summary_rows = tables.frame("divergence_summary").collect()
        totals, pair_totals = key_totals(summary_rows), verdict_totals(summary_rows)
        if pair_totals["COMPARED"] == pair_totals["CONSISTENT"]:
            # Every key is CONSISTENT (a healthy store): the reports are known empty, and their plan (the witnesses'
            # values looked up in every row) is never run.
            tables.stage_empty("divergence_reports")
        else:
            # The witnesses' values are read from raw_topic_snapshots: in batches that fit the heap however large
            # the snapshot's values are.
            largest = store.column_max("raw_topic_snapshots", snapshot_id, "value_bytes")
            with parquet_batches(session, parquet_batch_rows(largest)):
                tables.stage(comparison.reports, "divergence_reports")
        tables.add_metadata(
            "divergence_reports",
            {
                **count_metadata(totals, pair_totals),
                **carried,
                "by_replica_pair": dg.MetadataValue.md(divergence_by_pair(summary_rows)),
            },
        )
        # Unset, every state is kept and nothing is collected for the plan.
        dropped, retention = [], {"state_retention": "all"}
        if keep is not None:
            known = contexts if contexts is not None else prior.context  # no other state: none to drop
            dropped, retention = retention_plan(known, tables.frame(STATE), snapshot_id, keep)
        tables.add_metadata(STATE, retention)
        yield from tables.publish(after_commit={
            "divergence_reports": lambda: report_metadata(context, store, reports, snapshot_id, totals, pair_totals),
        })
        # After the new state is committed: a failure here leaves extra states, which is safe, and the next audit
        # drops them. A concurrent audit that chose a dropped state refuses to use it (it re-reads its context).
        if dropped:
            version = store.delete_snapshots(session, STATE, dropped)
            context.log.info(f"state retention {keep}: dropped the states of {len(dropped)} snapshot(s) "
                             f"({', '.join(dropped[:MAX_LISTED_DROPPED])}) from {STATE} in Delta version {version}")


def report_metadata(
    context: dg.AssetExecutionContext, store: DeltaStore, settings: ReportSettings, snapshot_id: str,
    totals: dict[str, Optional[int]], pair_totals: Optional[dict[str, int]] = None,
) -> dict:
    """Write the snapshot's report page from the committed tables; its link and the first keys' pictures.

    The tables are committed by then: a page that cannot be written (storage, a bug) is logged and named in the
    metadata (``report_error``), and the step still succeeds with its tables.
    """
    from explain.report import build_report
    from explain.text import explain_command

    try:
        report = build_report(store.warehouse_root, snapshot_id, totals, settings.page_pictures(), settings.redacting(),
                              pair_totals=pair_totals)
        metadata = {"report_page": dg.MetadataValue.path(report.uri), "keys_explained": len(report.docs),
                    "keys_pictured": report.pictured}
        if report.docs:
            metadata["explain_first"] = dg.MetadataValue.text(explain_command(report.docs[0], store.warehouse_root))
        markdown = report.ui_markdown(settings.embedded_pictures())
        if markdown is not None:
            metadata["most_important_keys"] = dg.MetadataValue.md(markdown)
    except Exception as error:  # noqa: BLE001 - the page is secondary to the published tables
        context.log.warning(f"no report page for {snapshot_id}: {type(error).__name__}: {error}")
        return {"report_error": f"{type(error).__name__}: {error}"}
    context.log.info(f"report page: {report.uri} ({len(report.docs)} key(s) explained, {report.pictured} pictured)")
    return metadata


def comparison_rows(store: DeltaStore, own_rows: Optional[int]) -> Optional[int]:
    """The most rows the comparison reads: the snapshot's data rows (``own_rows``, from the Delta log), and every
    state it could carry (None: unknown)."""
    return None if own_rows is None else own_rows + (store.snapshot_rows(STATE) or 0)


VERDICT_COLUMNS = {"COMPARED": "keys_compared", "CONSISTENT": "consistent", "DIVERGENT": "divergent",
                   "MISSING": "missing", "IN_FLIGHT": "in_flight"}
# The worst verdict first (the order a person asks in): "how many keys are wrong".
COUNT_ORDER = ("COMPARED", "DIVERGENT", "MISSING", "IN_FLIGHT", "CONSISTENT")


def verdict_totals(summary_rows) -> dict[str, int]:
    """Key pairs per verdict over ``divergence_summary``'s rows (one per topic partition and replica pair, collected
    once by the step): a key of three replicas counts once per pair."""
    return {name: sum(int(row[column] or 0) for row in summary_rows) for name, column in VERDICT_COLUMNS.items()}


def key_totals(summary_rows) -> dict[str, Optional[int]]:
    """Keys per verdict (SPEC 10: each (topic, partition, key) once, under its worst verdict over its pairs): the
    ``partition_keys_*`` of one row per topic partition, added up. None where a row lacks them (audited before)."""
    per_partition = {(row["topic"], row["partition"]): row for row in summary_rows}
    out: dict[str, Optional[int]] = {}
    for name in VERDICT_COLUMNS:
        values = [_field(row, f"partition_keys_{name.lower()}") for row in per_partition.values()]
        out[name] = None if any(v is None for v in values) else sum(int(v) for v in values)
    return out


def _field(row, name: str):
    try:
        return row[name]
    except (KeyError, ValueError):  # a Spark Row or a dict without the column
        return None


def count_metadata(keys: dict[str, Optional[int]], key_pairs: dict[str, int]) -> dict[str, int]:
    """The materialization's counts, keys first (``keys_*``), then key pairs under their own name (``key_pairs_*``)."""
    return {
        **{f"keys_{name.lower()}": dg.MetadataValue.int(int(keys[name])) for name in COUNT_ORDER
           if keys.get(name) is not None},
        **{f"key_pairs_{name.lower()}": dg.MetadataValue.int(int(key_pairs[name])) for name in COUNT_ORDER},
    }


EXAMPLE_COLUMNS = ("topic", "partition", "replica_a", "replica_b", "key", "verdict")


@dg.asset_check(
    asset="divergence_reports",
    name="no_proven_divergence",
    description="Fails (ERROR) when any key is proven DIVERGENT or MISSING between two replicas.",
    partitions_def=snapshot_partitions,
)
def no_proven_divergence(context: dg.AssetCheckExecutionContext, spark: SparkResource, store: DeltaStore):
    # The key pairs and the first proven ones in one query; none at all when the Delta log says the reports are empty.
    found, counts = matching_rows(
        spark, store, "divergence_reports", context.partition_key, F.col("verdict").isin(*PROVEN),
        [F.col(c) for c in ("topic", "partition", "replica_a", "replica_b", "key")],
        {v: F.count_if(F.col("verdict") == v) for v in PROVEN}, EXAMPLE_KEYS, list(EXAMPLE_COLUMNS),
    )
    examples = [{k: r[k] for k in EXAMPLE_COLUMNS} for r in found]
    pairs = sum(counts.values())
    # Keys (each once, under its worst verdict) from the step's summary: a few rows, read without Spark.
    keys = committed_key_totals(store, context.partition_key)
    metadata = {}
    if keys["DIVERGENT"] is not None and keys["MISSING"] is not None:
        metadata |= {"keys_divergent": keys["DIVERGENT"], "keys_missing": keys["MISSING"]}
    metadata |= {
        "key_pairs_divergent": counts.get("DIVERGENT", 0),
        "key_pairs_missing": counts.get("MISSING", 0),
        "example_keys": dg.MetadataValue.json(examples),
    }
    if pairs == 0:
        description = None
    elif "keys_divergent" in metadata:
        proven = keys["DIVERGENT"] + keys["MISSING"]
        description = (f"{proven} key(s) proven divergent or missing ({keys['DIVERGENT']} DIVERGENT, "
                       f"{keys['MISSING']} MISSING), in {pairs} key pair(s)")
    else:  # a snapshot audited before keys were counted: key pairs only, named so
        description = f"{pairs} key pair(s) proven divergent or missing"
    return dg.AssetCheckResult(
        passed=pairs == 0,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata=metadata,
        description=description,
    )


def committed_key_totals(store: DeltaStore, snapshot_id: str) -> dict[str, Optional[int]]:
    """``key_totals`` of the snapshot's committed ``divergence_summary`` (delta-rs, no Spark: a row per pair)."""
    from resources.delta_reader import TableReader

    names = [f"partition_keys_{v.lower()}" for v in VERDICT_COLUMNS]
    table = TableReader(store.warehouse_root).read(
        "divergence_summary", snapshot_id, columns=["topic", "partition"], optional=names
    )
    return key_totals([] if table is None else table.to_pylist())
