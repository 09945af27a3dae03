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


# SPEC's shared examples sit beside the project folder (../shared/examples).
SHARED_EXAMPLES = Path(__file__).resolve().parents[2] / "shared" / "examples"
