"""Seeded simulator of an active/active replicated store, behind ``replica-lens simulate``.

It writes a raw topic snapshot (SPEC section 1 rows, or with ``--format venice-kafka`` the same
history as raw Venice records: ``_VeniceSink``, docs/venice-input.md) plus a ground-truth file
listing every injected fault and stream anomaly at the exact position where an audit must find it.

Model (SPEC sections 1, 3-7):

- ``regions`` regions each own a real-time topic (RT) per (topic, partition). A region's
  client writes go to its RT with increasing offsets (``source_offset``) and a hybrid logical
  clock ``write_ts = physical_ms << 18 | logical``. Every ``heartbeat_every`` of its own writes,
  and once at the end, the region's leader puts a heartbeat into its RT.
- Every region's leader consumes every RT. A message reaches a leader after a replication
  delay (small for its own RT); the leader applies messages in arrival order, which keeps each
  RT's order but interleaves the RTs differently in every region. Data messages are resolved
  last-writer-wins on ``(write_ts, source_region)``: a loser is not written to the version topic
  (VT), but the applied watermark still advances. A heartbeat from region X becomes a HEARTBEAT
  row in the VT carrying the leader's whole applied watermark as ``hb_vector`` (with
  ``heartbeat_vector="own"``, as Venice's heartbeats: only X's own component, no ``hb_vector``).
- Healthy replicas therefore end in the same state whatever their interleaving; every
  difference comes from an injected fault and is listed in the ground truth.

Only per-RT cursors, the in-flight messages of each leader and per-key conflict metadata are
held in memory; rows stream to files in chunks, so tens of millions of rows are fine.

The package, by concern:

- ``config``: ``SimulationConfig`` (every knob, one ``--flag`` each), region and topic names,
  the model's constants;
- ``sinks``: the files of SPEC rows (JSON lines, gzip, Parquet);
- ``venice``: raw Venice records (``--format venice-kafka``) and the helpers naming their keys,
  values, regions and push settings;
- ``damage``: compaction and lost records of a damaged dump, and the complete topic's proofs;
- ``plan``: what is decided before the messages flow, and the results;
- ``leader``: one region's leader of one partition, with the faults and anomalies it injects;
- ``partition``: one (topic, partition): the RTs and their leaders;
- here: ``simulate`` (the files, the ground truth, the ``_SUCCESS`` marker) and the command line.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Optional

# simulate and the command line need only some of these names; the others keep importable from
# here every name that was when the simulator was one module.
from replica_lens.simulator.config import (
    BASE_MS,
    DELETE,
    FAILOVER,
    FILE_FORMATS,
    HEARTBEAT,
    HEARTBEAT_VECTORS,
    LOGICAL_BITS,
    PUT,
    VENICE_COMPRESSIONS,
    SimulationConfig,
    region_names,
    topic_names,
)
from replica_lens.simulator.partition import _PartitionSim
from replica_lens.simulator.plan import _Plan
from replica_lens.simulator.sinks import parquet_schema
from replica_lens.simulator.venice import (
    VENICE_VALUE_SCHEMA_ID,
    kafka_source_schema,
    venice_cluster_regions,
    venice_key,
    venice_push_settings,
    venice_value,
    venice_value_bytes,
)
from resources.errors import UsageError
from pipelines.venice.push_settings import push_settings_document
from resources.snapshots import SUCCESS_MARKER, check_snapshot_id

__all__ = [
    "SimulationConfig",
    "SnapshotExistsError",
    "add_arguments",
    "config_from_args",
    "region_names",
    "simulate",
    "topic_names",
]


class SnapshotExistsError(UsageError, FileExistsError):
    """The snapshot folder is already there (pass overwrite=True to replace it)."""


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.inprogress")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def simulate(
    out_dir: str | Path,
    snapshot_id: str,
    config: SimulationConfig,
    *,
    overwrite: bool = False,
    progress: Optional[Callable[[int, int, int], None]] = None,
) -> dict:
    """Write ``<out_dir>/<snapshot_id>/`` (data files, then ``_SUCCESS``) and
    ``<out_dir>/<snapshot_id>.ground_truth.json``; return a summary of what was written.

    ``progress(done, total, rows)`` is called after each topic partition is written, with
    the partitions done, their total and the rows written so far."""
    check_snapshot_id(snapshot_id)
    if not isinstance(config, SimulationConfig):
        raise TypeError("config must be a SimulationConfig")
    config.__post_init__()  # fields may have been changed after construction
    out = Path(out_dir)
    folder = out / snapshot_id
    truth_path = out / f"{snapshot_id}.ground_truth.json"
    if folder.exists() or truth_path.exists():
        if not overwrite:
            raise SnapshotExistsError(f"snapshot {snapshot_id!r} already exists in {out}; refusing to overwrite it")
        # The marker goes first so that no reader takes the folder for complete while it is replaced.
        if (folder / SUCCESS_MARKER).exists():
            (folder / SUCCESS_MARKER).unlink()
        if folder.exists():
            shutil.rmtree(folder)
        if truth_path.exists():
            truth_path.unlink()
        (out / f"{snapshot_id}.venice_push_settings.json").unlink(missing_ok=True)
    folder.mkdir(parents=True)

    plan = _Plan(config)
    total = config.topics * config.partitions
    for ti in range(config.topics):
        for p in range(config.partitions):
            _PartitionSim(plan, ti, p, folder).run()
            if progress is not None:
                progress(ti * config.partitions + p + 1, total, sum(sum(k.values()) for k in plan.rows.values()))

    truth = {
        "snapshot_id": snapshot_id,
        "config": config.as_dict(),
        "regions": plan.regions,
        "topics": plan.topics,
        "partitions": config.partitions,
        "exporters": plan.exporters,
        "injected_faults": plan.faults,
        "anomalies": plan.anomalies,
        # Keys whose last values differ between replicas: what a diff of the final states finds. A lost write or
        # corrupted value overwritten later differs only for a while; Leap Frog proves those too (as DIVERGENT, once
        # heartbeats cover them), so an audit reports these keys and the faults below that were overwritten.
        "keys_differing_at_end": sorted(plan.divergent, key=lambda d: (d["topic"], d["partition"], d["key"])),
        "conflicting_writes": plan.conflict_entries,
        "lagging": plan.lagging,
        "bounds": {
            "natural_max_heartbeat_gap_ms": plan.natural_max_gap_ms,
            "natural_clock_interval_width_ms": 2 * config.clock_uncertainty_ms,
        },
        "warnings": plan.warnings,
    }
    if config.damaged:
        truth["damage"] = {
            "compact_below": config.compact_below,
            "lose_records": config.lose_records,
            "compacted": sum(d["compacted"] for d in plan.damage),
            "lost": sum(d["lost"] for d in plan.damage),
            "partitions": plan.damage,
            # Every key the complete topic proves DIVERGENT or MISSING: a damaged dump may prove
            # fewer (SPEC section 3a), never others.
            "complete_topic_proofs": plan.complete_topic_proofs,
        }
    if config.file_format == "venice-kafka":
        # What an audit of these records needs (replica-lens audit --cluster-regions ... --venice-clock-uncertainty-ms ...).
        push = plan.venice_push or venice_push_settings(config)
        settings_path = out / f"{snapshot_id}.venice_push_settings.json"
        _atomic_write_text(settings_path, json.dumps(push_settings_document({t: push for t in plan.topics}), indent=1) + "\n")
        truth["venice"] = {
            "cluster_regions": venice_cluster_regions(plan.regions),
            "clock_uncertainty_ms": config.clock_uncertainty_ms,
            # Every START_OF_PUSH declares these; the file names them for an audit of a dump without one.
            "push_settings": push.describe(),
            "push_settings_file": settings_path.name,  # beside this file
            # Records that hold no row, per replica and kind: the audit's skipped counts.
            "records_without_rows": {r: dict(sorted(c.items())) for r, c in sorted(plan.venice_records.items())},
        }
    _atomic_write_text(truth_path, json.dumps(truth, indent=1) + "\n")
    _atomic_write_text(folder / SUCCESS_MARKER, "")

    rows_total = sum(sum(kinds.values()) for kinds in plan.rows.values())
    return {
        "snapshot_dir": str(folder),
        "ground_truth": str(truth_path),
        "files": len(plan.files),
        "rows_total": rows_total,
        "rows": {replica: dict(kinds) for replica, kinds in plan.rows.items()},
        "upstream_messages": plan.upstream_messages,
        "injected_faults": len(plan.faults),
        "anomalies": len(plan.anomalies),
        "keys_differing_at_end": len(plan.divergent),
        "faults_overwritten_later": sum(f.get("final_state_differs") is False for f in plan.faults),
        "warnings": plan.warnings,
        **({"damage": {"compacted": truth["damage"]["compacted"], "lost": truth["damage"]["lost"],
                       "complete_topic_proofs": len(plan.complete_topic_proofs)}} if config.damaged else {}),
        **({"audit_with": f"--cluster-regions {truth['venice']['cluster_regions']} --venice-clock-uncertainty-ms "
                          f"{config.clock_uncertainty_ms}"
                          + (f" --venice-push-settings {settings_path}" if config.mid_stream_from
                             else "")} if "venice" in truth else {}),
    }


# --------------------------------------------------------------------------- command line


def _flag(f: dataclasses.Field) -> str:
    return f.metadata.get("flag", "--" + f.name.replace("_", "-"))


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add one ``--flag`` per SimulationConfig field (defaults are the dataclass defaults)."""
    group = parser.add_argument_group("simulation")
    for f in dataclasses.fields(SimulationConfig):
        kind = f.metadata.get("type") or type(f.default)
        kwargs: dict[str, Any] = {"dest": f.name, "type": kind, "default": f.default,
                                  "help": f"{f.metadata['help']} (default: {f.default})".replace("%", "%%")}
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        if kind is bool:
            del kwargs["type"]
            kwargs["action"] = argparse.BooleanOptionalAction
        group.add_argument(_flag(f), **kwargs)
    return parser


def config_from_args(ns: argparse.Namespace) -> SimulationConfig:
    """The SimulationConfig of parsed arguments (fields missing from ``ns`` keep their defaults)."""
    values = {f.name: getattr(ns, f.name) for f in dataclasses.fields(SimulationConfig) if hasattr(ns, f.name)}
    return SimulationConfig(**values)
