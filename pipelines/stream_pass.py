"""The fused pass per stream: segments, ``L``, gaps, resolved timestamp, ``P``, ``U``, ``M`` and anomalies (SPEC 2, 3, 5).

Every (snapshot, replica, topic, partition) stream is brought together once (one exchange by
stream, no sort in Spark) and one vectorized function over its rows in offset order computes
what separate Spark window passes computed before (kept as the tests' oracle,
``tests/reference_windows.py``), with the same meanings:

- per row (``heartbeat_segments``): its segment (heartbeats at or before it), the opening
  heartbeat's offset, contribution and applied times, the row's contribution, ``L(p)`` (the
  componentwise max of the contributions strictly before it), the resolved timestamp, and the
  gap fields (``gap_before``, ``gap_start``, ``gap_end``, ``missing_before``; positions read that
  hold no row close gaps and are not rows);
- per data row (``reconstructed_watermarks``): ``U(r)`` (the floor, ``P`` or after a gap the
  floor of its run, joined with the key's ``{source_region: source_offset}`` so far) and ``M(r)``
  (``L`` of the key's next data row in the same run, else ``L`` of the row that ends the run at a
  gap, else ``L(end)``);
- the stream anomalies of SPEC 5 (``stream_anomalies``), by the rules ``pipelines/anomalies.py``
  describes: per component, source region or key, over the same order.

Vectors are laid out dense inside the pass, one ``int64`` column per region the stream names,
``-1`` for a missing component (offsets are never negative): a running max is then numpy's
``maximum.accumulate``, and a key's running max a cumulative max over keys sorted by offset.
They leave the pass as ``map<string,bigint>`` again, keys in region order.

``stream_rows`` is the pass on Arrow (no Spark: testable and callable on the driver);
``stream_pass`` applies it to a frame: in Spark's Python workers after one exchange by stream,
or, for a few rows (``DRIVER_MAX_ROWS``, or ``REPLICA_LENS_DRIVER_MAX_ROWS``), once on the driver. The
tables ``heartbeat_segments``, ``heartbeat_segment_summary`` (one row per segment, made with its
rows), ``reconstructed_watermarks`` and ``stream_anomalies`` are selections of its output
(``segment_rows``, ``summary_rows``, ``watermark_rows``, ``anomaly_rows``).

The audit has the pass write the two per-row tables itself (``written``): each task writes its
rows of ``heartbeat_segments`` and ``reconstructed_watermarks`` (``written_rows``) as Parquet
with pyarrow, into the tables' staged writes, and returns only the summaries and anomalies.
Returned through Spark, every row was converted from Arrow into Spark's rows (six maps each),
kept, read again and encoded as Parquet by the JVM: at 2M rows that took the step from about
8 s to 20 s warm (docs/performance.md).

Nor need the rows come through Spark: the ingestion's one exchange is by stream, so each file of
``raw_topic_snapshots`` holds its streams whole (``DeltaStore.stream_files``), and
``stream_pass_of_files`` runs one task per file that reads it with pyarrow (``file_rows``): no
Spark read, exchange or conversion of the rows into Arrow by the JVM.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from functools import partial
from typing import Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark import cloudpickle
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.arrow_vectors import map_entries, map_vectors
from pipelines.frames import computed_once
from resources.staged_files import ArrowStage
from resources.tuning import on_driver
from schemas.conform import conform, local_batches, to_arrow_schema
from schemas.operations import StreamAnomalies
from schemas.raw import DATA_KINDS, VECTOR
from schemas.segments import HeartbeatSegments, HeartbeatSegmentSummary
from schemas.watermarks import ReconstructedWatermarks

PARTITION_KEYS = ("snapshot_id", "replica", "topic", "partition")
# The per-row tables the pass can write itself, where it makes their rows (``stream_pass(written=...)``).
WRITTEN = ("heartbeat_segments", "reconstructed_watermarks")
_DATA_KINDS = pa.array(list(DATA_KINDS))
MISSING = -1
# Rows per Arrow batch the pass returns to Spark (a few MB each).
OUTPUT_BATCH_ROWS = 16_384
_NONE = np.iinfo(np.int64).max  # "no value" inside integer arrays that are nullable columns outside

# What the pass reads of each row: every column of heartbeat_segments that is not computed.
COMPUTED = (
    "segment", "opening_offset", "baseline_vector", "opening_applied_ts_min_ms", "opening_applied_ts_max_ms",
    "contribution", "applied_lower_bound", "resolved_ts_ms", "gap_before", "gap_start", "gap_end", "missing_before",
)
_SEGMENT_STRUCT = HeartbeatSegments.to_structtype()
INPUT_COLUMNS = tuple(f.name for f in _SEGMENT_STRUCT.fields if f.name not in COMPUTED)
_WATERMARK_STRUCT = ReconstructedWatermarks.to_structtype()
# The anomaly columns of stream_anomalies that are not columns of a row: set on the pass's anomaly rows only.
ANOMALY_COLUMNS = ("anomaly", "observed", "expected", "reference_offset", "previous_leader_epoch", "detail")
_ANOMALY_STRUCT = StreamAnomalies.to_structtype()
_SUMMARY_STRUCT = HeartbeatSegmentSummary.to_structtype()
# The columns of heartbeat_segment_summary that are not columns of a row: one struct, set on the summary rows only.
SUMMARY = "segment_summary"
SUMMARY_COLUMNS = tuple(f.name for f in _SUMMARY_STRUCT.fields if f.name not in _SEGMENT_STRUCT.names)
# The pass's output: every column of heartbeat_segments, then U and M (null on rows that are not data rows), then
# the anomaly columns, then the summary's. Three kinds of rows: a row of the stream (``kind`` set); an anomaly found
# at a row (``anomaly`` set; its position, key, source region and leader epoch too, ``kind`` null); a segment's
# summary (``segment_summary`` set; its stream, segment and opening columns too, ``kind`` null).
OUTPUT_STRUCT = T.StructType(
    [T.StructField(f.name, f.dataType, True) for f in _SEGMENT_STRUCT.fields]
    + [T.StructField("touch_bound", VECTOR, True), T.StructField("reach", VECTOR, True)]
    + [T.StructField(name, _ANOMALY_STRUCT[name].dataType, True) for name in ANOMALY_COLUMNS]
    + [T.StructField(SUMMARY, T.StructType([_SUMMARY_STRUCT[name] for name in SUMMARY_COLUMNS]), True)]
)


@dataclass(frozen=True)
class AnomalyBounds:
    """Configured bounds of the time-based anomalies (``pipelines/anomalies.py`` describes the rules).

    heartbeat_gap_ms: HEARTBEAT_GAP when the applied time between two consecutive
        heartbeats of a partition is surely above this (default 60 s, a dozen missed
        beats at the usual few-second heartbeat interval).
    clock_uncertainty_ms: CLOCK_UNCERTAINTY when the origin or the applied clock
        interval of a heartbeat (max - min) is wider than this (default 1 s; a healthy
        NTP-synchronised clock is uncertain by milliseconds).
    """

    heartbeat_gap_ms: int = 60_000
    clock_uncertainty_ms: int = 1_000


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

    Each group is lifted above the ones before it (``group * span``, ``span`` above the values'
    range): one ``maximum.accumulate`` then never carries a max across groups. When the lift could
    overflow (offsets near 2**63), each value is first replaced by its rank among the distinct
    values (a sort: the common case does without it).
    """
    if values.size == 0:
        return values
    low, high = int(values.min()), int(values.max())
    span = high - low + 1
    if span * (int(group.max()) + 1) < 2**62:
        lift = (group.astype(np.int64) * span - low)[:, None]
        return np.maximum.accumulate(values + lift, axis=0) - lift
    distinct, rank = np.unique(values, return_inverse=True)
    rank = rank.reshape(values.shape)
    lift = (group.astype(np.int64) * (len(distinct) + 1))[:, None]
    return distinct[np.maximum.accumulate(rank + lift, axis=0) - lift]


def _int_column(column: pa.ChunkedArray | pa.Array, none=_NONE) -> np.ndarray:
    return np.asarray(pc.fill_null(column.cast(pa.int64()), none).to_numpy(zero_copy_only=False), dtype=np.int64)


def _nullable(values: np.ndarray, none=_NONE) -> pa.Array:
    return pa.array(values, pa.int64(), mask=values == none)


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
        owner, hb_keys, hb_items = map_entries(hb)
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
        return self._laid_out(*map_entries(self.table[name].combine_chunks()))

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


def _by_key(s: _Stream, rows: np.ndarray, data: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The data rows ``data`` (positions in ``rows``) ordered by key, then offset: the order, and each one's key code."""
    keys = pc.dictionary_encode(s.table["key"].take(pa.array(rows[data]))).combine_chunks().indices.to_numpy()
    order = np.lexsort((data, keys))
    return order, keys[order]


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
    order, sorted_keys = _by_key(s, rows, data)
    sorted_rows = data[order]
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


def _stream_batches(table: pa.Table, schema: pa.Schema, bounds: AnomalyBounds) -> Iterator[tuple[bool, pa.RecordBatch]]:
    """The pass over one stream (its positions sorted by offset): its rows with every output column (``True``, the
    batch), then its summary and its anomalies (``False``, each batch)."""
    s = _Stream(table)
    rows = np.flatnonzero(s.is_row)
    seg = _segment_columns(s)
    batch = _stream_batch(s, rows, seg, schema)
    yield True, batch
    if len(rows):
        yield False, _summary_batch(s, rows, seg, batch, schema)
    found = _stream_anomalies(s, rows, bounds.heartbeat_gap_ms, bounds.clock_uncertainty_ms)
    if found.columns["at"]:
        yield False, _anomaly_batch(s, rows, found, schema)


def _stream_batch(s: _Stream, rows: np.ndarray, seg: dict[str, np.ndarray], schema: pa.Schema) -> pa.RecordBatch:
    """One stream's rows (``seg``: its ``_segment_columns``) with every output column (anomalies and summary null)."""
    table = s.table
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
        baseline_vector=map_vectors(seg["contribution"][np.maximum(opening, 0)], opened, regions),
        opening_applied_ts_min_ms=at_opening("applied_ts_min_ms"),
        opening_applied_ts_max_ms=at_opening("applied_ts_max_ms"),
        contribution=map_vectors(seg["contribution"][rows], None, regions),
        applied_lower_bound=map_vectors(seg["applied_lower_bound"][rows], None, regions),
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
    out["touch_bound"] = map_vectors(touch_full, touch_known, regions)
    out["reach"] = map_vectors(reach_full, is_data, regions)
    for name in (*ANOMALY_COLUMNS, SUMMARY):
        out[name] = pa.nulls(count, schema.field(name).type)
    return pa.RecordBatch.from_arrays([out[f.name] for f in schema], schema=schema)


def _summary_batch(
    s: _Stream, rows: np.ndarray, seg: dict[str, np.ndarray], batch: pa.RecordBatch, schema: pa.Schema,
) -> pa.RecordBatch:
    """One row per segment of the stream (``rows``: its rows' positions, in offset order; ``seg``: its
    ``_segment_columns``; ``batch``: its rows as ``_stream_batch`` gave them): ``heartbeat_segment_summary``'s columns,
    the summary's own in ``segment_summary``.

    A segment's rows are consecutive; its opening columns and resolved timestamp are those of its
    first row (only a heartbeat, which opens a segment, changes them), its closing watermark is ``L``
    just after its last row, and its gap figures are those of its rows that follow a gap.
    """
    count = len(rows)
    segment = seg["segment"][rows]
    first = np.flatnonzero(np.append(True, segment[1:] != segment[:-1]))  # each segment's first row, in ``rows``
    last = np.append(first[1:] - 1, count - 1)
    kind = batch.column("kind")

    def per_segment(mask: np.ndarray) -> np.ndarray:
        return np.add.reduceat(mask.astype(np.int64), first)

    def of_rows(name: str, at: np.ndarray) -> pa.Array:  # the column of ``batch`` at ``at`` (null where -1)
        return batch.column(name).take(pa.array(at, pa.int64(), mask=at < 0))

    gap_before = seg["gap_before"][rows]
    at_gap = gap_before > 0
    first_gap = _next_index(at_gap)[first]
    first_gap = np.where((first_gap >= 0) & (first_gap <= last), first_gap, -1)
    last_gap = _last_index(at_gap)[last]
    last_gap = np.where(last_gap >= first, last_gap, -1)
    counts = {k: per_segment(pc.fill_null(pc.equal(kind, k), False).to_numpy(zero_copy_only=False))
              for k in ("PUT", "DELETE", "HEARTBEAT")}
    rows_in = np.diff(np.append(first, count))
    opening = seg["opening"][rows[first]]
    fields = {
        "first_offset": of_rows("offset", first),
        "last_offset": of_rows("offset", last),
        "rows": pa.array(rows_in, pa.int64()),
        "puts": pa.array(counts["PUT"], pa.int64()),
        "deletes": pa.array(counts["DELETE"], pa.int64()),
        "heartbeats": pa.array(counts["HEARTBEAT"], pa.int64()),
        "other_rows": pa.array(rows_in - counts["PUT"] - counts["DELETE"] - counts["HEARTBEAT"], pa.int64()),
        "first_kind": of_rows("kind", first),
        "opening_has_vector": pa.array((opening >= 0) & (s.is_hb & s.hb_valid)[np.maximum(opening, 0)]),
        "closing_watermark": map_vectors(seg["applied"][rows[last]], None, s.regions),
        "gaps": pa.array(per_segment(at_gap), pa.int64()),
        "gap_positions": pa.array(np.add.reduceat(gap_before, first), pa.int64()),
        "first_gap_offset": of_rows("gap_start", first_gap),
        "last_gap_offset": of_rows("gap_end", last_gap),
        "first_gap_lower_bound": of_rows("applied_lower_bound", first_gap),
    }
    out = {name: pa.nulls(len(first), field.type) for name, field in zip(schema.names, schema)}
    # The columns a segment shares with its first row: its stream, its number, its opening heartbeat's.
    for name in (*PARTITION_KEYS, "segment", "opening_offset", "baseline_vector", "opening_applied_ts_min_ms",
                 "opening_applied_ts_max_ms", "resolved_ts_ms"):
        out[name] = of_rows(name, first)
    summary_type = schema.field(SUMMARY).type
    out[SUMMARY] = pa.StructArray.from_arrays([fields[f.name].cast(f.type) for f in summary_type],
                                              fields=list(summary_type))
    return pa.RecordBatch.from_arrays([out[f.name] for f in schema], schema=schema)


# ------------------------------------------------------------------ stream anomalies (SPEC 5)
class _Found:
    """The anomalies found in one stream, column by column (few: they are built as Python lists)."""

    def __init__(self) -> None:
        self.columns: dict[str, list] = {c: [] for c in ("at", "anomaly", "key_at", "source_region", "observed",
                                                          "expected", "reference_offset", "previous_leader_epoch",
                                                          "detail")}

    def add(self, at, anomaly, source_region, observed, expected, reference_offset, detail, key_at=None,
            previous_leader_epoch=None) -> None:
        for name, value in (("at", at), ("anomaly", anomaly), ("key_at", key_at), ("source_region", source_region),
                            ("observed", observed), ("expected", expected), ("reference_offset", reference_offset),
                            ("previous_leader_epoch", previous_leader_epoch), ("detail", detail)):
            self.columns[name].append(value)


def _earlier_max(values: np.ndarray, present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per position, the highest of ``values`` at earlier positions where ``present`` holds (-1: none), and the first
    of those positions that held it (the witness: the earliest among equal values)."""
    held = np.where(present, values, MISSING)
    running = np.maximum.accumulate(held) if len(held) else held
    before = np.empty_like(running)
    before[:1] = MISSING
    before[1:] = running[:-1]
    raised = present & (held > before)  # the first position at each new maximum
    witness = np.empty(len(held), dtype=np.int64)
    witness[:1] = -1
    witness[1:] = _last_index(raised)[:-1]
    return before, witness


def _text(value: int | None, none: str = "null") -> str:
    """A number as Spark's ``format_string`` writes it (``null`` when there is none), or ``none``."""
    return none if value is None else str(value)


def _stream_anomalies(s: _Stream, rows: np.ndarray, heartbeat_gap_ms: int, clock_uncertainty_ms: int) -> _Found:
    """Every anomaly of SPEC 5 in one stream's rows (``rows``: their positions, in offset order).

    The rules and the decisions the SPEC leaves open are those of ``pipelines/anomalies.py``.
    """
    found = _Found()
    regions = s.regions.to_pylist()
    offset = s.offset[rows]
    is_hb, is_data = s.is_hb[rows], s.is_data[rows]
    region, source = s.region[rows], s.source_offset[rows]

    def region_of(i: int) -> str | None:  # the source region of the row at ``i`` (among ``rows``), if it names one
        return regions[region[i]] if region[i] >= 0 else None

    # HEARTBEAT_REGRESSION: each component of a heartbeat against the highest earlier heartbeat's, per component.
    beats = np.flatnonzero(is_hb)
    claimed = np.where((s.hb_valid[rows][beats])[:, None], s.hb[rows[beats]], s.single(s.is_hb)[rows[beats]])
    for r in range(s.width):
        present = claimed[:, r] >= 0
        before, witness = _earlier_max(claimed[:, r], present)
        for j in np.flatnonzero(present & (claimed[:, r] < before)):
            value, bound, by = int(claimed[j, r]), int(before[j]), int(offset[beats[witness[j]]])
            found.add(beats[j], "HEARTBEAT_REGRESSION", regions[r], value, bound, by,
                      f"hb_vector[{regions[r]}] = {value} is below {bound}, claimed by the heartbeat at offset {by}")
    # DATA_BEYOND_HEARTBEAT: a data row's source offset against the next heartbeat that carries a vector.
    vector_hb = is_hb & s.hb_valid[rows]
    judge = np.append(_next_index(vector_hb)[1:], -1)  # strictly after the row
    judged = np.flatnonzero(is_data & (judge >= 0) & (region >= 0))
    components = s.hb[rows[judge[judged]], region[judged]]
    beyond = (components < 0) | (source[judged] > components)
    for i, component in zip(judged[beyond].tolist(), components[beyond].tolist()):
        name, at = regions[region[i]], int(offset[judge[i]])
        if component < 0:
            found.add(i, "DATA_BEYOND_HEARTBEAT", name, int(source[i]), None, at,
                      f"source offset {source[i]} from {name}, but the next heartbeat (offset {at}) has no {name} "
                      "component", key_at=i)
        else:
            found.add(i, "DATA_BEYOND_HEARTBEAT", name, int(source[i]), component, at,
                      f"source offset {source[i]} from {name} is above hb_vector[{name}] = {component} of the next "
                      f"heartbeat (offset {at})", key_at=i)
    # DUPLICATE_OR_REWIND: a data row not above the highest source offset seen from its source (data and heartbeats).
    messages = (is_data | is_hb) & (region >= 0) & (source >= 0)
    for r in range(s.width):
        seen = np.flatnonzero(messages & (region == r))
        before, witness = _earlier_max(source[seen], np.ones(len(seen), dtype=bool))
        for j in np.flatnonzero(is_data[seen] & (before >= 0) & (source[seen] <= before)):
            i, by = seen[j], seen[witness[j]]
            found.add(i, "DUPLICATE_OR_REWIND", regions[r], int(source[i]), int(before[j]), int(offset[by]),
                      f"source offset {source[i]} from {regions[r]} is not above {before[j]}, already seen in the "
                      f"{s.table['kind'][int(rows[by])].as_py()} at offset {offset[by]}", key_at=i)
    # WRITE_TS_REGRESSION: a data row's write_ts below that of the key's previous write that has one.
    write_ts = _int_column(s.table["write_ts"])[rows]
    epoch = _int_column(s.table["leader_epoch"])[rows]
    data = np.flatnonzero(is_data)
    order, keys = _by_key(s, rows, data)
    by_key = data[order]
    stamped = write_ts[by_key] != _NONE
    previous = np.empty(len(by_key), dtype=np.int64)
    previous[:1] = -1
    previous[1:] = _last_index(stamped)[:-1]
    same_key = (previous >= 0) & (keys[np.maximum(previous, 0)] == keys)
    stamp = write_ts[by_key]
    earlier = stamp[np.maximum(previous, 0)]
    for j in np.flatnonzero(same_key & stamped & (stamp < earlier)):
        i, p = by_key[j], by_key[previous[j]]
        now, then = int(write_ts[i]), int(write_ts[p])
        was = None if epoch[p] == _NONE else int(epoch[p])
        is_ = None if epoch[i] == _NONE else int(epoch[i])
        detail = (f"write_ts {now} (physical {now >> 18} ms) is below {then} (physical {then >> 18} ms) of the key's "
                  f"previous write at offset {offset[p]}")
        if was != is_:
            detail += f"; across a leader_epoch change {_text(was, 'unknown')} -> {_text(is_, 'unknown')}"
        found.add(i, "WRITE_TS_REGRESSION", region_of(i), now, then, int(offset[p]),
                  detail, key_at=i, previous_leader_epoch=was)
    # HEARTBEAT_GAP: applied time surely elapsed since the heartbeat before (its max to this one's min).
    applied_min = _int_column(s.table["applied_ts_min_ms"])[rows]
    applied_max = _int_column(s.table["applied_ts_max_ms"])[rows]
    earlier, later = beats[:-1], beats[1:]
    known = (applied_min[later] != _NONE) & (applied_max[earlier] != _NONE)
    gaps = np.where(known, applied_min[later] - np.where(known, applied_max[earlier], 0), 0)
    for j in np.flatnonzero(known & (gaps > heartbeat_gap_ms)):
        a, b, gap = earlier[j], later[j], int(gaps[j])
        found.add(b, "HEARTBEAT_GAP", region_of(b), gap, heartbeat_gap_ms,
                  int(offset[a]), f"at least {gap} ms of applied time since the heartbeat at offset {offset[a]} "
                  f"(bound {heartbeat_gap_ms} ms)")
    # CLOCK_UNCERTAINTY: a heartbeat's origin or applied interval wider than the bound.
    origin_min = _int_column(s.table["origin_ts_min_ms"])[rows]
    origin_max = _int_column(s.table["origin_ts_max_ms"])[rows]
    def width(low: np.ndarray, high: np.ndarray) -> np.ndarray:
        known = (low[beats] != _NONE) & (high[beats] != _NONE)
        return np.where(known, high[beats] - np.where(known, low[beats], 0), _NONE)

    origin_width, applied_width = width(origin_min, origin_max), width(applied_min, applied_max)
    wide = ((origin_width != _NONE) & (origin_width > clock_uncertainty_ms)) | (
        (applied_width != _NONE) & (applied_width > clock_uncertainty_ms))
    for j in np.flatnonzero(wide):
        b = beats[j]
        widths = [None if w == _NONE else int(w) for w in (origin_width[j], applied_width[j])]
        observed = max(w for w in widths if w is not None and w > clock_uncertainty_ms)
        found.add(b, "CLOCK_UNCERTAINTY", region_of(b), observed,
                  clock_uncertainty_ms, None, f"origin interval {_text(widths[0])} ms, applied interval "
                  f"{_text(widths[1])} ms (bound {clock_uncertainty_ms} ms)")
    return found


def _anomaly_batch(s: _Stream, rows: np.ndarray, found: _Found, schema: pa.Schema) -> pa.RecordBatch:
    """The anomalies found as rows of the pass's output (``anomaly`` set, ``kind`` null)."""
    c = found.columns
    at = rows[np.asarray(c["at"], dtype=np.int64)]
    count = len(at)
    keyed = np.asarray([k is not None for k in c["key_at"]], dtype=bool)
    key_rows = rows[np.asarray([k if k is not None else 0 for k in c["key_at"]], dtype=np.int64)]
    out = {name: pa.nulls(count, field.type) for name, field in zip(schema.names, schema)}
    for name in PARTITION_KEYS:
        out[name] = s.table[name].take(pa.array(at)).combine_chunks()
    out.update(
        offset=pa.array(s.offset[at], pa.int64()),
        key=pc.if_else(pa.array(keyed), s.table["key"].take(pa.array(key_rows)).combine_chunks(),
                       pa.nulls(count, pa.string())),
        leader_epoch=s.table["leader_epoch"].take(pa.array(at)).combine_chunks(),
        source_region=pa.array(c["source_region"], pa.string()),
        anomaly=pa.array(c["anomaly"], pa.string()),
        observed=pa.array(c["observed"], pa.int64()),
        expected=pa.array(c["expected"], pa.int64()),
        reference_offset=pa.array(c["reference_offset"], pa.int64()),
        previous_leader_epoch=pa.array(c["previous_leader_epoch"], pa.int64()),
        detail=pa.array(c["detail"], pa.string()),
    )
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


def written_rows(table: str, rows: pa.RecordBatch) -> pa.RecordBatch:
    """The rows of ``table`` (one of ``WRITTEN``) among one stream's rows as the pass gives them (every output column)."""
    if table == "reconstructed_watermarks":
        return rows.filter(pc.is_in(rows.column("kind"), _DATA_KINDS))
    return rows


def stream_rows(
    batches: Iterator[pa.RecordBatch], bounds: AnomalyBounds = AnomalyBounds(),
    written: Mapping[str, ArrowStage] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The fused pass over every stream among ``batches`` (``INPUT_COLUMNS``; read positions: kind null).

    A stream's positions must all be among ``batches`` (one exchange by stream gives that), in
    any order: they are sorted here by stream and offset. ``bounds``: the time-based anomalies'.

    ``written``: per table of ``WRITTEN``, where this task writes that table's rows (``written_rows``)
    itself; the stream's rows are then not returned, only the summaries and anomalies. The files are
    in place once the returned iterator is exhausted.
    """
    schema = to_arrow_schema(OUTPUT_STRUCT)
    files = {table: stage.files(task_number()) for table, stage in (written or {}).items()}
    try:
        for stream in _streams(batches):
            for are_rows, batch in _stream_batches(stream, schema, bounds):
                if are_rows and files:
                    for table, file in files.items():
                        # The table's columns first (no copy): the watermarks' filter then copies those only.
                        file.write(written_rows(table, batch.select(file.stage.schema.names)))
                    continue
                # In slices: the JVM holds each batch it receives whole, off its heap (a 20M-row audit's streams of
                # 1.7M rows, returned whole, took the driver JVM from 3.3 to 4.8 GiB).
                for start in range(0, batch.num_rows, OUTPUT_BATCH_ROWS):
                    yield batch.slice(start, OUTPUT_BATCH_ROWS)
        for file in files.values():
            file.close()
    except BaseException:
        for file in files.values():
            file.abort()
        raise


def task_number() -> int:
    """The partition this Spark task computes (its files are named by it), 0 outside a task (on the driver)."""
    from pyspark import TaskContext

    task = TaskContext.get()
    return task.partitionId() if task is not None else 0


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
        out["touch_bound"] = map_vectors(touch, known, s.regions)
        out["reach"] = map_vectors(reach, None, s.regions)
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


def stream_pass(
    raw: DataFrame, read_positions: DataFrame | None = None, rows: int | None = None,
    bounds: AnomalyBounds = AnomalyBounds(), written: Mapping[str, ArrowStage] | None = None,
) -> DataFrame:
    """Every version-topic row of ``raw`` with its segment columns, ``U`` and ``M``, and its anomalies (``OUTPUT_STRUCT``).

    ``read_positions``: (``snapshot_id``, ``replica``, ``topic``, ``partition``, ``offset``) of
    positions read that hold no row (raw Venice records skipped by rule): they close gaps and are
    not rows. ``rows``: how many rows ``raw`` holds when the caller knows (the Delta log does): at
    most ``DRIVER_MAX_ROWS`` the pass runs on the driver. ``bounds``: the time-based anomalies'.

    ``written``: per table of ``WRITTEN``, the staged write the pass fills with that table's rows
    where it makes them (``resources/staged_files.py``): no row of the streams comes back through
    Spark, only the summaries and anomalies, and the pass has run (every file written) when this
    returns, its output computed once and kept (``computed_once``).
    """
    _check_written(written)
    positions = _positions(raw, read_positions)
    kernel = partial(stream_rows, bounds=bounds, written=written)
    if on_driver(rows):
        return local_batches(raw.sparkSession, kernel(iter(positions.toArrow().to_batches())), OUTPUT_STRUCT)
    return _run_once(positions.repartition(*PARTITION_KEYS).mapInArrow(kernel, OUTPUT_STRUCT), written)


def _check_written(written: Mapping[str, ArrowStage] | None) -> None:
    unknown = set(written or ()) - set(WRITTEN)
    if unknown:
        raise ValueError(f"the stream pass writes {', '.join(WRITTEN)} only, not {', '.join(sorted(unknown))}")


def _run_once(passed: DataFrame, written: Mapping[str, ArrowStage] | None) -> DataFrame:
    """The pass's output; when it writes tables, run once, now: a second run would write the files again."""
    return computed_once(passed) if written else passed


def file_rows(
    ids: Iterator[pa.RecordBatch], files: tuple[tuple[pafs.FileSystem, str], ...], snapshot_id: str,
    schema: pa.Schema,
) -> Iterator[pa.RecordBatch]:
    """The version-topic rows (``INPUT_COLUMNS``, as ``schema``) of the files whose numbers ``ids`` hold, by pyarrow.

    ``files``: a snapshot's ``raw_topic_snapshots`` files (filesystem, path), each holding every row of
    its streams; the snapshot id is the folder's, not a column of the files.
    """
    columns = [name for name in schema.names if name != "snapshot_id"]
    for batch in ids:
        for number in batch.column(0).to_pylist():
            fs, path = files[number]
            table = pq.read_table(path, filesystem=fs, columns=columns)
            table = table.filter(pc.not_equal(table["kind"], "EXPORTER_POSITION"))
            table = table.append_column("snapshot_id", pa.array([snapshot_id] * table.num_rows, pa.string()))
            yield from table.select(schema.names).cast(schema).to_batches()


def stream_pass_of_files(
    spark, files: list[tuple[pafs.FileSystem, str]], snapshot_id: str, bounds: AnomalyBounds = AnomalyBounds(),
    written: Mapping[str, ArrowStage] | None = None,
) -> DataFrame:
    """``stream_pass`` of a snapshot whose ``raw_topic_snapshots`` files each hold every row of their streams.

    One task per file reads it with pyarrow (``file_rows``) and runs the pass on its streams: no Spark
    read of the rows, no exchange, no conversion of every row into Arrow by the JVM. The files are
    ``DeltaStore.stream_files`` (a snapshot ingested with its one exchange by stream); read positions
    (raw Venice records skipped by rule) must go through ``stream_pass``, which merges them in.
    """
    _check_written(written)
    schema = to_arrow_schema(T.StructType([_SEGMENT_STRUCT[name] for name in INPUT_COLUMNS]))
    read = partial(file_rows, files=tuple(files), snapshot_id=snapshot_id, schema=schema)

    def kernel(ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return stream_rows(read(ids), bounds=bounds, written=written)

    return _run_once(spark.range(0, len(files), 1, max(len(files), 1)).mapInArrow(kernel, OUTPUT_STRUCT), written)


def watermarks_of_segments(annotated: DataFrame) -> DataFrame:
    """``reconstructed_watermarks`` of ``heartbeat_segments`` rows computed earlier (``segment_watermarks``)."""
    columns = [f.name for f in _SEGMENT_STRUCT.fields]
    batches = annotated.select(*columns).repartition(*PARTITION_KEYS)
    return conform(batches.mapInArrow(segment_watermarks, _WATERMARK_STRUCT), _WATERMARK_STRUCT)


def segment_rows(passed: DataFrame) -> DataFrame:
    """``heartbeat_segments`` from the pass's output: its rows of the streams (anomalies and summaries have no kind)."""
    return conform(passed.where(F.col("kind").isNotNull()), HeartbeatSegments.to_structtype())


def summary_rows(passed: DataFrame) -> DataFrame:
    """``heartbeat_segment_summary`` from the pass's output: its summary rows, one per segment."""
    summaries = passed.where(F.col(SUMMARY).isNotNull())
    return conform(summaries.select(*_SEGMENT_STRUCT.names, f"{SUMMARY}.*"), _SUMMARY_STRUCT)


def watermark_rows(passed: DataFrame) -> DataFrame:
    """``reconstructed_watermarks`` from the pass's output: its data rows (an anomaly row has no kind)."""
    return conform(passed.where(F.col("kind").isin(*DATA_KINDS)), ReconstructedWatermarks.to_structtype())


def anomaly_rows(passed: DataFrame) -> DataFrame:
    """``stream_anomalies`` from the pass's output: its anomaly rows."""
    return conform(passed.where(F.col("anomaly").isNotNull()), _ANOMALY_STRUCT)
