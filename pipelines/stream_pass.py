"""The fused pass per stream: segments, ``L``, gaps, resolved timestamp, ``P``, ``U`` and ``M`` in one go (SPEC 2, 3, 3a).

Every (snapshot, replica, topic, partition) stream is brought together once (one exchange by
stream, no sort in Spark) and one vectorized function over its rows in offset order computes
what the separate window passes of ``pipelines/segments.py`` and ``pipelines/watermarks.py``
compute, with the same meanings:

- per row (``heartbeat_segments``): its segment (heartbeats at or before it), the opening
  heartbeat's offset, contribution and applied times, the row's contribution, ``L(p)`` (the
  componentwise max of the contributions strictly before it), the resolved timestamp, and the
  gap fields (``gap_before``, ``gap_start``, ``gap_end``, ``missing_before``; positions read that
  hold no row close gaps and are not rows);
- per data row (``reconstructed_watermarks``): ``U(r)`` (the floor, ``P`` or after a gap the
  floor of its run, joined with the key's ``{source_region: source_offset}`` so far) and ``M(r)``
  (``L`` of the key's next data row in the same run, else ``L`` of the row that ends the run at a
  gap, else ``L(end)``).

Vectors are laid out dense inside the pass, one ``int64`` column per region the stream names,
``-1`` for a missing component (offsets are never negative): a running max is then numpy's
``maximum.accumulate``, and a key's running max a cumulative max over keys sorted by offset.
They leave the pass as ``map<string,bigint>`` again, keys in region order.

``stream_rows`` is the pass on Arrow (no Spark: testable and callable on the driver);
``stream_pass`` applies it to a frame: in Spark's Python workers after one exchange by stream,
or, for a few rows (``DRIVER_MAX_ROWS``), once on the driver with no worker to start. The
tables ``heartbeat_segments`` and ``reconstructed_watermarks`` are both selections of its
output (``segment_rows``, ``watermark_rows``).
"""
from __future__ import annotations

import sys
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.conform import conform, local_batches, to_arrow_schema
from schemas.raw import DATA_KINDS, VECTOR
from schemas.segments import HeartbeatSegments
from schemas.watermarks import ReconstructedWatermarks

PARTITION_KEYS = ("snapshot_id", "replica", "topic", "partition")
# At most this many rows the pass runs on the driver: a small audit starts no Python worker for it.
DRIVER_MAX_ROWS = 20_000
MISSING = -1
_NONE = np.iinfo(np.int64).max  # "no value" inside integer arrays that are nullable columns outside

# What the pass reads of each row: every column of heartbeat_segments that is not computed.
COMPUTED = (
    "segment", "opening_offset", "baseline_vector", "opening_applied_ts_min_ms", "opening_applied_ts_max_ms",
    "contribution", "applied_lower_bound", "resolved_ts_ms", "gap_before", "gap_start", "gap_end", "missing_before",
)
_SEGMENT_STRUCT = HeartbeatSegments.to_structtype()
INPUT_COLUMNS = tuple(f.name for f in _SEGMENT_STRUCT.fields if f.name not in COMPUTED)
_WATERMARK_STRUCT = ReconstructedWatermarks.to_structtype()
# The pass's output: every column of heartbeat_segments, then U and M (null on rows that are not data rows).
OUTPUT_STRUCT = T.StructType(
    [T.StructField(f.name, f.dataType, True) for f in _SEGMENT_STRUCT.fields]
    + [T.StructField("touch_bound", VECTOR, True), T.StructField("reach", VECTOR, True)]
)


# ------------------------------------------------------------------ small numpy tools
def _last_index(mask: np.ndarray) -> np.ndarray:
    """Per position, the index of the last position at or before it where ``mask`` holds (-1: none)."""
    return np.maximum.accumulate(np.where(mask, np.arange(len(mask)), -1)) if len(mask) else np.zeros(0, np.int64)


def _next_index(mask: np.ndarray) -> np.ndarray:
    """Per position, the index of the first position at or after it where ``mask`` holds (-1: none)."""
    n = len(mask)
    if n == 0:
        return np.zeros(0, np.int64)
    found = np.minimum.accumulate(np.where(mask, np.arange(n), n)[::-1])[::-1]
    return np.where(found < n, found, -1)


def _taken(values: np.ndarray, index: np.ndarray, none=_NONE) -> np.ndarray:
    """``values[index]``, ``none`` where ``index`` is -1."""
    if len(values) == 0:
        return np.full(len(index), none, dtype=values.dtype)
    return np.where(index >= 0, values[np.maximum(index, 0)], none)


def _grouped_cummax(values: np.ndarray, group: np.ndarray) -> np.ndarray:
    """Running max of each column of ``values`` (rows, columns) within runs of equal ``group`` (rows sorted by group).

    Each value is replaced by its rank among the distinct values, and each group is lifted above
    the ones before it (``group * (ranks + 1)``): one ``maximum.accumulate`` then never carries a
    max across groups, and the ranks keep the lift far from overflowing whatever the offsets.
    """
    if values.size == 0:
        return values
    distinct, rank = np.unique(values, return_inverse=True)
    rank = rank.reshape(values.shape)
    lift = (group.astype(np.int64) * (len(distinct) + 1))[:, None]
    return distinct[np.maximum.accumulate(rank + lift, axis=0) - lift]


def _int_column(column: pa.ChunkedArray | pa.Array, none=_NONE) -> np.ndarray:
    return np.asarray(pc.fill_null(column.cast(pa.int64()), none).to_numpy(zero_copy_only=False), dtype=np.int64)


def _vectors(dense: np.ndarray, valid: np.ndarray | None, regions: pa.Array) -> pa.MapArray:
    """The dense vectors (rows, regions) as a map array: components below 0 left out, invalid rows null."""
    n, width = dense.shape
    present = dense >= 0
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(present.sum(axis=1), out=offsets[1:])
    columns = np.broadcast_to(np.arange(width), dense.shape)[present]
    keys = regions.take(pa.array(columns, type=pa.int32())) if width else pa.array([], pa.string())
    mask = None if valid is None else pa.array(~valid)
    return pa.MapArray.from_arrays(pa.array(offsets), keys, pa.array(dense[present], pa.int64()), mask=mask)


def _nullable(values: np.ndarray, none=_NONE) -> pa.Array:
    return pa.array(values, pa.int64(), mask=values == none)


def _entries(vectors: pa.MapArray) -> tuple[np.ndarray, pa.Array, pa.Array]:
    """The entries of a (possibly sliced) map array: the row each belongs to, its key, its value.

    ``keys`` and ``items`` of a slice are its whole buffers', and its ``offsets`` point into them.
    """
    bounds = vectors.offsets.to_numpy()
    lengths = np.where(vectors.is_valid().to_numpy(zero_copy_only=False), np.diff(bounds), 0)
    owner = np.repeat(np.arange(len(vectors)), lengths)
    entry = np.repeat(bounds[:-1], lengths) + np.arange(len(owner)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    entry = pa.array(entry, pa.int64())
    return owner, vectors.keys.take(entry), vectors.items.take(entry)


# ------------------------------------------------------------------ one stream
class _Stream:
    """One stream's positions in offset order: rows (kind set) and positions read that hold no row (kind null)."""

    def __init__(self, table: pa.Table):
        self.table = table
        self.n = table.num_rows
        kind = table["kind"]
        self.is_row = pc.is_valid(kind).to_numpy(zero_copy_only=False)
        self.is_hb = pc.fill_null(pc.equal(kind, "HEARTBEAT"), False).to_numpy(zero_copy_only=False)
        self.is_sop = pc.fill_null(pc.equal(kind, "START_OF_PUSH"), False).to_numpy(zero_copy_only=False)
        self.is_data = pc.fill_null(pc.is_in(kind, pa.array(DATA_KINDS)), False).to_numpy(zero_copy_only=False)
        self.offset = _int_column(table["offset"])
        self.source_offset = _int_column(table["source_offset"], MISSING)
        hb = table["hb_vector"].combine_chunks()
        self.hb_valid = hb.is_valid().to_numpy(zero_copy_only=False)
        owner, hb_keys, hb_items = _entries(hb)
        # The regions this stream names: every source region and every heartbeat vector's key.
        names = pc.unique(pa.concat_arrays([
            table["source_region"].combine_chunks().drop_null().cast(pa.string()), hb_keys.cast(pa.string()),
        ]))
        self.regions = names.take(pc.sort_indices(names))
        self.width = len(self.regions)
        self.region = _int_column(pc.index_in(table["source_region"], value_set=self.regions), MISSING)
        self.hb = self._laid_out(owner, hb_keys, hb_items)

    def _laid_out(self, owner: np.ndarray, keys: pa.Array, items: pa.Array) -> np.ndarray:
        dense = np.full((self.n, self.width), MISSING, dtype=np.int64)
        if len(keys):
            dense[owner, _int_column(pc.index_in(keys, value_set=self.regions))] = _int_column(items, MISSING)
        return dense

    def dense(self, name: str) -> np.ndarray:
        """The vector column ``name`` (whose regions are among the stream's), dense; null rows all missing."""
        return self._laid_out(*_entries(self.table[name].combine_chunks()))

    def single(self, rows: np.ndarray) -> np.ndarray:
        """``{source_region: source_offset}`` of ``rows`` (a mask), dense; all missing elsewhere."""
        dense = np.full((self.n, self.width), MISSING, dtype=np.int64)
        at = np.flatnonzero(rows & (self.region >= 0))
        dense[at, self.region[at]] = self.source_offset[at]
        return dense


def _contribution(s: _Stream) -> np.ndarray:
    """What each row adds to ``L`` of the rows after it: a heartbeat's vector (or, without one, its
    ``{source_region: source_offset}``), a data row's ``{source_region: source_offset}``, nothing else; dense."""
    contribution = s.single((s.is_hb & ~s.hb_valid) | s.is_data)
    vector_hb = s.is_hb & s.hb_valid
    contribution[vector_hb] = s.hb[vector_hb]
    return contribution


def _segment_columns(s: _Stream) -> dict[str, np.ndarray]:
    """Per position: the computed columns of ``heartbeat_segments`` (SPEC 2, 3, 3a), dense vectors."""
    n = s.n
    contribution = _contribution(s)
    applied = np.maximum.accumulate(contribution, axis=0) if n else contribution
    lower = np.full_like(contribution, MISSING)
    lower[1:] = applied[:-1]
    opening = _last_index(s.is_hb)
    columns = {
        "segment": np.cumsum(s.is_hb, dtype=np.int64),
        "opening": opening,
        "contribution": contribution,
        "applied_lower_bound": lower,
        "applied": applied,
    }
    # Resolved timestamp: per source region, origin_ts_min_ms of its last heartbeat so far; the least of them.
    origin_min = _int_column(s.table["origin_ts_min_ms"])
    resolved = np.full(n, _NONE, dtype=np.int64)
    for r in range(s.width):
        latest = _last_index(s.is_hb & (s.region == r) & (origin_min != _NONE))
        resolved = np.minimum(resolved, _taken(origin_min, latest))
    columns["resolved_ts_ms"] = resolved
    # Gaps: positions between two positions read that hold nothing (rows and read positions alike are positions).
    offset = s.offset
    index = np.arange(n)
    missing = offset - (offset[0] if n else 0) - index
    previous = np.empty(n, dtype=np.int64)
    previous[:1] = offset[:1] - 1  # the first position has no gap before it
    previous[1:] = offset[:-1]
    here = offset - previous - 1
    if s.is_row.all():
        gap_before = here
        start, end = offset - here, offset - 1
    else:
        # A gap can end at a read position (a quarantined record, then skipped ones): it is a gap of the next row.
        row_before = np.empty(n, dtype=np.int64)
        row_before[:1] = -1
        row_before[1:] = _last_index(s.is_row)[:-1]
        since_row = np.where(row_before >= 0, missing[np.maximum(row_before, 0)], 0)
        first_after_row = (here > 0) & (missing - here == since_row)
        start = _taken(previous + 1, _last_index(first_after_row))
        end = _taken(offset - 1, _last_index(here > 0))
        gap_before = missing - since_row
    at_gap = gap_before > 0
    columns.update(
        gap_before=gap_before, missing_before=missing,
        gap_start=np.where(at_gap, start, _NONE), gap_end=np.where(at_gap, end, _NONE),
    )
    return columns


def _watermark_columns(
    s: _Stream, rows: np.ndarray, lower: np.ndarray, missing: np.ndarray, end: np.ndarray,
) -> tuple[np.ndarray, ...]:
    """``U`` and ``M`` of the data rows among ``rows`` (indices of the stream's rows, in offset order), dense.

    ``lower``, ``missing``: ``L`` and ``missing_before`` of ``rows``; ``end``: ``L(end)``.
    Returns (data row positions in ``rows``, touch bound, touch bound known, reach).
    """
    kinds = s.is_data[rows]
    count = len(rows)
    if count == 0:
        empty = np.zeros((0, s.width), dtype=np.int64)
        return np.zeros(0, np.int64), empty, np.zeros(0, bool), empty
    # P: {} after START_OF_PUSH at the dump's first row, else the first heartbeat vector, else unknown.
    vector_hb = (s.is_hb & s.hb_valid)[rows]
    first_vector = _next_index(vector_hb)
    if s.is_sop[rows[0]]:
        pre_history, pre_known = np.full(s.width, MISSING, dtype=np.int64), True
    elif first_vector[0] >= 0:
        pre_history, pre_known = s.hb[rows[first_vector[0]]], True
    else:
        pre_history, pre_known = np.full(s.width, MISSING, dtype=np.int64), False
    # Runs (SPEC 3a): the rows between two gaps share missing_before, which grows exactly at a gap row.
    opener = np.searchsorted(missing, missing, side="left")  # the run's first row (a gap row after a gap)
    closer = np.searchsorted(missing, missing, side="right")  # the row that ends the run at a gap (count: none)
    floor_index = first_vector[opener]  # the first heartbeat vector at or after the run's first row
    after_gap = missing > 0
    floor_known = np.where(after_gap, floor_index >= 0, pre_known)
    floor = np.where(after_gap[:, None], s.hb[rows[np.maximum(floor_index, 0)]], pre_history[None, :])
    stop_known = closer < count
    stop = lower[np.minimum(closer, count - 1)]
    # The data rows by key, then offset: the key's rows so far (U) and its next row (M).
    data = np.flatnonzero(kinds)
    keys = pc.dictionary_encode(s.table["key"].take(pa.array(rows[data]))).combine_chunks().indices.to_numpy()
    order = np.lexsort((data, keys))
    sorted_rows, sorted_keys = data[order], keys[order]
    touched = _grouped_cummax(s.single(s.is_data)[rows[sorted_rows]], sorted_keys)
    touch = np.where(floor_known[sorted_rows][:, None], np.maximum(floor[sorted_rows], touched), MISSING)
    has_next = np.zeros(len(sorted_rows), dtype=bool)
    has_next[:-1] = sorted_keys[1:] == sorted_keys[:-1]
    following = np.append(sorted_rows[1:], 0)
    same_run = has_next & (missing[following] == missing[sorted_rows])
    reach = np.where(
        same_run[:, None], lower[following],
        np.where(stop_known[sorted_rows][:, None], stop[sorted_rows],
                 np.where(has_next[:, None], lower[following], end[None, :])),
    )
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    return data, touch[back], floor_known[sorted_rows][back], reach[back]


def _stream_batch(table: pa.Table, schema: pa.Schema) -> pa.RecordBatch:
    """The pass over one stream (its positions sorted by offset): its rows with every output column."""
    s = _Stream(table)
    seg = _segment_columns(s)
    rows = np.flatnonzero(s.is_row)
    end = seg["applied"][rows[-1]] if len(rows) else None  # L(end): every contribution joined
    data, touch, known, reach = _watermark_columns(
        s, rows, seg["applied_lower_bound"][rows], seg["missing_before"][rows], end,
    )
    count = len(rows)
    every = count == s.n  # no read position among them: the rows are the table as it is
    out = {name: table[name].combine_chunks() if every else table[name].take(pa.array(rows)).combine_chunks()
           for name in INPUT_COLUMNS}
    opening = seg["opening"][rows]
    opened = opening >= 0
    regions = s.regions

    def at_opening(name: str) -> pa.Array:
        return _nullable(_taken(_int_column(table[name]), opening))

    out.update(
        segment=pa.array(seg["segment"][rows], pa.int64()),
        opening_offset=_nullable(_taken(s.offset, opening)),
        baseline_vector=_vectors(seg["contribution"][np.maximum(opening, 0)], opened, regions),
        opening_applied_ts_min_ms=at_opening("applied_ts_min_ms"),
        opening_applied_ts_max_ms=at_opening("applied_ts_max_ms"),
        contribution=_vectors(seg["contribution"][rows], None, regions),
        applied_lower_bound=_vectors(seg["applied_lower_bound"][rows], None, regions),
        resolved_ts_ms=_nullable(seg["resolved_ts_ms"][rows]),
        gap_before=pa.array(seg["gap_before"][rows], pa.int64()),
        gap_start=_nullable(seg["gap_start"][rows]),
        gap_end=_nullable(seg["gap_end"][rows]),
        missing_before=pa.array(seg["missing_before"][rows], pa.int64()),
    )
    touch_full = np.full((count, s.width), MISSING, dtype=np.int64)
    reach_full = np.full((count, s.width), MISSING, dtype=np.int64)
    is_data = np.zeros(count, dtype=bool)
    touch_known = np.zeros(count, dtype=bool)
    touch_full[data], reach_full[data], is_data[data], touch_known[data] = touch, reach, True, known
    out["touch_bound"] = _vectors(touch_full, touch_known, regions)
    out["reach"] = _vectors(reach_full, is_data, regions)
    return pa.RecordBatch.from_arrays([out[f.name] for f in schema], schema=schema)


def _streams(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.Table]:
    """Each stream among ``batches``, its positions sorted by offset (all of a stream's positions must be there)."""
    received = [b for b in batches if b.num_rows]
    if not received:
        return
    table = pa.Table.from_batches(received).combine_chunks()
    table = table.sort_by([(k, "ascending") for k in (*PARTITION_KEYS, "offset")])
    n = table.num_rows
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    for name in PARTITION_KEYS:
        column = table[name].combine_chunks()
        starts[1:] |= pc.not_equal(column.slice(1), column.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    bounds = np.append(np.flatnonzero(starts), n)
    for begin, stop in zip(bounds[:-1], bounds[1:]):
        yield table.slice(begin, stop - begin)


def stream_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The fused pass over every stream among ``batches`` (``INPUT_COLUMNS``; read positions: kind null).

    A stream's positions must all be among ``batches`` (one exchange by stream gives that), in
    any order: they are sorted here by stream and offset.
    """
    schema = to_arrow_schema(OUTPUT_STRUCT)
    for stream in _streams(batches):
        batch = _stream_batch(stream, schema)
        if batch.num_rows:
            yield batch


def segment_watermarks(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """``U`` and ``M`` of the data rows of already annotated streams (``heartbeat_segments`` rows), as the pass gives.

    For segments computed earlier (a table read back): ``L`` and ``missing_before`` are read, not
    computed again; read positions are already in ``missing_before``.
    """
    schema = to_arrow_schema(_WATERMARK_STRUCT)
    for table in _streams(batches):
        s = _Stream(table)
        rows = np.arange(s.n)
        lower = s.dense("applied_lower_bound")
        end = np.maximum(lower[-1], _contribution(s)[-1])
        data, touch, known, reach = _watermark_columns(s, rows, lower, _int_column(table["missing_before"]), end)
        taken = pa.array(data)
        out = {f.name: table[f.name].take(taken).combine_chunks() for f in _WATERMARK_STRUCT.fields
               if f.name not in ("touch_bound", "reach")}
        out["touch_bound"] = _vectors(touch, known, s.regions)
        out["reach"] = _vectors(reach, None, s.regions)
        if len(data):
            yield pa.RecordBatch.from_arrays([out[f.name] for f in schema], schema=schema)


# The pass runs in Spark's Python workers, which receive it by value: executors need numpy and pyarrow only.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ------------------------------------------------------------------ Spark side
def _positions(raw: DataFrame, read_positions: DataFrame | None) -> DataFrame:
    """The version-topic rows, and the positions read that hold no row as rows of kind null (each position once)."""
    rows = raw.where(F.col("kind") != "EXPORTER_POSITION").select(*INPUT_COLUMNS)
    if read_positions is None:
        return rows
    types = {f.name: f.dataType for f in _SEGMENT_STRUCT.fields}
    markers = read_positions.select(*PARTITION_KEYS, "offset").distinct().select(
        *[F.col(c) if c in (*PARTITION_KEYS, "offset") else F.lit(None).cast(types[c]).alias(c) for c in INPUT_COLUMNS]
    )
    return rows.unionByName(markers)


def ran_on_driver(rows: int | None) -> bool:
    """Whether ``stream_pass`` over ``rows`` rows runs on the driver (a known, small number)."""
    return rows is not None and rows <= DRIVER_MAX_ROWS


def stream_pass(raw: DataFrame, read_positions: DataFrame | None = None, rows: int | None = None) -> DataFrame:
    """Every version-topic row of ``raw`` with its segment columns, ``U`` and ``M`` (``OUTPUT_STRUCT``).

    ``read_positions``: (``snapshot_id``, ``replica``, ``topic``, ``partition``, ``offset``) of
    positions read that hold no row (raw Venice records skipped by rule): they close gaps and are
    not rows. ``rows``: how many rows ``raw`` holds when the caller knows (the Delta log does): at
    most ``DRIVER_MAX_ROWS`` the pass runs on the driver.
    """
    positions = _positions(raw, read_positions)
    if ran_on_driver(rows):
        return local_batches(raw.sparkSession, stream_rows(iter(positions.toArrow().to_batches())), OUTPUT_STRUCT)
    return positions.repartition(*PARTITION_KEYS).mapInArrow(stream_rows, OUTPUT_STRUCT)


def watermarks_of_segments(annotated: DataFrame) -> DataFrame:
    """``reconstructed_watermarks`` of ``heartbeat_segments`` rows computed earlier (``segment_watermarks``)."""
    columns = [f.name for f in _SEGMENT_STRUCT.fields]
    batches = annotated.select(*columns).repartition(*PARTITION_KEYS)
    return conform(batches.mapInArrow(segment_watermarks, _WATERMARK_STRUCT), _WATERMARK_STRUCT)


def segment_rows(passed: DataFrame) -> DataFrame:
    """``heartbeat_segments`` from the pass's output."""
    return conform(passed, HeartbeatSegments.to_structtype())


def watermark_rows(passed: DataFrame) -> DataFrame:
    """``reconstructed_watermarks`` from the pass's output: its data rows."""
    return conform(passed.where(F.col("kind").isin(*DATA_KINDS)), ReconstructedWatermarks.to_structtype())
