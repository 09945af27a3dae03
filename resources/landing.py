"""The landing zone: where complete raw topic snapshots arrive.

A snapshot is a folder ``<root>/<snapshot_id>/`` whose ``_SUCCESS`` file is written
last; a folder without it is still being written and is never read. A folder whose
name is not a safe snapshot id is refused and never turned into a path. The root is a
plain path or a URI; it is listed through ``resources/filesystem.py``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import dagster as dg
import pyarrow.fs as pafs
from pydantic import Field

from pipelines.ingest.long_lines import DEFAULT_MAX_LINE_BYTES, MAX_MAX_LINE_BYTES, MIN_MAX_LINE_BYTES
from resources.errors import InvalidSetting, SnapshotNotReady
from resources.filesystem import Location
from resources.settings import whole_number
from resources.snapshots import SUCCESS_MARKER, UnsafeNameError, check_snapshot_id

CLUSTER_REGIONS_ENV = "REPLICA_LENS_CLUSTER_REGIONS"
CLOCK_UNCERTAINTY_ENV = "REPLICA_LENS_VENICE_CLOCK_UNCERTAINTY_MS"
PUSH_SETTINGS_ENV = "REPLICA_LENS_VENICE_PUSH_SETTINGS"
MAX_VALUE_BYTES_ENV = "REPLICA_LENS_MAX_VALUE_BYTES"
MAX_CHUNKS_ENV = "REPLICA_LENS_MAX_CHUNKS"
MAX_LINE_BYTES_ENV = "REPLICA_LENS_MAX_LINE_BYTES"


def parse_cluster_regions(text: Optional[str]) -> dict[int, str]:
    """``"0=dc-a,1=dc-b"`` -> ``{0: "dc-a", 1: "dc-b"}``: Venice upstream Kafka cluster ids to region names.

    Empty or None: no map (a snapshot of raw Venice records then fails on its first cluster id).
    """
    regions: dict[int, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        cid, sep, name = item.partition("=")
        if not sep or not cid.strip().lstrip("-").isdigit() or not name.strip():
            raise InvalidSetting(f"cluster regions: {item!r} is not <cluster id>=<region>, e.g. 0=dc-a,1=dc-b")
        if int(cid) in regions:
            raise InvalidSetting(f"cluster regions: cluster id {int(cid)} is named twice")
        regions[int(cid)] = name.strip()
    return regions


@dataclass(frozen=True)
class LandingScan:
    """One look at the landing zone."""

    complete: list[str]  # snapshot ids whose folder holds _SUCCESS, oldest first
    incomplete: list[str]  # safe ids still being written
    refused: list[str]  # folder names that are not safe snapshot ids


def parse_clock_uncertainty(text: Optional[str]) -> int:
    """``"3"`` -> 3: milliseconds, a whole number >= 0; empty or None -> 0."""
    if text is None or not text.strip():
        return 0
    try:
        value = int(text.strip())
    except ValueError:
        value = -1
    if value < 0:
        raise InvalidSetting(f"Venice clock uncertainty: {text!r} is not a whole number of milliseconds >= 0")
    return value


class LandingZone(dg.ConfigurableResource):
    """The folder where snapshot folders land: a plain path or a URI (``resources/filesystem.py``)."""

    root: str = Field(
        description="Landing folder holding one sub-folder per raw topic snapshot: a path, or a file://, s3://, "
        "gs://, abfss:// or hdfs:// URI."
    )
    cluster_regions: Optional[str] = Field(
        default=None,
        description="Raw Venice records: upstream Kafka cluster id -> region name, as '0=dc-a,1=dc-b' "
        f"(unset: the {CLUSTER_REGIONS_ENV} environment variable).",
    )
    venice_push_settings: Optional[str] = Field(
        default=None,
        description="Raw Venice records: a JSON file naming the compression and chunking of version topics whose "
        "START_OF_PUSH the snapshot does not hold (docs/venice-input.md; unset: the "
        f"{PUSH_SETTINGS_ENV} environment variable).",
    )
    venice_clock_uncertainty_ms: Optional[int] = Field(
        default=None,
        ge=0,
        description="Raw Venice records: a heartbeat's origin and applied time points are widened by this many "
        f"milliseconds on each side into intervals (unset: the {CLOCK_UNCERTAINTY_ENV} environment variable, "
        "else 0).",
    )
    max_value_bytes: Optional[int] = Field(
        default=None,
        ge=1,
        description="Raw Venice records: the largest value, decompressed and reassembled from its chunks; a larger one "
        f"is quarantined VALUE_TOO_LARGE (unset: {MAX_VALUE_BYTES_ENV}, else 16 MiB; at most about 96 MiB; "
        "raise the Spark driver heap with it: docs/venice-input.md).",
    )
    max_chunks: Optional[int] = Field(
        default=None,
        ge=1,
        description="Raw Venice records: the most chunks one manifest may name; more is quarantined VALUE_TOO_LARGE "
        f"(unset: {MAX_CHUNKS_ENV}, else 10000; docs/venice-input.md).",
    )

    max_line_bytes: Optional[int] = Field(
        default=None,
        ge=MIN_MAX_LINE_BYTES,
        le=MAX_MAX_LINE_BYTES,
        description="JSONL files: the longest line, in bytes before its LF; a longer one is never held whole and is "
        f"quarantined LINE_TOO_LONG with its first kilobyte (unset: {MAX_LINE_BYTES_ENV}, else 64 MiB; "
        "docs/operations.md).",
    )

    def line_limit(self) -> int:
        """The longest JSONL line read whole (this resource's setting, else the environment, else 64 MiB)."""
        if self.max_line_bytes is not None:
            return self.max_line_bytes
        value = whole_number(os.environ.get(MAX_LINE_BYTES_ENV), MAX_LINE_BYTES_ENV, minimum=MIN_MAX_LINE_BYTES)
        if value is not None and value > MAX_MAX_LINE_BYTES:
            raise InvalidSetting(f"{MAX_LINE_BYTES_ENV} is at most {MAX_MAX_LINE_BYTES} bytes (a Spark string), got {value}")
        return DEFAULT_MAX_LINE_BYTES if value is None else value

    def limit_settings(self) -> dict[str, int]:
        """The decoder's limits that are set (this resource's fields, else the environment), by the names of
        ``pipelines.venice.values.Limits``; the others keep the decoder's defaults."""
        out = {}
        for name, env in (("max_value_bytes", MAX_VALUE_BYTES_ENV), ("max_chunks", MAX_CHUNKS_ENV)):
            value = getattr(self, name)
            out[name] = value if value is not None else whole_number(os.environ.get(env), env, minimum=1)
        return {name: value for name, value in out.items() if value is not None}

    def cluster_region_map(self) -> dict[int, str]:
        """The configured cluster id -> region map (this resource's setting, else the environment)."""
        text = self.cluster_regions if self.cluster_regions is not None else os.environ.get(CLUSTER_REGIONS_ENV)
        return parse_cluster_regions(text)

    def push_settings_file(self) -> Optional[str]:
        """The configured Venice push settings file (this resource's setting, else the environment's), or None;
        ``pipelines.venice.push_settings.parse_push_settings`` reads it."""
        path = self.venice_push_settings if self.venice_push_settings is not None else os.environ.get(PUSH_SETTINGS_ENV)
        return path or None

    def clock_uncertainty_ms(self) -> int:
        """The configured half-width of a Venice heartbeat's clock intervals (this resource's setting, else the
        environment, else 0)."""
        if self.venice_clock_uncertainty_ms is not None:
            return self.venice_clock_uncertainty_ms
        return parse_clock_uncertainty(os.environ.get(CLOCK_UNCERTAINTY_ENV))

    def _root(self) -> Location:
        return Location.of(self.root)

    def _snapshot(self, snapshot_id: str) -> Location:
        check_snapshot_id(snapshot_id)
        folder = self._root().child(snapshot_id)
        if isinstance(folder.fs, pafs.LocalFileSystem):
            # A symbolic link must not lead out of the landing folder.
            root = Path(self._root().path).resolve()
            if Path(folder.path).resolve().parent != root:
                raise UnsafeNameError(f"snapshot {snapshot_id!r} resolves outside the landing folder {root}")
        return folder

    def snapshot_path(self, snapshot_id: str) -> str:
        """The folder of ``snapshot_id`` (a path or URI); refuses unsafe ids and ids that would leave the landing folder."""
        return self._snapshot(snapshot_id).uri

    def watched_store(self, snapshot_id: str) -> Optional[str]:
        """The store whose ``replica-lens watch`` landed ``snapshot_id`` (its ``_cut.json`` says), else None: the
        watch audits its own snapshots, in order, so the landing sensor leaves them alone."""
        import json

        cut = self._snapshot(snapshot_id).child("_cut.json")
        if not cut.is_file():
            return None
        try:
            return (json.loads(cut.read_text()).get("watch") or {}).get("store")
        except ValueError:
            return None

    def is_complete(self, snapshot_id: str) -> bool:
        return self._snapshot(snapshot_id).child(SUCCESS_MARKER).is_file()

    def require_complete(self, snapshot_id: str) -> str:
        """The folder (path or URI) of a complete snapshot, or a clear error."""
        folder = self._snapshot(snapshot_id)
        if not folder.is_dir():
            raise SnapshotNotReady(f"snapshot {snapshot_id!r} not found in the landing folder {self.root}")
        if not folder.child(SUCCESS_MARKER).is_file():
            raise SnapshotNotReady(
                f"snapshot {snapshot_id!r} is incomplete (no {SUCCESS_MARKER} in {folder.uri}): it is not read until it is"
            )
        return folder.uri

    def scan(self) -> LandingScan:
        """The snapshot folders, complete ones oldest first (by their marker's time), in one listing per folder."""
        complete: list[tuple[float, str]] = []
        incomplete: list[str] = []
        refused: list[str] = []
        for entry in self._root().list():
            # "_watch" (the cursors of replica-lens watch) and other tools' bookkeeping folders are not snapshots.
            if not entry.is_dir or entry.name.startswith("_"):
                continue
            try:
                folder = self._snapshot(entry.name)
            except UnsafeNameError:
                refused.append(entry.name)
                continue
            marker = folder.child(SUCCESS_MARKER)
            if marker.is_file():
                complete.append((marker.mtime() or 0.0, entry.name))
            else:
                incomplete.append(entry.name)
        return LandingScan(
            complete=[name for _, name in sorted(complete)],
            incomplete=incomplete,
            refused=refused,
        )
