"""The embedded engine: staged Parquet files committed as they are by delta-rs, read back file by file.

Spark (or a pass through pyarrow) wrote the data once into a staged folder
(``resources/delta_staging.py``); the commit lists its files, reads their footers for the
statistics (``resources/delta_stats.py``) and has delta-rs write one log entry naming them and
removing the snapshot's previous files. A crash before the commit leaves the table at its
previous version (the orphan files are never read and are removed by ``VACUUM``). Reads list the
live files from the log and hand them to Spark's Parquet reader, so a pass can read a snapshot
staged by stream file by file (``stream_files``).

Everything goes through ``resources/filesystem.py`` and delta-rs with the storage options of
``REPLICA_LENS_STORAGE_OPTIONS``: nothing assumes a local disk.
"""
from __future__ import annotations

import json
import random
import time
from typing import Optional, Sequence

import pyarrow.parquet as pq
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from resources.delta_log import EMBEDDED_UNSUPPORTED, LiveFile, add_actions, files_by_snapshot, reader_features
from resources.delta_reader import PARTITION_COLUMN
from resources.delta_staging import STREAMS_SUFFIX, StagedWrite, WriteResult, without_partition
from resources.delta_stats import file_stats
from resources.filesystem import Location, delta_storage_options
from schemas.conform import conform, local_frame

# Commits that lose a race to a concurrent writer are retried this many times in all.
COMMIT_ATTEMPTS = 10


def arrow_schema(struct: T.StructType):
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(struct)


# delta-rs must not rebase a commit that lost a race by itself: its conflict check lets an overwrite built on a stale
# version through an OPTIMIZE committed meanwhile (delta-rs 1.6: the overwrite removes the files it saw, the
# compacted file stays live beside the new ones, and the snapshot holds two copies). Every commit here is retried
# by ``commit_with_retries`` instead, rebuilt on the fresh table.
NO_REBASE = 0


def commit_with_retries(uri: str, commit) -> int:
    """Run ``commit(DeltaTable)`` with delta-rs; one that lost a race is retried on the fresh table. The new version.

    A concurrent commit (another partition's write, a retention delete, another tool's OPTIMIZE)
    makes delta-rs raise ``CommitFailedError`` (each commit passes ``max_commit_retries=NO_REBASE``);
    the retry re-reads the table first, with a growing jitter, so its removes are the fresh version's files.
    """
    from deltalake import DeltaTable
    from deltalake.exceptions import CommitFailedError

    for attempt in range(1, COMMIT_ATTEMPTS + 1):
        dt = DeltaTable(uri, storage_options=delta_storage_options())
        try:
            commit(dt)
            break
        except CommitFailedError:
            if attempt == COMMIT_ATTEMPTS:
                raise
            time.sleep(random.uniform(0.05, 0.25) * attempt)
    dt.update_incremental()
    return dt.version()


def commit_staged(staged: StagedWrite) -> WriteResult:
    """Publish ``staged``'s files as they are: one delta-rs commit naming them, with their footers' statistics."""
    from deltalake import DeltaTable
    from deltalake.transaction import AddAction

    uri = staged.uri
    schema = arrow_schema(staged.struct)
    options = delta_storage_options()
    if not DeltaTable.is_deltatable(uri, storage_options=options):
        try:
            DeltaTable.create(
                uri, schema=schema, partition_by=[PARTITION_COLUMN], name=staged.table, storage_options=options
            )
        except Exception:  # noqa: BLE001 - a concurrent run created it first; use theirs
            if not DeltaTable.is_deltatable(uri, storage_options=options):
                raise
    actions = []
    rows = 0
    now_ms = int(time.time() * 1000)
    # Listed and read through the filesystem layer: the staged files may be on object storage.
    target = Location.of(staged.folder)
    for info in target.walk_files():
        relative = target.relative(info.path)  # "<snapshot_id=...>/part-....parquet"
        partition = relative.rsplit("/", 1)[0] if "/" in relative else ""
        if not info.base_name.endswith(".parquet"):
            target.fs.delete_file(info.path)  # Spark's _SUCCESS and .crc files: not part of the table
            continue
        with target.fs.open_input_file(info.path) as handle:
            footer = pq.ParquetFile(handle).metadata
        rows += footer.num_rows
        actions.append(
            AddAction(
                path=f"{staged.relative_dir}/{relative}",
                size=info.size,
                partition_values={PARTITION_COLUMN: partition.split("=", 1)[1]},
                modification_time=now_ms,
                data_change=True,
                stats=json.dumps(file_stats(footer, skip=(PARTITION_COLUMN,))),
            )
        )
    version = commit_files(uri, actions, schema, staged.snapshot_id)
    return WriteResult(table_uri=uri, version=version, row_count=rows, engine="embedded", files=len(actions))


def commit_files(uri: str, actions: list, schema, snapshot_id: Optional[str]) -> int:
    """Commit ``actions`` as the snapshot's (or table's) only files; return the new version.

    delta-rs finds no conflict between two overwrites of a partition that held no files
    (both would commit: two copies), and sees one between overwrites of different
    partitions (a false failure). So each commit claims its partition with an
    application transaction id, which two commits of one partition cannot both carry,
    and a commit that lost a race is retried on the fresh table: its overwrite then
    replaces what the winner wrote, as if the writes had run one after the other.
    """
    from deltalake import CommitProperties, Transaction

    claim = f"replica-lens:{PARTITION_COLUMN}={snapshot_id}" if snapshot_id is not None else "replica-lens:table"
    return commit_with_retries(
        uri,
        lambda dt: dt.create_write_transaction(
            actions,
            mode="overwrite",
            schema=schema,
            partition_by=[PARTITION_COLUMN],
            partition_filters=None if snapshot_id is None else [(PARTITION_COLUMN, "=", snapshot_id)],
            commit_properties=CommitProperties(
                max_commit_retries=NO_REBASE, app_transactions=[Transaction(app_id=claim, version=dt.version() + 1)]
            ),
        ),
    )


def delete_snapshots(uri: str, ids: Sequence[str]) -> int:
    """Remove every row of ``ids`` (safe snapshot ids) in one delta-rs commit; its version."""
    from deltalake import CommitProperties

    predicate = f"{PARTITION_COLUMN} IN ({', '.join(repr(i) for i in ids)})"  # safe ids: no quote inside
    return commit_with_retries(
        uri, lambda dt: dt.delete(predicate, commit_properties=CommitProperties(max_commit_retries=NO_REBASE))
    )


def read_files(
    spark: SparkSession, uri: str, features: set[str], files: dict[str, list[LiveFile]], struct: T.StructType
) -> DataFrame:
    """The rows of the live ``files`` (by snapshot) of the table at ``uri``, read by Spark's Parquet reader."""
    unsupported = features & EMBEDDED_UNSUPPORTED
    if unsupported:
        raise RuntimeError(
            f"{uri} uses Delta features {sorted(unsupported)} that the embedded reader does not "
            "support: read it with delta-spark (set REPLICA_LENS_DELTA_JARS)"
        )
    data_struct = without_partition(struct)
    frames = [
        spark.read.schema(data_struct)
        .parquet(*(file.uri for file in part_files))
        .withColumn(PARTITION_COLUMN, F.lit(part))
        for part, part_files in sorted(files.items())
    ]
    if not frames:
        return local_frame(spark, [], struct)
    result = frames[0]
    for frame in frames[1:]:
        result = result.unionByName(frame)
    return conform(result, struct)


def snapshot_files(uri: str, snapshot_ids: Sequence[str]) -> Optional[dict[str, list[Location]]]:
    """``DeltaStore.snapshot_files`` for an existing table: the live files of each of ``snapshot_ids`` (an id without
    any: an empty list), or None when the table uses a feature the embedded reader lacks (its files alone would not
    give its rows: deletion vectors, column mapping)."""
    from deltalake import DeltaTable

    dt = DeltaTable(uri, storage_options=delta_storage_options())
    if reader_features(dt) & EMBEDDED_UNSUPPORTED:
        return None
    files = files_by_snapshot(add_actions(dt), uri, None)
    return {i: [Location.of(file.uri) for file in files.get(i, [])] for i in snapshot_ids}


def stream_files(uri: str, snapshot_id: str) -> Optional[list[Location]]:
    """``DeltaStore.stream_files`` for an existing table: its files of ``snapshot_id`` if all were staged by stream."""
    from deltalake import DeltaTable

    dt = DeltaTable(uri, storage_options=delta_storage_options())
    if reader_features(dt) & EMBEDDED_UNSUPPORTED:
        return None
    files = files_by_snapshot(add_actions(dt), uri, snapshot_id).get(snapshot_id, [])
    if not files or not all(file.uri[len(uri) + 1:].split("/", 1)[0].endswith(STREAMS_SUFFIX) for file in files):
        return None
    return [Location.of(file.uri) for file in files]
