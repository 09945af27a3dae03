"""Output sinks of SPEC section 1 rows: each streams the rows of one (replica, topic, partition)
into rotating files under temporary names, published when full: JSON lines (``_JsonSink``,
optionally gzip) or Parquet (``_ParquetSink``, on ``_ArrowSink`` which ``venice._VeniceSink``
shares). A sink is called by its leader: ``start_of_push``, ``data``, ``heartbeat``,
``exporter_position``, then ``close``."""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Optional

from replica_lens.simulator.config import SimulationConfig


class _Sink:
    """Rows of one (replica, topic, partition), streamed into rotating files under temporary names."""

    def __init__(self, folder: Path, replica: str, topic: str, partition: int, config: SimulationConfig):
        self.folder = folder
        self.replica, self.topic, self.partition = replica, topic, partition
        self.stem = f"{replica}.{topic}.p{partition}"
        self.rows_per_file = config.rows_per_file
        self.skip_below = config.mid_stream_from or 0
        self.counts = {"START_OF_PUSH": 0, "PUT": 0, "DELETE": 0, "HEARTBEAT": 0, "EXPORTER_POSITION": 0}
        # Records a sink writes beyond the rows (raw Venice records only): after START_OF_PUSH, and around
        # a data row (``reserve``). The leader leaves offsets for them.
        self.preamble = 0
        self.chunking = False
        self.files: list[str] = []
        self.in_file = 0
        self._tmp: Optional[Path] = None

    def _next_path(self, ext: str) -> Path:
        name = f"{self.stem}.{len(self.files):05d}.{ext}"
        self.files.append(name)
        self._tmp = self.folder / f".{name}.inprogress"
        return self._tmp

    def _publish(self) -> None:
        os.replace(self._tmp, self.folder / self.files[-1])
        self._tmp = None


class _JsonSink(_Sink):
    _CHUNK = 4096

    def __init__(self, folder, replica, topic, partition, config, gz: bool):
        super().__init__(folder, replica, topic, partition, config)
        self.gz = gz
        self.pre = '{"replica": %s, "topic": %s, "partition": %d' % (json.dumps(replica), json.dumps(topic), partition)
        self.pre_off = self.pre + ', "offset": '
        self.lines: list[str] = []
        self.fh = None
        self.raw = None
        self.puts = self.deletes = 0
        self.spill_at = min(self._CHUNK, self.rows_per_file)  # in_file count at which the buffer is written

    def _open(self) -> None:
        path = self._next_path("jsonl.gz" if self.gz else "jsonl")
        if self.gz:
            self.raw = open(path, "wb")
            # mtime=0 and no file name keep the gzip header, and so the file, byte-identical across runs.
            self.fh = gzip.GzipFile(filename="", mode="wb", fileobj=self.raw, compresslevel=6, mtime=0)
        else:
            self.fh = open(path, "w", encoding="utf-8", newline="\n")

    def _spill(self) -> None:
        if self.fh is None:
            self._open()
        if self.lines:
            text = "".join(self.lines)
            self.fh.write(text.encode("utf-8") if self.gz else text)
            self.lines = []
        if self.in_file >= self.rows_per_file:
            self.fh.close()
            if self.raw is not None:
                self.raw.close()
                self.raw = None
            self.fh = None
            self._publish()
            self.in_file = 0
        self.spill_at = min(self.in_file + self._CHUNK, self.rows_per_file)

    def _add(self, line: str) -> None:
        self.lines.append(line)
        self.in_file += 1
        if self.in_file >= self.spill_at:
            self._spill()

    def close(self) -> None:
        if self.lines:
            self._spill()
        if self.fh is not None:
            self.in_file = self.rows_per_file
            self._spill()
        self.counts["PUT"] += self.puts
        self.counts["DELETE"] += self.deletes
        self.puts = self.deletes = 0

    def start_of_push(self, off: int, epoch: int) -> None:
        if off < self.skip_below:
            return
        self.counts["START_OF_PUSH"] += 1
        self._add(f'{self.pre_off}{off}, "leader_epoch": {epoch}, "kind": "START_OF_PUSH"}}\n')

    def data(self, off, epoch, key, value, src, soff, wts) -> None:
        if off < self.skip_below:
            return
        # The hot path: one f-string per row, appended straight to the buffer.
        if value is None:
            self.deletes += 1
            self.lines.append(
                f'{self.pre_off}{off}, "leader_epoch": {epoch}, "kind": "DELETE", "key": "{key}", '
                f'"source_region": "{src}", "source_offset": {soff}, "write_ts": {wts}}}\n'
            )
        else:
            self.puts += 1
            self.lines.append(
                f'{self.pre_off}{off}, "leader_epoch": {epoch}, "kind": "PUT", "key": "{key}", "value": "{value}", '
                f'"source_region": "{src}", "source_offset": {soff}, "write_ts": {wts}}}\n'
            )
        self.in_file += 1
        if self.in_file >= self.spill_at:
            self._spill()

    def heartbeat(self, off, epoch, src, soff, vector, omin, omax, amin, amax) -> None:
        if off < self.skip_below:
            return
        self.counts["HEARTBEAT"] += 1
        vec = "" if vector is None else ', "hb_vector": {%s}' % ", ".join(f'"{r}": {o}' for r, o in vector)
        self._add(
            f'{self.pre_off}{off}, "leader_epoch": {epoch}, "kind": "HEARTBEAT", "source_region": "{src}", '
            f'"source_offset": {soff}{vec}, "origin_ts_min_ms": {omin}, '
            f'"origin_ts_max_ms": {omax}, "applied_ts_min_ms": {amin}, "applied_ts_max_ms": {amax}}}\n'
        )

    def exporter_position(self, exporter: str, exported: int, reported_at: int) -> None:
        self.counts["EXPORTER_POSITION"] += 1
        self._add(
            f'{self.pre}, "kind": "EXPORTER_POSITION", "exporter": "{exporter}", '
            f'"exported_offset": {exported}, "reported_at_ms": {reported_at}}}\n'
        )


def parquet_schema():
    """The Parquet schema of snapshot files: SPEC section 1 field names, hb_vector as map<string,int64>."""
    import pyarrow as pa

    return pa.schema(
        [
            ("replica", pa.string()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("kind", pa.string()),
            ("key", pa.string()),
            ("value", pa.string()),
            ("source_region", pa.string()),
            ("source_offset", pa.int64()),
            ("hb_vector", pa.map_(pa.string(), pa.int64())),
            ("origin_ts_min_ms", pa.int64()),
            ("origin_ts_max_ms", pa.int64()),
            ("applied_ts_min_ms", pa.int64()),
            ("applied_ts_max_ms", pa.int64()),
            ("write_ts", pa.int64()),
            ("leader_epoch", pa.int64()),
            ("exporter", pa.string()),
            ("exported_offset", pa.int64()),
            ("reported_at_ms", pa.int64()),
        ]
    )


class _ArrowSink(_Sink):
    """Rows buffered as tuples of the ``_VARYING`` columns, written in chunks to rotating Parquet files;
    the other columns of ``schema`` are constant within a sink (``constants``)."""

    _CHUNK = 32_768
    _VARYING: tuple[str, ...] = ()
    _EXT = "parquet"

    def __init__(self, folder, replica, topic, partition, config, schema, constants: dict):
        super().__init__(folder, replica, topic, partition, config)
        import pyarrow as pa
        import pyarrow.parquet as pq

        self.pa, self.pq = pa, pq
        self.schema = schema
        self.constants = constants
        self.writer = None
        self.rows: list[tuple] = []

    def _flush(self) -> None:
        if not self.rows:
            return
        if self.writer is None:
            self.writer = self.pq.ParquetWriter(self._next_path(self._EXT), self.schema)
            self.in_file = 0
        n = len(self.rows)
        varying = dict(zip(self._VARYING, zip(*self.rows)))
        arrays = [
            self.pa.array(varying[f.name] if f.name in varying else [self.constants[f.name]] * n, f.type)
            for f in self.schema
        ]
        self.writer.write_table(self.pa.Table.from_arrays(arrays, schema=self.schema))
        self.in_file += n
        self.rows = []

    def _add(self, row: tuple) -> None:
        self.rows.append(row)
        if len(self.rows) >= self._CHUNK or self.in_file + len(self.rows) >= self.rows_per_file:
            self._flush()
            if self.in_file >= self.rows_per_file:
                self._close_file()

    def _close_file(self) -> None:
        self.writer.close()
        self.writer = None
        self._publish()

    def close(self) -> None:
        self._flush()
        if self.writer is not None:
            self._close_file()


class _ParquetSink(_ArrowSink):
    # Columns filled per row; replica, topic and partition are constant within a sink.
    _VARYING = (
        "offset", "kind", "key", "value", "source_region", "source_offset", "hb_vector", "origin_ts_min_ms",
        "origin_ts_max_ms", "applied_ts_min_ms", "applied_ts_max_ms", "write_ts", "leader_epoch", "exporter",
        "exported_offset", "reported_at_ms",
    )

    def __init__(self, folder, replica, topic, partition, config):
        constants = {"replica": replica, "topic": topic, "partition": partition}
        super().__init__(folder, replica, topic, partition, config, parquet_schema(), constants)

    def start_of_push(self, off, epoch) -> None:
        if off < self.skip_below:
            return
        self.counts["START_OF_PUSH"] += 1
        self._add((off, "START_OF_PUSH", None, None, None, None, None, None, None, None, None, None, epoch, None, None, None))

    def data(self, off, epoch, key, value, src, soff, wts) -> None:
        if off < self.skip_below:
            return
        kind = "DELETE" if value is None else "PUT"
        self.counts[kind] += 1
        self._add((off, kind, key, value, src, soff, None, None, None, None, None, wts, epoch, None, None, None))

    def heartbeat(self, off, epoch, src, soff, vector, omin, omax, amin, amax) -> None:
        if off < self.skip_below:
            return
        self.counts["HEARTBEAT"] += 1
        self._add((off, "HEARTBEAT", None, None, src, soff, vector, omin, omax, amin, amax, None, epoch, None, None, None))

    def exporter_position(self, exporter, exported, reported_at) -> None:
        self.counts["EXPORTER_POSITION"] += 1
        self._add((None, "EXPORTER_POSITION", None, None, None, None, None, None, None, None, None, None, None,
                   exporter, exported, reported_at))
