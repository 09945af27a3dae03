"""Damage to a dump after the fact (SPEC section 3a, ``compact_below`` and ``lose_records``):
``_DamagedSink`` holds a replica partition's rows until its history is complete, then writes
them compacted and with records lost; ``_complete_topic_proofs`` says what the complete
topic proves, the ground truth a damaged dump is audited against."""
from __future__ import annotations

import random

from replica_lens.simulator.config import SimulationConfig

_SOP, _DATA, _HB, _EXP = 0, 1, 2, 3


class _DamagedSink:
    """Holds a replica partition's rows until its history is complete, then writes them to ``sink``
    with the damage asked for: Kafka log compaction below ``compact_below`` of the partition's
    offsets, then records lost at random (``lose_records``). Offsets are never renumbered.

    The complete rows stay in ``complete_rows`` (SPEC fields the reference reads) until the
    partition's complete-topic proofs are computed; ``damage`` counts what was removed."""

    def __init__(self, sink, config: SimulationConfig, seed_key: str):
        self.sink = sink
        self.config = config
        self.preamble, self.chunking = 0, False  # not combined with the sinks that write more (SimulationConfig)
        self.rng = random.Random(f"lose:{seed_key}:{sink.replica}")
        self.calls: list[tuple] = []
        self.complete_rows: list[dict] = []
        self.damage: dict = {}

    @property
    def counts(self) -> dict:
        return self.sink.counts

    @property
    def files(self) -> list[str]:
        return self.sink.files

    def start_of_push(self, off, epoch) -> None:
        self.calls.append((_SOP, off, epoch))

    def data(self, off, epoch, key, value, src, soff, wts) -> None:
        self.calls.append((_DATA, off, epoch, key, value, src, soff, wts))

    def heartbeat(self, off, epoch, src, soff, vector, omin, omax, amin, amax) -> None:
        self.calls.append((_HB, off, epoch, src, soff, vector, omin, omax, amin, amax))

    def exporter_position(self, exporter, exported, reported_at) -> None:
        self.calls.append((_EXP, exporter, exported, reported_at))

    def close(self) -> None:
        calls, self.calls = self.calls, []
        sink = self.sink
        base = {"replica": sink.replica, "topic": sink.topic, "partition": sink.partition}
        # The newest offset of each Kafka key: a data row's record key, one key for all heartbeats.
        newest: dict = {}
        offsets = 0
        for c in calls:
            if c[0] == _DATA:
                newest[c[3]] = c[1]
            elif c[0] == _HB:
                newest[None] = c[1]
            if c[0] != _EXP:
                offsets = max(offsets, c[1] + 1)
        cut = int(self.config.compact_below * offsets) if self.config.compact_below is not None else 0
        lose = self.config.lose_records or 0.0
        skip_below = sink.skip_below
        compacted = lost = 0
        for c in calls:
            what = c[0]
            if what == _EXP:
                sink.exporter_position(*c[1:])
                continue
            off = c[1]
            if what == _SOP:
                self.complete_rows.append({**base, "offset": off, "kind": "START_OF_PUSH"})
                sink.start_of_push(*c[1:])
                continue
            if what == _DATA:
                _, _, _, key, value, src, soff, _ = c
                row = {**base, "offset": off, "kind": "DELETE" if value is None else "PUT", "key": key,
                       "source_region": src, "source_offset": soff}
                if value is not None:
                    row["value"] = value
                kafka_key = key
            else:
                _, _, _, src, soff, vector, omin = c[:7]
                row = {**base, "offset": off, "kind": "HEARTBEAT", "source_region": src, "source_offset": soff,
                       "hb_vector": None if vector is None else dict(vector), "origin_ts_min_ms": omin}
                kafka_key = None
            self.complete_rows.append(row)
            if off < cut and newest[kafka_key] != off:
                compacted += off >= skip_below
                continue
            if off >= skip_below and lose and self.rng.random() < lose:
                lost += 1
                continue
            if what == _DATA:
                sink.data(*c[1:])
            else:
                sink.heartbeat(*c[1:])
        self.damage = {**base, "offsets": offsets, "compaction_cut": cut, "compacted": compacted, "lost": lost}
        sink.close()


def _complete_topic_proofs(sinks: list[_DamagedSink]) -> tuple[list[dict], list[dict]]:
    """What the complete (undamaged) topic proves, by the plain-Python reading of SPEC sections 3-4:
    the damage of each replica partition's sink (in ``sinks``' order), and the keys proved
    DIVERGENT or MISSING. Takes the sinks' ``complete_rows``."""
    from replica_lens.reference import reference_verdicts

    damage, proofs = [], []
    rows = []
    for sink in sinks:
        damage.append(sink.damage)
        rows += sink.complete_rows
        sink.complete_rows = []
    for (topic, partition, a, b, key), finding in reference_verdicts(rows).items():
        if finding.verdict in ("DIVERGENT", "MISSING"):
            proofs.append({
                "topic": topic, "partition": partition, "replica_a": a, "replica_b": b, "key": key,
                "verdict": finding.verdict, "missing_in": finding.missing_in,
            })
    return damage, proofs
