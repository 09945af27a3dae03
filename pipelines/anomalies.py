"""Stream anomalies of the version topics (SPEC section 5), computed from the raw rows.

Each anomaly is found with window functions over one (snapshot, replica, topic,
partition) stream ordered by offset (sub-partitioned by source region, component or
key where the rule compares like with like), so the cost grows with the rows. Every
output row names the offending row, the value it had (``observed``), the bound it broke
(``expected``) and the row that set that bound (``reference_offset``).

DATA_BEYOND_HEARTBEAT is the exception: it reads the heartbeat segments (SPEC 2), which
have already ordered each stream. A data row's judge (the next heartbeat that carries a
vector) opens the first later segment whose opening heartbeat has one, so a window over
the segment summary's few rows finds every segment's judge, and a join by segment hands
it to the rows. Ordering every row of the stream backwards for it cost one of the step's
three full sorts; the join over the summary is cheaper (figures: docs/performance.md).

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

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.segments import annotate_segments, summarize_segments
from schemas.conform import conform
from schemas.operations import StreamAnomalies
from schemas.raw import DATA_KINDS

PARTITION_KEYS = ("snapshot_id", "replica", "topic", "partition")


@dataclass(frozen=True)
class AnomalyBounds:
    """Configured bounds of the time-based anomalies.

    heartbeat_gap_ms: HEARTBEAT_GAP when the applied time between two consecutive
        heartbeats of a partition is surely above this (default 60 s, a dozen missed
        beats at the usual few-second heartbeat interval).
    clock_uncertainty_ms: CLOCK_UNCERTAINTY when the origin or the applied clock
        interval of a heartbeat (max - min) is wider than this (default 1 s; a healthy
        NTP-synchronised clock is uncertain by milliseconds).
    """

    heartbeat_gap_ms: int = 60_000
    clock_uncertainty_ms: int = 1_000


def _stream(keys: tuple[str, ...] = (), descending: bool = False) -> Window:
    order = F.col("offset").desc() if descending else F.col("offset").asc()
    return Window.partitionBy(*PARTITION_KEYS, *keys).orderBy(order)


def _before(keys: tuple[str, ...] = ()) -> Window:
    return _stream(keys).rowsBetween(Window.unboundedPreceding, -1)


def _anomaly(
    df: DataFrame,
    anomaly: str,
    observed: Column,
    expected: Column,
    reference_offset: Column,
    detail: Column,
    source_region: Column | None = None,
    key: Column | None = None,
    previous_leader_epoch: Column | None = None,
) -> DataFrame:
    """The rows of ``df`` as StreamAnomalies rows."""
    columns = {
        "anomaly": F.lit(anomaly),
        "key": key if key is not None else F.lit(None),
        "source_region": source_region if source_region is not None else F.col("source_region"),
        "observed": observed,
        "expected": expected,
        "reference_offset": reference_offset,
        "previous_leader_epoch": previous_leader_epoch if previous_leader_epoch is not None else F.lit(None),
        "detail": detail,
    }
    return conform(df, StreamAnomalies.to_structtype(), columns)


def _heartbeat_regressions(vt: DataFrame) -> DataFrame:
    components = (
        vt.where(F.col("kind") == "HEARTBEAT")
        .select(
            *PARTITION_KEYS,
            "offset",
            "leader_epoch",
            F.explode(
                F.coalesce(F.col("hb_vector"), F.create_map(F.col("source_region"), F.col("source_offset")))
            ).alias("component", "value"),
        )
        .where(F.col("value").isNotNull())
    )
    # Highest earlier value of the component; among equal values the earliest heartbeat
    # that claimed it (largest negated offset), as the witness.
    earlier = F.max(F.struct(F.col("value"), (-F.col("offset")).alias("neg_offset"))).over(_before(("component",)))
    regressed = components.withColumn("earlier", earlier).where(F.col("value") < F.col("earlier.value"))
    return _anomaly(
        regressed,
        "HEARTBEAT_REGRESSION",
        observed=F.col("value"),
        expected=F.col("earlier.value"),
        reference_offset=-F.col("earlier.neg_offset"),
        source_region=F.col("component"),
        detail=F.format_string(
            "hb_vector[%s] = %d is below %d, claimed by the heartbeat at offset %d",
            F.col("component"),
            F.col("value"),
            F.col("earlier.value"),
            -F.col("earlier.neg_offset"),
        ),
    )


def _next_vector_heartbeats(summary: DataFrame) -> DataFrame:
    """Per segment of ``heartbeat_segment_summary``: ``judge``, the first later heartbeat carrying an ``hb_vector``.

    A data row of segment k comes after that segment's opening heartbeat and before the
    next one, which opens segment k + 1; so the first heartbeat after the row that carries
    a vector opens the first segment after k whose ``opening_has_vector`` holds, and its
    vector is that segment's ``baseline_vector`` (a heartbeat's contribution is its
    ``hb_vector`` when it has one). Scanning a partition's few segments backwards, the last
    such opening met is the first one after. Segments with no such heartbeat after them
    are left out (their rows have no judge).
    """
    later = Window.partitionBy(*PARTITION_KEYS).orderBy(F.col("segment").desc()).rowsBetween(
        Window.unboundedPreceding, -1
    )
    judge = F.last(
        F.when(
            F.col("opening_has_vector"),
            F.struct(F.col("opening_offset").alias("offset"), F.col("baseline_vector").alias("hb_vector")),
        ),
        ignorenulls=True,
    ).over(later)
    return summary.select(*PARTITION_KEYS, "segment", judge.alias("judge")).where(F.col("judge").isNotNull())


def _data_beyond_heartbeat(segments: DataFrame, summary: DataFrame) -> DataFrame:
    # Each data row meets its judge by its segment (a join with a few rows per replica
    # partition, which Spark broadcasts), not by ordering every row of the stream again.
    judged = (
        segments.where(F.col("kind").isin(*DATA_KINDS))
        .join(_next_vector_heartbeats(summary), on=[*PARTITION_KEYS, "segment"])
        .withColumn("component", F.element_at(F.col("judge.hb_vector"), F.col("source_region")))
        .where(F.col("component").isNull() | (F.col("source_offset") > F.col("component")))
    )
    return _anomaly(
        judged,
        "DATA_BEYOND_HEARTBEAT",
        observed=F.col("source_offset"),
        expected=F.col("component"),
        reference_offset=F.col("judge.offset"),
        key=F.col("key"),
        detail=F.when(
            F.col("component").isNull(),
            F.format_string(
                "source offset %d from %s, but the next heartbeat (offset %d) has no %s component",
                F.col("source_offset"),
                F.col("source_region"),
                F.col("judge.offset"),
                F.col("source_region"),
            ),
        ).otherwise(
            F.format_string(
                "source offset %d from %s is above hb_vector[%s] = %d of the next heartbeat (offset %d)",
                F.col("source_offset"),
                F.col("source_region"),
                F.col("source_region"),
                F.col("component"),
                F.col("judge.offset"),
            )
        ),
    )


def _duplicates_or_rewinds(vt: DataFrame) -> DataFrame:
    messages = vt.where(
        (F.col("kind").isin(*DATA_KINDS) | (F.col("kind") == "HEARTBEAT"))
        & F.col("source_region").isNotNull()
        & F.col("source_offset").isNotNull()
    )
    highest = F.max(
        F.struct(F.col("source_offset"), (-F.col("offset")).alias("neg_offset"), F.col("kind"))
    ).over(_before(("source_region",)))
    found = (
        messages.withColumn("highest", highest)
        .where(F.col("kind").isin(*DATA_KINDS) & (F.col("source_offset") <= F.col("highest.source_offset")))
    )
    return _anomaly(
        found,
        "DUPLICATE_OR_REWIND",
        observed=F.col("source_offset"),
        expected=F.col("highest.source_offset"),
        reference_offset=-F.col("highest.neg_offset"),
        key=F.col("key"),
        detail=F.format_string(
            "source offset %d from %s is not above %d, already seen in the %s at offset %d",
            F.col("source_offset"),
            F.col("source_region"),
            F.col("highest.source_offset"),
            F.col("highest.kind"),
            -F.col("highest.neg_offset"),
        ),
    )


def _physical_ms(hlc: Column) -> Column:
    return F.shiftright(hlc, 18)


def _write_ts_regressions(vt: DataFrame) -> DataFrame:
    writes = vt.where(F.col("kind").isin(*DATA_KINDS) & F.col("key").isNotNull())
    previous = F.last(
        F.when(
            F.col("write_ts").isNotNull(),
            F.struct(F.col("write_ts"), F.col("offset"), F.col("leader_epoch")),
        ),
        ignorenulls=True,
    ).over(_before(("key",)))
    regressed = writes.withColumn("previous", previous).where(F.col("write_ts") < F.col("previous.write_ts"))
    epoch_changed = ~F.col("leader_epoch").eqNullSafe(F.col("previous.leader_epoch"))
    return _anomaly(
        regressed,
        "WRITE_TS_REGRESSION",
        observed=F.col("write_ts"),
        expected=F.col("previous.write_ts"),
        reference_offset=F.col("previous.offset"),
        key=F.col("key"),
        previous_leader_epoch=F.col("previous.leader_epoch"),
        detail=F.concat(
            F.format_string(
                "write_ts %d (physical %d ms) is below %d (physical %d ms) of the key's previous write at offset %d",
                F.col("write_ts"),
                _physical_ms(F.col("write_ts")),
                F.col("previous.write_ts"),
                _physical_ms(F.col("previous.write_ts")),
                F.col("previous.offset"),
            ),
            F.when(
                epoch_changed,
                F.format_string(
                    "; across a leader_epoch change %s -> %s",
                    F.coalesce(F.col("previous.leader_epoch").cast(T.StringType()), F.lit("unknown")),
                    F.coalesce(F.col("leader_epoch").cast(T.StringType()), F.lit("unknown")),
                ),
            ).otherwise(F.lit("")),
        ),
    )


def _heartbeat_gaps(vt: DataFrame, bound_ms: int) -> DataFrame:
    heartbeats = vt.where(F.col("kind") == "HEARTBEAT")
    previous = F.last(F.struct(F.col("offset"), F.col("applied_ts_max_ms"))).over(_stream().rowsBetween(-1, -1))
    gaps = (
        heartbeats.withColumn("previous", previous)
        .withColumn("gap", F.col("applied_ts_min_ms") - F.col("previous.applied_ts_max_ms"))
        .where(F.col("gap") > F.lit(bound_ms))
    )
    return _anomaly(
        gaps,
        "HEARTBEAT_GAP",
        observed=F.col("gap"),
        expected=F.lit(bound_ms),
        reference_offset=F.col("previous.offset"),
        detail=F.format_string(
            "at least %d ms of applied time since the heartbeat at offset %d (bound %d ms)",
            F.col("gap"),
            F.col("previous.offset"),
            F.lit(bound_ms),
        ),
    )


def _clock_uncertainty(vt: DataFrame, bound_ms: int) -> DataFrame:
    origin_width = F.col("origin_ts_max_ms") - F.col("origin_ts_min_ms")
    applied_width = F.col("applied_ts_max_ms") - F.col("applied_ts_min_ms")
    bound = F.lit(bound_ms)
    wide = (
        vt.where(F.col("kind") == "HEARTBEAT")
        .withColumn("origin_width", origin_width)
        .withColumn("applied_width", applied_width)
        .where((F.col("origin_width") > bound) | (F.col("applied_width") > bound))
    )
    return _anomaly(
        wide,
        "CLOCK_UNCERTAINTY",
        observed=F.greatest(
            F.when(F.col("origin_width") > bound, F.col("origin_width")),
            F.when(F.col("applied_width") > bound, F.col("applied_width")),
        ),
        expected=bound,
        reference_offset=F.lit(None),
        detail=F.format_string(
            "origin interval %d ms, applied interval %d ms (bound %d ms)",
            F.col("origin_width"),
            F.col("applied_width"),
            bound,
        ),
    )


def find_stream_anomalies(
    raw: DataFrame,
    bounds: AnomalyBounds = AnomalyBounds(),
    segments: DataFrame | None = None,
    summary: DataFrame | None = None,
) -> DataFrame:
    """Every stream anomaly of SPEC section 5 in ``raw`` (rows shaped like raw_topic_snapshots).

    ``segments`` and ``summary``: the same rows' ``heartbeat_segments`` and
    ``heartbeat_segment_summary``, which DATA_BEYOND_HEARTBEAT reads its judges from; what
    is not given is computed (``pipelines.segments``: the segments from ``raw``, the summary
    from the segments).
    """
    if segments is None:
        segments = annotate_segments(raw)
    if summary is None:
        summary = summarize_segments(segments)
    vt = raw.where(F.col("offset").isNotNull() & (F.col("kind") != "EXPORTER_POSITION"))
    parts = [
        _heartbeat_regressions(vt),
        _data_beyond_heartbeat(segments, summary),
        _duplicates_or_rewinds(vt),
        _write_ts_regressions(vt),
        _heartbeat_gaps(vt, bounds.heartbeat_gap_ms),
        _clock_uncertainty(vt, bounds.clock_uncertainty_ms),
    ]
    found = parts[0]
    for part in parts[1:]:
        found = found.unionByName(part)
    return conform(found, StreamAnomalies.to_structtype())
