"""Housekeeping: VACUUM of a table, optionally after compacting its snapshots of many small files.

A VACUUM of each table removes every file that no Delta version still needs and that is
older than the retention: the files of superseded snapshot writes (removed from the table
by a later commit more than the retention ago) and files that no version ever named
(``write-<uuid>`` folders of writes that crashed before their commit). The retention is
what keeps a write in flight safe: its staged files are named by no version until it
commits, so only their age protects them (keep the retention well above the longest
run). It also bounds time travel: a version older than the retention may have lost its
files. Optionally, partitions of many small files are first compacted into fewer files
(delta-rs ``optimize.compact``, a commit that changes no row).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import pyarrow.fs as pafs

from resources.delta_log import absent_columns, add_actions, files_by_snapshot, reader_features
from resources.delta_reader import PARTITION_COLUMN
from resources.filesystem import Location, delta_storage_options

# delta-rs' default target for compacted files; a file under half of it is "small": two fit in one.
COMPACT_TARGET_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True)
class VacuumResult:
    """What housekeeping did to one table (or, on a dry run, would do)."""

    table: str
    dry_run: bool
    files: int  # removed: superseded files past the retention and files no version names
    bytes: int
    folders: int = 0  # empty folders left by removed files (never counted on a dry run)
    compacted: tuple[str, ...] = ()  # snapshots whose small files were (or would be) compacted
    files_compacted: int = 0  # small files rewritten (on a dry run: that would be)
    files_written: int = 0  # files the compaction wrote
    note: str = ""  # e.g. a compaction that lost a race to a concurrent write
    paths: tuple[str, ...] = ()  # the files removed (on a dry run: that would be), relative to the table

    def as_row(self) -> dict:
        return {
            "table": self.table,
            "files_removed": self.files,
            "bytes_removed": self.bytes,
            "folders_removed": self.folders,
            "snapshots_compacted": len(self.compacted),
            "files_compacted": self.files_compacted,
            "files_written": self.files_written,
            "note": self.note,
        }


def partitions_to_compact(
    files: Sequence[tuple[Optional[str], int]], target_bytes: int = COMPACT_TARGET_BYTES, min_files: int = 2
) -> list[Optional[str]]:
    """The partitions (snapshot ids) of ``(partition, size)`` live files that compaction would shrink.

    A partition needs it when it holds at least ``min_files`` files under half the target
    size: two of those fit in one target-size file. Partitions of one file, or of files
    near the target, are left alone (rewriting them would gain nothing).
    """
    small: dict[Optional[str], int] = {}
    for partition, size in files:
        if size < target_bytes // 2:
            small[partition] = small.get(partition, 0) + 1
    return sorted((p for p, n in small.items() if n >= min_files), key=lambda p: (p is None, p or ""))


def remove_empty_folders(root: str, deleted: Sequence[str], cutoff: float) -> int:
    """Remove the empty folders under ``root`` that this vacuum emptied or that are older than ``cutoff``.

    The log (``_delta_log``) and hidden top-level folders are never touched. A folder of a
    write in flight is young and never emptied by a vacuum (its files are young too), so
    it stays; ``rmdir`` removes only empty folders, so a file arriving meanwhile wins.
    Returns how many folders were removed.
    """
    emptied = {os.path.dirname(os.path.join(root, path)) for path in deleted}
    removed = 0
    for top in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        if top.startswith(("_", ".")) or not os.path.isdir(os.path.join(root, top)):
            continue
        for folder, subfolders, names in os.walk(os.path.join(root, top), topdown=False):
            if names or any(os.path.isdir(os.path.join(folder, sub)) for sub in subfolders):
                continue
            try:
                if folder not in emptied and os.stat(folder).st_mtime >= cutoff:
                    continue
                os.rmdir(folder)
            except OSError:  # a file arrived, or another vacuum removed it first
                continue
            removed += 1
            emptied.add(os.path.dirname(folder))
    return removed


def vacuum_table(
    table: str, uri: str, retention_hours: int, dry_run: bool, compact: bool, target_bytes: int
) -> VacuumResult:
    """``DeltaStore.vacuum`` of one table at ``uri`` (see the module docstring)."""
    from deltalake import DeltaTable, WriterProperties
    from deltalake.exceptions import CommitFailedError

    dt = DeltaTable(uri, storage_options=delta_storage_options())
    compacted: list[Optional[str]] = []
    files_compacted = files_written = 0
    notes: list[str] = []
    if compact:
        actions = add_actions(dt)
        live = list(
            zip(
                actions.get(f"partition.{PARTITION_COLUMN}", [None] * len(actions.get("path", []))),
                actions.get("size_bytes", []),
            )
        )
        by_snapshot = files_by_snapshot(actions, uri, None)
        columns = [f.name for f in dt.schema().fields if f.name != PARTITION_COLUMN]
        # With column mapping a file's column names are not the table's: no footer tells (as for reads).
        mapped = "columnMapping" in reader_features(dt)
        for partition in partitions_to_compact(live, target_bytes):
            small = sum(1 for p, size in live if p == partition and size < target_bytes // 2)
            # A compaction writes the table's current columns, padding those an older
            # snapshot's files lack with nulls; reads could no longer tell that the
            # snapshot predates them (see delta_log.refuse_outdated_snapshots). Such a snapshot is
            # left as it is until it is materialized again.
            missing = [] if mapped else absent_columns(by_snapshot.get(partition, []), columns)[0]
            if missing:
                notes.append(
                    f"compaction of {partition} skipped (written before column(s) {', '.join(missing)}: "
                    f"materialize {table} of snapshot {partition} again first)"
                )
                continue
            if dry_run:
                compacted.append(partition)
                files_compacted += small
                continue
            try:
                metrics = dt.optimize.compact(
                    partition_filters=None if partition is None else [(PARTITION_COLUMN, "=", partition)],
                    target_size=target_bytes,
                    writer_properties=WriterProperties(compression="ZSTD"),
                )
            except CommitFailedError as error:  # a write of the snapshot won: it is fresh anyway
                notes.append(f"compaction of {partition} skipped (concurrent write: {str(error).splitlines()[0]})")
                dt.update_incremental()
                continue
            compacted.append(partition)
            files_compacted += int(metrics.get("numFilesRemoved", 0))
            files_written += int(metrics.get("numFilesAdded", 0))
    # The vacuum must see the latest version (the compaction's, a concurrent write's): with a
    # short retention a stale view would take their files for files no version names.
    dt.update_incremental()
    # The files to remove, measured before they go (delta-rs reports paths only). delta-rs also names the files of
    # expired removes that are no longer there (another tool's VACUUM, e.g. delta-spark's, deleted them): only the
    # files present are counted, as Delta's own VACUUM lists them.
    candidates = dt.vacuum(retention_hours=retention_hours, dry_run=True, enforce_retention_duration=False, full=True)
    location = Location.of(uri)
    sizes = {location.relative(info.path): info.size for info in location.walk_files()} if candidates else {}
    candidates = [path for path in candidates if path in sizes]
    folders = 0
    if dry_run:
        removed = candidates
    else:
        cutoff = time.time() - retention_hours * 3600
        # (Nothing to remove: no VACUUM commits, which would only lengthen the log.)
        removed = candidates and [path for path in dt.vacuum(
            retention_hours=retention_hours, dry_run=False, enforce_retention_duration=False, full=True
        ) if path in sizes]
        # Object stores have no folders; a local warehouse keeps the empty ones a vacuum leaves.
        if isinstance(location.fs, pafs.LocalFileSystem):
            folders = remove_empty_folders(location.path, removed, cutoff)
    return VacuumResult(
        table=table,
        dry_run=dry_run,
        files=len(removed),
        bytes=sum(sizes.get(path, 0) for path in removed),
        folders=folders,
        compacted=tuple(str(p) for p in compacted),
        files_compacted=files_compacted,
        files_written=files_written,
        note="; ".join(notes),
        paths=tuple(sorted(removed)),
    )
