"""The window passes the fused stream pass replaced (issue 52), kept as its oracle: segments, ``L``, gaps, ``U``, ``M``
and the stream anomalies.

This is the implementation the audit ran before ``pipelines/stream_pass.py``: Spark window
functions over each stream ordered by offset (segments, ``L``, the resolved timestamp, gaps),
then by key (``U``, ``M``), with a join of the runs between gaps, and one window per anomaly
rule (as ``pipelines/anomalies.py`` describes them). ``tests/test_stream_pass.py`` holds the
pass to it row for row on generated streams. Not imported by the product.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.segments import PARTITION_KEYS, summarize_segments
from pipelines.vectors import empty_vector, partition_regions, region_universe, running_max, running_max_single, single
from pipelines.watermarks import partition_watermarks
from pipelines.anomalies import AnomalyBounds
from schemas.conform import conform
from schemas.operations import StreamAnomalies
from schemas.raw import DATA_KINDS, VECTOR
from schemas.segments import HeartbeatSegments
from schemas.watermarks import ReconstructedWatermarks


def _by_offset() -> Window:
    return Window.partitionBy(*PARTITION_KEYS).orderBy("offset")


def contribution() -> Column:
    """What a row adds to the applied lower bound of every later row of its partition."""
    is_data = F.col("kind").isin(*DATA_KINDS)
    return (
        F.when(F.col("kind") == "HEARTBEAT", F.coalesce(F.col("hb_vector"), single("source_region", "source_offset")))
        .when(is_data, single("source_region", "source_offset"))
        .otherwise(empty_vector())
    )


def _last_at_heartbeat(column: Column, upto: Window) -> Column:
    return F.last(F.when(F.col("kind") == "HEARTBEAT", column), ignorenulls=True).over(upto)


def _resolved_ts(regions: list[str], upto: Window) -> Column:
    # Per origin region, the origin_ts_min_ms of the last heartbeat from it so far; the
    # resolved timestamp is the least of them. Regions not seen yet are null, which
    # least() skips, so they do not hold the watermark back before they first appear.
    latest = [
        F.last(
            F.when((F.col("kind") == "HEARTBEAT") & (F.col("source_region") == F.lit(r)), F.col("origin_ts_min_ms")),
            ignorenulls=True,
        ).over(upto)
        for r in regions
    ]
    if not latest:
        return F.lit(None).cast(T.LongType())
    return latest[0] if len(latest) == 1 else F.least(*latest)


def _with_read_positions(rows: DataFrame, read_positions: DataFrame | None) -> DataFrame:
    """``rows`` and, as rows of kind null, the positions read that hold no row (ordered with them, then dropped).

    Each position once: a record read twice (a file delivered twice) is one position, and counting it twice
    would take one from ``missing_before`` of every later row.
    """
    if read_positions is None:
        return rows
    markers = read_positions.select(*PARTITION_KEYS, "offset").distinct().select(
        *PARTITION_KEYS, "offset", *[F.lit(None).cast(f.dataType).alias(f.name) for f in rows.schema.fields
                                     if f.name not in (*PARTITION_KEYS, "offset")]
    )
    return rows.unionByName(markers.select(*rows.columns))


def window_segments(raw: DataFrame, read_positions: DataFrame | None = None) -> DataFrame:
    """Every version-topic row with its segment, opening heartbeat, baseline, contribution, ``L(p)`` and gaps.

    ``read_positions``: (``snapshot_id``, ``replica``, ``topic``, ``partition``, ``offset``) of
    positions read that hold no row of the dump (records skipped by rule): they close gaps
    and are not rows.
    """
    rows = raw.where(F.col("kind") != "EXPORTER_POSITION").withColumn("contribution", contribution())
    # Every region a contribution can name: each row's source region and each heartbeat vector's keys.
    regions = region_universe(rows, region_columns=["source_region"], vector_columns=["hb_vector"])
    upto = _by_offset().rowsBetween(Window.unboundedPreceding, Window.currentRow)
    before = _by_offset().rowsBetween(Window.unboundedPreceding, -1)
    # Positions between the dump's first position and this row that were not read; all in the window's one sort.
    first_position = F.min("offset").over(upto)
    missing_before = F.col("offset") - first_position - (F.row_number().over(_by_offset()) - 1)
    previous = F.lag("offset", 1).over(_by_offset())
    annotated = _with_read_positions(rows, read_positions).select(
        "*",
        F.sum((F.col("kind") == "HEARTBEAT").cast(T.LongType())).over(upto).alias("segment"),
        _last_at_heartbeat(F.col("offset"), upto).alias("opening_offset"),
        _last_at_heartbeat(F.col("contribution"), upto).alias("baseline_vector"),
        _last_at_heartbeat(F.col("applied_ts_min_ms"), upto).alias("opening_applied_ts_min_ms"),
        _last_at_heartbeat(F.col("applied_ts_max_ms"), upto).alias("opening_applied_ts_max_ms"),
        running_max(F.col("contribution"), regions, before).alias("applied_lower_bound"),
        _resolved_ts(regions, upto).alias("resolved_ts_ms"),
        F.coalesce(F.col("offset") - previous - 1, F.lit(0)).cast(T.LongType()).alias("gap_before"),
        missing_before.cast(T.LongType()).alias("missing_before"),
        previous.alias("_previous"),
    )
    at_gap = F.col("gap_before") > 0
    # Without read positions every position is a row, and the gaps since the row before are the ones right before
    # it (what ``_gaps_between_rows`` would find, without its two extra windows).
    if read_positions is None:
        annotated = annotated.select(
            "*",
            F.when(at_gap, F.col("offset") - F.col("gap_before")).alias("gap_start"),
            F.when(at_gap, F.col("offset") - 1).alias("gap_end"),
        )
    else:
        annotated = _gaps_between_rows(annotated, before, upto)
    return conform(annotated, HeartbeatSegments.to_structtype())


def _gaps_between_rows(positions: DataFrame, before: Window, upto: Window) -> DataFrame:
    """The rows of ``positions`` (rows and read positions, with each position's own ``gap_before``), each with the
    gaps since the row before it: a gap can end at a read position (a quarantined record, then skipped ones), and
    it is a gap of the rows all the same (SPEC 3a).

    ``gap_before`` becomes the positions missing since the previous row (``missing_before`` minus the previous
    row's), ``gap_start`` the first of them and ``gap_end`` the last. Same ordering as the rows' other windows: no
    sort of its own.
    """
    row = F.col("kind").isNotNull()
    here = F.col("gap_before")  # positions missing right before this position, row or read
    with_previous_row = positions.select(
        "*", F.last(F.when(row, F.col("missing_before")), ignorenulls=True).over(before).alias("_row_missing")
    )
    since_row = F.coalesce(F.col("_row_missing"), F.lit(0))
    # The first gap after the previous row: the one whose positions missing before it are the previous row's.
    first_after_row = (here > 0) & (F.col("missing_before") - here == since_row)
    gaps = with_previous_row.select(
        "*",
        F.last(F.when(first_after_row, F.col("_previous") + 1), ignorenulls=True).over(upto).alias("_first_start"),
        F.last(F.when(here > 0, F.col("offset") - 1), ignorenulls=True).over(upto).alias("_last_end"),
    ).where(row)
    gap_before = (F.col("missing_before") - since_row).cast(T.LongType())
    return gaps.withColumn("gap_before", gap_before).select(
        "*",
        F.when(F.col("gap_before") > 0, F.col("_first_start")).alias("gap_start"),
        F.when(F.col("gap_before") > 0, F.col("_last_end")).alias("gap_end"),
    )


def gap_runs(annotated: DataFrame) -> DataFrame:
    """Per replica partition and *run* (the rows between two gaps, named by their ``missing_before``): its bounds.

    - ``run_floor``: ``P`` of the rows after the gap that opens the run (SPEC 3a): the
      ``hb_vector`` of the first heartbeat with a vector at or after the run's first row,
      wherever it lies; null when none follows (their ``U`` is unknown).
    - ``run_stop``: ``L`` of the first row after the gap that closes the run, where the
      reach of every version in the run stops; null for the last run.

    Read off the rows after a gap and the heartbeats with a vector only, ordered once.
    """
    at_gap = F.col("gap_before") > 0
    vector_heartbeat = (F.col("kind") == "HEARTBEAT") & F.col("hb_vector").isNotNull()
    # Descending offsets: the frame up to the current row holds the rows at or after it.
    after = Window.partitionBy(*PARTITION_KEYS).orderBy(F.desc("offset")).rowsBetween(
        Window.unboundedPreceding, Window.currentRow
    )
    gaps = annotated.where(at_gap | vector_heartbeat).select(
        *PARTITION_KEYS, "offset", "gap_before", "missing_before", "applied_lower_bound",
        F.last(F.when(vector_heartbeat, F.col("hb_vector")), ignorenulls=True).over(after).alias("next_vector"),
    ).where(at_gap)
    no_vector = F.lit(None).cast(VECTOR)
    opening = gaps.select(*PARTITION_KEYS, F.col("missing_before").alias("run"),
                          F.col("next_vector").alias("run_floor"), no_vector.alias("run_stop"))
    closing = gaps.select(*PARTITION_KEYS, (F.col("missing_before") - F.col("gap_before")).alias("run"),
                          no_vector.alias("run_floor"), F.col("applied_lower_bound").alias("run_stop"))
    return opening.unionByName(closing).groupBy(*PARTITION_KEYS, "run").agg(
        F.first("run_floor", ignorenulls=True).alias("run_floor"),
        F.first("run_stop", ignorenulls=True).alias("run_stop"),
    )


def window_watermarks(
    annotated: DataFrame, partitions: DataFrame | None = None, regions: list[str] | None = None,
    gaps: bool | None = None,
) -> DataFrame:
    """One row per PUT/DELETE with its content token, ``L``, ``U`` (null when unknown) and ``M``.

    ``partitions`` is ``partition_watermarks`` of the segments' summary when the caller has
    it (the asset passes the table it just wrote); ``P`` and ``L(end)`` come from its few rows.
    ``regions``: ``partition_regions(partitions)`` when the caller has it (the asset observes it
    on the write of ``partitions``: no query of its own), else collected here. ``gaps``: whether
    any dump has a gap (the asset observes it on the same write), else read off ``partitions``.
    Without gaps the bounds are SPEC 3's; with gaps SPEC 3a's (``gap_runs``): the reach of a
    version stops at the first gap after it, and a version after a gap takes its run's floor.
    """
    data = annotated.where(F.col("kind").isin(*DATA_KINDS))
    partitions = partitions if partitions is not None else partition_watermarks(summarize_segments(annotated))
    regions = partition_regions(partitions) if regions is None else regions
    if gaps is None:
        gaps = bool(partitions.agg(F.sum("gaps")).first()[0] or 0)
    bounds = partitions.select(*PARTITION_KEYS, "pre_history_bound", "end_lower_bound")
    by_key = Window.partitionBy(*PARTITION_KEYS, "key").orderBy("offset")
    next_lower_bound = F.lead("applied_lower_bound", 1).over(by_key.rowsBetween(1, 1))
    rows = data.join(F.broadcast(bounds), on=list(PARTITION_KEYS), how="inner")
    if gaps:
        runs = gap_runs(annotated).withColumnRenamed("run", "missing_before")
        rows = rows.join(runs, on=[*PARTITION_KEYS, "missing_before"], how="left")
        # Rows after a gap: P of their run; before any gap: P of the dump.
        floor = F.when(F.col("missing_before") > 0, F.col("run_floor")).otherwise(F.col("pre_history_bound"))
        same_run = F.lead("missing_before", 1).over(by_key.rowsBetween(1, 1)) == F.col("missing_before")
        reach = (
            F.when(next_lower_bound.isNotNull() & same_run, next_lower_bound)
            .when(F.col("run_stop").isNotNull(), F.col("run_stop"))
            .otherwise(F.coalesce(next_lower_bound, F.col("end_lower_bound")))
        )
    else:
        floor = F.col("pre_history_bound")
        reach = F.coalesce(next_lower_bound, F.col("end_lower_bound"))
    # U = max(floor, the key's {source_region: source_offset} so far): the floor's regions are in ``regions``.
    touched = running_max_single(
        F.col("source_region"),
        F.col("source_offset"),
        regions,
        by_key.rowsBetween(Window.unboundedPreceding, Window.currentRow),
        floor=floor,
    )
    rows = rows.select(
        "*",
        F.when(floor.isNotNull(), touched).alias("touch_bound"),
        reach.alias("reach"),
    )
    return conform(rows, ReconstructedWatermarks.to_structtype())


# ------------------------------------------------------------------ stream anomalies (SPEC 5)
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


def window_anomalies(
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
        segments = window_segments(raw)
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
