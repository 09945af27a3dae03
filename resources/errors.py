"""What the user asked for cannot be done as asked: errors the command line reports in one line.

A ``UsageError`` is raised where the request is judged (a snapshot id, a missing or
incomplete snapshot, a simulation or benchmark setting); ``replica-lens`` prints its
message and exits 2. Any other exception is a bug and is reported as one (exit 70), so
that a ``ValueError`` deep in the pipeline is never mistaken for a mistake of the user's.
The concrete classes keep the built-in base that callers already catch.
"""


class UsageError(Exception):
    """The request cannot be carried out as given; the message says what to change."""


class InvalidSetting(UsageError, ValueError):
    """A setting or name outside what is accepted."""


class SnapshotNotReady(UsageError, FileNotFoundError):
    """The snapshot is not in the landing folder, or has no completion marker yet."""
