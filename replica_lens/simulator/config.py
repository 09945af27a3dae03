"""The settings of a simulated snapshot (``SimulationConfig``, one ``--flag`` each), the names of
its regions and topics, and the constants of the model: file formats, the hybrid logical clock
and the kinds of the messages that flow through the simulation."""
from __future__ import annotations

import dataclasses
import string
from dataclasses import dataclass, field
from typing import Any, Optional

from resources.errors import InvalidSetting

FILE_FORMATS = ("jsonl", "jsonl.gz", "parquet", "venice-kafka")
HEARTBEAT_VECTORS = ("full", "own")
VENICE_COMPRESSIONS = ("gzip", "zstd-dict")

# Physical clock origin of the simulation (ms since the epoch, 2023-11-14).
BASE_MS = 1_700_000_000_000
LOGICAL_BITS = 18

# Message kinds inside the simulation; a FAILOVER placeholder becomes a PUT or DELETE.
PUT, DELETE, HEARTBEAT, FAILOVER = 0, 1, 2, 3
_KIND_NAMES = ("PUT", "DELETE", "HEARTBEAT")
_INF = float("inf")

_TOPIC_STEMS = ("store", "orders", "users", "events", "carts", "payments", "sessions", "profiles")


def _opt(default: Any, help: str, **kwargs: Any) -> Any:
    return field(default=default, metadata={"help": help, **kwargs})


@dataclass
class SimulationConfig:
    """Every knob of a simulated snapshot. All faults and anomalies default to off."""

    seed: int = _opt(7, "random seed; the same seed and options give byte-identical files")
    regions: int = _opt(3, "number of regions (named dc-a, dc-b, ...)")
    topics: int = _opt(1, "number of version topics (named store_v1, orders_v1, ...)")
    partitions: int = _opt(2, "partitions per topic")
    keys: int = _opt(1000, "distinct keys per topic (key i lives in partition i % partitions)")
    writes: int = _opt(20000, "upstream client writes in total, across topics, partitions and regions")
    hot_key_fraction: float = _opt(0.0, "fraction of keys that are hot (0 = uniform key choice)")
    hot_write_share: float = _opt(0.5, "share of writes that go to the hot keys when hot_key_fraction > 0")
    delete_fraction: float = _opt(0.1, "share of writes that are DELETEs")
    heartbeat_every: int = _opt(50, "each region's leader emits a heartbeat into its RT every N own writes, and at the end")
    heartbeat_vector: Optional[str] = _opt(
        None,
        "what a HEARTBEAT row carries: full = the leader's whole applied watermark as hb_vector (the VIP-2 "
        "proposal), own = only its own (source_region, source_offset), as Venice's heartbeats do today "
        "(default: own for venice-kafka, else full)",
        type=str,
        choices=HEARTBEAT_VECTORS,
    )
    write_interval_ms: float = _opt(5.0, "mean time between two writes of one region to one partition")
    replication_delay_ms: float = _opt(50.0, "mean cross-region replication delay")
    clock_uncertainty_ms: int = _opt(3, "half-width of every clock interval [t - d, t + d]")
    exporters: int = _opt(2, "exporters (change-capture consumers) reporting positions per replica partition")
    exporter_report_every: int = _opt(500, "each exporter reports its position every N version-topic rows")
    file_format: str = _opt(
        "jsonl",
        "file format: jsonl, jsonl.gz, parquet (SPEC rows) or venice-kafka (raw Venice records as Spark's Kafka "
        "source writes them, plus a SPEC Parquet file of exporter positions)",
        flag="--format",
        choices=FILE_FORMATS,
    )
    rows_per_file: int = _opt(1_000_000, "rows per data file before starting the next one")
    mid_stream_from: Optional[int] = _opt(
        None, "drop the rows below this offset from every version topic (a mid-stream dump)", type=int
    )
    # Faults: they make replicas differ.
    lost_writes: int = _opt(0, "upstream messages that one replica skips (its watermark still advances)")
    corrupted_values: int = _opt(0, "messages that one replica writes with a different value")
    duplicate_deliveries: int = _opt(0, "messages that one replica writes twice (adjacent or a few rows later)")
    lagging_replica: Optional[str] = _opt(None, "region whose leader stops before the last lag_messages messages", type=str)
    lag_messages: int = _opt(100, "upstream messages per partition the lagging replica never applies")
    conflicting_writes: int = _opt(0, "pairs of concurrent writes of one key from two regions with close clocks")
    # Stream anomalies (SPEC sections 5-7), each listed at its exact position.
    failover_clock_behind: int = _opt(0, "leader fail-overs whose new leader's clock starts behind (WRITE_TS_REGRESSION)")
    failover_behind_ms: int = _opt(1000, "how far behind the new leader's clock starts")
    heartbeat_under_report: int = _opt(0, "heartbeats with an hb_vector component below an earlier one (HEARTBEAT_REGRESSION)")
    rewind: int = _opt(0, "re-applications of a span of already applied messages (DUPLICATE_OR_REWIND)")
    rewind_span: int = _opt(3, "rows re-applied by each rewind")
    stalled_heartbeat: int = _opt(0, "leader stalls making a long applied-time gap between two heartbeats (HEARTBEAT_GAP)")
    stall_ms: int = _opt(60_000, "length of each stall")
    wide_clock_interval: int = _opt(0, "heartbeats with a wide applied clock interval (CLOCK_UNCERTAINTY)")
    wide_clock_ms: int = _opt(500, "half-width of a wide clock interval")
    exporter_regression: int = _opt(0, "exporter reports lower than the same exporter's earlier report")
    # Damage to the dump (SPEC section 3a), applied to each replica partition once its history is complete.
    compact_below: Optional[float] = _opt(
        None,
        "Kafka log compaction of each replica partition below this fraction of its offsets: there only the newest "
        "record of each Kafka key stays (a data key's newest PUT or DELETE anywhere in the partition; all heartbeats "
        "share one key; START_OF_PUSH is kept); offsets are not renumbered",
        type=float,
    )
    lose_records: Optional[float] = _opt(
        None,
        "drop each version-topic record but START_OF_PUSH from the dump with this probability (seeded; after "
        "--compact-below when both are given)",
        type=float,
    )
    # Store-version settings of raw Venice records (--format venice-kafka only; docs/venice-input.md).
    compression: Optional[str] = _opt(
        None,
        "venice-kafka: the version's compression, declared in every START_OF_PUSH: gzip, or zstd-dict (a "
        "dictionary trained on the values, carried in START_OF_PUSH) (default: none)",
        type=str,
        choices=VENICE_COMPRESSIONS,
    )
    chunk_above: Optional[int] = _opt(
        None,
        "venice-kafka: a chunked version: a value whose stored (compressed) bytes exceed this many is written as "
        "chunks of this size then a manifest, and replacing or deleting it is followed by chunk-cleanup DELETEs; "
        "a quarter of the values (chosen by their hash) are made 2-3 times this size",
        type=int,
    )
    push_control_messages: bool = _opt(
        False,
        "venice-kafka: write what a leader writes around a push after START_OF_PUSH (a producer's "
        "START_OF_SEGMENT, END_OF_PUSH, TOPIC_SWITCH, a leadership DOL_STAMP) and an END_OF_SEGMENT at the end",
        type=bool,
    )

    def __post_init__(self) -> None:
        for name in ("regions", "topics", "partitions", "keys", "heartbeat_every", "rows_per_file"):
            if getattr(self, name) < 1:
                raise InvalidSetting(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.regions > 26 * 27:
            raise InvalidSetting(f"regions must be at most {26 * 27}")
        for name in (
            "writes", "exporters", "lost_writes", "corrupted_values", "duplicate_deliveries", "lag_messages",
            "conflicting_writes", "failover_clock_behind", "failover_behind_ms", "heartbeat_under_report", "rewind",
            "stalled_heartbeat", "stall_ms", "wide_clock_interval", "wide_clock_ms", "exporter_regression",
            "clock_uncertainty_ms",
        ):
            if getattr(self, name) < 0:
                raise InvalidSetting(f"{name} must not be negative, got {getattr(self, name)}")
        for name in ("hot_key_fraction", "hot_write_share", "delete_fraction"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise InvalidSetting(f"{name} must be within [0, 1], got {getattr(self, name)}")
        if self.write_interval_ms <= 0 or self.replication_delay_ms < 0:
            raise InvalidSetting("write_interval_ms must be positive and replication_delay_ms not negative")
        if self.exporter_report_every < 1:
            raise InvalidSetting("exporter_report_every must be at least 1")
        if self.rewind_span < 1:
            raise InvalidSetting("rewind_span must be at least 1")
        if self.file_format not in FILE_FORMATS:
            raise InvalidSetting(f"file_format must be one of {', '.join(FILE_FORMATS)}, got {self.file_format!r}")
        if self.mid_stream_from is not None and self.mid_stream_from < 0:
            raise InvalidSetting("mid_stream_from must not be negative")
        if self.lagging_replica is not None and self.lagging_replica not in region_names(self.regions):
            raise InvalidSetting(
                f"lagging_replica {self.lagging_replica!r} is not one of {', '.join(region_names(self.regions))}"
            )
        if self.conflicting_writes and self.regions < 2:
            raise InvalidSetting("conflicting_writes needs at least two regions")
        if self.failover_clock_behind and self.failover_behind_ms < 1:
            raise InvalidSetting("failover_behind_ms must be at least 1 for failover_clock_behind")
        if self.wide_clock_interval and self.wide_clock_ms <= self.clock_uncertainty_ms:
            raise InvalidSetting("wide_clock_ms must exceed clock_uncertainty_ms for wide_clock_interval")
        if self.stalled_heartbeat and self.stall_ms < 1:
            raise InvalidSetting("stall_ms must be at least 1 for stalled_heartbeat")
        if self.exporter_regression and not self.exporters:
            raise InvalidSetting("exporter_regression needs at least one exporter")
        if self.heartbeat_vector is not None and self.heartbeat_vector not in HEARTBEAT_VECTORS:
            raise InvalidSetting(
                f"heartbeat_vector must be one of {', '.join(HEARTBEAT_VECTORS)}, got {self.heartbeat_vector!r}"
            )
        if self.file_format == "venice-kafka":
            if self.heartbeat_vector == "full":
                raise InvalidSetting("venice-kafka heartbeats carry one component: heartbeat_vector must be own")
            if self.wide_clock_interval:
                raise InvalidSetting(
                    "venice-kafka heartbeats carry time points, widened by one uncertainty at audit time: "
                    "wide_clock_interval cannot be written"
                )
        if self.compact_below is not None and not 0.0 <= self.compact_below <= 1.0:
            raise InvalidSetting(f"compact_below must be within [0, 1], got {self.compact_below}")
        if self.lose_records is not None and not 0.0 <= self.lose_records < 1.0:
            raise InvalidSetting(f"lose_records must be within [0, 1), got {self.lose_records}")
        if self.compression is not None and self.compression not in VENICE_COMPRESSIONS:
            raise InvalidSetting(f"compression must be one of {', '.join(VENICE_COMPRESSIONS)}, got {self.compression!r}")
        if self.chunk_above is not None and self.chunk_above < 16:
            raise InvalidSetting(f"chunk_above must be at least 16 bytes, got {self.chunk_above}")
        if self.file_format != "venice-kafka":
            for name in ("compression", "chunk_above"):
                if getattr(self, name) is not None:
                    raise InvalidSetting(f"{name} describes raw Venice records: it needs --format venice-kafka")
            if self.push_control_messages:
                raise InvalidSetting("push_control_messages describes raw Venice records: it needs --format venice-kafka")
        if self.damaged and (self.chunk_above is not None or self.push_control_messages):
            raise InvalidSetting(
                "compact_below and lose_records cannot yet be combined with chunk_above or push_control_messages "
                "(the ground truth's complete-topic proofs would take their records' positions for gaps)"
            )
        if self.heartbeat_under_report and not self.full_heartbeat_vectors:
            raise InvalidSetting("heartbeat_under_report lowers an hb_vector component: it needs heartbeat_vector full")

    @property
    def damaged(self) -> bool:
        """Whether the dump is damaged after the fact (``compact_below`` or ``lose_records`` given)."""
        return self.compact_below is not None or self.lose_records is not None

    def as_dict(self) -> dict:
        """The settings for the ground truth; the damage options only when given (older files stay the same)."""
        out = dataclasses.asdict(self)
        for name in ("compact_below", "lose_records", "compression", "chunk_above"):
            if out[name] is None:
                del out[name]
        if not out["push_control_messages"]:
            del out["push_control_messages"]
        return out

    @property
    def full_heartbeat_vectors(self) -> bool:
        """Whether HEARTBEAT rows carry the whole applied watermark (``heartbeat_vector``, resolved)."""
        if self.heartbeat_vector is None:
            return self.file_format != "venice-kafka"
        return self.heartbeat_vector == "full"


def region_names(n: int) -> list[str]:
    letters = string.ascii_lowercase
    names = [f"dc-{c}" for c in letters] + [f"dc-{a}{b}" for a in letters for b in letters]
    return names[:n]


def topic_names(n: int) -> list[str]:
    return [_TOPIC_STEMS[i] + "_v1" if i < len(_TOPIC_STEMS) else f"topic{i}_v1" for i in range(n)]
