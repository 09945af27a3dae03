"""The plain-Python reference's reading of SPEC section 3a (gaps in a dump's offsets), no Spark.

Every dump here is built by hand: ``stream`` lays messages at consecutive offsets, and a gap is
made by leaving rows out. Passing the left-out offsets as ``read_positions`` says they were read
(records skipped by rule, chunks), which must give back exactly the section 3 results.
"""
from __future__ import annotations

from tests.reference_leapfrog import (
    ABSENT,
    build_dump,
    compare_key,
    find_gaps,
    heartbeat,
    put,
    reference_verdicts,
    sop,
    stream,
)

A, B, C = "dc-a", "dc-b", "dc-c"


def without(rows: list[dict], *offsets: int) -> list[dict]:
    return [r for r in rows if r["offset"] not in offsets]


def test_gaps_are_the_unread_runs_between_read_positions():
    # Catches a gap counted at a position that was read (a skipped control message), a gap
    # invented before the first or after the last read position, or runs not merged.
    assert find_gaps([0, 1, 4, 5, 9]) == [(2, 3), (6, 8)]
    assert find_gaps([3]) == [] and find_gaps([]) == []
    rows = without(stream(A, "t", [sop(), put("k", "x", A, 0), put("j", "y", A, 1), put("k", "z", A, 2),
                                   put("j", "w", A, 3), put("k", "v", A, 4)]), 2, 3)
    dump = build_dump(rows)
    assert dump.gaps == [(2, 3)]
    assert dump.gap_before == {0: False, 1: False, 4: True, 5: False}
    read = build_dump(rows, read_positions=[3])
    assert read.gaps == [(2, 2)] and read.gap_before[4] is False
    assert build_dump(rows, read_positions=[2, 3]).gaps == []


def test_read_positions_give_back_the_section_3_results():
    # Catches read positions treated as gaps (a Venice dump with skipped control messages
    # would lose every proof behind its first control message).
    full = stream(A, "t", [put("k", "x", A, 0), heartbeat(A, 1, {A: 1}), put("k", "y", B, 0), put("j", "z", A, 2),
                           heartbeat(B, 1, {A: 2, B: 1}), put("k", "w", A, 3)], first_offset=10)
    # The same dump where 12 and 14 were read but carried no row (chunks, skipped control messages).
    holed = without(full, 12, 14)
    with_reads = build_dump(holed, read_positions=[12, 14])
    assert with_reads.gaps == [] and not any(with_reads.gap_before.values())
    # Section 3 by hand: P = {A: 1} (heartbeat 11), the key's running max, reach to the next row of the key.
    assert with_reads.pre_history == {A: 1}
    assert with_reads.touch == {10: {A: 1}, 13: {A: 2}, 15: {A: 3}}
    assert with_reads.reach == {10: {A: 2}, 13: {A: 3}, 15: {A: 3}}
    # Unread, the same positions are gaps: after them no heartbeat with a vector bounds anything.
    gapped = build_dump(holed)
    assert gapped.gaps == [(12, 12), (14, 14)]
    assert gapped.touch == {10: {A: 1}, 13: None, 15: None}
    assert gapped.reach == {10: {A: 1}, 13: {A: 2}, 15: {A: 3}}


def test_reach_stops_at_the_first_gap_after_a_version():
    # Catches a reach that runs on to the next row of the key (or the end) across a gap,
    # where the key may have been overwritten.
    rows = stream(A, "t", [sop(), put("k", "x", A, 0), put("j", "y", A, 1), put("m", "z", A, 2),
                           put("j", "u", B, 0), put("k", "w", A, 3), put("m", "q", B, 1)])
    dump = build_dump(without(rows, 3))
    # k=x at 1: its next row is at 5, the gap (3, 3) lies between: M = L(4), the first row after it.
    assert dump.reach[1] == dump.lower_bounds[4] == {A: 1}
    assert dump.reach[1] != dump.lower_bounds[5]
    # j=y at 2 likewise; j=u at 4 and k=w at 5 lie after the only gap: as in section 3.
    assert dump.reach[2] == {A: 1}
    assert dump.reach[4] == dump.end and dump.reach[5] == dump.end
    # The end of the dump has no gap after the last row: m=q at 6 reaches L(end).
    assert dump.reach[6] == dump.end == {A: 3, B: 1}


def test_reach_to_the_end_stops_at_a_gap_after_the_last_version():
    # Catches a last version whose reach is L(end) although a gap follows it.
    rows = stream(A, "t", [put("k", "x", A, 0), put("j", "y", A, 1), put("j", "z", A, 2), put("j", "w", A, 3)])
    dump = build_dump(without(rows, 2))
    assert dump.reach[0] == dump.lower_bounds[3] == {A: 1}
    assert dump.end == {A: 3}


def test_bottom_reach_stops_at_the_first_gap_of_the_dump():
    # Catches a pre-dump version whose reach is L(first row of k) although a gap lies before
    # that row, and a never-seen key that reaches L(end) across a gap.
    rows = stream(A, "t", [sop(), put("j", "y", A, 0), put("k", "x", A, 1), put("j", "z", A, 2),
                           put("m", "u", A, 3), put("k", "w", A, 4)])
    dump = build_dump(without(rows, 2, 4))  # gaps (2, 2) and (4, 4)
    bottom = {key: dump.versions(key)[0] for key in ("j", "k", "m", "never")}
    assert all(v.offset is None and v.token == ABSENT and v.touch == {} for v in bottom.values())
    assert bottom["j"].reach == dump.lower_bounds[1] == {}  # its first row comes before every gap
    assert bottom["k"].reach == dump.lower_bounds[3] == {A: 0}  # L(g), g = 3, the first row after the first gap
    assert bottom["m"].reach == dump.lower_bounds[3]  # the first gap of the dump, not the one before m
    assert bottom["never"].reach == {A: 0}
    assert build_dump(rows).versions("never")[0].reach == {A: 4}  # no gap: L(end)


def test_touch_after_a_gap_takes_the_first_vector_heartbeat_after_the_last_gap_before_it():
    # Catches U(v) built on the dump's pre-history although a gap lies before v, on the last
    # heartbeat before v, on a heartbeat without hb_vector, or on the heartbeat after the
    # first gap instead of the last gap before v.
    rows = stream(A, "t", [
        heartbeat(A, 0, {A: 0}),            # 0: P of the dump
        put("k", "x", A, 1),                # 1
        put("j", "y", A, 2),                # 2  -> gap
        put("k", "z", B, 0),                # 3: gap (2, 2) before it
        heartbeat(B, 1),                    # 4: no hb_vector, skipped
        heartbeat(A, 3, {A: 3, B: 1}),      # 5: P_v of 3
        put("j", "w", B, 2),                # 6  -> gap
        put("k", "u", A, 4),                # 7: gap (6, 6) before it
        put("m", "q", A, 5),                # 8
        heartbeat(B, 3, {A: 5, B: 3}),      # 9: P_v of 7 and 8, after them
    ])
    dump = build_dump(without(rows, 2, 6))
    assert dump.touch[1] == {A: 1}  # no gap before it: max(P, {A: 1})
    assert dump.touch[3] == {A: 3, B: 1}  # max(P_v = hb 5, {A: 1}, {B: 0})
    assert dump.touch[7] == {A: 5, B: 3}  # P_v = hb 9, after v; the key's rows 1, 3, 7 are below it
    assert dump.touch[8] == {A: 5, B: 3}
    complete = build_dump(rows)
    assert complete.touch[3] == {A: 1, B: 0} and complete.touch[7] == {A: 4, B: 0}


def test_touch_with_running_max_of_the_key_above_the_heartbeat():
    # Catches P_v used alone, without the key's own rows at or before v (the record holds them).
    rows = stream(A, "t", [put("j", "y", A, 0), put("j", "w", A, 1), heartbeat(A, 1, {A: 1}),
                           put("k", "x", B, 7), put("k", "z", A, 9)])
    dump = build_dump(without(rows, 1))
    assert dump.touch[3] == {A: 1, B: 7}
    assert dump.touch[4] == {A: 9, B: 7}


def test_no_vector_heartbeat_after_the_last_gap_leaves_touch_unknown():
    # Catches a version after a gap given a touch bound (and so a proof) with nothing to bound
    # what the gap held, in a dump that starts with START_OF_PUSH too.
    rows = stream(A, "t", [sop(), put("k", "x", A, 0), put("j", "y", A, 1), put("k", "z", A, 2),
                           heartbeat(A, 3)])
    dump = build_dump(without(rows, 2))
    assert dump.pre_history == {}
    assert dump.touch[1] == {A: 0}
    assert dump.touch[3] is None
    other = build_dump(stream(B, "t", [sop(), put("k", "q", A, 2), heartbeat(A, 5, {A: 5})]))
    assert compare_key(dump, other, "k", A, B).verdict == "IN_FLIGHT"


def test_a_compacted_history_proves_nothing_the_complete_topic_does_not():
    # Catches the section 3 rules applied to a compacted dump: the pre-dump version of k in A
    # reaches past the removed k=x and "proves" a false DIVERGENT against B's k=x.
    history = [sop(), put("k", "x", A, 0), put("j", "z", A, 1), put("k", "y", B, 0), heartbeat(B, 1, {A: 1, B: 1})]
    a_complete = stream(A, "t", history)
    b = stream(B, "t", history)
    # Kafka compaction of A below offset 3: k's newest record is at 3, so k=x at 1 goes.
    a_compacted = without(a_complete, 1)
    complete = reference_verdicts(a_complete + b)
    assert complete[("t", 0, A, B, "k")].verdict == "CONSISTENT"
    # Today's rules: the compacted position read as if nothing were missing.
    today = reference_verdicts(a_compacted + b, read_positions={(A, "t", 0): [1]})
    assert today[("t", 0, A, B, "k")].verdict == "DIVERGENT"
    gaps = reference_verdicts(a_compacted + b)
    assert gaps[("t", 0, A, B, "k")].verdict == "CONSISTENT"
    assert all(f.verdict not in ("DIVERGENT", "MISSING") for f in gaps.values())


def test_a_lost_record_proves_no_missing_key():
    # Catches the never-seen key's pre-dump version reaching L(end) across the gap a lost
    # record left: A would be reported MISSING k although it wrote k.
    a_complete = stream(A, "t", [sop(), put("k", "x", A, 0), put("j", "z", A, 1), heartbeat(A, 2, {A: 2})])
    b = stream(B, "t", [sop(), put("k", "x", A, 0), put("j", "z", A, 1), heartbeat(A, 2, {A: 2})])
    lost = without(a_complete, 1)
    assert reference_verdicts(a_complete + b)[("t", 0, A, B, "k")].verdict == "CONSISTENT"
    today = reference_verdicts(lost + b, read_positions={(A, "t", 0): [1]})[("t", 0, A, B, "k")]
    assert (today.verdict, today.missing_in) == ("MISSING", A)
    assert reference_verdicts(lost + b)[("t", 0, A, B, "k")].verdict == "IN_FLIGHT"


def test_a_real_divergence_after_a_gap_is_still_proven():
    # Catches rules so cautious that a gap hides every proof: a heartbeat after the gap
    # bounds U, and a lost write of B is found against A's version after the gap.
    a_complete = stream(A, "t", [sop(), put("j", "y", A, 0), put("j", "w", A, 1), heartbeat(A, 2, {A: 2}),
                                 put("k", "x", A, 3), heartbeat(A, 4, {A: 4})])
    b = stream(B, "t", [sop(), put("j", "y", A, 0), put("j", "w", A, 1), heartbeat(A, 2, {A: 2}),
                        heartbeat(A, 4, {A: 4})])
    damaged = without(a_complete, 1)
    finding = reference_verdicts(damaged + b)[("t", 0, A, B, "k")]
    assert (finding.verdict, finding.missing_in) == ("MISSING", B)
    assert finding.witness_a.offset == 4 and finding.witness_a.touch == {A: 3}
