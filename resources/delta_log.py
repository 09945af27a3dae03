"""What a table's Delta log says about its live files, read with delta-rs (no Spark, no data read).

The store's reads, housekeeping and refusal of outdated snapshots all start from the log's add
actions: which files are live, in which snapshot partition, with which statistics. A file's
footer is read only where the log has no statistics for a column (``absent_columns``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional, Sequence

import pyarrow.parquet as pq

from resources.delta_reader import PARTITION_COLUMN
from resources.filesystem import Location

# Delta reader features the embedded reader (file lists read by Spark's Parquet reader) cannot honour.
EMBEDDED_UNSUPPORTED = frozenset({"deletionVectors", "columnMapping"})


def add_actions(dt) -> dict[str, list]:
    """The live files of a delta-rs table as columns (delta-rs returns an Arrow-capsule table)."""
    import pyarrow as pa

    return pa.table(dt.get_add_actions(flatten=True)).to_pydict()


def reader_features(dt) -> set[str]:
    """The Delta reader features a delta-rs table uses (e.g. ``columnMapping``, ``deletionVectors``)."""
    return set(getattr(dt.protocol(), "reader_features", None) or [])


class OutdatedSnapshot(RuntimeError):
    """A snapshot's files lack a column that its table's schema now declares non-nullable."""


@functools.lru_cache(maxsize=65_536)
def file_columns(uri: str) -> frozenset[str]:
    """The top-level column names of one data file, from its Parquet footer (a committed file never changes)."""
    location = Location.of(uri)
    with location.fs.open_input_file(location.path) as handle:
        return frozenset(pq.ParquetFile(handle).schema_arrow.names)


@dataclass(frozen=True)
class LiveFile:
    """One data file of a table's current version, as the Delta log describes it."""

    uri: str
    null_counts: dict[str, Optional[int]]  # column -> the log's nullCount (absent or None: not recorded for it)


def files_by_snapshot(actions: dict[str, list], uri: str, snapshot_id: Optional[str]) -> dict[str, list[LiveFile]]:
    """The live data files of ``snapshot_id`` (None: of every snapshot) by snapshot, from the log's ``add_actions``."""
    paths = actions.get("path", [])
    partitions = actions.get(f"partition.{PARTITION_COLUMN}", [None] * len(paths))
    counted = {key[len("null_count."):]: values for key, values in actions.items() if key.startswith("null_count.")}
    by_snapshot: dict[str, list[LiveFile]] = {}
    for i, (path, part) in enumerate(zip(paths, partitions)):
        if snapshot_id is None or part == snapshot_id:
            nulls = {column: values[i] for column, values in counted.items()}
            by_snapshot.setdefault(part, []).append(LiveFile(f"{uri}/{path}", nulls))
    return by_snapshot


def absent_columns(files: Sequence[LiveFile], columns: Sequence[str]) -> tuple[list[str], list[str]]:
    """Of ``columns``: those some file lacks (its footer), and those some file holds only as padding (the log).

    A column the log counts nulls for is in the file: no footer is read for it. A column
    without a count (a map or struct, a writer that left statistics out, a file written
    before the column existed) is looked up in the file's footer.
    """
    missing, padded = set(), set()
    for file in files:
        for name in columns:
            nulls = file.null_counts.get(name)
            if nulls is None:
                if name not in file_columns(file.uri):
                    missing.add(name)
            elif nulls > 0:
                padded.add(name)
    return sorted(missing), sorted(padded)


def refuse_outdated_snapshots(table: str, required: Sequence[str], files: dict[str, list[LiveFile]]) -> None:
    """Raise ``OutdatedSnapshot`` when a file of these snapshots has no value in a ``required`` (non-nullable) column.

    Delta adds a new column to a table's schema on the first write that has it; the files
    of snapshots written before keep their old columns, and every reader (delta-spark and
    the embedded one alike) returns null for the missing column. For a nullable column that
    is the designed upgrade path (null: not known). For a column the schema declares
    non-nullable it would be a value no writer produced, so the snapshot is refused instead,
    naming the asset to materialize again.

    Two signs, neither of which reads the data: a file whose Parquet footer lacks the
    column (read once per process: files never change once committed), and a file whose
    Delta log entry counts nulls in it. Every write is validated against the model, so a
    null there was never written: it is what a compaction after the upgrade leaves
    (delta-rs and delta-spark rewrite an older snapshot's files with the table's current
    columns, padded with nulls). The log answers for the columns it has statistics for,
    so footers are read only for the others (maps, structs).
    """
    required = [name for name in required if name != PARTITION_COLUMN]  # in the path, not in the files
    if not required:
        return
    for snapshot, snapshot_files in sorted(files.items()):
        missing, padded = absent_columns(snapshot_files, required)
        if missing or padded:
            raise OutdatedSnapshot(
                f"{table}: snapshot {snapshot} was written by an earlier version of Replica Lens, without the "
                f"column(s) {', '.join(sorted({*missing, *padded}))} that the table now requires"
                + (f" (its files hold {', '.join(padded)} as nulls: compacted after the upgrade)" if padded else "")
                + f": materialize {table} of snapshot {snapshot} again"
            )
