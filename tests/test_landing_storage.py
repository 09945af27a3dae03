"""The landing zone is reached through one filesystem layer: plain paths, file:// URIs and object storage.

The object-storage case runs against an S3-compatible server (moto) started on loopback:
Spark cannot read S3 here (no hadoop-aws jars), but listing, markers, Parquet footers and
the gzip check go through ``resources/filesystem.py`` and are tested on it.
"""
from __future__ import annotations

import gzip
import json
import socket

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from pipelines.ingest import list_snapshot_files, read_snapshot_lines
from resources.errors import InvalidSetting, SnapshotNotReady
from resources.filesystem import STORAGE_OPTIONS_ENV, Location
from resources.landing import LandingZone

ROW = {"replica": "dc-a", "topic": "t", "partition": 0, "offset": 0, "kind": "START_OF_PUSH"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_options():
    """Options of an S3FileSystem reaching a moto server on loopback, with one empty bucket ``landing``."""
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=_free_port(), verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        options = {
            "endpoint_override": f"http://{host}:{port}",
            "access_key": "testing",
            "secret_key": "testing",
            "region": "us-east-1",
            "allow_bucket_creation": True,
        }
        pafs.S3FileSystem(**options).create_dir("landing")
        yield options
    finally:
        server.stop()


def _put(fs: pafs.FileSystem, path: str, data: bytes) -> None:
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
    _fill(pafs.S3FileSystem(**s3_options), "landing/zone-a")

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
    """Catches the gzip check and the Parquet footer read opening a URI with ``open``: every file looked broken."""
    from pipelines import ingest

    monkeypatch.setenv(STORAGE_OPTIONS_ENV, json.dumps(s3_options))
    fs = pafs.S3FileSystem(**s3_options)
    whole = gzip.compress(b'{"a": 1}\n' * 50)
    _put(fs, "landing/gz/whole.jsonl.gz", whole)
    _put(fs, "landing/gz/cut.jsonl.gz", whole[: len(whole) // 2])
    assert ingest._gzip_problem("s3a://landing/gz/whole.jsonl.gz") is None  # noqa: SLF001
    assert "truncated" in ingest._gzip_problem("s3a://landing/gz/cut.jsonl.gz")  # noqa: SLF001

    location = Location.of("s3://landing/gz")
    assert location.uri == "s3a://landing/gz" and location.is_dir()
    assert [e.name for e in location.list()] == ["cut.jsonl.gz", "whole.jsonl.gz"]


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
