"""Region -> offset vectors (SPEC section 3) as Spark columns, and the output-schema select.

A vector is a ``map<string,bigint>`` from source region to upstream offset. A missing
component means "nothing known" and sits below every offset. Spark has no aggregate that
takes a componentwise max of maps over a window, so a running max is one ``max`` per
region of a small region universe (all over the same window, hence one sort), assembled
back into a map. For comparisons, ``dense`` lays a vector out as one ``bigint`` per region
with ``-1`` for a missing component (offsets are never negative): the SPEC order
``u <= v`` (every component of ``u`` present in ``v`` and not larger) is then exactly the
componentwise ``<=`` of the dense arrays.

The region universe is the handful of distinct region names of a frame, collected once
on the driver: a few strings, whatever the number of rows.
"""
from __future__ import annotations

from typing import Iterable, Sequence

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.raw import VECTOR

MISSING = -1


def empty_vector() -> Column:
    return F.create_map().cast(VECTOR)


def single(region: Column | str, offset: Column | str) -> Column:
    """The one-component vector ``{region: offset}``."""
    return F.create_map(F.col(region) if isinstance(region, str) else region,
                        (F.col(offset) if isinstance(offset, str) else offset).cast(T.LongType()))


def vector_max(a: Column, b: Column) -> Column:
    """Componentwise max of two vectors; a null vector counts as empty.

    The merge calls a lambda function per component, which Spark does not compile; where one
    side is null (a key with no carried state, the common case) the other side is the answer
    and the merge is skipped (docs/performance.md, the levers table).
    """
    merged = F.map_zip_with(a, b, lambda _k, x, y: F.greatest(x, y))
    return F.when(a.isNull(), F.coalesce(b, empty_vector())).when(b.isNull(), a).otherwise(merged)


def vector_leq(u: Column, v: Column) -> Column:
    """SPEC order ``u <= v``: every component of ``u`` is in ``v`` and not larger (null when either is null)."""
    return F.when(u.isNull() | v.isNull(), F.lit(None).cast(T.BooleanType())).otherwise(
        F.forall(F.map_keys(u), lambda k: F.coalesce(v[k] >= u[k], F.lit(False)))
    )


def universe(region_columns: Iterable[str] = (), vector_columns: Iterable[str] = ()) -> Column:
    """Aggregate: the sorted distinct region names in ``region_columns`` and the keys of ``vector_columns``.

    One global aggregation: each task keeps the distinct names and key sets it saw (a
    handful), no row is exploded or shuffled. Being an aggregate, it can also ride on the job
    that writes a table (``StepTables.stage(..., observe=)``) and cost no scan of its own.
    ``collect_set`` skips nulls: a null region, or a null vector's (null) key set. At least one
    column: ``region_universe`` answers the empty question itself.
    """
    names = [F.collect_set(c) for c in region_columns]
    keys = [F.flatten(F.collect_set(F.map_keys(c))) for c in vector_columns]
    return F.array_sort(F.array_distinct(F.flatten(F.array(*names, *keys))))


def region_universe(df: DataFrame, region_columns: Iterable[str] = (), vector_columns: Iterable[str] = ()) -> list[str]:
    """Sorted distinct region names found in ``region_columns`` and the keys of ``vector_columns`` (``universe``).

    One scan, one global aggregation, instead of a union of the columns with the keys
    exploded, made distinct by a shuffle (figures: docs/performance.md).
    """
    region_columns, vector_columns = list(region_columns), list(vector_columns)
    if not region_columns and not vector_columns:
        return []
    return list(df.agg(universe(region_columns, vector_columns).alias("regions")).first()["regions"])


# The vectors of ``partition_watermarks`` whose keys are every region its partitions can name.
PARTITION_VECTORS = ("end_lower_bound", "pre_history_bound")


def partition_regions(partition_wm: DataFrame) -> list[str]:
    """Sorted regions any vector of these replica partitions can name: the keys of ``L(end)`` and ``P``.

    ``L(end)`` is the componentwise max of every contribution of a dump (each data row's
    ``{source_region: source_offset}``, each heartbeat's vector or component), so its keys
    are every region a row of the partition names; ``P`` is one of its heartbeat vectors, or
    the carried stream's. Read off ``partition_watermarks`` (one row per replica partition),
    the universe costs no scan of the rows; the step that writes that table observes the same
    set on its write instead (``universe(vector_columns=PARTITION_VECTORS)``). A superset is
    always safe where it is used: a region no vector names compares as missing (``-1``) on
    both sides, and a running max over it is null, which ``sparse`` leaves out.
    """
    return region_universe(partition_wm, vector_columns=PARTITION_VECTORS)


def dense(vector: Column, regions: Sequence[str]) -> Column:
    """``array<bigint>`` over ``regions`` with ``-1`` for a missing component (null stays null)."""
    if not regions:
        return F.when(vector.isNotNull(), F.array().cast(T.ArrayType(T.LongType())))
    return F.when(
        vector.isNotNull(), F.array(*[F.coalesce(vector[F.lit(r)], F.lit(MISSING).cast(T.LongType())) for r in regions])
    )


_ENTRY = T.StructType([T.StructField("key", T.StringType(), False), T.StructField("value", T.LongType())])


def sparse(components: Sequence[Column], regions: Sequence[str]) -> Column:
    """The vector whose component for ``regions[i]`` is ``components[i]``; null or negative means missing.

    Built without a lambda function: the entries of the missing components are null and
    ``array_except`` drops them. (``map_filter`` with a lambda, the obvious way, is not
    generated code, and slower: docs/performance.md.)
    """
    if not regions:
        return empty_vector()
    entries = [
        F.when(c.isNotNull() & (c >= 0), F.struct(F.lit(r).alias("key"), c.cast(T.LongType()).alias("value")))
        for r, c in zip(regions, components)
    ]
    return F.map_from_entries(F.array_except(F.array(*entries), F.array(F.lit(None).cast(_ENTRY))))


def running_max(vector: Column, regions: Sequence[str], window: Window) -> Column:
    """Componentwise max of ``vector`` over ``window`` (one max per region, all over one sort)."""
    return sparse([F.max(vector[F.lit(r)]).over(window) for r in regions], regions)


def running_max_single(
    region: Column, offset: Column, regions: Sequence[str], window: Window, floor: Column | None = None
) -> Column:
    """Componentwise max over ``window`` of the one-component vectors ``{region: offset}``, and of ``floor``.

    ``floor`` (a vector whose regions are all in ``regions``) joins the max component by
    component, so that no intermediate map is built and merged (``vector_max`` merges two
    maps with a lambda function, which Spark does not compile: docs/performance.md).
    """
    components = [F.max(F.when(region == F.lit(r), offset)).over(window) for r in regions]
    if floor is not None:
        components = [F.greatest(floor[F.lit(r)], c) for r, c in zip(regions, components)]
    return sparse(components, regions)


