"""Landing and warehouse are reached through one filesystem layer: plain paths, file:// URIs and object storage.

The object-storage cases run against an S3-compatible server (moto) started on loopback:
Spark cannot read or write S3 here (no hadoop-aws jars), but the landing zone's listing,
markers, Parquet footers and gzip files (these read in Spark's Python workers), and the
embedded Delta commit of staged files, go through ``resources/filesystem.py`` and delta-rs,
and are tested on it.
"""
from __future__ import annotations

import gzip
import json
import socket
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from pipelines.ingest import list_snapshot_files, read_snapshot_lines
from resources.errors import InvalidSetting, SnapshotNotReady
from resources.filesystem import STORAGE_OPTIONS_ENV, Location, s3_filesystem_options
from resources.landing import LandingZone

ROW = {"replica": "dc-a", "topic": "t", "partition": 0, "offset": 0, "kind": "START_OF_PUSH"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_options():
    """Storage options (delta-rs's names) reaching a moto server on loopback, with buckets ``landing`` and ``warehouse``."""
    pytest.importorskip("moto.server")
    # A process of its own: delta-rs holds the GIL while it waits on a request, so a server
    # thread in this process (moto's ThreadedMotoServer) could never answer it.
    host, port = "127.0.0.1", _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", host, "-p", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection((host, port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                pytest.fail("the moto S3 server did not start")
            time.sleep(0.2)
    try:
        options = {
            "AWS_ENDPOINT_URL": f"http://{host}:{port}",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
            # moto has no conditional writes for delta-rs's commit; one writer at a time here.
            "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
        }
        for bucket in ("landing", "warehouse"):
            _s3(options, allow_bucket_creation=True).create_dir(bucket)
        yield options
    finally:
        server.terminate()
        server.wait(timeout=30)


def _s3(options: dict, **extra) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(**s3_filesystem_options(options), **extra)


def _put(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    if isinstance(fs, pafs.LocalFileSystem):  # (on S3 a folder would be an object of its own)
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path, compression=None) as out:
        out.write(data)


def _fill(fs: pafs.FileSystem, root: str) -> None:
    """Three snapshots (complete, incomplete, unsafe name) with a JSONL, a gzip, a Parquet and a stray file."""
    line = (json.dumps(ROW) + "\n").encode()
    _put(fs, f"{root}/snap-1/dc-a.p0.jsonl", line)
    _put(fs, f"{root}/snap-1/dc-a.p1.jsonl.gz", gzip.compress(line))
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_pylist([ROW]), sink)
    _put(fs, f"{root}/snap-1/dc-a.p2.parquet", sink.getvalue().to_pybytes())
    _put(fs, f"{root}/snap-1/notes.txt", b"not data")
    _put(fs, f"{root}/snap-1/_SUCCESS", b"")
    _put(fs, f"{root}/snap-2/dc-a.p0.jsonl", line)
    _put(fs, f"{root}/has space/dc-a.p0.jsonl", line)


def test_a_landing_on_s3_is_listed_through_the_filesystem_layer(s3_options, monkeypatch):
    """Catches a landing zone listed with ``os`` calls: on object storage every snapshot was "not found"."""
    monkeypatch.setenv(STORAGE_OPTIONS_ENV, json.dumps(s3_options))
    _fill(_s3(s3_options), "landing/zone-a")

    zone = LandingZone(root="s3a://landing/zone-a")
    scan = zone.scan()
    assert (scan.complete, scan.incomplete, scan.refused) == (["snap-1"], ["snap-2"], ["has space"])
    folder = zone.require_complete("snap-1")
    assert folder == "s3a://landing/zone-a/snap-1"  # as Spark's s3a connector reads it
    with pytest.raises(SnapshotNotReady, match="incomplete"):
        zone.require_complete("snap-2")
    with pytest.raises(SnapshotNotReady, match="not found"):
        zone.require_complete("snap-3")

    files = list_snapshot_files(folder)
    assert [(f.name, f.format) for f in files.data_files] == [
        ("dc-a.p0.jsonl", "jsonl"),
        ("dc-a.p1.jsonl.gz", "jsonl.gz"),
        ("dc-a.p2.parquet", "parquet"),
    ]
    assert all(f.path.startswith("s3a://landing/zone-a/snap-1/") and f.size > 0 for f in files.data_files)
    assert [o["file"] for o in files.other_files] == ["notes.txt"]


def test_gzip_and_parquet_footers_are_read_through_the_layer(s3_options, monkeypatch):
    """Catches the gzip reader opening a URI with ``open``: every file looked broken."""
    from pipelines.ingest.gzip_lines import gzip_file_batches

    monkeypatch.setenv(STORAGE_OPTIONS_ENV, json.dumps(s3_options))
    fs = _s3(s3_options)
    whole = gzip.compress(b'{"a": 1}\n' * 50)
    _put(fs, "landing/gz/whole.jsonl.gz", whole)
    _put(fs, "landing/gz/cut.jsonl.gz", whole[: len(whole) // 2])

    location = Location.of("s3://landing/gz")
    assert location.uri == "s3a://landing/gz" and location.is_dir()
    assert [e.name for e in location.list()] == ["cut.jsonl.gz", "whole.jsonl.gz"]

    def rows(name: str) -> list[tuple]:
        batches = gzip_file_batches(location.fs, location.child(name).path, name)
        return [(r["raw"], r["read_error"]) for b in batches for r in b.to_pylist()]

    assert rows("whole.jsonl.gz") == [(b'{"a": 1}', None)] * 50
    *kept, (raw, lost) = rows("cut.jsonl.gz")
    assert raw is None and "truncated" in lost and f"; {len(kept)} complete lines" in lost


def test_a_gzip_snapshot_on_s3_is_read_on_the_executors(s3_options, monkeypatch, spark):
    """Catches the executors reaching a gzip file on object storage otherwise than the driver
    lists it (a path without its filesystem, or the driver's storage options left behind):
    Spark itself cannot read S3 here, the Python workers read through the pickled pyarrow
    filesystem."""
    monkeypatch.setenv(STORAGE_OPTIONS_ENV, json.dumps(s3_options))
    fs = _s3(s3_options)
    line = (json.dumps(ROW) + "\n").encode()
    _put(fs, "landing/gz-snap/a.jsonl.gz", gzip.compress(line * 3))
    _put(fs, "landing/gz-snap/b.jsonl.gz", gzip.compress(line * 4)[:-4])
    got = read_snapshot_lines(spark, "s3a://landing/gz-snap").collect()
    assert sorted((r["source_file"], r["raw"] or "", r["read_error"] is None) for r in got) == sorted(
        [("a.jsonl.gz", json.dumps(ROW), True)] * 3 + [("b.jsonl.gz", json.dumps(ROW), True)] * 4
        + [("b.jsonl.gz", "", False)]
    )


def test_a_file_uri_landing_reads_the_same_rows_as_its_path(tmp_path, spark):
    """Catches ``--landing file:///...`` answering "snapshot not found" (the URI taken for a relative path)."""
    _fill(pafs.LocalFileSystem(), str(tmp_path))
    by_path = LandingZone(root=str(tmp_path))
    by_uri = LandingZone(root=tmp_path.as_uri())
    assert by_uri.scan() == by_path.scan()
    assert by_uri.require_complete("snap-1") == f"file://{tmp_path}/snap-1"

    def rows(folder: str) -> list[tuple]:
        lines = read_snapshot_lines(spark, folder)
        return sorted((r["source_file"], r["raw"], r["read_error"]) for r in lines.collect())

    from_path = rows(by_path.require_complete("snap-1"))
    assert len(from_path) == 3  # one row from each data file
    assert rows(by_uri.require_complete("snap-1")) == from_path


def test_storage_options_must_be_a_json_object(monkeypatch):
    """Catches a malformed REPLICA_LENS_STORAGE_OPTIONS being ignored (then S3 is reached with the wrong endpoint)."""
    monkeypatch.setenv(STORAGE_OPTIONS_ENV, "endpoint=http://x")
    with pytest.raises(InvalidSetting, match="not JSON"):
        Location.of("s3://bucket/landing")
    monkeypatch.setenv(STORAGE_OPTIONS_ENV, "[1, 2]")
    with pytest.raises(InvalidSetting, match="JSON object"):
        Location.of("s3://bucket/landing")


def _staged_on_s3(fs: pafs.FileSystem, relative_dir: str, rows: list[dict], warehouse: str = "wh"):
    """Parquet files (and Spark's _SUCCESS) where Spark would have staged a snapshot of table ``t``."""
    from pyspark.sql import types as T

    from resources.delta_staging import StagedWrite

    struct = T.StructType([
        T.StructField("snapshot_id", T.StringType(), False),
        T.StructField("offset", T.LongType(), False),
        T.StructField("key", T.StringType(), True),
    ])
    folder = f"warehouse/{warehouse}/t/{relative_dir}/snapshot_id=s1"
    for i in range(0, len(rows), 2):
        sink = pa.BufferOutputStream()
        schema = pa.schema([pa.field("offset", pa.int64(), False), pa.field("key", pa.string())])
        pq.write_table(pa.Table.from_pylist(rows[i:i + 2], schema=schema), sink)
        _put(fs, f"{folder}/part-{i:05d}.parquet", sink.getvalue().to_pybytes())
    _put(fs, f"warehouse/{warehouse}/t/{relative_dir}/_SUCCESS", b"")
    return StagedWrite(
        table="t", uri=f"s3a://warehouse/{warehouse}/t", snapshot_id="s1", relative_dir=relative_dir, struct=struct,
        row_count=len(rows),
    )


def test_the_embedded_delta_commit_works_on_object_storage(s3_options, monkeypatch):
    """Catches a commit that finds the staged files with ``os.walk`` (on S3 it found none and committed an
    empty snapshot), that ignores the storage options, or that leaves Spark's markers in the table."""
    import deltalake

    from resources.delta_store import DeltaStore

    monkeypatch.setenv(STORAGE_OPTIONS_ENV, json.dumps(s3_options))
    fs = _s3(s3_options)
    store = DeltaStore(warehouse_root="s3://warehouse/wh", engine="embedded")
    assert store.table_uri("t") == "s3a://warehouse/wh/t"

    first = [{"offset": i, "key": f"k{i}"} for i in range(5)]
    result = store.commit(None, _staged_on_s3(fs, "write-1", first))
    assert (result.row_count, result.files, result.version) == (5, 3, 1)
    assert not fs.get_file_info("warehouse/wh/t/write-1/_SUCCESS").is_file

    table = deltalake.DeltaTable("s3a://warehouse/wh/t", storage_options=s3_options)
    assert sorted(table.to_pyarrow_table().to_pylist(), key=lambda r: r["offset"]) == [
        {"snapshot_id": "s1", **row} for row in first
    ]
    assert sorted(table.get_add_actions(flatten=True).column("min.offset").to_pylist()) == [0, 2, 4]

    # A re-write of the snapshot replaces it (one copy), and a discarded write leaves nothing behind.
    second = [{"offset": i, "key": f"new{i}"} for i in range(2)]
    assert store.commit(None, _staged_on_s3(fs, "write-2", second)).row_count == 2
    table = deltalake.DeltaTable("s3a://warehouse/wh/t", storage_options=s3_options)
    assert sorted(r["key"] for r in table.to_pyarrow_table().to_pylist()) == ["new0", "new1"]
    assert store.snapshot_ids("t") == ["s1"]
    store.discard(_staged_on_s3(fs, "write-3", first))
    assert fs.get_file_info("warehouse/wh/t/write-3").type == pafs.FileType.NotFound


def test_vacuum_works_on_object_storage(s3_options, monkeypatch):
    """Catches housekeeping that lists and measures files on the local disk: on S3 it found no table."""
    import deltalake

    from resources.delta_store import DeltaStore

    monkeypatch.setenv(STORAGE_OPTIONS_ENV, json.dumps(s3_options))
    fs = _s3(s3_options)
    store = DeltaStore(warehouse_root="s3a://warehouse/vac", engine="embedded")
    store.commit(None, _staged_on_s3(fs, "write-1", [{"offset": i, "key": "old"} for i in range(5)], "vac"))
    store.commit(None, _staged_on_s3(fs, "write-2", [{"offset": 9, "key": "new"}], "vac"))
    _staged_on_s3(fs, "write-3", [{"offset": 1, "key": "crashed"}], "vac")  # never committed
    assert store.tables() == ["t"]

    (dry,) = store.vacuum(retention_hours=0, dry_run=True)
    # write-1's 3 files and write-3's 2, and the empty "folder" objects pyarrow leaves on S3
    # when a folder's last file goes (Spark's _SUCCESS, removed by the commits).
    assert dry.dry_run and dry.files >= 5 and dry.bytes > 0
    (done,) = store.vacuum(retention_hours=0)
    assert (done.files, done.bytes) == (dry.files, dry.bytes)
    left = sorted(i.path for i in fs.get_file_info(pafs.FileSelector("warehouse/vac/t", recursive=True))
                  if i.type == pafs.FileType.File and "_delta_log" not in i.path)
    assert left == ["warehouse/vac/t/write-2/snapshot_id=s1/part-00000.parquet"]
    table = deltalake.DeltaTable("s3a://warehouse/vac/t", storage_options=s3_options)
    assert table.to_pyarrow_table().to_pylist() == [{"snapshot_id": "s1", "offset": 9, "key": "new"}]
