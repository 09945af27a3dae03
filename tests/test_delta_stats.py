"""Delta file statistics read off Parquet footers: every bound a bound, nothing a reader could misuse."""
from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.parquet as pq

from resources.delta_stats import STRING_PREFIX_LENGTH, file_stats


def _stats(tmp_path, table: pa.Table, row_group_size: int = 2) -> dict:
    path = tmp_path / "f.parquet"
    pq.write_table(table, path, row_group_size=row_group_size)
    return file_stats(pq.ParquetFile(path).metadata)


def test_bounds_and_null_counts_combine_across_row_groups(tmp_path):
    """Catches: only the first (or last) row group's bounds kept, null counts not summed, or an
    all-null row group (no bounds of its own) dropping the column's bounds."""
    table = pa.table({
        "offset": pa.array([5, 1, None, None, 9, 3], pa.int64()),
        "flag": [True, True, None, None, False, None],
        "day": pa.array([dt.date(2024, 3, 1), None, None, None, dt.date(2023, 1, 2), None]),
    })
    stats = _stats(tmp_path, table)
    assert stats["numRecords"] == 6
    assert stats["minValues"] == {"offset": 1, "flag": False, "day": "2023-01-02"}
    assert stats["maxValues"] == {"offset": 9, "flag": True, "day": "2024-03-01"}
    assert stats["nullCount"] == {"offset": 2, "flag": 3, "day": 4}


def test_long_strings_keep_a_prefix_as_min_and_no_max(tmp_path):
    """Catches: a truncated max (a prefix is smaller than the string: a reader would skip the file
    for a value it holds), or an untruncated min bloating the log."""
    long_low, long_high = "a" * 40, "z" * 40
    stats = _stats(tmp_path, pa.table({"short": ["b", "c", None], "long": [long_low, "m", long_high]}))
    assert stats["minValues"] == {"short": "b", "long": "a" * STRING_PREFIX_LENGTH}
    assert stats["maxValues"] == {"short": "c"}
    assert stats["nullCount"] == {"short": 1, "long": 0}


def test_maps_arrays_binary_and_floats_get_no_bounds_and_only_exact_null_counts(tmp_path):
    """Catches: bounds for types the protocol does not order, a float max that excludes NaN (a file
    with NaN pruned from ``x > 5``), or a map's null count taken from its leaves (empty maps and null
    values counted as null maps)."""
    vector = pa.map_(pa.string(), pa.int64())
    table = pa.table({
        "never_null": pa.array([{"a": 1}, {}, {"b": None}], vector),
        "sometimes": pa.array([None, {"a": 1}, {"a": 2}], vector),
        "items": pa.array([[1], [2, 3], []], pa.list_(pa.int64())),
        "blob": [b"x", None, b"y"],
        "ratio": [1.0, float("nan"), 2.0],
    })
    stats = _stats(tmp_path, table, row_group_size=3)
    assert stats["minValues"] == {} and stats["maxValues"] == {}
    # "never_null" holds an empty map and a null value: its leaves count nulls, so its count is unknown.
    assert stats["nullCount"] == {"blob": 1, "ratio": 0}

    clean = _stats(tmp_path, pa.table({"vector": pa.array([{"a": 1}, {"b": 2}], vector)}))
    assert clean["nullCount"] == {"vector": 0}


def test_struct_fields_are_nested_and_timestamps_stay_bounds_at_millisecond_precision(tmp_path):
    """Catches: struct fields flattened to ``a.b`` keys, a timestamp max truncated below the value it
    bounds, or a tz-aware timestamp written without its zone."""
    moments = [dt.datetime(2024, 1, 1, 0, 0, 0, 123456), dt.datetime(2024, 1, 1, 0, 0, 1, 999001)]
    table = pa.table({
        "s": pa.array([{"x": 1, "y": "a"}, None, {"x": 7, "y": None}]),
        "at": pa.array(moments + [None], pa.timestamp("us", tz="UTC")),
        "local": pa.array(moments + [None], pa.timestamp("us")),
    })
    stats = _stats(tmp_path, table, row_group_size=3)
    assert stats["minValues"] == {
        "s": {"x": 1, "y": "a"}, "at": "2024-01-01T00:00:00.123Z", "local": "2024-01-01T00:00:00.123",
    }
    assert stats["maxValues"] == {
        "s": {"x": 7, "y": "a"}, "at": "2024-01-01T00:00:02.000Z", "local": "2024-01-01T00:00:02.000",
    }
    assert stats["nullCount"] == {"s": {"x": 1, "y": 2}, "at": 1, "local": 1}


def test_a_file_without_rows_has_no_bounds(tmp_path):
    """Catches: an empty file (Spark writes one for an empty partition) given bounds, or failing."""
    stats = _stats(tmp_path, pa.table({"offset": pa.array([], pa.int64())}))
    assert stats["numRecords"] == 0 and stats["minValues"] == {} and stats["maxValues"] == {}
    assert stats["nullCount"].get("offset", 0) == 0
