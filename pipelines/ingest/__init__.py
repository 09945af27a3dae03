"""Ingestion of one complete snapshot folder: accepted rows, quarantined rows, and their accounting.

Three steps, read -> judge -> account, one module each:

- ``pipelines/ingest/reading.py`` reads the folder: it lists the files (``list_snapshot_files``:
  ``*.jsonl``, ``*.jsonl.gz``, ``*.parquet``) and turns every one into text lines
  ``(source_file, raw, read_error, decoded_reason)`` (``read_snapshot_lines``): a JSONL line as
  it is, a Parquet row as a JSON object, raw Venice records decoded by
  ``pipelines/venice/frame.py``, one row per unreadable file (or unreadable tail). The JSONL
  line rules (what ends a line, what is blank) and where each part of the work runs are told
  there. ``read_skipped_positions`` reads the positions of the raw Venice records skipped by
  rule, for ``raw_topic_skipped``.
- ``pipelines/ingest/judging.py`` judges the lines against SPEC 1, one validation path for every
  format (``judge_rows`` -> ``Judgement``; ``validate_rows``): the accepted rows, the
  quarantined rows with their reasons, and the records skipped by rule, counted.
- ``pipelines/ingest/accounting.py`` counts the result from the stored tables
  (``accounting_from_tables``): rows_read = rows_accepted + rows_quarantined + rows_skipped.

This module re-exports what other code imports from ``pipelines.ingest``; the product code
imports from the three modules. A test that patches a module's constant (``LINE_BUCKETS``)
patches the module that uses it (``pipelines.ingest.judging``), not this one.
"""
from pipelines.ingest.accounting import UNKNOWN_REPLICA, accounting_from_tables, skipped_kind
from pipelines.ingest.judging import (
    QUARANTINE_POSITION,
    RAW_POSITION,
    LINE_BUCKETS,
    Judgement,
    bitmap_buckets,
    judge_rows,
    validate_rows,
)
from pipelines.ingest.reading import (
    BYTES_PER_ROW,
    FORMATS,
    LINES_SCHEMA,
    VENICE_COLUMNS,
    SnapshotFile,
    SnapshotFiles,
    VeniceSettings,
    is_venice_schema,
    list_snapshot_files,
    read_skipped_positions,
    read_snapshot_lines,
    venice_cluster_ids,
)

__all__ = [
    "BYTES_PER_ROW",
    "FORMATS",
    "LINES_SCHEMA",
    "LINE_BUCKETS",
    "QUARANTINE_POSITION",
    "RAW_POSITION",
    "UNKNOWN_REPLICA",
    "VENICE_COLUMNS",
    "Judgement",
    "SnapshotFile",
    "SnapshotFiles",
    "VeniceSettings",
    "accounting_from_tables",
    "bitmap_buckets",
    "is_venice_schema",
    "judge_rows",
    "list_snapshot_files",
    "read_skipped_positions",
    "read_snapshot_lines",
    "skipped_kind",
    "validate_rows",
    "venice_cluster_ids",
]
