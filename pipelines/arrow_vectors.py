"""Vectors (``{region: offset}`` maps) between Arrow map arrays and dense numpy arrays, for the passes in Python.

The stream pass (``pipelines/stream_pass.py``), the Leap Frog pass (``pipelines/leapfrog.py``) and
the replica state's checksum (``pipelines/state/arrow_checksum.py``) read and write vectors as Arrow
``map<string, int64>`` columns, and lay them out dense inside (one ``int64`` column per region,
``-1`` for a missing component: offsets are never negative). numpy and pyarrow only: this module
travels by value to Spark's Python workers with those passes.
"""
from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle


def map_vectors(dense: np.ndarray, valid: np.ndarray | None, regions: pa.Array) -> pa.MapArray:
    """The dense vectors (rows, regions) as a map array: components below 0 left out, invalid rows null."""
    n, width = dense.shape
    present = dense >= 0
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(present.sum(axis=1), out=offsets[1:])
    columns = np.broadcast_to(np.arange(width), dense.shape)[present]
    keys = regions.take(pa.array(columns, type=pa.int32())) if width else pa.array([], pa.string())
    mask = None if valid is None else pa.array(~valid)
    return pa.MapArray.from_arrays(pa.array(offsets), keys, pa.array(dense[present], pa.int64()), mask=mask)


def map_entries(vectors: pa.MapArray) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """The entries of a (possibly sliced) map array: the row each belongs to (ascending), its key, its value.

    ``keys`` and ``items`` of a slice are its whole buffers', and its ``offsets`` point into them.
    """
    bounds = vectors.offsets.to_numpy()
    lengths = np.where(vectors.is_valid().to_numpy(zero_copy_only=False), np.diff(bounds), 0)
    owner = np.repeat(np.arange(len(vectors)), lengths)
    entry = np.repeat(bounds[:-1], lengths) + np.arange(len(owner)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    entry = pa.array(entry, pa.int64())
    return owner, vectors.keys.take(entry), vectors.items.take(entry)


def dense_vectors(vectors: pa.Array, regions: pa.Array) -> np.ndarray:
    """A map array as dense vectors (rows, regions): ``-1`` for a component it lacks, and every component of a null
    vector. Components of regions not in ``regions`` are left out: give every region the vectors name."""
    if isinstance(vectors, pa.ChunkedArray):
        vectors = vectors.combine_chunks()
    dense = np.full((len(vectors), len(regions)), -1, dtype=np.int64)
    owner, keys, values = map_entries(vectors)
    if len(owner):
        column = pc.index_in(keys, value_set=regions)
        known = column.is_valid().to_numpy(zero_copy_only=False)
        dense[owner[known], column.to_numpy(zero_copy_only=False)[known].astype(np.int64)] = \
            values.to_numpy(zero_copy_only=False)[known]
    return dense


# Sent to Spark's Python workers by value, with the passes that use it.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
