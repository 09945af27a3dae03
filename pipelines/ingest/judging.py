"""Judging read lines against SPEC section 1: accepted rows, quarantined rows, and what the accepted pass saw.

``judge_rows`` (``validate_rows`` for the two frames alone) judges the text rows of
``pipelines.ingest.reading`` (``LINES_SCHEMA``) whatever file format they came from: one validation
path for every format, so a Parquet column whose type differs from SPEC 1 (an offset stored
as a string, a float partition) shows up as BAD_TYPE on each row, exactly as the same JSON
line would. It gives a ``Judgement``: the accepted rows (RawTopicSnapshots), the quarantined
rows (RawTopicQuarantine, each with its reason and detail), and the observations of the
accepted pass that tell the quarantine which parts and lines to judge again
(``bitmap_buckets``, ``LINE_BUCKETS``).

Raw Venice records (decoded by the reading, ``decoded_reason``): one the decoder quarantines
carries its reason (``decoded_reason``) into the quarantine; one it skips by rule
(``schemas.raw.SKIP_REASONS``) is dropped before judging and counted by an observation of the
accepted pass (``Judgement.skipped_by_reason``); its position is read again by
``pipelines.ingest.reading.read_skipped_positions``.

A quarantined row keeps the position it names (``replica``, ``topic``, ``partition``,
``offset`` of RawTopicQuarantine, each when it has the field's JSON type; ``RAW_POSITION``):
a position lost to the quarantine, a gap of one position (``quarantined_positions`` of
``pipelines.ingest.accounting``).

Known limits: Spark's JSON parser ignores text after the closing ``]`` of an enclosing
array, so a line ``{...}] tail`` is accepted with its tail ignored (``{...}{...}``,
``{...}, {...}`` and ``{...} tail`` are all MALFORMED_JSON); a JSON object with a repeated
field name keeps the last value (as Spark and Python's json do).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from typing import Callable

from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.frames import observed
from pipelines.venice.frame import REASON_DETAIL
from pipelines.venice.values import VARIANT_SIZE_LIMIT
from schemas.conform import conform, local_frame, quoted, select_sql, sql_literal
from schemas.raw import (
    SKIP_REASONS,
    FORBIDDEN_BY_KIND,
    KINDS,
    MESSAGE_FIELDS,
    NON_NEGATIVE,
    STREAM_COLUMNS,
    REQUIRED_ALWAYS,
    REQUIRED_BY_KIND,
    RawTopicQuarantine,
    RawTopicSnapshots,
)

# Spark's JSON parser is lenient by default; a message is strict JSON. Its strings may be as long as a Variant holds
# (the fields pass through one below), not only Jackson's default 20 million characters: a decoded Venice value
# up to the decoder's limit is base64 text here (pipelines/venice/values.py, MAX_SUPPORTED_VALUE_BYTES).
_JSON_OPTIONS = {"allowSingleQuotes": "false", "allowNonNumericNumbers": "false", "allowComments": "false",
                 "maxStringLen": str(VARIANT_SIZE_LIMIT)}
_STRING_FIELDS = tuple(name for name, t in MESSAGE_FIELDS.items() if isinstance(t, T.StringType))
_MESSAGE_STRUCT = T.StructType([T.StructField(name, t) for name, t in MESSAGE_FIELDS.items()])
_FIELD_MAP = T.MapType(T.StringType(), T.VariantType())
TOMBSTONE = "TOMBSTONE"
# Session settings the judging's queries need (``resources.session.session_settings``). Spark keeps up to 4,096
# rows of a window partition as copies on the heap, outside the memory it manages and spills. The judging's windows
# hold one position's rows, whole: a record delivered a hundred times is a hundred copies of its value (measured:
# 100 copies of a 16 MiB value exhausted the 3 GiB heap). Beyond 16 rows a partition goes to spillable pages; a
# position rarely holds more than one row, so nothing else changes.
JUDGING_SPARK_SETTINGS = {"spark.sql.windowExec.buffer.in.memory.threshold": "16"}


def value_token() -> Column:
    """The content a row holds, comparable by equality: sha256 hex of its value, TOMBSTONE for a DELETE.

    Computed once, where the row is read (``value_hash`` of ``raw_topic_snapshots``): every later stage compares
    and carries the token, never the value, so no sort, window, scan or batch after the ingestion holds a value.
    Null for a row without a value (a heartbeat); a PUT always has one (SPEC 1).
    """
    return F.when(F.col("kind") == "DELETE", F.lit(TOMBSTONE)).otherwise(F.sha2(F.col("value"), 256))


def _present(name: str) -> Column:
    return F.col(f"present_{name}")


def _bad_type(name: str) -> Column:
    return F.col(f"bad_type_{name}")


# The per-field flags and problem lists below are Spark SQL text, not Columns: the JVM parses a
# select's texts at once (``select_sql``), where built as Columns they were about 2,000 calls from
# Python to the JVM per judging (docs/performance.md, "Calls to the JVM"). The line's columns they
# read: ``all_fields`` (the map of every field to its JSON token, a variant), ``typed`` (the typed
# parse) and ``kind_text``.
def _token(name: str) -> str:
    return f"all_fields[{sql_literal(name)}]"


def _typed(name: str) -> str:
    return f"typed.{quoted(name)}"


def _field_flags() -> list[str]:
    """Per field, once per row: is it there (not null), and does its JSON token not fit its type.

    ``all_fields`` is the line's map of every field to its JSON token (a variant). A JSON null is
    the same as an absent field. The map is only looked up here, never rebuilt or iterated:
    Spark evaluates map functions with lambdas (``map_filter``, ``exists``) without code
    generation, reading every entry through a path that is costly per element (it looked up
    the session configuration per entry in a profile of 2M rows), while a lookup by key is
    generated code.
    """
    flags = []
    for name, data_type in MESSAGE_FIELDS.items():
        token = _token(name)  # null when absent
        present = f"({token} IS NOT NULL AND NOT is_variant_null({token}))"
        # A string field parses from any JSON token (an object becomes its text), so its
        # token type is read on the variant; a number or map field is null in the typed
        # parse when its token does not fit (a string "5", 5.0, an overflow, a non-integer
        # or null component).
        if name in _STRING_FIELDS:
            wrong = f"schema_of_variant({token}) != 'STRING'"
        elif isinstance(data_type, T.MapType):
            wrong = f"{_typed(name)} IS NULL OR exists(map_values({_typed(name)}), v -> v IS NULL)"
        else:
            wrong = f"{_typed(name)} IS NULL"
        flags.append(f"{present} AS {quoted('present_' + name)}")
        flags.append(f"({present} AND coalesce(({wrong}), TRUE)) AS {quoted('bad_type_' + name)}")
    return flags


# The text around an unknown kind: "kind 'X' is not one of PUT, DELETE, ...".
_KIND_TEXT = (sql_literal("kind '"), sql_literal("' is not one of " + ", ".join(KINDS)))


def _problem_lists() -> dict[str, str]:
    """Per reason, the text listing a row's problems of that kind, null when it has none (SQL).

    The text is a ``concat_ws`` of one piece per possible problem, built only for rows that have
    one (``CASE WHEN``), so the great majority of rows, which have no problem, never assemble five
    empty strings (docs/performance.md, the levers table).
    """

    def kinds_with(table: dict[str, tuple[str, ...]], name: str) -> str:
        kinds = [k for k, names in table.items() if name in names]
        return f"coalesce(kind_text IN ({', '.join(map(sql_literal, kinds))}), FALSE)" if kinds else "FALSE"

    def required(name: str) -> str:
        return "TRUE" if name in REQUIRED_ALWAYS else kinds_with(REQUIRED_BY_KIND, name)

    def negative(name: str) -> str:
        if isinstance(MESSAGE_FIELDS[name], T.MapType):
            return f"coalesce(exists(map_values({_typed(name)}), v -> v < 0), FALSE)"
        return f"coalesce({_typed(name)} < 0, FALSE)"

    def present(name: str) -> str:
        return quoted(f"present_{name}")

    vectors = [n for n, t in MESSAGE_FIELDS.items() if isinstance(t, T.MapType)]
    # (condition, text when it holds) per possible problem.
    problems = {
        "MISSING_FIELD": [(f"{required(n)} AND NOT {present(n)}", sql_literal(n)) for n in MESSAGE_FIELDS],
        "BAD_TYPE": [
            (
                quoted(f"bad_type_{n}"),
                f"concat({sql_literal(n + ' (')}, schema_of_variant({_token(n)}), "
                f"{sql_literal(', expected ' + MESSAGE_FIELDS[n].simpleString() + ')')})",
            )
            for n in MESSAGE_FIELDS
        ],
        "UNKNOWN_KIND": [(
            f"NOT (kind_text IN ({', '.join(map(sql_literal, KINDS))}))",
            f"concat({_KIND_TEXT[0]}, kind_text, {_KIND_TEXT[1]})",
        )],
        "NEGATIVE_VALUE": [
            (negative(n), f"concat({sql_literal(n + ' = ')}, to_json({_token(n)}))") for n in (*NON_NEGATIVE, *vectors)
        ],
        "UNEXPECTED_FIELD": [
            (f"{kinds_with(FORBIDDEN_BY_KIND, n)} AND {present(n)}", f"concat({sql_literal(n + ' on a ')}, kind_text)")
            for n in MESSAGE_FIELDS
            if any(n in names for names in FORBIDDEN_BY_KIND.values())
        ],
    }
    return {
        reason: (
            "CASE WHEN " + " OR ".join(f"coalesce(({condition}), FALSE)" for condition, _ in pieces)
            + " THEN concat_ws(', ', "
            + ", ".join(f"CASE WHEN {condition} THEN {text} END" for condition, text in pieces) + ") END"
        )
        for reason, pieces in problems.items()
    }


# The quarantine's position columns (RawTopicQuarantine) -> the checked rows' columns that hold them.
RAW_POSITION = {"replica": "raw_replica", "topic": "raw_topic", "partition": "raw_partition", "offset": "raw_offset"}
# A quarantined row's position: known when all four are there.
QUARANTINE_POSITION = tuple(RAW_POSITION)


def _raw_position() -> list[str]:
    """Each field of a row's position (``RAW_POSITION``) when the row has it with its JSON type and, for the
    partition and the offset, not negative (it is then no position); null otherwise. Reads the flags of
    ``_field_flags`` (SQL, as they are)."""
    fields = []
    for name, alias in RAW_POSITION.items():
        known = f"{quoted('present_' + name)} AND NOT {quoted('bad_type_' + name)}"
        if name in NON_NEGATIVE:
            known = f"{known} AND {_typed(name)} >= 0"
        fields.append(f"CASE WHEN {known} THEN {_typed(name)} END AS {quoted(alias)}")
    return fields


# The columns of a line carried through the checks: the line itself, its parse and the decoder's reason.
_CARRIED = ("source_file", "raw", "read_error", "decoded_reason", "typed", "all_fields")


def _checked_rows(lines: DataFrame, snapshot_id: str) -> DataFrame:
    """Every line parsed, with its first problem as ``reason`` (null when none) and all of them in ``detail``.

    Built in steps (parse, per-field flags, problems, verdict) so that each is computed
    once per row: one flat expression would repeat the shared parts dozens of times, and
    Spark would spend more time compiling it than running it.
    """
    if "read_error" not in lines.columns:
        lines = lines.withColumn("read_error", F.lit(None).cast(T.StringType()))
    raw = F.col("raw")
    # The line is parsed twice: typed, for values (a field that does not fit its type is
    # null while the rest still parses), and as a map of variants, for which fields are
    # there, with what JSON type, and the unknown ones. The map parse reads the line
    # wrapped in [ ]: two objects on one line ("{..}{..}", "{..},{..}") or text after the
    # object then fail or give two elements, instead of the rest being silently ignored.
    wrapped = F.from_json(F.concat(F.lit("["), raw, F.lit("]")), T.ArrayType(_FIELD_MAP), _JSON_OPTIONS)
    parsed = (
        lines.select(
            "source_file",
            "raw",
            "read_error",
            "decoded_reason",
            F.from_json(raw, _MESSAGE_STRUCT, _JSON_OPTIONS).alias("typed"),
            wrapped.alias("wrapped"),
        )
        .select("*", F.when(F.size("wrapped") == 1, F.col("wrapped")[0]).alias("all_fields"))
    )
    typed = F.col("typed")
    # Whether the line names a field SPEC 1 does not have: it has more fields than known ones.
    # A lookup is null only for an absent key (a JSON null is a variant null); the lookups
    # are the ones _field_flags makes, so the generated code looks each field up once.
    known_fields = " + ".join(f"CAST({_token(name)} IS NOT NULL AS INT)" for name in MESSAGE_FIELDS)
    flagged = (
        select_sql(parsed, [
            *map(quoted, _CARRIED), *_field_flags(), f"size(all_fields) > ({known_fields}) AS has_extra_fields",
        ])
        # The kind, when it is a JSON string: what decides the fields a row needs.
        .select("*", F.when(_present("kind") & ~_bad_type("kind"), typed["kind"]).alias("kind_text"))
    )
    listed = _problem_lists()
    with_problems = select_sql(flagged, [
        *map(quoted, _CARRIED),
        "has_extra_fields",
        *_raw_position(),
        # Null when the row has no problem of that kind.
        *[f"{text} AS {quoted('problems_' + code)}" for code, text in listed.items()],
    ])

    unreadable = F.col("read_error").isNotNull()
    malformed = F.col("all_fields").isNull()
    # A raw Venice record the decoder quarantined: its reason first (raw is then the Kafka record).
    decoded = F.col("decoded_reason").isNotNull()
    reason = (
        F.when(decoded, F.col("decoded_reason"))
        .when(unreadable, F.lit("UNREADABLE_FILE"))
        .when(malformed, F.lit("MALFORMED_JSON"))
    )
    for code in listed:
        reason = reason.when(F.col(f"problems_{code}").isNotNull(), F.lit(code))
    found = [
        F.when(F.col(f"problems_{code}").isNotNull(), F.concat(F.lit(code + ": "), F.col(f"problems_{code}")))
        for code in listed
    ]
    decoded_detail = F.create_map(*[F.lit(x) for kv in REASON_DETAIL.items() for x in kv])[F.col("decoded_reason")]
    detail = (
        # A reader's own detail of the row first (where a LINE_TOO_LONG line stood), else the reason's text.
        F.when(decoded, F.coalesce(F.col("read_error"), decoded_detail, F.col("decoded_reason")))
        .when(unreadable, F.col("read_error"))
        .when(malformed, F.lit("not a single JSON object (invalid JSON, another JSON value, or several on one line)"))
        .otherwise(F.concat_ws("; ", *found))
    )
    # Built only for the (rare) lines that have extra fields: map_filter is not generated code.
    extras = F.map_filter(F.col("all_fields"), lambda k, _v: ~k.isin(list(MESSAGE_FIELDS)))
    return with_problems.select(
        F.lit(snapshot_id).alias("snapshot_id"),
        "source_file",
        "raw",
        *[typed[name].alias(name) for name in MESSAGE_FIELDS],
        F.when(F.col("has_extra_fields"), F.transform_values(extras, lambda _k, v: F.to_json(v))).alias("extra_fields"),
        *RAW_POSITION.values(),
        reason.alias("reason"),
        detail.alias("detail"),
    )


# The accepted pass tells the quarantine's pass which lines it quarantines as buckets of their
# hash, the bits of one bitmap (Spark's bitmap_construct_agg: 32,768 bits, 4 KiB, whatever the
# number of rows quarantined). Above half the buckets, the quarantine's pass judges every line.
LINE_BUCKETS = 32768


def _line_bucket_sql() -> str:
    """The bucket (0 to LINE_BUCKETS - 1) of a line: a hash of its file and text, known before it is parsed."""
    return f"pmod(xxhash64(source_file, raw), {LINE_BUCKETS})"


def _bucket_bitmap(where: Column) -> Column:
    """An aggregate: the bitmap of the ``line_bucket`` column's values on the rows ``where`` holds."""
    # bitmap_bit_position(n) is n - 1 for n in 1..LINE_BUCKETS; a null sets no bit.
    return F.bitmap_construct_agg(F.bitmap_bit_position(F.when(where, F.col("line_bucket") + 1)))


def bitmap_buckets(*bitmaps: bytes | None) -> list[int]:
    """The buckets set in any of the bitmaps (``_bucket_bitmap``, read from an observation), in order."""
    return sorted({i for bitmap in bitmaps for i in range(len(bitmap or b"") * 8) if bitmap[i // 8] >> (i % 8) & 1})


def _sorted_entries(column: str) -> Column:
    # Maps cannot be compared or grouped on; their sorted entries can.
    return F.array_sort(F.map_entries(F.col(column)))


@dataclass(frozen=True)
class Judgement:
    """A snapshot's lines judged: the accepted rows, the quarantined rows, and what the accepted pass saw.

    ``accepted`` carries two observations (``DataFrame.observe``): the rows that had a
    problem of their own, and the candidates that sat at a conflicting position, each
    counted and as a bitmap of their lines' buckets (a hash of file and text, ``LINE_BUCKETS``
    of them; a fixed 4 KiB whatever the count). Both are filled by the job that computes the
    accepted rows, so once it has run, ``quarantine()`` knows whether the quarantine is
    empty: then it is, at no cost. Else it reads the lines again and judges only those in
    the bitmaps' buckets (a hash of the text, no parse, for the others), with only the
    parts the counts call for: the rows with a problem of their own when there are any, the
    conflicting positions (an exchange and sort of those lines by position, each carrying
    its text) only when there are any: a small part of judging every line again
    (docs/performance.md, ``dirty``).

    Judging a subset of the lines quarantines the same rows. Every quarantined line is in
    its bucket. A row's own problems are its own. Every candidate at a conflicting position
    is quarantined, so all of them are there to be compared again; the candidates of other
    positions that share a bucket are a part of their position's rows, which all have one
    content, and a part of them cannot disagree either.

    When no line reaches the exchange by position (every line quarantined or skipped by rule),
    Spark drops these observations from the plan it ran (``pipelines.frames.observed``): then
    the quarantine judges every line for both parts, and the skipped rows are counted by a
    query of their own. Reading the missing counts as none would lose every row of such a snapshot.

    The ``quarantined`` frame judges every line, for callers that ask before the accepted
    rows are computed. Either plan is built only when it is asked for: building and
    analysing it costs the driver noticeable time in a fresh JVM.
    """

    accepted: DataFrame
    # (own problems, conflicting positions, the quarantined lines' buckets or None for all) -> quarantine
    build_quarantined: Callable[[bool, bool, "list[int] | None"], DataFrame]
    own_problems: Observation
    conflicts: Observation
    skipped: Observation | None = None  # raw Venice records skipped by rule, per SKIP_REASONS
    count_skipped: Callable[[], dict[str, int]] = dict  # the same, counted by a query of its own

    def skipped_by_reason(self) -> dict[str, int]:
        """Rows skipped by rule, per reason (only those seen); call it after ``accepted`` has been computed."""
        if self.skipped is None:
            return {}
        counts = observed(self.skipped)
        if counts is None:  # Spark dropped the observation (no row was accepted): count the lines again
            counts = self.count_skipped()
        return {r: int(n) for r, n in sorted(counts.items()) if int(n or 0) > 0}

    @property
    def quarantined(self) -> DataFrame:
        """Every quarantined row, whatever the accepted pass counted (it need not have run)."""
        return self.build_quarantined(True, True, None)

    def quarantined_buckets(self) -> list[int] | None:
        """The buckets (``line_bucket``) of the lines the accepted pass quarantined; None if Spark dropped its count."""
        own, conflicts = observed(self.own_problems), observed(self.conflicts)
        if own is None or conflicts is None:
            return None
        return bitmap_buckets(own.get("lines"), conflicts.get("lines"))

    def _parts(self) -> tuple[bool, bool, list[int] | None]:
        """What the quarantine holds, from the accepted pass: rows with problems of their own, rows at conflicting
        positions, and the buckets of their lines (None: judge every line).

        Spark drops the observations when no row of the snapshot reaches the exchange by position
        (``pipelines.frames.observed``), every line quarantined for instance: then the quarantine
        may hold both parts, and every line is judged again.
        """
        own, conflicts = observed(self.own_problems), observed(self.conflicts)
        if own is None or conflicts is None:
            return True, True, None
        buckets = bitmap_buckets(own.get("lines"), conflicts.get("lines"))
        # When most buckets hold a quarantined line, the filter would keep most lines: judge them all.
        return (
            int(own.get("rows") or 0) > 0,
            int(conflicts.get("rows") or 0) > 0,
            buckets if len(buckets) <= LINE_BUCKETS // 2 else None,
        )

    def quarantine_is_empty(self) -> bool:
        """Whether no row was quarantined; call it after ``accepted`` has been computed (its observations are read)."""
        own, conflicting, _ = self._parts()
        return not (own or conflicting)

    def quarantine(self) -> DataFrame:
        """The quarantined rows; call it after ``accepted`` has been computed (its observations are read)."""
        own, conflicting, buckets = self._parts()
        if not own and not conflicting:
            return local_frame(self.accepted.sparkSession, [], RawTopicQuarantine.to_structtype())
        return self.build_quarantined(own, conflicting, buckets)


def validate_rows(lines: DataFrame, snapshot_id: str) -> tuple[DataFrame, DataFrame]:
    """Split read lines into (accepted, quarantined), shaped like RawTopicSnapshots and RawTopicQuarantine."""
    judgement = judge_rows(lines, snapshot_id)
    return judgement.accepted, judgement.quarantined


def judge_rows(lines: DataFrame, snapshot_id: str) -> Judgement:
    """Judge read lines: accepted and quarantined rows (RawTopicSnapshots, RawTopicQuarantine shapes).

    Rows without a problem of their own are candidates. Candidates at one (replica, topic,
    partition, offset) whose content differs are all CONFLICTING_POSITION: none can be
    trusted over the others. The rest are accepted once per distinct content (every field
    and the extra fields, so the position too; EXPORTER_POSITION rows, which have none,
    collapse on their content alone), with ``copies`` counting the identical rows and
    ``source_file`` the smallest file name among them.

    The accepted rows take one pass: parse and judge every line, one exchange by position
    and one sort by position, content and file, on which one window per position runs: does
    it hold more than one distinct content (then all its rows are quarantined), else how many
    copies, and the first by file. Nothing is kept in between: the text of a line is needed
    only for the quarantine, which is usually empty and then costs nothing
    (``Judgement.quarantine``).
    """
    if "decoded_reason" not in lines.columns:
        lines = lines.withColumn("decoded_reason", F.lit(None).cast(T.StringType()))
    # Raw Venice records skipped by rule are dropped here, counted by the accepted pass. The
    # quarantine pass reads the lines without the observation (an Observation serves one job).
    skip = F.coalesce(F.col("decoded_reason").isin(list(SKIP_REASONS)), F.lit(False))
    skipped = Observation()
    observed_lines = lines.observe(
        skipped, *[F.count_if(F.col("decoded_reason") == F.lit(r)).alias(r) for r in SKIP_REASONS]
    )

    def judged_rows(frame: DataFrame, problems: Observation, positions: bool = False) -> DataFrame:
        """The judged lines, with ``problems`` counting those that have a problem of their own.

        ``positions``: with the rest of each row's position as the quarantine stores it (``RAW_POSITION``),
        for the quarantine's pass only; the accepted pass does not carry them.

        The observation is also what keeps every filter on ``reason`` above the judging. Spark
        moves a filter below a projection by writing each column it names as that column's
        expression, and does so projection after projection, so a filter on ``reason`` placed
        right on these rows would end up below the parse, holding its own ``from_json`` for
        every flag that the reason is made of: 988 parses of every line instead of 2. A filter
        cannot move below an observation, which would then
        count other rows, so each line is parsed and judged once and the filters come after.
        """
        checked = _checked_rows(frame.where(~skip), snapshot_id)
        judged = checked.select(
            *comparable,
            value_token().alias("value_hash"),
            "source_file",
            "raw",
            "raw_replica",
            *([c for c in RAW_POSITION.values() if c != "raw_replica"] if positions else []),
            "reason",
            "detail",
            F.expr(_line_bucket_sql()).alias("line_bucket"),
        )
        return judged.observe(problems, F.count_if(~candidate).alias("rows"), _bucket_bitmap(~candidate).alias("lines"))

    content_names = ["snapshot_id", *MESSAGE_FIELDS, "extra_fields"]
    maps = {n for n in content_names if n == "extra_fields" or isinstance(MESSAGE_FIELDS.get(n), T.MapType)}
    comparable = [_sorted_entries(n).alias(n) if n in maps else F.col(n) for n in content_names]
    candidate = F.col("reason").isNull()
    own_problems = Observation()
    conflicts = Observation()

    # One window per position, ordered by content and file. Maps take part as their sorted entries. The offset
    # leads the sort, since the sort compares rows by a prefix of their first column first; snapshot_id, the same
    # on every row, is left out.
    position = ["offset", "replica", "topic", "partition"]
    # The content is compared by its value's token, not the value: windows copy what they compare (a value of
    # megabytes once per row of a position), and equal tokens are equal values.
    rest = ["value_hash" if n == "value" else n for n in content_names if n not in position and n != "snapshot_id"]
    content = F.struct(*[F.col(n) for n in rest])
    # An EXPORTER_POSITION row has no offset: its reports of every content share (replica, topic, partition) and
    # never conflict, so there each content is a window of its own (the column is null on every other row).
    exporter_content = F.when(F.col("offset").isNull(), content)
    by_position = Window.partitionBy(*position, exporter_content).orderBy(*rest, "source_file")
    at_position = by_position.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)

    def at_positions(
        rows: DataFrame, carried: tuple[str, ...] = (), window: Window = at_position, first_copy: bool = False,
    ) -> DataFrame:
        """Every row, with whether its window (a position's candidates) holds more than one content, and its rows.

        ``first_copy``: with ``nth``, the row's rank among its position's rows (``by_position``) by content and
        file (1: the first copy).
        """
        return rows.select(
            *content_names,
            "value_hash",
            "source_file",
            *carried,
            # EXPORTER_POSITION rows have no offset: they never conflict, whatever they hold.
            (
                F.col("offset").isNotNull()
                & ~F.first(content).over(window).eqNullSafe(F.last(content).over(window))
            ).alias("conflicting"),
            F.count(F.lit(1)).over(window).alias("rows_at_position"),
            *([F.row_number().over(by_position).alias("nth")] if first_copy else []),
        )

    observed = judged_rows(observed_lines, own_problems)
    # The one exchange of the candidates is by stream: each position's window is within its stream, and each task then
    # writes whole streams (``raw_topic_snapshots`` staged ``whole_streams``: the stream pass reads its files one by
    # one, with no exchange of its own).
    # Every candidate's line bucket goes through the exchange (8 bytes a row), for the bitmap of the conflicting
    # rows' lines; observed before the copies are collapsed, so that every conflicting line is in it. A position
    # that does not conflict holds one content: its rows are that content's copies, and its first row (by file)
    # is the one accepted. The rows of a conflicting position are all quarantined.
    compared = (
        at_positions(observed.where(candidate).repartition(*STREAM_COLUMNS), ("line_bucket",), first_copy=True)
        .observe(
            conflicts, F.count_if(F.col("conflicting")).alias("rows"), _bucket_bitmap(F.col("conflicting")).alias("lines")
        )
        .where(F.col("nth") == 1)
        .withColumnRenamed("rows_at_position", "copies")
    )
    accepted_struct = RawTopicSnapshots.to_structtype()
    # The first copy in file order carries the smallest file name.
    accepted = conform(
        compared.where(~F.col("conflicting")), accepted_struct,
        {**{name: F.map_from_entries(F.col(name)) for name in maps}, "value_bytes": F.octet_length("value")},
    )

    def build_quarantined(own: bool, conflicting: bool, buckets: list[int] | None) -> DataFrame:
        """The quarantine, from one more read of the lines: the parts asked for, judging the lines in ``buckets`` only.

        ``buckets`` None: every line is judged.

        Built only here (planning it costs the driver time in a fresh JVM; most snapshots have no bad row). The
        lines are judged again without the accepted pass's observations (an Observation serves one query).
        """
        # Only the lines in the buckets of quarantined lines are judged: a quarantined line is in one. Judged alone,
        # they are judged the same, conflicts included: every candidate at a conflicting position is quarantined, so
        # all of them are in, while the candidates of another position that come along cannot disagree among themselves.
        # The buckets are one SQL text (a Column per bucket would be a round trip to the JVM each).
        listed = ", ".join(map(str, buckets or ()))
        in_buckets = lines if buckets is None else lines.where(f"{_line_bucket_sql()} IN ({listed})")
        judged = judged_rows(in_buckets, Observation(), positions=True)
        # Where the quarantined row stood, as far as it says (RawTopicQuarantine).
        stood = [F.col(column).alias(name) for name, column in RAW_POSITION.items()]
        quarantine_struct = RawTopicQuarantine.to_structtype()
        wanted = []
        if own:
            wanted.append(~candidate)
        if conflicting:
            wanted.append(candidate)
        rows = judged.where(reduce(Column.__or__, wanted))
        if not conflicting:
            return conform(
                rows.select("snapshot_id", "source_file", *stood, "raw", "reason", "detail"),
                quarantine_struct,
            )
        # Both parts from this one read: the rows with problems of their own go through the exchange by position
        # too (usually few), in windows of their line's bucket (a malformed line has no position), so the candidates'
        # windows (no bucket) hold candidates only. A row with a problem of its own keeps its own reason and detail
        # whoever shares its window. Their text is carried through, never read again for a join.
        own_line = F.when(~candidate, F.col("line_bucket"))
        windowed = at_positions(
            rows, ("raw", *RAW_POSITION.values(), "reason", "detail"), at_position.partitionBy(*position, own_line)
        )
        conflict_detail = F.format_string(
            "%d rows at replica %s, topic %s, partition %d, offset %d do not all have the same content",
            "rows_at_position",
            "replica",
            "topic",
            "partition",
            "offset",
        )
        quarantined = windowed.where(~candidate | F.col("conflicting")).select(
            "snapshot_id",
            "source_file",
            *stood,
            "raw",
            F.coalesce("reason", F.lit("CONFLICTING_POSITION")).alias("reason"),
            F.when(candidate, conflict_detail).otherwise(F.col("detail")).alias("detail"),
        )
        return conform(quarantined, quarantine_struct)

    def count_skipped() -> dict[str, int]:
        counted = lines.where(skip).groupBy("decoded_reason").agg(F.count(F.lit(1)).alias("rows")).collect()
        return {row["decoded_reason"]: row["rows"] for row in counted}

    return Judgement(
        accepted=accepted,
        build_quarantined=build_quarantined,
        own_problems=own_problems,
        conflicts=conflicts,
        skipped=skipped,
        count_skipped=count_skipped,
    )
