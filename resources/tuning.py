"""Default sizes of the Spark session and of housekeeping, importable without starting anything (the CLI reads them)."""

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

# Steps of one audit run at once, on threads of the run's process (replica_lens/executor.py).
# Measured on the 2-core development machine (docs/performance.md, "Levers tried").
DEFAULT_CONCURRENT_STEPS = 2
