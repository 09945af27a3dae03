"""The rows of the incremental-audit state (``replica_state``) and the checksum a commit context keeps of them.

The *state* after auditing a snapshot S keeps, per (replica, topic, partition), each key's
last version (a VERSION row) and one *commit context* (a CONTEXT row; Varlog's design:
only the latest context, stored atomically with the state it describes, and checked
against it before use). Both are the rows of snapshot S's partition of
``replica_state``, written in one Delta commit (``pipelines/state/carry.py``, ``next_state``).

A context's ``state_rows`` is the count of its VERSION rows and ``state_checksum`` the
sum, modulo 2^64 as a signed long, of ``xxhash64`` over every VERSION column (vectors as
their entries sorted by region), which no order of the rows changes (``version_hash``,
``checksum``). ``pipelines/state/check.py`` checks a context against them before its
state is used.
"""
from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

VERSION = "VERSION"
CONTEXT = "CONTEXT"
REPLICA_PARTITION = ("replica", "topic", "partition")
VECTOR_COLUMNS = ("key_touch", "first_lower_bound", "touch_bound", "reach")
# What a VERSION row keeps of its key's last data row (the comparison's pass returns them too: pipelines/leapfrog.py).
# The value itself is not kept: it stays in raw_topic_snapshots of ``origin_snapshot_id``, at ``offset``.
LAST_VERSION_COLUMNS = ("offset", "kind", "value_hash", "source_region", "source_offset", "write_ts")
# The carried columns of a VERSION row, in the checksum's order. Spark's xxhash64 skips null inputs: a state
# written before a column existed keeps its checksum, and so does one written while states kept each version's
# ``value`` (null since: the column stays in the table and in this list for those states).
VERSION_COLUMNS = ("key", "offset", "kind", "value", *LAST_VERSION_COLUMNS[2:], "key_touch", "first_lower_bound",
                   "origin_snapshot_id", "touch_bound", "reach", "missing_before")
CARRIED_COLUMNS = tuple(c for c in VERSION_COLUMNS if c not in ("value", "origin_snapshot_id"))

_DECIMAL = T.DecimalType(20, 0)  # holds any long and 2^64


def partition_name(row) -> str:
    """``replica/topic/partition`` of a row holding those columns, as refusals name a replica partition."""
    return f"{row['replica']}/{row['topic']}/{row['partition']}"


# ------------------------------------------------------------------ checksum
def version_hash() -> Column:
    """``xxhash64`` over every VERSION column; vectors as their entries sorted by region, so map order is moot."""
    return F.xxhash64(
        *[F.array_sort(F.map_entries(F.col(c))) if c in VECTOR_COLUMNS else F.col(c) for c in VERSION_COLUMNS]
    )


def checksum(hashes: Column) -> Column:
    """Aggregate: the sum of ``hashes`` modulo 2^64 as a signed long (decimal, since ANSI sums must not overflow)."""
    modulus = F.lit(str(2**64)).cast(_DECIMAL)
    total = F.pmod(F.coalesce(F.sum(hashes.cast(_DECIMAL)), F.lit(0).cast(_DECIMAL)), modulus)
    return F.when(total >= F.lit(str(2**63)).cast(_DECIMAL), total - modulus).otherwise(total).cast(T.LongType())
