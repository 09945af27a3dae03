"""The plan of a simulation: everything decided before the messages flow (writes per RT, the keys,
where each fault, conflict and fail-over goes), the sink of each replica partition for the
file format, and the results that the partitions fill as they run."""
from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

from replica_lens.simulator.config import SimulationConfig, region_names, topic_names
from replica_lens.simulator.sinks import _JsonSink, _ParquetSink
from replica_lens.simulator.venice import _VeniceSink, venice_push_settings


class _Plan:
    """Everything decided before the messages flow: counts per RT, and where each fault goes."""

    def __init__(self, config: SimulationConfig):
        self.config = config
        self.venice_push = None  # the PushSettings of venice-kafka records, made with the first sink
        self.venice_records: dict[str, Counter] = {}  # replica -> Venice records without a row, by kind
        self.regions = region_names(config.regions)
        self.topics = topic_names(config.topics)
        self.exporters = [f"exporter-{i}" for i in range(config.exporters)]
        rng = random.Random(f"plan:{config.seed}")
        nreg, ntop, npart = config.regions, config.topics, config.partitions
        cells = [(t, p, x) for t in range(ntop) for p in range(npart) for x in range(nreg)]
        base, extra = divmod(config.writes, len(cells))
        self.rt_writes = {cell: base + (1 if i < extra else 0) for i, cell in enumerate(cells)}
        self.key_width = max(4, len(str(config.keys - 1)))
        n_hot = 0
        if config.hot_key_fraction > 0:
            n_hot = max(1, round(config.keys * config.hot_key_fraction))
        self.n_hot = n_hot
        # Fault triggers: a fraction of the leader's applied messages after which the fault waits
        # for the first eligible message.
        self.triggers: dict[tuple[int, int, int], list[tuple[float, str]]] = {}
        tps = [(t, p) for t in range(ntop) for p in range(npart)]
        for what in ("lost_writes", "corrupted_values", "duplicate_deliveries", "rewind", "heartbeat_under_report",
                     "stalled_heartbeat", "wide_clock_interval", "exporter_regression"):
            name = {"lost_writes": "lost_write", "corrupted_values": "corrupted_value",
                    "duplicate_deliveries": "duplicate_delivery"}.get(what, what)
            for _ in range(getattr(config, what)):
                t, p = rng.choice(tps)
                x = rng.randrange(nreg)
                self.triggers.setdefault((t, p, x), []).append((rng.uniform(0.05, 0.8), name))
        self.conflicts: dict[tuple[int, int], list[dict]] = {}
        for cid in range(config.conflicting_writes):
            t, p = rng.choice(tps)
            a, b = rng.sample(range(nreg), 2)
            duration = min(self.rt_writes[(t, p, x)] for x in range(nreg)) * config.write_interval_ms * 1000
            hot, cold = self.partition_keys(p)
            keys = hot + cold
            taken = {c["key"] for c in self.conflicts.get((t, p), [])}
            free = [k for k in keys if k not in taken] or keys
            self.conflicts.setdefault((t, p), []).append({
                "id": cid, "key": rng.choice(free), "region_idx": (a, b), "t_us": int(rng.uniform(0.1, 0.8) * duration),
                "writes": [],
            })
        self.warnings: list[str] = []
        # Fail-overs go to distinct leaders first; a leader failing over twice does so at distinct times.
        self.failovers: dict[tuple[int, int], dict[int, list[int]]] = {}
        leaders = [(t, p, x) for t, p in tps for x in range(nreg)]
        for i in range(config.failover_clock_behind):
            if i % len(leaders) == 0:
                rng.shuffle(leaders)
            t, p, x = leaders[i % len(leaders)]
            duration = self.rt_writes[(t, p, x)] * config.write_interval_ms * 1000
            times = self.failovers.setdefault((t, p), {}).setdefault(x, [])
            times.append(int(rng.uniform(0.2, 0.7) * duration))
            times.sort()
        # Results, filled as partitions run.
        self.faults: list[dict] = []
        self.anomalies: list[dict] = []
        self.divergent: list[dict] = []
        self.conflict_entries: list[dict] = []
        self.lagging: list[dict] = []
        self.files: list[str] = []
        self.rows = {r: {"START_OF_PUSH": 0, "PUT": 0, "DELETE": 0, "HEARTBEAT": 0, "EXPORTER_POSITION": 0}
                     for r in self.regions}
        self.upstream_messages = 0
        self.natural_max_gap_ms = 0
        self.damage: list[dict] = []  # per replica partition, with compact_below / lose_records
        self.complete_topic_proofs: list[dict] = []

    def key_name(self, i: int) -> str:
        return f"k{i:0{self.key_width}d}"

    def partition_keys(self, partition: int) -> tuple[list[str], list[str]]:
        idx = range(partition, self.config.keys, self.config.partitions)
        return ([self.key_name(i) for i in idx if i < self.n_hot], [self.key_name(i) for i in idx if i >= self.n_hot])

    def make_sink(self, folder: Path, replica: str, topic: str, partition: int):
        fmt = self.config.file_format
        if fmt == "parquet":
            return _ParquetSink(folder, replica, topic, partition, self.config)
        if fmt == "venice-kafka":
            if self.venice_push is None:
                self.venice_push = venice_push_settings(self.config)
            return _VeniceSink(folder, replica, topic, partition, self.config, self.regions, self.venice_push)
        return _JsonSink(folder, replica, topic, partition, self.config, gz=(fmt == "jsonl.gz"))
