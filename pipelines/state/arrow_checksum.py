"""The replica state's checksum counted on Arrow rows, equal to Spark's (``pipelines/state/rows.py``).

A commit context keeps ``state_checksum``: the sum modulo 2^64 of Spark's ``xxhash64`` over each
VERSION row's columns (``version_hash``), vectors as their entries sorted by region. The Leap
Frog comparison writes the VERSION rows itself, from its Arrow batches in Spark's Python tasks
(``pipelines/leapfrog.py``), and counts each task's share of the checksum here, as it writes
them: no Spark job reads the rows again to checksum them. ``check.py`` checks a carried state the
same way (``state_sums``, over the VERSION rows read); a state Spark wrote (``next_state``) has
Spark's ``version_hash``: the two must agree bit for bit (``tests/test_arrow_checksum.py``).

Spark's ``xxhash64(c1, c2, ...)`` starts from the seed 42 and hashes each column's value with the
hash so far as its seed; a null leaves it as it is. Per type (Spark's ``XXH64``, the reference
xxHash64 algorithm on little-endian bytes): a long is ``hashLong``, an int ``hashInt``, a string
its UTF-8 bytes (``hashUnsafeBytes``); an array hashes its elements in order and a struct its
fields in order, each with the hash so far as its seed. Every function here hashes a whole column
at once with numpy (unsigned 64-bit arithmetic wraps as Java's longs do), one seed per row.

numpy and pyarrow only: this module travels by value to Spark's Python workers with the pass.
"""
from __future__ import annotations

import sys
from typing import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark import cloudpickle

from pipelines.arrow_vectors import map_entries

SEED = 42
_P1 = np.uint64(0x9E3779B185EBCA87)
_P2 = np.uint64(0xC2B2AE3D27D4EB4F)
_P3 = np.uint64(0x165667B19E3779F9)
_P4 = np.uint64(0x85EBCA77C2B2AE63)
_P5 = np.uint64(0x27D4EB2F165667C5)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


def _fmix(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint64(33))
    h = h * _P2
    h = h ^ (h >> np.uint64(29))
    h = h * _P3
    return h ^ (h >> np.uint64(32))


def _round(h: np.ndarray, word: np.ndarray) -> np.ndarray:
    """One 8-byte word into the hash (the loop of ``hashBytesByWords`` and ``hashLong``)."""
    h = h ^ (_rotl(word * _P2, 31) * _P1)
    return _rotl(h, 27) * _P1 + _P4


def hash_longs(values: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """Spark's ``XXH64.hashLong`` of each value (int64) with its row's seed (uint64)."""
    return _fmix(_round(seeds + _P5 + np.uint64(8), values.astype(np.int64).view(np.uint64)))


def _hash_bytes(matrix: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    """Spark's ``XXH64.hashUnsafeBytes`` of rows of equal length: ``matrix`` (rows, length) of uint8."""
    length = matrix.shape[1]
    whole = length // 8
    words = np.ascontiguousarray(matrix[:, :whole * 8]).view("<u8").astype(np.uint64)
    word = 0
    if length >= 32:
        v = [seeds + _P1 + _P2, seeds + _P2, seeds.copy(), seeds - _P1]
        for stripe in range(length // 32):
            for lane in range(4):
                v[lane] = _rotl(v[lane] + words[:, 4 * stripe + lane] * _P2, 31) * _P1
        h = _rotl(v[0], 1) + _rotl(v[1], 7) + _rotl(v[2], 12) + _rotl(v[3], 18)
        for lane in v:
            h = (h ^ (_rotl(lane * _P2, 31) * _P1)) * _P1 + _P4
        word = 4 * (length // 32)
    else:
        h = seeds + _P5
    h = h + np.uint64(length)
    for at in range(word, whole):
        h = _round(h, words[:, at])
    at = whole * 8
    if at + 4 <= length:
        quad = np.ascontiguousarray(matrix[:, at:at + 4]).view("<u4")[:, 0].astype(np.uint64)
        h = _rotl(h ^ (quad * _P1), 23) * _P2 + _P3
        at += 4
    for byte in range(at, length):
        h = _rotl(h ^ (matrix[:, byte].astype(np.uint64) * _P5), 11) * _P1
    return _fmix(h)


def hash_strings(strings: pa.Array, seeds: np.ndarray) -> np.ndarray:
    """Spark's hash of each string (its UTF-8 bytes) with its row's seed; a null leaves the seed as it is."""
    if isinstance(strings, pa.ChunkedArray):
        strings = strings.combine_chunks()
    strings = strings.cast(pa.large_string())
    out = seeds.copy()
    valid = np.flatnonzero(strings.is_valid().to_numpy(zero_copy_only=False))
    if not len(valid):
        return out
    buffers = strings.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[strings.offset:strings.offset + len(strings) + 1]
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.empty(0, np.uint8)
    starts, lengths = offsets[valid], np.diff(offsets)[valid]
    # Rows of one length at a time: each a (rows, length) matrix of bytes, hashed together.
    for length in np.unique(lengths):
        rows = np.flatnonzero(lengths == length)
        out[valid[rows]] = _hash_bytes(_byte_matrix(data, starts[rows], int(length)), seeds[valid[rows]])
    return out


def _byte_matrix(data: np.ndarray, starts: np.ndarray, length: int) -> np.ndarray:
    """The (rows, length) bytes of strings of one length starting at ``starts`` (ascending).

    Strings that lie one after the other (a column of digests of one length, broken by a few nulls or other lengths)
    are copied run by run from ``data``; strings scattered among others of other lengths are gathered byte by byte.
    """
    if not length:
        return np.empty((len(starts), 0), np.uint8)
    bounds = np.concatenate(([0], np.flatnonzero(np.diff(starts) != length) + 1, [len(starts)]))
    if len(bounds) - 1 > max(1, len(starts) // 16):
        return data[starts[:, None] + np.arange(length)]
    return np.concatenate([
        data[int(starts[a]):int(starts[a]) + (b - a) * length].reshape(b - a, length)
        for a, b in zip(bounds[:-1], bounds[1:])
    ])


def _hash_column(column: pa.Array, seeds: np.ndarray) -> np.ndarray:
    """One column of a row hash: a null leaves the seed as it is."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_map(column.type):
        return _hash_vectors(column, seeds)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return hash_strings(column, seeds)
    if pa.types.is_int64(column.type):
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        values = column.fill_null(0).to_numpy(zero_copy_only=False)
        return np.where(valid, hash_longs(values, seeds), seeds)
    if pa.types.is_null(column.type):
        return seeds
    raise TypeError(f"no Spark hash of {column.type} here")


def _hash_vectors(vectors: pa.Array, seeds: np.ndarray) -> np.ndarray:
    """``array_sort(map_entries(v))`` of each map<string, long>: its entries by key (bytes), each key then value."""
    out = seeds.copy()
    owner, keys, values = map_entries(vectors)
    if not len(owner):
        return out
    values = values.to_numpy(zero_copy_only=False)
    # Each row's entries sorted by key, as array_sort orders strings (by their UTF-8 bytes: code points). The keys
    # are a few region names: each name's bytes are hashed with the seeds of the entries that hold it.
    names = pc.dictionary_encode(keys)
    encoded = [s.encode() for s in names.dictionary.to_pylist()]
    rank_of = np.argsort(np.argsort(np.array(encoded, dtype=object)))
    codes = names.indices.to_numpy(zero_copy_only=False)
    order = np.lexsort((rank_of[codes], owner))
    owner, codes, values = owner[order], codes[order], values[order]
    position = np.arange(len(owner)) - np.searchsorted(owner, owner, side="left")
    name_bytes = [np.frombuffer(b, np.uint8)[None, :] for b in encoded]  # one row, broadcast over the seeds
    # The k-th entries of every row at once: a row's hash so far is the seed of its next entry.
    for k in range(int(position.max()) + 1):
        at = np.flatnonzero(position == k)
        rows, held = owner[at], codes[at]
        seeds = out[rows]
        for code in np.unique(held):
            same = held == code
            seeds[same] = _hash_bytes(name_bytes[code], seeds[same])
        out[rows] = hash_longs(values[at], seeds)
    return out


def row_hashes(table: pa.Table | pa.RecordBatch, columns: Sequence[str]) -> np.ndarray:
    """Spark's ``xxhash64`` of ``columns`` (in order) per row of ``table``, as uint64 (a long's bits).

    Vectors (map<string, long> columns) hash as ``array_sort(map_entries(v))``, as ``version_hash`` has them.
    """
    hashes = np.full(table.num_rows, SEED, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for name in columns:
            hashes = _hash_column(table.column(name), hashes)
    return hashes


STATE_SUMS = ("snapshot_id", "replica", "topic", "partition")


def state_sums(batches: Iterable[pa.RecordBatch], columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
    """Per (snapshot, replica partition) of VERSION rows (``STATE_SUMS`` and ``columns``): their count and their share
    of the checksum (``found_rows``, ``found_checksum``: a signed long), one batch of a few rows for all ``batches``.

    What ``check.py`` checks a carried state's contexts against; the shares of several tasks add up modulo 2^64.
    """
    totals: dict[tuple, list[int]] = {}
    for batch in batches:
        if not batch.num_rows:
            continue
        hashes = row_hashes(batch, columns)
        codes, names = [], []
        for name in STATE_SUMS:
            encoded = pc.dictionary_encode(batch.column(name))
            codes.append(encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64))
            names.append(encoded.dictionary.to_pylist())
        group = np.zeros(batch.num_rows, np.int64)
        for code, values in zip(codes, names):
            group = group * len(values) + code
        ids, first, inverse = np.unique(group, return_index=True, return_inverse=True)
        sums = np.zeros(len(ids), np.uint64)
        np.add.at(sums, inverse, hashes)
        counts = np.bincount(inverse, minlength=len(ids))
        for i, at in enumerate(first):
            total = totals.setdefault(tuple(values[code[at]] for code, values in zip(codes, names)), [0, 0])
            total[0] += int(counts[i])
            total[1] += int(sums[i])
    if totals:
        keys = list(totals)
        types = (pa.string(), pa.string(), pa.string(), pa.int32())
        yield pa.RecordBatch.from_pydict({
            **{name: pa.array([k[i] for k in keys], t) for i, (name, t) in enumerate(zip(STATE_SUMS, types))},
            "found_rows": pa.array([totals[k][0] for k in keys], pa.int64()),
            "found_checksum": pa.array([signed(totals[k][1]) for k in keys], pa.int64()),
        })


def checksum(hashes: np.ndarray) -> int:
    """The sum of ``hashes`` modulo 2^64, as a signed long (``rows.checksum``); sums of parts add up the same way."""
    return signed(int(np.sum(hashes, dtype=np.uint64)))


def signed(total: int) -> int:
    """A sum modulo 2^64 as Spark's long holds it: the signed value of its 64 bits."""
    total %= 2**64
    return total - 2**64 if total >= 2**63 else total


# Sent to Spark's Python workers by value, with the comparison's pass.
def file_state_sums(
    ids: Iterator[pa.RecordBatch], files: tuple[tuple[str, object, str], ...], schema: pa.Schema,
    columns: Sequence[str], kind_column: str, kind: str,
) -> Iterator[pa.RecordBatch]:
    """``state_sums`` of the rows of kind ``kind`` in the state files whose numbers ``ids`` hold, each read here.

    ``files``: (snapshot id, pyarrow filesystem, path) of a snapshot's files of ``replica_state`` (the snapshot is
    the folder's, not a column of the files). Each file's rows are brought to ``schema`` (the columns Spark's read
    of the table would give, in its types): a column the file was written without is null, as Spark reads it, and
    the checksum skips nulls. No JVM converts the rows into Arrow: the file's own Arrow columns are hashed.
    """
    def rows() -> Iterator[pa.RecordBatch]:
        for batch in ids:
            for number in batch.column(0).to_pylist():
                yield from state_file(files[number], schema, kind_column, kind).to_batches()

    yield from state_sums(rows(), columns)


def state_file(file: tuple[str, object, str], schema: pa.Schema, kind_column: str, kind: str) -> pa.Table:
    """The rows of kind ``kind`` of one state file (snapshot id, pyarrow filesystem, path), in ``schema``.

    Typed first: a file rewritten by another writer may hold views of strings (delta-rs), which pyarrow's filter
    cannot take; a column the file was written without is null, as Spark reads it; ``snapshot_id`` is the folder's.
    """
    import pyarrow.parquet as pq

    snapshot_id, fs, path = file
    table = pq.read_table(path, filesystem=fs)
    count = table.num_rows
    typed = pa.table([
        pa.repeat(pa.scalar(snapshot_id, field.type), count) if field.name == "snapshot_id"
        else table[field.name].cast(field.type) if field.name in table.column_names
        else pa.nulls(count, field.type)
        for field in schema
    ], schema=schema)
    return typed.filter(pc.equal(table[kind_column].cast(pa.string()), kind))


cloudpickle.register_pickle_by_value(sys.modules[__name__])
