"""``replica-lens``: simulate snapshots and audit them from a shell (SPEC section 9)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Optional, Sequence

from replica_lens.cli_args import (
    EXIT_DIVERGENCE, EXIT_INTERNAL, EXIT_RUN_FAILED, EXIT_USAGE, add_audit_settings, at_least_one, state_retention,
)
from replica_lens.cli_brokers import add_broker_commands
from replica_lens.scopes import ALL, AUDIT_SCOPES
from resources.tuning import DEFAULT_CONCURRENT_STEPS, DEFAULT_RETENTION_HOURS, DEFAULT_SHUFFLE_PARTITIONS


def _simulate(args: argparse.Namespace) -> int:
    from replica_lens.simulator import config_from_args, simulate

    snapshot_id = args.snapshot_id or f"sim-{args.seed}"
    summary = simulate(args.out, snapshot_id, config_from_args(args), progress=_Progress("simulated"))
    print(f"snapshot {snapshot_id} written to {Path(args.out) / snapshot_id}")
    for line in _summary_lines(summary):
        print(f"  {line}")
    return 0


class _Progress:
    """Progress lines on stderr, at most one every ``every`` seconds, and always the last one."""

    def __init__(self, what: str, every: float = 2.0) -> None:
        self.what, self.every = what, every
        self.started = self.shown = time.monotonic()

    def __call__(self, done: int, total: int, rows: int) -> None:
        now = time.monotonic()
        if done < total and now - self.shown < self.every:
            return
        self.shown = now
        print(
            f"{self.what} topic partition {done}/{total}: {rows:,} rows ({now - self.started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )


def _summary_lines(summary: dict) -> list[str]:
    lines = []
    for key, value in summary.items():
        if isinstance(value, dict):
            inner = ", ".join(f"{k}={v}" for k, v in value.items())
            lines.append(f"{key}: {inner}")
        else:
            lines.append(f"{key}: {value}")
    return lines


def _audit(args: argparse.Namespace) -> int:
    # The JVM starts while Dagster and the definitions are imported (seconds each); the run's
    # Spark resource then gets this same session (same settings, see resources/session.py).
    from resources.session import start_in_background

    if args.redact_values is not None:  # the run's report settings read it (resources/redaction.py)
        from resources.redaction import REDACT_ENV

        os.environ[REDACT_ENV] = "1" if args.redact_values else "0"
    from resources.settings import delta_settings

    delta = delta_settings(args.delta_jars, args.delta_engine)
    start_in_background(master=args.spark_master, shuffle_partitions=args.shuffle_partitions, delta_jars_dir=delta.jars_dir)
    from replica_lens.audit import audit_snapshots

    return audit_snapshots(
        landing=args.landing,
        warehouse=args.warehouse,
        snapshot_id=args.snapshot_id,
        spark_master=args.spark_master,
        delta_jars_dir=delta.jars_dir,
        delta_engine=delta.engine,
        shuffle_partitions=args.shuffle_partitions,
        fail_on_divergence=args.fail_on_divergence,
        verbosity="verbose" if args.verbose else "quiet" if args.quiet else "normal",
        json_path=args.json,
        state_retention=args.state_retention,
        concurrent_steps=args.concurrent_steps,
        scope=args.scope,
        cluster_regions=args.cluster_regions,
        venice_clock_uncertainty_ms=args.venice_clock_uncertainty_ms,
        venice_push_settings=args.venice_push_settings,
    )


def _explain(args: argparse.Namespace) -> int:
    # Nothing of Spark or Dagster is imported: the published tables are read with delta-rs.
    from explain.document import redact
    from explain.reading import explain_key, key_of
    from resources.redaction import redacting
    from explain.text import render_text

    doc = explain_key(args.warehouse, args.snapshot_id, args.topic, args.partition, key_of(args.key, args.key_text))
    if redacting(args.redact_values):
        redact(doc)
    if args.html:
        from explain.page import key_page

        _write_text(args.html, key_page(doc))
    if args.png:
        from explain.timeline import png

        _write_bytes(args.png, png(doc, dpi=100))
    if args.json:
        text = json.dumps(doc, indent=1, ensure_ascii=False) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
            return 0
        _write_text(args.json, text)
    print(render_text(doc), end="")
    return 0


def _write_text(path: str, text: str) -> None:
    _write_bytes(path, text.encode("utf-8"))


def _write_bytes(path: str, data: bytes) -> None:
    """Write a file the user named, whole or not at all (a temporary file renamed into place)."""
    target = Path(path)
    partial = target.with_name(f".{target.name}.partial")
    partial.write_bytes(data)
    partial.replace(target)


def _benchmark(args: argparse.Namespace) -> int:
    from replica_lens.benchmark import benchmark, print_report

    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    report = benchmark(
        rows=args.rows,
        variants=tuple(args.variants.split(",")),
        out=args.json,
        workdir=args.workdir,
        shuffle_partitions=args.shuffle_partitions,
        keep=args.keep,
        process_runs=args.process_runs,
        in_process_audits=args.in_process_audits,
    )
    print_report(report)
    print(f"results written to {args.json}")
    return 0 if all(v["success"] for v in report["variants"]) else EXIT_RUN_FAILED


def _vacuum(args: argparse.Namespace) -> int:
    from resources.delta_store import DeltaStore
    from resources.errors import InvalidSetting

    if not Path(args.warehouse).is_dir():
        raise InvalidSetting(f"no warehouse at {args.warehouse}: give the folder that holds the Delta tables")
    results = DeltaStore(warehouse_root=args.warehouse).vacuum(
        retention_hours=args.retention_hours, dry_run=args.dry_run, compact=args.compact
    )
    for line in vacuum_lines(results, args.warehouse, args.retention_hours, args.dry_run):
        print(line)
    return 0


def vacuum_lines(results: Sequence, warehouse: str, retention_hours: int, dry_run: bool) -> list[str]:
    """The per-table summary of a vacuum (``VacuumResult`` rows), as ``replica-lens vacuum`` prints it."""
    removed = "would remove" if dry_run else "removed"
    lines = [f"vacuum of {warehouse} (retention {retention_hours} h{'; dry run: nothing changed' if dry_run else ''})"]
    if not results:
        return lines + ["  no Delta table found"]
    width = max(len(r.table) for r in results)
    lines.append(f"  {'table':<{width}}  {'files':>7}  {'bytes':>13}  compacted")
    for r in results:
        compacted = ", ".join(r.compacted) or "-"
        if r.compacted:
            compacted += f" ({r.files_compacted} small files" + (f" -> {r.files_written})" if not dry_run else ")")
        note = f"  [{r.note}]" if r.note else ""
        lines.append(f"  {r.table:<{width}}  {r.files:>7,}  {r.bytes:>13,}  {compacted}{note}")
    files, size = sum(r.files for r in results), sum(r.bytes for r in results)
    lines.append(f"{removed} {files:,} files, {size:,} bytes in {len(results)} tables")
    return lines


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="replica-lens", description=__doc__)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--verbose",
        action="store_true",
        help="on an unexpected error, print the whole traceback; audit: also Dagster's event log and Spark's warnings",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    sim = commands.add_parser("simulate", parents=[common], help="write a seeded, simulated raw topic snapshot folder")
    sim.add_argument("--out", required=True, help="landing folder to write the snapshot folder into")
    sim.add_argument("--snapshot-id", help="name of the snapshot folder (default: sim-<seed>)")
    from replica_lens.simulator import add_arguments

    add_arguments(sim)
    sim.set_defaults(handler=_simulate)

    audit = commands.add_parser(
        "audit", parents=[common], help="audit every complete snapshot (or the one named) through Dagster"
    )
    audit.add_argument("--landing", required=True, help="landing folder holding snapshot folders")
    audit.add_argument("--warehouse", required=True, help="folder for the Delta tables, one per asset")
    audit.add_argument("--snapshot-id", help="audit only this snapshot")
    add_audit_settings(audit)
    audit.add_argument(
        "--fail-on-divergence",
        action="store_true",
        help=f"exit {EXIT_DIVERGENCE} when any key is proven DIVERGENT or MISSING",
    )
    audit.add_argument(
        "--state-retention",
        type=state_retention,
        metavar="N",
        help="keep the states (replica_state) of the N snapshots ending furthest along each replica partition's log "
        "and drop the older ones after each audit (at least 2; default: keep every state)",
    )
    audit.add_argument(
        "--scope",
        choices=AUDIT_SCOPES,
        default=ALL,
        help="which tables to compute: all (default), or divergence (the ingest, the stream pass and the divergence "
        "step; no replication lag or exporter tables for the snapshot)",
    )
    audit.add_argument(
        "--concurrent-steps",
        type=at_least_one,
        metavar="N",
        help=f"run up to N independent steps of an audit at once, in this process and Spark session "
        f"(default {DEFAULT_CONCURRENT_STEPS}; 1: one after another)",
    )
    audit.add_argument(
        "--redact-values", action=argparse.BooleanOptionalAction, default=None,
        help="keep every value's text out of the report page and the UI's metadata: hashes only "
        "(default: $REPLICA_LENS_REDACT_VALUES, else off)",
    )
    audit.add_argument(
        "--quiet", action="store_true", help="print only each snapshot's summary and errors (no line per step)"
    )
    audit.add_argument(
        "--json",
        metavar="PATH",
        help="also write the summary as one JSON document to PATH ('-': to stdout, everything else to stderr)",
    )
    audit.set_defaults(handler=_audit)

    explain = commands.add_parser(
        "explain", parents=[common],
        help="explain one key of an audited snapshot: every replica's versions and every pair's verdict (reads the "
        "published tables; never audits again)",
    )
    explain.add_argument("--warehouse", required=True, help="folder holding the audited snapshot's Delta tables")
    explain.add_argument("--snapshot-id", required=True, help="the audited snapshot")
    explain.add_argument("--topic", required=True, help="version topic, e.g. store_v1")
    explain.add_argument("--partition", required=True, type=int, help="topic partition")
    which = explain.add_mutually_exclusive_group(required=True)
    which.add_argument("--key", help="the key as the tables hold it (raw Venice records: base64 of the key bytes)")
    which.add_argument(
        "--key-text", metavar="TEXT",
        help="raw Venice records: the key bytes as UTF-8 text, looked up as their base64 (what --key takes)",
    )
    explain.add_argument("--json", metavar="FILE", help="also write the explanation as JSON to FILE ('-': only JSON, to stdout)")
    explain.add_argument("--html", metavar="FILE", help="also write a self-contained page with a timeline picture to FILE")
    explain.add_argument("--png", metavar="FILE", help="also write the timeline picture alone, as PNG, to FILE")
    explain.add_argument(
        "--redact-values", action=argparse.BooleanOptionalAction, default=None,
        help="keep every value's text out of the output: hashes only (default: $REPLICA_LENS_REDACT_VALUES, else off)",
    )
    explain.set_defaults(handler=_explain)

    add_broker_commands(commands, common)

    bench = commands.add_parser(
        "benchmark",
        parents=[common],
        help="time the audit as a process against the essential pass, and per asset step against the floors",
    )
    bench.add_argument("--rows", type=int, default=2_000_000, help="version-topic rows to simulate per variant (not tiny)")
    bench.add_argument(
        "--variants",
        default="uniform,hot",
        help="comma-separated: uniform, hot (1%% of keys, half the writes), tiny (~1,500 rows whatever --rows: the fixed cost), "
        "large (uniform with ten times --rows; with uniform in the same run, the report compares it with ten uniform audits), "
        "dirty (uniform with four bad lines in every file: the quarantine's pass)",
    )
    bench.add_argument(
        "--process-runs",
        type=int,
        default=1,
        help="whole-process runs of the essential pass and of `replica-lens audit` per variant, alternating; "
        "the medians are reported (0: skip them, floors and per-step figures only)",
    )
    bench.add_argument(
        "--in-process-audits",
        type=int,
        default=1,
        help="audits of each variant in the benchmark's own JVM, one after another: the first gives the per-step "
        "figures, later ones show what the same audit costs in a JVM that has run it before (its code compiled)",
    )
    bench.add_argument("--json", default="bench-results/benchmark.json", help="where to write the results")
    bench.add_argument("--workdir", help="folder for the simulated snapshots and tables (default: a temporary one)")
    bench.add_argument("--shuffle-partitions", type=int, default=DEFAULT_SHUFFLE_PARTITIONS, help="spark.sql.shuffle.partitions (upper bound; adaptive execution merges small partitions)")
    bench.add_argument("--keep", action="store_true", help="keep the simulated snapshots and tables")
    bench.set_defaults(handler=_benchmark)

    vacuum = commands.add_parser(
        "vacuum",
        parents=[common],
        help="remove the files no Delta version needs (superseded, or of crashed writes) from every table",
    )
    vacuum.add_argument("--warehouse", required=True, help="folder holding the Delta tables, one per asset")
    vacuum.add_argument(
        "--retention-hours",
        type=int,
        default=DEFAULT_RETENTION_HOURS,
        help="remove only files older than this; versions older than it can no longer be read "
        "(keep it above the longest audit run; default: %(default)s, 7 days)",
    )
    vacuum.add_argument("--dry-run", action="store_true", help="report what would be removed; change nothing")
    vacuum.add_argument(
        "--compact", action="store_true", help="first compact the snapshots that hold several small files"
    )
    vacuum.set_defaults(handler=_vacuum)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run one command; its exit code (tests and scripts call this in their own process)."""
    return _dispatch(build_parser().parse_args(argv))


def run(argv: Optional[Sequence[str]] = None) -> None:
    """The ``replica-lens`` command (and ``python -m replica_lens.cli``): ``main``, then exit.

    After an audit the process ends without tearing the interpreter down. Its work is done by
    then: tables committed, files written and closed, the Dagster instance disposed of. The exit
    handlers still run (PySpark's stops the JVM); what is skipped is Python clearing every module
    and object of Dagster and PySpark one by one: 0.6 s of a 16 s audit of a small snapshot, for
    nothing (docs/performance.md).
    """
    args = build_parser().parse_args(argv)
    code = _dispatch(args)
    if args.handler is _audit:
        _end_at_once(code)
    sys.exit(code)


def _end_at_once(code: int) -> None:
    """Flush the output, run the exit handlers, and end the process with ``code`` without the interpreter's teardown."""
    import atexit

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said on it
            pass
    atexit._run_exitfuncs()  # noqa: SLF001 - what a normal exit runs first; the teardown after it is skipped
    os._exit(code)


def _dispatch(args: argparse.Namespace) -> int:
    from resources.errors import UsageError

    if not args.verbose:
        # Dagster flags the partitioned asset checks this code location uses as a preview
        # feature on every load: a notice for developers, not for the operator.
        import warnings

        warnings.filterwarnings("ignore", message=".*is currently in preview.*")
    try:
        return args.handler(args)
    except UsageError as error:  # bad ids, settings, missing snapshots: what to change, no traceback
        print(f"replica-lens: {error}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as error:  # noqa: BLE001 - anything else is a bug: say so in one line
        if args.verbose:
            traceback.print_exc()
        first_line = (str(error).strip().splitlines() or [""])[0]
        print(
            f"replica-lens: internal error ({type(error).__name__}: {first_line}); this is a bug, not a problem "
            "with your input: re-run with --verbose for the traceback and report it",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":
    run()
