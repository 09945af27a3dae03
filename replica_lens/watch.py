"""Continuous audits of live brokers (SPEC 11): each tick cuts every watched store's version topics in every
region, lands the new offsets as one broker snapshot and audits it incrementally.

``replica-lens watch`` (one tick with ``--once``, else one every interval) and the ``watch_brokers`` job (its
``broker_watch`` sensor, ``replica_lens/jobs.py``) run the same tick, ``watch_store``, per store:

1. **Resume.** A snapshot the store's cursor names as *pending* (landed or being landed when the last tick stopped)
   comes first: complete (``_SUCCESS``) -> it is audited again (re-materializing a snapshot writes the same
   tables, so an audit killed half-way leaves nothing twice); incomplete -> its folder is removed and the cut is
   taken again from the last published ends. Until the pending snapshot is audited no new cut is taken: a cut is
   published (landed *and* audited) whole or not at all, and the chain never has a hole.
2. **Cut.** Per region, the topics matching the store's pattern (Venice's ``<store>_v<N>``) and, for each of their
   partitions, the end offset, before any record is read (``kafka_cut.take_cut``). ``s`` is the cursor's last
   published ``e``; a topic the cursor does not know (a new push) starts a chain at its log start offset; a topic
   that is gone (a retired version) is no longer cut, and its last audit stays. ``max_offsets_per_partition``
   bounds ``e`` so that a backlog is read as several cuts in order. A region that does not answer is *skipped*:
   the others are read, its partitions are recorded with ``s = e`` = their last published end and the reason, and
   its next cut starts from there.
3. **Land.** When any partition moved (or a topic appeared), the cursor first records the snapshot as pending
   (``<store>-<sequence>``, written atomically), then ``kafka_dump.land_cut`` reads exactly the cut and writes
   the folder, ``_cut.json`` and last ``_SUCCESS``.
4. **Audit.** ``audit(snapshot_id, scope)`` (``run_audit`` on the same Dagster instance and Spark session, with the
   store's ``audit_scope``): the partition's incremental audit continues the carried state of the previous
   snapshot of each replica partition (docs/incremental.md). Only when it succeeds does the cursor advance: the published ends become the
   cut's ``e`` (a skipped region keeps its own), the pending mark goes.

The cursor (``<landing>/_watch/<store>.json``) lives beside the snapshots it describes, so the shell and the
sensor continue the same chain, and a restarted process continues from it; the sensor's own cursor mirrors the
published ends for the UI. Consumer secrets come from files or environment variables named in the store file
(``docs/operations.md``) and reach only Kafka's clients: never the cursor, ``_cut.json``, a table, a run's
config or a log line.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import re
import time
import tomllib
from dataclasses import dataclass, field
from typing import Callable, Optional

from pipelines.venice.kafka_cut import (
    CUT_FILE, ISOLATION_LEVELS, BrokerUnavailable, DumpRequest, PartitionCut, list_topics, options_file, take_cut,
)
from pipelines.venice.kafka_dump import land_cut
from resources.errors import InvalidSetting, UsageError
from resources.filesystem import Location
from resources.snapshots import SUCCESS_MARKER
from replica_lens.scopes import ALL, AUDIT_SCOPES

WATCH_FOLDER = "_watch"  # under the landing root; the landing scan skips folders starting with "_"
STORES_ENV = "REPLICA_LENS_STORES"
WATCH_INTERVAL_ENV = "REPLICA_LENS_WATCH_INTERVAL_S"
DEFAULT_INTERVAL_S = 60
DEFAULT_WARN_AFTER_SKIPPED_CUTS = 3
# Consumer settings whose values are secrets: refused in a store file's plain ``options`` (they belong in an
# options file or an environment variable).
SECRET_NAME = re.compile(r"(?i)password|jaas|secret|token|credential|ssl\.key\.|keystore\.key|truststore\.certificates")
STORE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}")


@dataclass(frozen=True)
class RegionConfig:
    """One region of a store: its brokers and its consumer settings (plain ones, a properties file, variables)."""

    name: str
    bootstrap_servers: str
    options: dict[str, str] = field(default_factory=dict)
    options_file: Optional[str] = None
    options_from_env: dict[str, str] = field(default_factory=dict)  # setting -> environment variable
    broker_timeout_s: Optional[float] = None  # None: the store's

    def consumer_options(self) -> dict[str, str]:
        """The region's consumer settings, secrets read now (never kept in the configuration)."""
        options = dict(self.options)
        options.update(options_file(self.options_file))
        for name, variable in self.options_from_env.items():
            if variable not in os.environ:
                raise InvalidSetting(f"region {self.name}: {name} comes from ${variable}, which is not set")
            options[name] = os.environ[variable]
        return options


@dataclass(frozen=True)
class StoreConfig:
    """A store to watch: its regions, which topics are its version topics, how each cut reads them."""

    name: str
    regions: tuple[RegionConfig, ...]
    topic_pattern: str
    isolation_level: str = "read_committed"
    max_offsets_per_partition: Optional[int] = None
    warn_after_skipped_cuts: int = DEFAULT_WARN_AFTER_SKIPPED_CUTS
    broker_timeout_s: float = 30.0
    options: dict[str, str] = field(default_factory=dict)  # for every region
    audit_scope: str = ALL  # what each cut's audit materializes (replica_lens/scopes.py)

    def request(self) -> DumpRequest:
        """The dump request of one cut (secrets resolved from their files and variables at this moment)."""
        return DumpRequest(
            regions={r.name: r.bootstrap_servers for r in self.regions},
            topics=(self.topic_pattern,),  # placeholder: each region's cut names the topics it lists
            isolation_level=self.isolation_level,
            kafka_options=dict(self.options),
            region_options={r.name: r.consumer_options() for r in self.regions},
            timeout_s=self.broker_timeout_s,
            region_timeouts={r.name: r.broker_timeout_s for r in self.regions if r.broker_timeout_s is not None},
            max_offsets=self.max_offsets_per_partition,
        )


@dataclass(frozen=True)
class WatchConfig:
    stores: tuple[StoreConfig, ...]
    interval_s: int = DEFAULT_INTERVAL_S


def _strings(value, where: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(v, (str, int, bool)) for v in value.values()):
        raise InvalidSetting(f"{where}: expected a table of NAME = \"VALUE\"")
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in value.items()}


def _plain_options(value, where: str) -> dict[str, str]:
    options = _strings(value, where)
    for name in options:
        if SECRET_NAME.search(name):
            raise InvalidSetting(f"{where}: {name} is a secret: name it in options_from_env or an options_file, "
                                 "never in the store file itself")
    return options


def _seconds(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise InvalidSetting(f"{where}: a positive number of seconds")
    return float(value)


def parse_stores(text: str, source: str = "the store file") -> WatchConfig:
    """The store file (TOML, docs/operations.md): every mistake is refused with where it is."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidSetting(f"{source}: not TOML ({exc})") from None
    unknown = set(document) - {"interval_seconds", "stores"}
    if unknown:
        raise InvalidSetting(f"{source}: unknown setting(s) {sorted(unknown)}")
    interval = document.get("interval_seconds", DEFAULT_INTERVAL_S)
    if not isinstance(interval, int) or interval < 1:
        raise InvalidSetting(f"{source}: interval_seconds must be a whole number of at least 1")
    stores = []
    if not isinstance(document.get("stores", {}), dict):
        raise InvalidSetting(f"{source}: stores is a table per store ([stores.NAME])")
    for name, body in (document.get("stores") or {}).items():
        where = f"{source}: stores.{name}"
        if not isinstance(body, dict) or not isinstance(body.get("regions", {}), dict):
            raise InvalidSetting(f"{where}: a table of settings with a table per region ([stores.{name}.regions.REGION])")
        if not STORE_NAME.fullmatch(name):
            raise InvalidSetting(f"{where}: a store's name is letters, digits, '_' and '-'")
        known = {"topic_pattern", "isolation_level", "max_offsets_per_partition", "warn_after_skipped_cuts",
                 "broker_timeout_seconds", "options", "regions", "audit_scope"}
        if set(body) - known:
            raise InvalidSetting(f"{where}: unknown setting(s) {sorted(set(body) - known)}")
        pattern = body.get("topic_pattern", re.escape(name) + r"_v[0-9]+")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise InvalidSetting(f"{where}.topic_pattern: not a regular expression ({exc})") from None
        isolation = body.get("isolation_level", "read_committed")
        if isolation not in ISOLATION_LEVELS:
            raise InvalidSetting(f"{where}.isolation_level: one of {ISOLATION_LEVELS}")
        bound = body.get("max_offsets_per_partition")
        if bound is not None and (not isinstance(bound, int) or bound < 1):
            raise InvalidSetting(f"{where}.max_offsets_per_partition: a whole number of at least 1")
        warn = body.get("warn_after_skipped_cuts", DEFAULT_WARN_AFTER_SKIPPED_CUTS)
        if not isinstance(warn, int) or warn < 1:
            raise InvalidSetting(f"{where}.warn_after_skipped_cuts: a whole number of at least 1")
        timeout = _seconds(body.get("broker_timeout_seconds", 30), f"{where}.broker_timeout_seconds")
        scope = body.get("audit_scope", ALL)
        if scope not in AUDIT_SCOPES:
            raise InvalidSetting(f"{where}.audit_scope: one of {', '.join(AUDIT_SCOPES)}")
        regions = []
        for region, settings in (body.get("regions") or {}).items():
            rwhere = f"{where}.regions.{region}"
            if not isinstance(settings, dict):
                raise InvalidSetting(f"{rwhere}: a table of settings")
            extra = set(settings) - {"bootstrap_servers", "options", "options_file", "options_from_env",
                                     "broker_timeout_seconds"}
            if extra:
                raise InvalidSetting(f"{rwhere}: unknown setting(s) {sorted(extra)}")
            servers = settings.get("bootstrap_servers")
            if not isinstance(servers, str) or not servers.strip():
                raise InvalidSetting(f"{rwhere}: bootstrap_servers = \"HOST:PORT[,HOST:PORT...]\" is required")
            regions.append(RegionConfig(
                region, servers.strip(), _plain_options(settings.get("options", {}), f"{rwhere}.options"),
                settings.get("options_file"), _strings(settings.get("options_from_env", {}), f"{rwhere}.options_from_env"),
                None if "broker_timeout_seconds" not in settings
                else _seconds(settings["broker_timeout_seconds"], f"{rwhere}.broker_timeout_seconds"),
            ))
        if not regions:
            raise InvalidSetting(f"{where}: name at least one region ([stores.{name}.regions.REGION])")
        stores.append(StoreConfig(name, tuple(regions), pattern, isolation, bound, warn, float(timeout),
                                  _plain_options(body.get("options", {}), f"{where}.options"), scope))
    if not stores:
        raise InvalidSetting(f"{source}: no store to watch ([stores.NAME])")
    return WatchConfig(tuple(stores), interval)


def load_stores(path: str) -> WatchConfig:
    try:
        text = open(os.path.expanduser(path), encoding="utf-8").read()
    except OSError as exc:
        raise InvalidSetting(f"--stores: cannot read {path!r} ({exc.strerror})") from None
    return parse_stores(text, path)


# --------------------------------------------------------------------------- the cursor


@dataclass
class Cursor:
    """Where a store's chain stands: the last published snapshot, its sequence, per partition the last published
    ``e`` (with the log start and cleanup policy last seen), the cuts in a row that skipped each region, and the
    snapshot being landed or audited (``pending``)."""

    store: str
    sequence: int = 0
    published: Optional[str] = None
    pending: Optional[str] = None
    partitions: dict[tuple[str, str, int], dict] = field(default_factory=dict)  # -> {end, log_start, cleanup_policy}
    skipped_cuts: dict[str, int] = field(default_factory=dict)

    def ends(self) -> dict[tuple[str, str, int], int]:
        return {key: p["end"] for key, p in self.partitions.items()}

    def as_document(self) -> dict:
        return {
            "store": self.store, "sequence": self.sequence, "published": self.published, "pending": self.pending,
            "skipped_cuts": dict(sorted(self.skipped_cuts.items())),
            "partitions": [{"region": r, "topic": t, "partition": p, **v}
                           for (r, t, p), v in sorted(self.partitions.items())],
        }

    @classmethod
    def from_document(cls, document: dict) -> "Cursor":
        return cls(
            store=document["store"], sequence=int(document["sequence"]), published=document.get("published"),
            pending=document.get("pending"), skipped_cuts={k: int(v) for k, v in document.get("skipped_cuts", {}).items()},
            partitions={(p["region"], p["topic"], int(p["partition"])):
                        {"end": int(p["end"]), "log_start": int(p["log_start"]), "cleanup_policy": p["cleanup_policy"]}
                        for p in document.get("partitions", [])},
        )


def cursor_location(landing: str, store: str) -> Location:
    return Location.of(landing).child(WATCH_FOLDER).child(f"{store}.json")


def read_cursor(landing: str, store: str) -> Cursor:
    location = cursor_location(landing, store)
    if not location.is_file():
        return Cursor(store)
    return Cursor.from_document(json.loads(location.read_text()))


def write_cursor(landing: str, cursor: Cursor) -> None:
    """Replace the store's cursor whole (a temporary file renamed over it): a kill leaves the old or the new one."""
    location = cursor_location(landing, cursor.store)
    location.fs.create_dir(os.path.dirname(location.path), recursive=True)
    partial = Location.of(landing).child(WATCH_FOLDER).child(f".{cursor.store}.json.partial")
    partial.write_text(json.dumps(cursor.as_document(), indent=1) + "\n")
    location.fs.move(partial.path, location.path)


# --------------------------------------------------------------------------- one tick of one store


@dataclass
class TickResult:
    """What one tick did for one store (printed by ``replica-lens watch``, metadata of the ``watch_brokers`` run)."""

    store: str
    snapshot_id: Optional[str] = None  # the snapshot landed (or resumed) and audited
    action: str = "none"  # "none" (nothing moved), "audited", "resumed", "audit_failed", "no_region"
    regions: dict[str, dict] = field(default_factory=dict)  # region -> {topics, partitions, records, skipped}
    cut_at: Optional[str] = None
    seconds_cut_to_audited: Optional[float] = None
    error: Optional[str] = None
    divergent_keys: Optional[int] = None
    failed_checks: list[str] = field(default_factory=list)  # "asset:check" of the audit's checks that did not pass

    @property
    def failed(self) -> bool:
        return self.action in ("audit_failed", "error")


AuditFn = Callable[[str, str], "object"]  # (snapshot id, scope) -> an object with .success, .error, .proven_divergent


def _skip_rows(cursor: Cursor, region: str, reason: str) -> list[PartitionCut]:
    """A skipped region's known partitions as rows of the cut: ``s = e`` = their last published end."""
    return [
        PartitionCut(r, t, p, v["end"], v["end"], v["log_start"], v["cleanup_policy"], broker_end=v["end"], skipped=reason)
        for (r, t, p), v in sorted(cursor.partitions.items()) if r == region
    ]


def take_store_cut(spark, store: StoreConfig, request: DumpRequest, cursor: Cursor
                   ) -> tuple[dict[str, list[PartitionCut]], dict[str, str]]:
    """Every region's cut of the store's version topics, and the regions that did not answer (with why)."""
    cuts: dict[str, list[PartitionCut]] = {}
    skipped: dict[str, str] = {}
    previous = cursor.ends()
    for region in request.regions:
        try:
            topics = list_topics(spark, request, region, store.topic_pattern)
            cuts[region] = take_cut(spark, request, region, previous, tuple(topics))
        except (BrokerUnavailable, UsageError) as exc:
            skipped[region] = request.redact(str(exc))
            cuts[region] = _skip_rows(cursor, region, skipped[region])
    return cuts, skipped


def _moved(cuts: dict[str, list[PartitionCut]]) -> bool:
    """Whether the cut reads anything new: a partition of a region read whose ``e`` passed its ``s`` (a new topic's
    ``s`` is its log start; a new empty one waits until it holds a record)."""
    return any(p.skipped is None and p.end > p.start for cut in cuts.values() for p in cut)


def _publish(cursor: Cursor, document: dict) -> None:
    """Advance the cursor to a snapshot whose audit succeeded: its ends (a skipped region keeps its own)."""
    read_regions = set(document["regions"]) - set(document.get("skipped_regions", {}))
    for region in read_regions:  # partitions of read regions that are gone belong to deleted (retired) topics
        for key in [k for k in cursor.partitions if k[0] == region]:
            del cursor.partitions[key]
    for p in document["partitions"]:
        if p.get("skipped") is None:
            cursor.partitions[(p["region"], p["topic"], int(p["partition"]))] = {
                "end": int(p["end"]), "log_start": int(p["log_start"]), "cleanup_policy": p["cleanup_policy"]}
    for region in document["regions"]:
        skips = document.get("skipped_regions", {})
        cursor.skipped_cuts[region] = int(skips[region]["skipped_cuts"]) if region in skips else 0
    cursor.published = document["snapshot_id"]
    cursor.sequence = int(document["watch"]["sequence"])
    cursor.pending = None


def _region_lines(document: dict) -> dict[str, dict]:
    regions: dict[str, dict] = {}
    for region in document["regions"]:
        parts = [p for p in document["partitions"] if p["region"] == region]
        skip = document.get("skipped_regions", {}).get(region)
        regions[region] = {
            "topics": sorted({p["topic"] for p in parts}),
            "partitions": len(parts),
            "records": sum(int(p["delivered"] or 0) for p in parts),
            "offsets": sum(int(p["end"]) - int(p["start"]) for p in parts),
            "backlog": sum(max(0, int(p.get("broker_end", p["end"])) - int(p["end"])) for p in parts),
            "skipped": skip["reason"] if skip else None,
            "skipped_cuts": skip["skipped_cuts"] if skip else 0,
        }
    return regions


def _audit_pending(landing: str, cursor: Cursor, audit: AuditFn, result: TickResult, scope: str) -> bool:
    """Audit the cursor's pending snapshot; publish it when the audit succeeds. True when published."""
    folder = Location.of(landing).child(cursor.pending)
    document = json.loads(folder.child(CUT_FILE).read_text())
    result.snapshot_id = cursor.pending
    result.cut_at = document["cut_at"]
    result.regions = _region_lines(document)
    outcome = audit(cursor.pending, scope)
    result.failed_checks = list(outcome.failed_checks)
    if not outcome.success:
        result.action = "audit_failed"
        result.error = outcome.error or "the audit failed"
        return False
    result.divergent_keys = outcome.proven_divergent
    taken = dt.datetime.fromisoformat(document["cut_at"])
    result.seconds_cut_to_audited = round((dt.datetime.now(dt.timezone.utc) - taken).total_seconds(), 3)
    _publish(cursor, document)
    write_cursor(landing, cursor)
    return True


def watch_store(spark, store: StoreConfig, landing: str, audit: AuditFn, *,
                register: Optional[Callable[[str], None]] = None) -> TickResult:
    """One tick of one store (the module's docstring): resume a pending snapshot, else cut, land and audit.

    ``register(snapshot_id)`` runs before the snapshot's ``_SUCCESS`` exists (the Dagster partition is added first,
    so that the landing sensor never takes a watched snapshot for one of its own)."""
    cursor = read_cursor(landing, store.name)
    result = TickResult(store.name)
    if cursor.pending is not None:
        folder = Location.of(landing).child(cursor.pending)
        if folder.child(SUCCESS_MARKER).is_file():
            published = _audit_pending(landing, cursor, audit, result, store.audit_scope)
            if published:
                result.action = "resumed"
            return result
        if folder.is_dir():  # landing stopped half-way: nothing of it was published; the cut is taken again
            folder.delete_tree()
        cursor.pending = None
        write_cursor(landing, cursor)
    request = store.request()
    taken_at = dt.datetime.now(dt.timezone.utc)
    cuts, skipped = take_store_cut(spark, store, request, cursor)
    skipped_regions = {region: {"reason": reason, "skipped_cuts": cursor.skipped_cuts.get(region, 0) + 1}
                       for region, reason in skipped.items()}
    if len(skipped) == len(request.regions):
        result.action = "no_region"
        result.regions = {region: {"topics": [], "partitions": len(cuts[region]), "records": 0, "offsets": 0,
                                   "backlog": 0, "skipped": reason,
                                   "skipped_cuts": skipped_regions[region]["skipped_cuts"]}
                          for region, reason in skipped.items()}
        for region, entry in skipped_regions.items():
            cursor.skipped_cuts[region] = entry["skipped_cuts"]
        write_cursor(landing, cursor)
        return result
    if not _moved(cuts):
        result.regions = {region: {"topics": sorted({p.topic for p in cut}), "partitions": len(cut), "records": 0,
                                   "offsets": 0, "backlog": 0, "skipped": skipped.get(region),
                                   "skipped_cuts": skipped_regions.get(region, {}).get("skipped_cuts", 0)}
                          for region, cut in cuts.items()}
        for region in request.regions:
            cursor.skipped_cuts[region] = skipped_regions.get(region, {}).get("skipped_cuts", 0)
        write_cursor(landing, cursor)
        return result
    sequence = cursor.sequence + 1
    snapshot_id = f"{store.name}-{sequence:06d}"
    cursor.pending = snapshot_id
    write_cursor(landing, cursor)  # before anything is written: a kill from here on is resumed, never forgotten
    if register is not None:
        register(snapshot_id)
    extra = {"watch": {"store": store.name, "sequence": sequence,
                       "warn_after_skipped_cuts": store.warn_after_skipped_cuts}}
    try:
        land_cut(spark, request, cuts, landing, snapshot_id, taken_at, continues=cursor.published,
                 skipped=skipped_regions, extra=extra, overwrite=True, whole_values=True)
    except Exception as exc:  # noqa: BLE001 - the folder is gone (land_snapshot); the next tick cuts again
        cursor.pending = None
        write_cursor(landing, cursor)
        result.action = "error"
        result.error = request.redact(f"landing {snapshot_id} failed: {type(exc).__name__}: {exc}")
        return result
    if _audit_pending(landing, cursor, audit, result, store.audit_scope):
        result.action = "audited"
    return result


def tick_lines(result: TickResult) -> list[str]:
    """What one store's tick read, per region, for a terminal."""
    head = {
        "none": "nothing new to read",
        "no_region": "no region answered: nothing read",
        "audited": f"snapshot {result.snapshot_id} landed and audited",
        "resumed": f"snapshot {result.snapshot_id} (landed before) audited",
        "audit_failed": f"snapshot {result.snapshot_id}: the audit failed, retried next tick",
        "error": "the cut could not be landed, taken again next tick",
    }[result.action]
    if result.divergent_keys is not None:
        head += f"; keys proven DIVERGENT or MISSING: {result.divergent_keys}"
    if result.seconds_cut_to_audited is not None:
        head += f"; {result.seconds_cut_to_audited:.1f} s from the cut to the audit's end"
    lines = [f"store {result.store}: {head}"]
    for region, r in sorted(result.regions.items()):
        if r.get("skipped"):
            lines.append(f"  {region}: skipped ({r['skipped_cuts']} cut(s) in a row): {r['skipped']}")
        else:
            backlog = f", {r['backlog']:,} offsets left for the next cut" if r.get("backlog") else ""
            lines.append(f"  {region}: {r['records']:,} records over {r['offsets']:,} offsets of {r['partitions']} "
                         f"partitions ({', '.join(r['topics']) or 'no version topic'}){backlog}")
    if result.error:
        lines.append(f"  error: {result.error}")
    return lines


def watch_once(spark, config: WatchConfig, landing: str, audit: AuditFn,
               register: Optional[Callable[[str], None]] = None) -> list[TickResult]:
    """One tick of every store, one store after another."""
    return [watch_store(spark, store, landing, audit, register=register) for store in config.stores]


def watch_forever(spark, config: WatchConfig, landing: str, audit: AuditFn, report: Callable[[TickResult], None],
                  interval_s: Optional[int] = None, ticks: Optional[int] = None,
                  register: Optional[Callable[[str], None]] = None) -> None:
    """A tick of every store every ``interval_s`` seconds (from the start of one tick to the next), ``ticks`` times
    (None: until interrupted)."""
    interval = interval_s or config.interval_s
    done = 0
    while ticks is None or done < ticks:
        started = time.monotonic()
        for result in watch_once(spark, config, landing, audit, register):
            report(result)
        done += 1
        if ticks is None or done < ticks:
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
