"""A continuing snapshot's key as its divergence verdict saw it: the carried version and the stream's bounds.

A snapshot S whose dump of a replica partition continues an earlier snapshot's state
(docs/incremental.md) is compared with that state: the key's last version carried from the
state joins S's rows at its real offset, and S's rows take the stream's bounds. The
divergence stage computes them with Spark (``pipelines/state/carry.py``, ``carry_over``); for one key,
this module computes the same, in plain Python, from what the tables keep:

- the predecessor's commit context (its ``replica_state`` CONTEXT row: the stream's P,
  START_OF_PUSH, ``L(end)``, last offset, gap positions and first gap so far);
- the key's carried version (the predecessor's VERSION row, if the key has one);
- S's own ``partition_watermarks`` row and the key's ``reconstructed_watermarks`` rows.

``continue_stream`` returns S's rows rewritten as ``carry_over`` rewrites them (the rows of a
verified overlap, at or below the state's last offset, left out), the carried version first,
and the stream-wide facts. ``tests/test_incremental.py`` checks every key of its scenarios
against ``carry_over``'s own output, so the two cannot drift apart unseen.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

Vector = dict[str, int]
_FROM_GAP_ROWS = object()  # the carried version's reach row is S's first gap row: the document finds it


def as_vector(value: Any) -> Optional[Vector]:
    """A map column as read (a dict, or Arrow's list of pairs) -> dict; None stays None."""
    if value is None:
        return None
    items = value.items() if isinstance(value, dict) else value
    return {str(k): int(v) for k, v in items}


def vmax(*vectors: Optional[Vector]) -> Vector:
    """Componentwise max; a null vector counts as empty (as ``pipelines.vectors.vector_max``)."""
    out: Vector = {}
    for vector in vectors:
        for region, offset in (vector or {}).items():
            out[region] = max(offset, out.get(region, offset))
    return out


@dataclass
class Stream:
    """What the stream holds of one replica partition when S continues a state (``carried_from`` in the document)."""

    previous_snapshot_id: str
    previous_last_offset: int
    start_gap: int  # positions between the state's last offset and S's first offset (SPEC 3a)
    starts_with_sop: bool  # the stream's first dump started with START_OF_PUSH
    pre_history_bound: Optional[Vector]  # P of the stream (None: unknown)
    end_lower_bound: Vector  # L(end) of the stream: the state's, raised by S's
    earlier_gap_positions: int  # positions missing before S: in earlier dumps and between the state and S
    first_gap_lower_bound: Optional[Vector]  # L after the stream's first gap
    first_gap_earlier: bool  # the stream's first gap lies before S's first row
    first_gap_row: Optional[int]  # the row right after the stream's first gap, when S holds it (else S's own)

    def as_json(self) -> dict:
        return {
            "previous_snapshot_id": self.previous_snapshot_id,
            "previous_last_offset": self.previous_last_offset,
            "gap_before_snapshot": self.start_gap,
            "stream_starts_with_start_of_push": self.starts_with_sop,
            "stream_pre_history_bound": self.pre_history_bound,
            "stream_end_lower_bound": self.end_lower_bound,
            "stream_gap_positions_before_snapshot": self.earlier_gap_positions,
        }


def absent_dump(context: dict, snapshot_id: str) -> dict:
    """The ``partition_watermarks`` row the audit makes for a replica partition its broker cut lists without rows in
    the snapshot (``pipelines/state/absent.py``, ``absent_watermarks``), from the CONTEXT row it continues: a dump
    right after the state that read nothing (``rows`` 0, no bounds of its own, no gap)."""
    return {
        "snapshot_id": snapshot_id, "replica": context["replica"], "topic": context["topic"],
        "partition": context["partition"], "first_offset": context["last_offset"] + 1,
        "last_offset": context["last_offset"], "starts_with_sop": False, "pre_history_bound": None,
        "pre_history_known": False, "end_lower_bound": {}, "rows": 0, "puts": 0, "deletes": 0, "heartbeats": 0,
        "gaps": 0, "gap_positions": 0, "first_gap_offset": None, "last_gap_offset": None,
        "first_gap_lower_bound": None, "absent": True,
    }


def continue_stream(
    dump: dict, context: dict, carried: Optional[dict], rows: list[dict]
) -> tuple[Stream, list[dict]]:
    """(the stream's facts, the key's rows as the comparison used them) for one continued replica partition.

    ``dump`` is S's ``partition_watermarks`` row, ``context`` the predecessor's CONTEXT row,
    ``carried`` the key's VERSION row in the predecessor's state (or None) and ``rows`` the
    key's ``reconstructed_watermarks`` rows in S. The returned rows carry the columns
    ``explain.document`` reads; the carried one has ``carried_from`` set and, where its reach
    rests on a row of an earlier dump, ``reach_row`` None and ``gap_after`` decided here.
    """
    prior_end = as_vector(context["end_lower_bound"]) or {}
    prior_last = context["last_offset"]
    prior_gaps = context.get("gap_positions") or 0
    prior_first_gap = as_vector(context.get("first_gap_lower_bound"))
    own_first_gap = as_vector(dump.get("first_gap_lower_bound"))
    # Positions read and skipped by rule between the state and S (``read_between``, from the reader) are not missing.
    start_gap = max(dump["first_offset"] - prior_last - 1 - (context.get("read_between") or 0), 0)
    pre_history = as_vector(context.get("pre_history_bound"))
    if pre_history is None:  # a stream whose P is unknown takes S's first heartbeat vector
        pre_history = as_vector(dump.get("pre_history_bound"))
    missing_before_snapshot = prior_gaps + start_gap
    if prior_first_gap is not None:  # in an earlier dump: its row is not in S
        first_gap, earlier, gap_row = prior_first_gap, True, None
    elif start_gap > 0:  # between the state and S: S's first row follows it
        first_gap, earlier, gap_row = prior_end, True, dump["first_offset"]
    elif own_first_gap is not None:
        first_gap, earlier, gap_row = vmax(prior_end, own_first_gap), False, None
    else:
        first_gap, earlier, gap_row = None, False, None
    stream = Stream(
        previous_snapshot_id=context["snapshot_id"], previous_last_offset=prior_last, start_gap=start_gap,
        starts_with_sop=bool(context["starts_with_sop"]), pre_history_bound=pre_history,
        end_lower_bound=vmax(prior_end, as_vector(dump["end_lower_bound"])),
        earlier_gap_positions=missing_before_snapshot, first_gap_lower_bound=first_gap, first_gap_earlier=earlier,
        first_gap_row=gap_row,
    )

    prior_touch = as_vector(carried["key_touch"]) if carried is not None else None
    own = sorted((r for r in rows if r["offset"] > prior_last), key=lambda r: r["offset"])
    out: list[dict] = []
    touched: Vector = {}
    for row in own:
        if row["source_region"] is not None and row["source_offset"] is not None:
            touched = vmax(touched, {row["source_region"]: row["source_offset"]})
        missing = row["missing_before"] + missing_before_snapshot
        if missing > 0:  # after a gap: the floor S's own watermarks gave it, and the carried touch
            own_touch = as_vector(row["touch_bound"])
            touch = None if own_touch is None else vmax(own_touch, prior_touch)
        else:
            touch = None if pre_history is None else vmax(pre_history, prior_touch, touched)
        out.append({**row, "applied_lower_bound": vmax(prior_end, as_vector(row["applied_lower_bound"])),
                    "touch_bound": touch, "reach": vmax(prior_end, as_vector(row["reach"])), "missing_before": missing})
    if carried is None:
        return stream, out

    carried_missing = carried.get("missing_before") or 0
    first_own = out[0] if out else None
    if prior_gaps > carried_missing:  # a gap after it in an earlier dump stopped its reach there
        reach, reach_row, cut = as_vector(carried["reach"]), None, True
    elif start_gap > 0:  # the gap between the state and S
        reach, reach_row, cut = prior_end, dump["first_offset"], True
    elif first_own is not None and first_own["missing_before"] == missing_before_snapshot:
        reach, reach_row, cut = first_own["applied_lower_bound"], first_own["offset"], False
    elif own_first_gap is not None:  # S's first gap lies before the key's first row in S (or S never writes it)
        reach, reach_row, cut = vmax(prior_end, own_first_gap), _FROM_GAP_ROWS, True
    else:
        reach, reach_row, cut = stream.end_lower_bound, None, False
    if carried_missing > 0:
        touch = as_vector(carried["touch_bound"])
    else:
        touch = None if pre_history is None else vmax(pre_history, prior_touch)
    version = {
        "offset": carried["offset"], "key": carried["key"], "kind": carried["kind"], "value": carried["value"],
        "value_hash": carried["value_hash"], "source_region": carried["source_region"],
        "source_offset": carried["source_offset"], "write_ts": carried.get("write_ts"),
        "applied_lower_bound": as_vector(carried["first_lower_bound"]), "touch_bound": touch, "reach": reach,
        "missing_before": 0, "carried_from": context["snapshot_id"],
        "origin_snapshot_id": carried.get("origin_snapshot_id"), "gap_after": cut, "gap_before": carried_missing > 0,
    }
    if reach_row is not _FROM_GAP_ROWS:
        version["reach_row"] = reach_row
    # Its reach is L at a row of an earlier dump (after a gap there): that row is not in this snapshot.
    version["reach_in_earlier_dump"] = prior_gaps > carried_missing
    return stream, [version, *out]
