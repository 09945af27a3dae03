"""The landing zone: where complete raw topic snapshots arrive.

A snapshot is a folder ``<root>/<snapshot_id>/`` whose ``_SUCCESS`` file is written
last; a folder without it is still being written and is never read. A folder whose
name is not a safe snapshot id is refused and never turned into a path.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from pydantic import Field

from resources.delta_store import UnsafeNameError, check_snapshot_id
from resources.errors import SnapshotNotReady

SUCCESS_MARKER = "_SUCCESS"


@dataclass(frozen=True)
class LandingScan:
    """One look at the landing zone."""

    complete: list[str]  # snapshot ids whose folder holds _SUCCESS, oldest first
    incomplete: list[str]  # safe ids still being written
    refused: list[str]  # folder names that are not safe snapshot ids


class LandingZone(dg.ConfigurableResource):
    """The folder where snapshot folders land."""

    root: str = Field(description="Landing folder holding one sub-folder per raw topic snapshot.")

    def snapshot_path(self, snapshot_id: str) -> str:
        """The folder of ``snapshot_id``; refuses unsafe ids and ids that would leave the landing folder."""
        check_snapshot_id(snapshot_id)
        root = Path(self.root).expanduser().resolve()
        path = (root / snapshot_id).resolve()
        if path.parent != root:
            raise UnsafeNameError(f"snapshot {snapshot_id!r} resolves outside the landing folder {root}")
        return str(path)

    def is_complete(self, snapshot_id: str) -> bool:
        return os.path.isfile(os.path.join(self.snapshot_path(snapshot_id), SUCCESS_MARKER))

    def require_complete(self, snapshot_id: str) -> str:
        """The folder of a complete snapshot, or a clear error."""
        path = self.snapshot_path(snapshot_id)
        if not os.path.isdir(path):
            raise SnapshotNotReady(f"snapshot {snapshot_id!r} not found in the landing folder {self.root}")
        if not os.path.isfile(os.path.join(path, SUCCESS_MARKER)):
            raise SnapshotNotReady(
                f"snapshot {snapshot_id!r} is incomplete (no {SUCCESS_MARKER} in {path}): it is not read until it is"
            )
        return path

    def scan(self) -> LandingScan:
        root = Path(self.root).expanduser()
        if not root.is_dir():
            return LandingScan(complete=[], incomplete=[], refused=[])
        complete: list[tuple[float, str]] = []
        incomplete: list[str] = []
        refused: list[str] = []
        for entry in sorted(os.scandir(root), key=lambda e: e.name):
            if not entry.is_dir(follow_symlinks=False):
                continue
            try:
                path = self.snapshot_path(entry.name)
            except UnsafeNameError:
                refused.append(entry.name)
                continue
            marker = os.path.join(path, SUCCESS_MARKER)
            if os.path.isfile(marker):
                complete.append((os.path.getmtime(marker), entry.name))
            else:
                incomplete.append(entry.name)
        return LandingScan(
            complete=[name for _, name in sorted(complete)],
            incomplete=incomplete,
            refused=refused,
        )
