"""Default sizes of the Spark session and of housekeeping, importable without starting anything (the CLI reads them)."""
from __future__ import annotations

import os
from typing import Optional

# An upper bound, not a task count: adaptive execution merges each shuffle's partitions to
# about 32 MB, so 2 million rows run in a dozen tasks and 20 million in a hundred or more.
# A bound of 64 forced ~100 MB partitions at 20 million rows, whose sorts spilled so often
# that merging the spills ran out of heap.
DEFAULT_SHUFFLE_PARTITIONS = 512
DEFAULT_DRIVER_MEMORY = "3g"

# VACUUM keeps files that no Delta version needs for this long (Delta's own default): the
# time-travel window, and the margin that protects a write in flight (its staged files are
# named by no version until it commits).
DEFAULT_RETENTION_HOURS = 7 * 24

# At most this many rows, a pass over Arrow batches (the stream pass, the Leap Frog comparison) runs once on the
# driver: a small audit then starts no Python worker, whose start costs more than the pass over its rows.
DRIVER_MAX_ROWS = 20_000
DRIVER_MAX_ROWS_ENV = "REPLICA_LENS_DRIVER_MAX_ROWS"


def on_driver(rows: Optional[int]) -> bool:
    """Whether a pass over ``rows`` rows (a known number; None: unknown) runs on the driver.

    At most ``DRIVER_MAX_ROWS``, or ``REPLICA_LENS_DRIVER_MAX_ROWS`` when set (0: every pass in Spark's Python workers).
    """
    from resources.settings import whole_number

    value = whole_number(os.environ.get(DRIVER_MAX_ROWS_ENV), DRIVER_MAX_ROWS_ENV, minimum=0)
    return rows is not None and rows <= (DRIVER_MAX_ROWS if value is None else value)

# Above DRIVER_MAX_ROWS and at most this many rows, the Leap Frog pass in Spark's Python workers runs in one task per
# core: adaptive execution would merge its exchange (some 65 bytes a row) into a single 32 MB partition, one Python task
# on one core, while the pass costs CPU per row (a 1% cut with its carried state: 320,000 rows, 4 s in one task).
# Larger inputs keep adaptive execution's partitions (already one per 32 MB).
SPLIT_PASS_MAX_ROWS = 1_000_000


def pass_tasks(rows: Optional[int], cores: int) -> Optional[int]:
    """How many tasks a pass in Spark's workers over ``rows`` rows gets (None: adaptive execution's partitions): one
    per core, each of at least ``DRIVER_MAX_ROWS`` rows (what one pass on the driver takes; a cluster's hundred cores
    would otherwise each start a Python worker for a few hundred rows)."""
    if rows is None or on_driver(rows) or rows > SPLIT_PASS_MAX_ROWS or cores < 2:
        return None
    return min(cores, -(-rows // DRIVER_MAX_ROWS))


# At most this many rows in a snapshot continuing a state (a small cut of a live store), the per-key facts of its rows
# are broadcast to the scan of the carried versions instead of shuffling and sorting those (pipelines/state/carry.py,
# ``carry_over``): at about 200 bytes a key, some 40 MB sent to each task.
BROADCAST_MAX_ROWS = 200_000

# Steps of one audit run at once, on threads of the run's process (replica_lens/executor.py).
# Measured on the 2-core development machine (docs/performance.md, "Levers tried").
DEFAULT_CONCURRENT_STEPS = 2

# Spark's Parquet reader decodes up to this many rows of a row group at once (its default), every value whole.
PARQUET_BATCH_ROWS = 4096
# What a batch of a column whose values are large may hold: a batch of rows then shrinks to fit
# (``parquet_batch_rows``), down to one row.
PARQUET_BATCH_BYTES = 64 * 1024 * 1024


def parquet_batch_rows(largest_value: Optional[int], budget: int = PARQUET_BATCH_BYTES) -> Optional[int]:
    """Rows per Parquet reader batch so that a batch of a column whose values take at most ``largest_value`` bytes
    holds at most about ``budget`` bytes (at least one row).

    None when Spark's default batch fits (or the largest value is not known): the session is then left as it is.
    """
    if largest_value is None or largest_value * PARQUET_BATCH_ROWS <= budget:
        return None
    return max(1, budget // largest_value)
