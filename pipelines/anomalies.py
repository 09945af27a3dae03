"""Stream anomalies of the version topics (SPEC section 5), computed from the raw rows.

Each anomaly is found in one (snapshot, replica, topic, partition) stream ordered by offset
(compared per source region, component or key where the rule compares like with like), by
the same pass per stream that computes the segments and watermarks
(``pipelines/stream_pass.py``, ``_stream_anomalies``): no ordering of its own. Every
output row names the offending row, the value it had (``observed``), the bound it broke
(``expected``) and the row that set that bound (``reference_offset``).

Decisions the SPEC leaves open:

- HEARTBEAT_REGRESSION: one row per regressed component, so that ``observed`` and
  ``expected`` are plain offsets; ``source_region`` names the component. A heartbeat
  is compared with the componentwise max of *all* earlier heartbeats of the partition,
  not just the previous one. A heartbeat without ``hb_vector`` takes part with its one
  component ``{source_region: source_offset}`` (as in SPEC section 3). A component an
  earlier vector had and a later one lacks is not reported: a vector that names fewer
  regions claims nothing about the others, and vectorless heartbeats are valid.
- DATA_BEYOND_HEARTBEAT: the judge is the next heartbeat that carries an ``hb_vector``;
  a vectorless heartbeat only says where its own message sat in its origin's RT and
  cannot bound the other regions. When the judging vector lacks the data row's source
  region the row is reported too (``expected`` null): the vector claims nothing applied
  from a region the replica had already applied a write from.
- DUPLICATE_OR_REWIND: "seen from that source" counts the data rows *and* the
  heartbeats originated by that source. A heartbeat from region X is a message of X's
  RT with its own offset there, in the same offset space as X's data messages, and the
  replica applies X's RT in order; so a write from X at or below the offset of an X
  heartbeat already written was either delivered again or applied out of order, and a
  change-capture consumer tracking the highest offset seen per region drops it either
  way. ``hb_vector`` components are not counted: they are the replica's claims, not
  messages it wrote; a claim ahead of later data shows up as HEARTBEAT_REGRESSION or
  not at all, never as a duplicate.
- WRITE_TS_REGRESSION: a data row whose ``write_ts`` is strictly below that of the key's
  previous data row that has a ``write_ts``; equal stamps (a duplicate delivery) are
  not a regression. ``previous_leader_epoch`` is that previous row's epoch, and the
  detail says when the epoch changed between them (a leader transfer that let the
  clock go back, which TiKV's HLC forbids).
- HEARTBEAT_GAP: the gap is ``applied_ts_min_ms`` of a heartbeat minus
  ``applied_ts_max_ms`` of the heartbeat before it in the partition: the least the gap
  can have been, so a gap is only reported when it is certain, never because of clock
  uncertainty.
- CLOCK_UNCERTAINTY: one row per heartbeat whose origin or applied interval is wider
  than the bound; ``observed`` is the wider of the offending widths, the detail names both.
"""
from __future__ import annotations

from pyspark.sql import DataFrame

from pipelines.stream_pass import AnomalyBounds, anomaly_rows, stream_pass  # noqa: F401 - AnomalyBounds: its home for callers


def find_stream_anomalies(raw: DataFrame, bounds: AnomalyBounds = AnomalyBounds(), rows: int | None = None) -> DataFrame:
    """Every stream anomaly of SPEC section 5 in ``raw`` (rows shaped like raw_topic_snapshots).

    The anomaly rows of the pass per stream (``pipelines/stream_pass.py``); ``rows``: how many
    rows ``raw`` has, when known (a few run on the driver). The audit takes them from the same
    pass as its segments and watermarks.
    """
    passed = stream_pass(raw, rows=rows, bounds=bounds)
    return anomaly_rows(passed)
