"""Table name -> pandera model: the one lookup every asset, check and reader uses."""
from __future__ import annotations

import pandera.pyspark as pa
from pyspark.sql import types as T

from schemas.raw import RawTopicQuarantine, RawTopicSnapshots

_MODELS: dict[str, type[pa.DataFrameModel]] = {
    "raw_topic_snapshots": RawTopicSnapshots,
    "raw_topic_quarantine": RawTopicQuarantine,
}


def model_for(table: str) -> type[pa.DataFrameModel]:
    try:
        return _MODELS[table]
    except KeyError:
        raise KeyError(f"no pandera model registered for table {table!r}") from None


def struct_for(table: str) -> T.StructType:
    return model_for(table).to_structtype()
