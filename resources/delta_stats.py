"""Delta file statistics (``numRecords``, ``minValues``, ``maxValues``, ``nullCount``) from a Parquet footer.

The embedded engine commits files that Spark wrote: delta-rs writes only the log, so the
statistics that let a reader skip files (data skipping) must be supplied with each add
action. They are read from the file's own footer (its row groups' column statistics),
never from the data: no second pass, and the bounds are those of the bytes committed.

What is written, per column (the partition column is in ``partitionValues`` instead):

- ``nullCount`` for every column whose count the footer gives exactly: a primitive or a
  struct field (the sum over row groups). For a map or an array the footer counts nulls
  per leaf value, which mixes null columns with empty ones and null elements; only a
  count of 0 there proves the column is never null, so 0 is written, else nothing.
- ``minValues`` and ``maxValues`` for integers, strings, booleans, dates and timestamps:
  the min of the row groups' mins and the max of their maxes. A row group without
  bounds that holds a non-null value (a writer that left them out: Spark's INT96
  timestamps, values too long for parquet-mr's statistics) drops the column's bounds.
  A column of nulls only has none (a reader then relies on ``nullCount``).
- Not bounded: maps, arrays and binary (the protocol has no order for them), decimals
  (JSON numbers would round them), and floating point: Parquet writers leave NaN out of
  min and max while Spark orders NaN above every number, so a footer's max could prune a
  file holding NaN from ``x > 5``.
- Strings are compared as UTF-8 bytes (Parquet's and Spark's order). ``minValues`` keeps
  a 32-character prefix (as delta-spark does; a prefix is never greater than the string).
  A prefix is *smaller* than the string, so it cannot stand for the max: a max longer than
  32 characters is left out rather than bumped.
- Timestamps have millisecond precision in the log: the min is truncated down, the max
  rounded up to the next millisecond, so both stay bounds.

Struct fields are nested dicts, as the protocol writes them. Every function here is pure:
it reads a ``pyarrow.parquet.FileMetaData`` and returns plain JSON-ready values.
"""
from __future__ import annotations

import datetime as _dt
from typing import Any, Iterable, Optional

import pyarrow as pa

STRING_PREFIX_LENGTH = 32

_UNITS_PER_MS = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}
_EPOCH = _dt.datetime(1970, 1, 1)
_NO_BOUND = object()  # a row group that holds values but no bounds: the column gets none


def _chunks(metadata) -> dict[str, list[tuple[int, Any]]]:
    """Per leaf path (``a.b``): one ``(rows, statistics or None)`` per row group."""
    chunks: dict[str, list[tuple[int, Any]]] = {}
    for index in range(metadata.num_row_groups):
        group = metadata.row_group(index)
        for column in range(group.num_columns):
            chunk = group.column(column)
            statistics = chunk.statistics if chunk.is_stats_set else None
            chunks.setdefault(chunk.path_in_schema, []).append((group.num_rows, statistics))
    return chunks


def _null_count(groups: list[tuple[int, Any]]) -> Optional[int]:
    total = 0
    for _, statistics in groups:
        if statistics is None or not statistics.has_null_count:
            return None
        total += statistics.null_count
    return total


def _bounded(arrow_type: pa.DataType) -> bool:
    return (
        pa.types.is_integer(arrow_type)
        or pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_boolean(arrow_type)
        or pa.types.is_date(arrow_type)
        or pa.types.is_timestamp(arrow_type)
    )


def _json_value(arrow_type: pa.DataType, statistics, which: str) -> Any:
    """A row group's min (``which="min"``) or max as the log writes it, or ``_NO_BOUND``."""
    if pa.types.is_timestamp(arrow_type):
        raw = statistics.min_raw if which == "min" else statistics.max_raw
        per_ms = _UNITS_PER_MS.get(arrow_type.unit)
        ms = raw * 1000 if per_ms is None else (raw // per_ms if which == "min" else -(-raw // per_ms))
        text = (_EPOCH + _dt.timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")
        return text + ("Z" if arrow_type.tz is not None else "")
    value = statistics.min if which == "min" else statistics.max
    if pa.types.is_date(arrow_type):
        return value.isoformat() if isinstance(value, _dt.date) else _NO_BOUND
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        if not isinstance(value, str):  # not valid UTF-8: no bound rather than a wrong one
            return _NO_BOUND
        if which == "min":
            return value[:STRING_PREFIX_LENGTH]
        return value if len(value) <= STRING_PREFIX_LENGTH else _NO_BOUND
    if pa.types.is_boolean(arrow_type):
        return bool(value)
    return int(value)


def _order_key(value: Any):
    # Strings order as UTF-8 bytes (code points, for valid UTF-8) in Parquet and Spark alike.
    return value.encode("utf-8") if isinstance(value, str) else value


def _bounds(arrow_type: pa.DataType, groups: list[tuple[int, Any]]) -> tuple[Any, Any]:
    """The column's (min, max) over every row group; either is ``_NO_BOUND`` when not provable."""
    lows, highs = [], []
    for rows, statistics in groups:
        if statistics is None:
            return _NO_BOUND, _NO_BOUND
        if not statistics.has_min_max:
            if statistics.has_null_count and statistics.null_count == rows:
                continue  # only nulls here: nothing to bound
            return _NO_BOUND, _NO_BOUND
        lows.append(_json_value(arrow_type, statistics, "min"))
        highs.append(_json_value(arrow_type, statistics, "max"))
    low = _NO_BOUND if not lows or _NO_BOUND in lows else min(lows, key=_order_key)
    high = _NO_BOUND if not highs or _NO_BOUND in highs else max(highs, key=_order_key)
    return low, high


def _leaves_under(chunks: dict[str, list], path: str) -> Iterable[list]:
    prefix = path + "."
    return (groups for leaf, groups in chunks.items() if leaf.startswith(prefix))


def _field_stats(field: pa.Field, path: str, chunks: dict, out: dict[str, dict]) -> None:
    """Add ``field``'s entries to ``out`` (``minValues``, ``maxValues``, ``nullCount``), nested for structs."""
    arrow_type = field.type
    if pa.types.is_struct(arrow_type):
        inner: dict[str, dict] = {key: {} for key in out}
        for child in arrow_type:
            _field_stats(child, f"{path}.{child.name}", chunks, inner)
        for key, values in inner.items():
            if values:
                out[key][field.name] = values
        return
    if pa.types.is_map(arrow_type) or pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type) \
            or pa.types.is_fixed_size_list(arrow_type):
        counts = [_null_count(groups) for groups in _leaves_under(chunks, path)]
        if 0 in counts:  # a null map or array is a null in every one of its leaves
            out["nullCount"][field.name] = 0
        return
    groups = chunks.get(path)
    if groups is None:
        return
    nulls = _null_count(groups)
    if nulls is not None:
        out["nullCount"][field.name] = nulls
    if _bounded(arrow_type):
        low, high = _bounds(arrow_type, groups)
        if low is not _NO_BOUND:
            out["minValues"][field.name] = low
        if high is not _NO_BOUND:
            out["maxValues"][field.name] = high


def file_stats(metadata, skip: Iterable[str] = ()) -> dict:
    """The Delta ``stats`` object of one Parquet file, from its footer (``pq.ParquetFile(p).metadata``).

    ``skip`` names top-level columns left out (the partition column, were it in the file).
    """
    skipped = set(skip)
    out: dict[str, dict] = {"minValues": {}, "maxValues": {}, "nullCount": {}}
    chunks = _chunks(metadata)
    for field in metadata.schema.to_arrow_schema():
        if field.name not in skipped:
            _field_stats(field, field.name, chunks, out)
    return {"numRecords": metadata.num_rows, **out}
