"""Table name -> pandera model: the one lookup every asset, check and reader uses."""
from __future__ import annotations

import functools

import pandera.pyspark as pa
from pyspark.sql import types as T

from schemas.broker import BrokerCuts
from schemas.divergence import DivergenceReports, DivergenceSummary
from schemas.operations import (
    CompactionBounds,
    ExporterPositions,
    ExporterRegressions,
    HeartbeatLag,
    ReplicationLag,
    StreamAnomalies,
)
from schemas.raw import RawTopicQuarantine, RawTopicSkipped, RawTopicSnapshots
from schemas.segments import HeartbeatSegments, HeartbeatSegmentSummary
from schemas.state import ReplicaState
from schemas.trend import AuditTrend
from schemas.watermarks import PartitionWatermarks, ReconstructedWatermarks

_MODELS: dict[str, type[pa.DataFrameModel]] = {
    model.Config.name: model
    for model in (
        RawTopicSnapshots,
        RawTopicQuarantine,
        RawTopicSkipped,
        HeartbeatSegments,
        HeartbeatSegmentSummary,
        ReconstructedWatermarks,
        PartitionWatermarks,
        DivergenceReports,
        DivergenceSummary,
        ReplicaState,
        StreamAnomalies,
        HeartbeatLag,
        ReplicationLag,
        ExporterPositions,
        ExporterRegressions,
        CompactionBounds,
        AuditTrend,
        BrokerCuts,
    )
}


def model_for(table: str) -> type[pa.DataFrameModel]:
    try:
        return _MODELS[table]
    except KeyError:
        raise KeyError(f"no pandera model registered for table {table!r}") from None


def struct_for(table: str) -> T.StructType:
    return model_for(table).to_structtype()


@functools.lru_cache(maxsize=None)
def required_columns(table: str) -> tuple[str, ...]:
    """The columns ``table``'s model declares non-nullable (``to_structtype`` marks every field nullable)."""
    return tuple(name for name, column in model_for(table).to_schema().columns.items() if not column.nullable)


def tables() -> list[str]:
    return sorted(_MODELS)
