"""Where the landing zone lives: one filesystem layer for plain paths and storage URIs.

The landing zone is listed, and its ``_SUCCESS`` markers and Parquet footers are read,
through pyarrow's filesystems (``pyarrow.fs``), never through ``os`` calls, so that a
landing folder can be a plain path, a ``file://`` URI or a URI of object storage or a
distributed filesystem that both Spark and pyarrow support:

=============================  ==========================  ===============================
landing given as               listed with (pyarrow)        read by Spark as
=============================  ==========================  ===============================
``/data/landing``, ``file://``  ``LocalFileSystem``          the same path / URI
``s3://b/p``, ``s3a://b/p``     ``S3FileSystem``             ``s3a://b/p`` (hadoop-aws)
``gs://b/p``                    ``GcsFileSystem``            ``gs://b/p`` (GCS connector)
``abfss://c@acct.dfs...``       ``AzureFileSystem``          ``abfss://...`` (hadoop-azure)
``hdfs://nn:8020/p``            ``HadoopFileSystem``         ``hdfs://nn:8020/p``
=============================  ==========================  ===============================

Credentials and endpoints: pyarrow and delta-rs read the usual environment of each store
(for S3 ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, ``AWS_ENDPOINT_URL``).
``REPLICA_LENS_STORAGE_OPTIONS`` (a JSON object, also read from ``.env`` by ``dagster dev``)
gives them explicitly, in delta-rs's vocabulary (its ``storage_options``, the keys of the
``object_store`` crate), for example
``{"AWS_ENDPOINT_URL": "http://127.0.0.1:9000", "AWS_ALLOW_HTTP": "true"}`` for an
S3-compatible server. The Delta commits take them as they are; the listing takes the S3
ones it has a name for (``s3_filesystem_options``). Spark needs its own configuration for
the same store (the ``spark.hadoop.fs.s3a.*`` settings and the hadoop-aws jars; see
docs/cluster.md).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Optional
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from resources.errors import InvalidSetting

STORAGE_OPTIONS_ENV = "REPLICA_LENS_STORAGE_OPTIONS"
# pyarrow's name of a scheme Spark (Hadoop) spells differently.
_PYARROW_SCHEME = {"s3a": "s3", "s3n": "s3"}
_SPARK_SCHEME = {"s3": "s3a"}


def storage_options() -> dict[str, str]:
    """``REPLICA_LENS_STORAGE_OPTIONS`` (a JSON object of delta-rs storage options), or none."""
    text = os.environ.get(STORAGE_OPTIONS_ENV, "").strip()
    if not text:
        return {}
    try:
        options = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidSetting(f"{STORAGE_OPTIONS_ENV} is not JSON: {exc}") from exc
    if not isinstance(options, dict):
        raise InvalidSetting(f"{STORAGE_OPTIONS_ENV} must be a JSON object of storage options")
    return {str(k): str(v) for k, v in options.items()}


# delta-rs (object_store) option -> pyarrow.fs.S3FileSystem argument.
_S3_ARGUMENTS = {
    "aws_access_key_id": "access_key",
    "aws_secret_access_key": "secret_key",
    "aws_session_token": "session_token",
    "aws_region": "region",
    "aws_default_region": "region",
    "aws_endpoint_url": "endpoint_override",
    "aws_endpoint": "endpoint_override",
}


def s3_filesystem_options(options: dict[str, str]) -> dict[str, str]:
    """The arguments of ``pyarrow.fs.S3FileSystem`` that ``options`` (delta-rs's names) set."""
    return {_S3_ARGUMENTS[k.lower()]: v for k, v in options.items() if k.lower() in _S3_ARGUMENTS}


def delta_storage_options() -> Optional[dict[str, str]]:
    """What delta-rs is given as ``storage_options`` (None: its defaults and the environment)."""
    return storage_options() or None


def _scheme(uri: str) -> str:
    parts = urlsplit(uri)
    # A Windows drive letter or a plain path has no scheme worth the name.
    return parts.scheme.lower() if len(parts.scheme) > 1 else ""


def spark_uri(uri: str) -> str:
    """``uri`` as Spark's Hadoop connectors name it (``s3://`` is read with ``s3a``); paths unchanged."""
    scheme = _scheme(uri)
    return _SPARK_SCHEME.get(scheme, scheme) + uri[len(scheme):] if scheme else uri


@dataclass(frozen=True)
class Entry:
    """One entry of a listed folder."""

    name: str
    uri: str
    is_file: bool
    is_dir: bool
    size: Optional[int]
    mtime: Optional[float]  # seconds since the epoch, when the store knows it


@dataclass(frozen=True)
class Location:
    """A folder or file given as a plain path or a URI, with the filesystem that reaches it."""

    uri: str  # as Spark should read it
    fs: pafs.FileSystem
    path: str  # the filesystem's own path

    @classmethod
    def of(cls, uri: str, options: Optional[dict] = None) -> "Location":
        scheme = _scheme(uri)
        if scheme in ("", "file"):
            path = urlsplit(uri).path if scheme == "file" else uri
            path = os.path.abspath(os.path.expanduser(path))
            local_uri = f"file://{path}" if scheme == "file" else path
            return cls(uri=local_uri, fs=pafs.LocalFileSystem(), path=path)
        options = storage_options() if options is None else options
        arrow_scheme = _PYARROW_SCHEME.get(scheme, scheme)
        arrow_uri = arrow_scheme + uri[len(scheme):]
        try:
            if arrow_scheme == "s3" and s3_filesystem_options(options):
                parts = urlsplit(arrow_uri)
                fs = pafs.S3FileSystem(**s3_filesystem_options(options))
                path = parts.netloc + parts.path
            else:
                fs, path = pafs.FileSystem.from_uri(arrow_uri)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for an unusable URI
            raise InvalidSetting(f"cannot open {uri!r}: {exc}") from exc
        return cls(uri=spark_uri(uri).rstrip("/"), fs=fs, path=path.rstrip("/"))

    def child(self, name: str) -> "Location":
        return Location(uri=f"{self.uri.rstrip('/')}/{name}", fs=self.fs, path=f"{self.path.rstrip('/')}/{name}")

    def _info(self) -> pafs.FileInfo:
        return self.fs.get_file_info(self.path)

    def is_dir(self) -> bool:
        return self._info().type == pafs.FileType.Directory

    def is_file(self) -> bool:
        return self._info().type == pafs.FileType.File

    def mtime(self) -> Optional[float]:
        info = self._info()
        return info.mtime.timestamp() if info.mtime is not None else None

    def relative(self, inner: str) -> str:
        """The path of ``inner`` (a path of this filesystem inside this location) relative to it."""
        return inner[len(self.path.rstrip("/")) + 1:]

    def walk_files(self) -> list[pafs.FileInfo]:
        """Every file under this folder, at any depth (empty when it does not exist)."""
        selector = pafs.FileSelector(self.path, recursive=True, allow_not_found=True)
        return sorted((i for i in self.fs.get_file_info(selector) if i.type == pafs.FileType.File), key=lambda i: i.path)

    def write_text(self, text: str) -> None:
        """Write this file whole (its folder created): a partial file is written beside it, then renamed into place
        (one step on local disks and HDFS; object stores have no partial object to show anyway)."""
        parent = self.path.rsplit("/", 1)[0]
        self.fs.create_dir(parent, recursive=True)
        partial = f"{parent}/.{self.path.rsplit('/', 1)[1]}.partial"
        with self.fs.open_output_stream(partial) as out:
            out.write(text.encode("utf-8"))
        self.fs.move(partial, self.path)

    def read_text(self) -> str:
        with self.open() as stream:
            return stream.read().decode("utf-8")

    def delete_tree(self) -> None:
        """Remove this folder and everything in it (nothing when it does not exist)."""
        if self.is_dir():
            self.fs.delete_dir(self.path)

    def open(self):
        """The file's bytes as they are stored (never decompressed on the way), as a readable stream."""
        return self.fs.open_input_stream(self.path, compression=None)

    def list(self) -> list[Entry]:
        """The entries directly inside this folder, sorted by name (empty when it does not exist)."""
        if not self.is_dir():
            return []
        infos = self.fs.get_file_info(pafs.FileSelector(self.path, recursive=False, allow_not_found=True))
        entries = [
            Entry(
                name=info.base_name,
                uri=self.child(info.base_name).uri,
                is_file=info.type == pafs.FileType.File,
                is_dir=info.type == pafs.FileType.Directory,
                size=info.size if info.type == pafs.FileType.File else None,
                mtime=info.mtime.timestamp() if info.mtime is not None else None,
            )
            for info in infos
        ]
        return sorted(entries, key=lambda e: e.name)
