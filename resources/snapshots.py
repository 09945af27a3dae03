"""What a snapshot id may be, and how a snapshot folder says it is complete: one home for both.

A snapshot id names a folder in the landing zone and a partition of every table, so it is
turned into paths: it must match ``[A-Za-z0-9][A-Za-z0-9._-]{0,127}`` (SPEC section 1), and
anything else is refused before it reaches a path. A snapshot folder is complete once its
empty ``_SUCCESS`` file exists; writers put it there last, and readers skip a folder without it.

Every folder that names snapshots (``resources/``, ``pipelines/``, ``assets/``,
``replica_lens/``) takes the rule from here; this module imports nothing of the project
but its errors.
"""
from __future__ import annotations

import re

from resources.errors import InvalidSetting

SNAPSHOT_ID_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
SNAPSHOT_ID = re.compile(SNAPSHOT_ID_PATTERN)
SUCCESS_MARKER = "_SUCCESS"


class UnsafeNameError(InvalidSetting):
    """A snapshot id or table name that must never be used in a path."""


def check_snapshot_id(snapshot_id: str) -> str:
    """Return ``snapshot_id`` if it matches SPEC section 1, else raise ``UnsafeNameError``."""
    if not isinstance(snapshot_id, str) or not SNAPSHOT_ID.fullmatch(snapshot_id):
        raise UnsafeNameError(f"refusing snapshot id {snapshot_id!r}: it must match {SNAPSHOT_ID_PATTERN}")
    return snapshot_id
