"""The plain-Python reference of SPEC sections 2-4 and 3a, for tests: ``replica_lens/reference.py``,
plus helpers that build streams by hand."""
from __future__ import annotations

from typing import Optional

from replica_lens.reference import (  # noqa: F401  (re-exported for the tests)
    ABSENT,
    TOMBSTONE,
    Dump,
    Finding,
    Place,
    Vector,
    Version,
    blocking,
    build_dump,
    compare_key,
    contribution,
    dumps_of,
    find_gaps,
    leq,
    reference_verdicts,
    resolution,
    token,
    vmax,
)


# Building streams by hand, for the tests' scenarios: one dict per message, offsets assigned in order.

def sop() -> dict:
    return {"kind": "START_OF_PUSH"}


def put(key: str, value: str, region: str, source_offset: int, write_ts: Optional[int] = None) -> dict:
    return {"kind": "PUT", "key": key, "value": value, "source_region": region,
            "source_offset": source_offset, "write_ts": write_ts}


def delete(key: str, region: str, source_offset: int, write_ts: Optional[int] = None) -> dict:
    return {"kind": "DELETE", "key": key, "source_region": region, "source_offset": source_offset,
            "write_ts": write_ts}


def heartbeat(region: str, source_offset: int, vector: Optional[Vector] = None, origin_ms: int = 1_000,
              applied_ms: int = 2_000) -> dict:
    return {"kind": "HEARTBEAT", "source_region": region, "source_offset": source_offset, "hb_vector": vector,
            "origin_ts_min_ms": origin_ms, "origin_ts_max_ms": origin_ms + 5,
            "applied_ts_min_ms": applied_ms, "applied_ts_max_ms": applied_ms + 5}


def stream(replica: str, topic: str, messages: list[dict], partition: int = 0, first_offset: int = 0) -> list[dict]:
    """One replica's dump of a topic partition: the messages at consecutive offsets."""
    return [
        {"replica": replica, "topic": topic, "partition": partition, "offset": first_offset + i, **m}
        for i, m in enumerate(messages)
    ]
