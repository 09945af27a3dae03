"""Build small frames shaped like the project's tables from plain Python dicts."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from pyspark.sql import DataFrame, SparkSession

from schemas.raw import RawTopicSnapshots


def raw_frame(spark: SparkSession, rows: Iterable[dict[str, Any]], snapshot_id: str = "t") -> DataFrame:
    """A ``raw_topic_snapshots``-shaped frame; fields a row leaves out are null."""
    struct = RawTopicSnapshots.to_structtype()
    defaults = {"snapshot_id": snapshot_id, "copies": 1, "source_file": "test.jsonl"}
    records = [tuple({**defaults, **row}.get(f.name) for f in struct.fields) for row in rows]
    return spark.createDataFrame(records, struct)


# Fixtures that ship with the repository: a two-region snapshot with injected faults
# (two lost writes, one corrupted value) and the divergence reports it implies.
EXAMPLES = Path(__file__).resolve().parent / "data"
