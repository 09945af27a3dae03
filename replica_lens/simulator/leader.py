"""The leader of one region for one (topic, partition): it applies every RT's messages in
arrival order, resolves them last-writer-wins, writes its version topic through its sink,
emits heartbeats and exporter reports, and injects the faults and stream anomalies it is
armed with (recording each at its exact position through its ``_PartitionSim``)."""
from __future__ import annotations

import random
from typing import TYPE_CHECKING, Optional

from replica_lens.simulator.config import _INF, BASE_MS, DELETE, HEARTBEAT, LOGICAL_BITS, PUT

if TYPE_CHECKING:
    from replica_lens.simulator.partition import _PartitionSim


class _Leader:
    """The leader of one region for one (topic, partition): applies messages and writes its VT."""

    def __init__(self, sim: "_PartitionSim", idx: int, limit: int, triggers: list[tuple[int, str]], sink):
        self.sim = sim
        self.idx = idx
        self.name = sim.regions[idx]
        self.limit = limit  # messages this leader applies (fewer than all for the lagging replica)
        self.sink = sink
        self.n = 0
        self.off = 0
        self.epoch = 1
        self.full_vectors = sim.config.full_heartbeat_vectors
        self.now = 0  # applied clock, microseconds since BASE_MS
        self.floor = 0  # a stalled leader applies nothing before this time
        self.win: dict[str, tuple] = {}  # key -> (write_ts, source idx, value or None, vt offset)
        self.wm = [-1] * len(sim.regions)  # applied high watermark per source region
        self.shadow: dict[str, Optional[tuple]] = {}  # fault keys: the state without the fault
        self.triggers = sorted(triggers, reverse=True)
        self.next_arm = self.triggers[-1][0] if self.triggers else _INF
        self.armed: list[str] = []  # faults waiting for an eligible data message
        self.slow = False
        self.dup: Optional[dict] = None  # pending duplicate delivery
        self.rewinds = 0
        self.recent: list[tuple] = []  # recent data rows, collected while a rewind is armed
        self.failover_soffs: set[int] = set()  # RT offsets of this region's pending fail-over retries
        # Heartbeat anomalies.
        self.wide = 0
        self.stalls = 0
        self.gap_open: Optional[dict] = None
        self.under = 0
        self.under_waited = 0
        self.seg: Optional[list[tuple]] = None  # data rows since the last heartbeat, while an under-report waits
        self.last_true_hb: Optional[list[int]] = None
        self.last_hb_amid: Optional[int] = None
        self.natural_max_gap_ms = 0
        # Exporters.
        self.exp_rng = random.Random(f"exporters:{sim.seed_key}:{self.name}")
        self.exp_max = [-1] * len(sim.exporters)
        self.exp_at = [0] * len(sim.exporters)
        self.exp_regress = 0
        self.every = sim.config.exporter_report_every
        self.next_report = self.every - 1
        sink.start_of_push(0, self.epoch)
        self.off = 1 + sink.preamble
        self.chunking = sink.chunking
        # Rows written so far plus one: the offset of the next row where every row takes one offset. What
        # waits for a number of rows (a duplicate delivery) counts these, so that records a sink writes
        # beside the rows (chunks, control messages) leave the history as it is.
        self.rows = 1

    # ---- the hot path

    def apply(self, msg: tuple, arrival: int) -> None:
        if self.n >= self.limit:
            return
        self.n += 1
        if self.n >= self.next_arm:
            self._arm()
        self.now = arrival if arrival > self.floor else self.floor
        x = msg[0]
        self.wm[x] = msg[1]
        if self.slow:
            self._apply_slow(msg)
            return
        if msg[2] == HEARTBEAT:
            self._heartbeat(x, msg[1], msg[6])
            return
        k = msg[3]
        wts = msg[5]
        cur = self.win.get(k)
        if cur is not None and (wts < cur[0] or (wts == cur[0] and x <= cur[1])):
            return  # loses last-writer-wins: nothing written, the watermark has advanced
        if self.chunking:
            off = self._take(k, msg[4])
        else:
            off = self.off
            self.off = off + 1
            self.rows += 1
        self.win[k] = (wts, x, msg[4], off)
        self.sink.data(off, self.epoch, k, msg[4], self.sim.regions[x], msg[1], wts)
        if off >= self.next_report:
            self._report()

    # ---- faults and anomalies

    def _arm(self) -> None:
        while self.triggers and self.triggers[-1][0] <= self.n:
            _, what = self.triggers.pop()
            if what == "rewind":
                self.rewinds += 1
                self.recent = []
            elif what == "heartbeat_under_report":
                self.under += 1
            elif what == "stalled_heartbeat":
                self.stalls += 1
            elif what == "wide_clock_interval":
                self.wide += 1
            elif what == "exporter_regression":
                self.exp_regress += 1
            else:
                self.armed.append(what)
        self.next_arm = self.triggers[-1][0] if self.triggers else _INF
        self._update_slow()

    def _update_slow(self) -> None:
        self.slow = bool(
            self.armed or self.shadow or self.dup or self.rewinds or self.under or self.failover_soffs
        )

    def _apply_slow(self, msg: tuple) -> None:
        x, soff, kind, k, val, wts, t = msg
        if kind == HEARTBEAT:
            self._heartbeat(x, soff, t)
            self._after_row(None)
            return
        if x == self.idx and soff in self.failover_soffs:
            self._failover_row(msg)
            return
        if k in self.shadow:
            s = self.shadow[k]
            if s is None or wts > s[0] or (wts == s[0] and x > s[1]):
                self.shadow[k] = (wts, x, val)
        cur = self.win.get(k)
        if cur is not None and (wts < cur[0] or (wts == cur[0] and x <= cur[1])):
            return
        fault = None
        if self.armed and k not in self.sim.used_keys:
            for i, what in enumerate(self.armed):
                if (what == "corrupted_value" and val is None) or (what == "duplicate_delivery" and self.dup):
                    continue
                fault = self.armed.pop(i)
                self.sim.used_keys.add(k)
                break
        region = self.sim.regions[x]
        if fault == "lost_write":
            self.shadow[k] = (wts, x, val)
            self.sim.record_fault(self, "lost_write", k, region, soff, None, write_ts=wts, value=val)
            self._update_slow()
            return
        stored = val
        if fault == "corrupted_value":
            stored = val + "-corrupt"
            self.shadow[k] = (wts, x, val)
        off = self._data_row(k, stored, region, soff, wts)
        self.win[k] = (wts, x, stored, off)
        if fault == "corrupted_value":
            self.sim.record_fault(self, "corrupted_value", k, region, soff, off, write_ts=wts, value=val,
                                  written_value=stored)
        elif fault == "duplicate_delivery":
            gap = self.sim.rng.randint(0, 3)
            self.dup = {"due": self.rows + gap, "row": (k, stored, region, soff, wts), "x": x, "original": off}
        self._after_row((k, stored, region, soff, wts))
        self._update_slow()

    def _data_row(self, k, val, region, soff, wts) -> int:
        """Write a data row (after a due or same-key pending duplicate) and return its offset."""
        if self.dup is not None and (self.dup["due"] <= self.rows or self.dup["row"][0] == k):
            self._flush_dup()
        return self._write(k, val, region, soff, wts)

    def _write(self, k, val, region, soff, wts) -> int:
        """Write a data row at the next offset; return it."""
        off = self._take(k, val)
        self.sink.data(off, self.epoch, k, val, region, soff, wts)
        if self.seg is not None:
            self.seg.append((off, region, soff))
        if off >= self.next_report:
            self._report()
        return off

    def _take(self, k: str, val: Optional[str]) -> int:
        """The offset of the next data row, after the records the sink writes before it; the offsets of
        those it writes after it are taken too (chunks and chunk cleanups of raw Venice records)."""
        off = self.off
        self.rows += 1
        if self.chunking:
            before, after = self.sink.reserve(off, k, val)
            off += before
            self.off = off + 1 + after
        else:
            self.off = off + 1
        return off

    def _flush_dup(self) -> None:
        dup, self.dup = self.dup, None
        k, val, region, soff, wts = dup["row"]
        off = self._write(k, val, region, soff, wts)
        cur = self.win[k]
        self.win[k] = (cur[0], cur[1], cur[2], off)
        self.recent = []
        self.sim.record_fault(self, "duplicate_delivery", k, region, soff, off, write_ts=wts, value=val,
                              original_vt_offset=dup["original"])
        self._update_slow()

    def _after_row(self, data_row: Optional[tuple]) -> None:
        """Bookkeeping after a row in slow mode: a due duplicate, then a rewind once its span is ready."""
        if self.dup is not None and self.dup["due"] <= self.rows:
            self._flush_dup()
            return
        if not self.rewinds or self.dup is not None:
            return
        if data_row is None:
            self.recent = []
            return
        keys = [r[0] for r in self.recent]
        if data_row[0] in keys:
            self.recent = self.recent[keys.index(data_row[0]) + 1:]
        self.recent.append(data_row)
        if len(self.recent) >= self.sim.config.rewind_span:
            self._rewind()

    def _rewind(self) -> None:
        # The span is the latest rows and holds each key once, so re-applying it leaves every
        # key at its current value and write_ts: only DUPLICATE_OR_REWIND can flag it.
        span, self.recent = self.recent, []
        self.rewinds -= 1
        offsets = []
        for k, val, region, soff, wts in span:
            off = self._data_row(k, val, region, soff, wts)
            cur = self.win[k]
            self.win[k] = (cur[0], cur[1], cur[2], off)
            offsets.append(off)
        first = span[0]
        self.sim.record_anomaly(
            self, "DUPLICATE_OR_REWIND", "rewind", offsets[0], offsets=offsets, key=first[0],
            source_region=first[2], source_offset=first[3],
            rewound=[{"offset": o, "key": r[0], "source_region": r[2], "source_offset": r[3]} for o, r in zip(offsets, span)],
        )
        self._update_slow()

    def make_retry(self, msg: tuple) -> tuple:
        """Fill the fail-over placeholder of this region's RT: a client retry stamped by a clock behind."""
        best = None
        for k, cur in self.win.items():
            if cur[1] == self.idx and k not in self.sim.used_keys and (best is None or cur[3] > best[1][3]):
                best = (k, cur)
        x, soff, _, _, _, slot_wts, t = msg
        if best is None:
            self.sim.warnings.append(
                f"failover_clock_behind not injected in {self.name} {self.sim.topic}/{self.sim.partition}: "
                "no key written from this region yet"
            )
            k = self.sim.any_key()
            return (x, soff, PUT, k, f"v{self.sim.letters[x]}{soff}", slot_wts, t)
        k, cur = best
        self.sim.used_keys.add(k)
        behind = max(0, (cur[0] >> LOGICAL_BITS) - self.sim.config.failover_behind_ms) << LOGICAL_BITS
        self.failover_soffs.add(soff)
        self._update_slow()
        return (x, soff, PUT if cur[2] is not None else DELETE, k, cur[2], behind, t)

    def _failover_row(self, msg: tuple) -> None:
        x, soff, kind, k, _, wts, _ = msg
        self.failover_soffs.discard(soff)
        cur = self.win[k]
        # The new leader trusts its own clock and writes the retry without conflict resolution;
        # it re-writes the key's current value, and keeps the key's conflict metadata, so the
        # replicas still agree on values. Every other leader drops the message by LWW.
        self.epoch += 1
        off = self._data_row(k, cur[2], self.name, soff, wts)
        self.win[k] = (cur[0], cur[1], cur[2], off)
        self.sim.record_anomaly(
            self, "WRITE_TS_REGRESSION", "failover_clock_behind", off, key=k, source_region=self.name,
            source_offset=soff, write_ts=wts, previous_offset=cur[3], previous_write_ts=cur[0],
            leader_epoch=self.epoch, previous_leader_epoch=self.epoch - 1,
        )
        # The retry is not the key's current write, so no rewind may re-apply it.
        self._after_row(None)
        self._update_slow()

    # ---- heartbeats and exporter reports

    def _heartbeat(self, x: int, soff: int, t_origin: int) -> None:
        sim = self.sim
        if self.dup is not None and self.dup["due"] <= self.rows:
            self._flush_dup()
        off = self.off
        self.off = off + 1
        self.rows += 1
        d = sim.config.clock_uncertainty_ms
        amid = BASE_MS + self.now // 1000
        omid = BASE_MS + t_origin // 1000
        wm = self.wm
        regions = sim.regions
        # Own mode: the row carries no hb_vector, only (source_region, source_offset).
        vector = [(regions[i], wm[i]) for i in range(len(wm)) if wm[i] >= 0] if self.full_vectors else None
        anomalies = []
        if self.under:
            vector = self._under_report(off, x, vector, anomalies)
        if not anomalies:  # an under-reported vector is no baseline for the next one
            self.last_true_hb = list(wm)
        half = d
        if self.wide:
            self.wide -= 1
            half = sim.config.wide_clock_ms
            anomalies.append(("CLOCK_UNCERTAINTY", "wide_clock_interval",
                              {"interval": "applied", "width_ms": 2 * half}))
        self.sink.heartbeat(off, self.epoch, regions[x], soff, vector, omid - d, omid + d, amid - half, amid + half)
        if self.gap_open is not None:
            gap = self.gap_open
            self.gap_open = None
            anomalies.append(("HEARTBEAT_GAP", "stalled_heartbeat",
                              {"previous_offset": gap["offset"], "gap_ms": amid - gap["amid"]}))
        elif self.last_hb_amid is not None:
            self.natural_max_gap_ms = max(self.natural_max_gap_ms, amid - self.last_hb_amid)
        self.last_hb_amid = amid
        if self.stalls:
            self.stalls -= 1
            self.floor = self.now + sim.config.stall_ms * 1000
            self.gap_open = {"offset": off, "amid": amid}
        for anomaly, cause, extra in anomalies:
            sim.record_anomaly(self, anomaly, cause, off, source_region=regions[x], source_offset=soff, **extra)
        if off >= self.next_report:
            self._report()

    def _under_report(self, off: int, x: int, vector: list, anomalies: list) -> list:
        """Lower one hb_vector component below the previous heartbeat's, when a segment is tracked."""
        if self.seg is None or self.last_true_hb is None:
            self.seg = []  # track the coming segment so that its data rows beyond the heartbeat are known
            return vector
        seg, self.seg = self.seg, []
        prev = self.last_true_hb
        regions = self.sim.regions
        best = None
        for c in range(len(regions)):
            if c == x or prev[c] < 1:
                continue
            beyond = [r for r in seg if r[1] == regions[c] and r[2] > prev[c] - 1]
            if best is None or len(beyond) < len(best[1]):
                best = (c, beyond)
        self.under_waited += 1
        # Waiting a while for a segment with no rows from the lowered component keeps the
        # under-report from also putting data rows beyond it (listed exactly when it does).
        if best is None or (best[1] and self.under_waited < 50 and self.n < 0.9 * self.limit):
            return vector
        self.under_waited = 0
        c, beyond = best
        self.under -= 1
        if not self.under:
            self.seg = None
            self._update_slow()
        lowered = prev[c] - 1
        vector = [(r, lowered if r == regions[c] else o) for r, o in vector]
        anomalies.append(("HEARTBEAT_REGRESSION", "heartbeat_under_report",
                          {"component": regions[c], "reported": lowered, "earlier": prev[c]}))
        for row_off, region, soff in beyond:
            self.sim.record_anomaly(self, "DATA_BEYOND_HEARTBEAT", "heartbeat_under_report", row_off,
                                    source_region=region, source_offset=soff, heartbeat_offset=off)
        return vector

    def _report(self) -> None:
        self.next_report += self.every
        last = self.off - 1
        for e, name in enumerate(self.sim.exporters):
            lag = int(self.exp_rng.random() * self.every)
            position = min(last, max(self.exp_max[e], last - lag, 0))
            self._emit_report(e, name, position)
        if self.exp_regress:
            self._regress(self.exp_rng.randrange(len(self.sim.exporters)))

    def _regress(self, e: int) -> None:
        """One report of exporter e below its highest so far (needs a position of at least 1)."""
        if self.exp_max[e] < 1:
            return
        self.exp_regress -= 1
        position = int(self.exp_rng.random() * self.exp_max[e])
        earlier = self.exp_max[e]
        at = self._emit_report(e, self.sim.exporters[e], position)
        self.sim.record_anomaly(
            self, "EXPORTER_REGRESSION", "exporter_regression", None, exporter=self.sim.exporters[e],
            exported_offset=position, previous_exported_offset=earlier, reported_at_ms=at,
        )

    def _emit_report(self, e: int, name: str, position: int) -> int:
        at = max(self.exp_at[e] + 1, BASE_MS + self.now // 1000)
        self.exp_at[e] = at
        # A regression report stays below the maximum; later reports never go below it again.
        self.exp_max[e] = max(self.exp_max[e], position)
        self.sink.exporter_position(name, position, at)
        return at

    def finish(self) -> None:
        if self.dup is not None:
            self._flush_dup()
        last = self.off - 1
        # Regressions still armed when the stream ends (a short partition) go just before the
        # final reports, after a report high enough to regress from.
        while self.exp_regress and last >= 2:
            e = self.exp_rng.randrange(len(self.sim.exporters))
            if self.exp_max[e] < 1:
                self._emit_report(e, self.sim.exporters[e], max(1, last - int(self.exp_rng.random() * self.every)))
            self._regress(e)
        for e, name in enumerate(self.sim.exporters):
            lag = 0 if e == 0 else int(self.exp_rng.random() * self.every)
            self._emit_report(e, name, min(last, max(self.exp_max[e], last - lag, 0)))
        self.sink.close()
