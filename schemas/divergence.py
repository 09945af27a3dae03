"""Schemas of the divergence stage: Leap Frog verdicts per key and per replica pair (SPEC section 4)."""
from __future__ import annotations

import pandera.pyspark as pa
from pyspark.sql import types as T

from schemas.raw import VECTOR

REPORTED_VERDICTS = ("DIVERGENT", "MISSING", "IN_FLIGHT")


class DivergenceReports(pa.DataFrameModel):
    """One row per key that is not CONSISTENT between two replicas (replica_a < replica_b).

    The witness is a pair of versions, v of replica_a and w of replica_b, with different
    content although each replica had applied everything that made the other's version
    (``touch_bound_b <= reach_a`` and ``touch_bound_a <= reach_b``). It is set for
    DIVERGENT and MISSING rows only; the pre-dump version has a null offset and hash 'ABSENT'.
    """

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    topic: T.StringType() = pa.Field(nullable=False)
    partition: T.IntegerType() = pa.Field(nullable=False, ge=0)
    replica_a: T.StringType() = pa.Field(nullable=False)
    replica_b: T.StringType() = pa.Field(nullable=False)
    key: T.StringType() = pa.Field(nullable=False)
    verdict: T.StringType() = pa.Field(nullable=False, isin=list(REPORTED_VERDICTS))
    missing_in: T.StringType() = pa.Field(nullable=True, description="MISSING only: the replica that never held the key")
    witness_offset_a: T.LongType() = pa.Field(nullable=True, ge=0)
    witness_offset_b: T.LongType() = pa.Field(nullable=True, ge=0)
    witness_value_a: T.StringType() = pa.Field(nullable=True)
    witness_value_b: T.StringType() = pa.Field(nullable=True)
    witness_hash_a: T.StringType() = pa.Field(nullable=True, description="sha256 of the value, TOMBSTONE or ABSENT")
    witness_hash_b: T.StringType() = pa.Field(nullable=True)
    touch_bound_a: VECTOR = pa.Field(nullable=True, description="U(v)")
    reach_a: VECTOR = pa.Field(nullable=True, description="M(v)")
    touch_bound_b: VECTOR = pa.Field(nullable=True, description="U(w)")
    reach_b: VECTOR = pa.Field(nullable=True, description="M(w)")
    last_offset_a: T.LongType() = pa.Field(nullable=True, ge=0, description="The key's last data row in replica_a")
    last_offset_b: T.LongType() = pa.Field(nullable=True, ge=0)
    last_hash_a: T.StringType() = pa.Field(
        nullable=True, description="Token of the last version (ABSENT for the pre-dump one; null when none)"
    )
    last_hash_b: T.StringType() = pa.Field(nullable=True)
    versions_a: T.LongType() = pa.Field(nullable=False, ge=0, description="Versions of the key, pre-dump one included")
    versions_b: T.LongType() = pa.Field(nullable=False, ge=0)

    class Config:
        name = "divergence_reports"
        strict = True


class DivergenceSummary(pa.DataFrameModel):
    """Key pairs per verdict for each pair of replicas holding the same topic partition, and the topic partition's keys.

    ``keys_compared`` ... ``in_flight`` count the keys of this replica pair (key pairs: a key of three replicas
    counts on each of its three pair rows). ``partition_keys_*`` count the topic partition's keys once each, under
    their worst verdict over all its pairs (DIVERGENT, then MISSING, IN_FLIGHT, CONSISTENT; SPEC 10), the same on every
    pair row of the partition: add them up over one row per topic partition. Null in snapshots audited before they
    existed.
    """

    snapshot_id: T.StringType() = pa.Field(nullable=False)
    topic: T.StringType() = pa.Field(nullable=False)
    partition: T.IntegerType() = pa.Field(nullable=False, ge=0)
    replica_a: T.StringType() = pa.Field(nullable=False)
    replica_b: T.StringType() = pa.Field(nullable=False)
    keys_compared: T.LongType() = pa.Field(nullable=False, ge=0)
    consistent: T.LongType() = pa.Field(nullable=False, ge=0)
    divergent: T.LongType() = pa.Field(nullable=False, ge=0)
    missing: T.LongType() = pa.Field(nullable=False, ge=0)
    in_flight: T.LongType() = pa.Field(nullable=False, ge=0)
    partition_keys_compared: T.LongType() = pa.Field(
        nullable=True, ge=0, description="Keys of the topic partition compared (each once, over all its pairs)"
    )
    partition_keys_consistent: T.LongType() = pa.Field(nullable=True, ge=0)
    partition_keys_divergent: T.LongType() = pa.Field(
        nullable=True, ge=0, description="Keys of the topic partition whose worst verdict is DIVERGENT"
    )
    partition_keys_missing: T.LongType() = pa.Field(nullable=True, ge=0)
    partition_keys_in_flight: T.LongType() = pa.Field(nullable=True, ge=0)

    class Config:
        name = "divergence_summary"
        strict = True
