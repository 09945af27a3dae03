"""One (topic, partition) of the simulation: every region's real-time topic, generated in order,
and every region's leader consuming them after its replication delays; when the partition is
done, its faults, anomalies, counts and files go to the ``_Plan``."""
from __future__ import annotations

import heapq
import random
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from replica_lens.simulator.config import _INF, BASE_MS, DELETE, FAILOVER, HEARTBEAT, LOGICAL_BITS, PUT
from replica_lens.simulator.damage import _complete_topic_proofs, _DamagedSink
from replica_lens.simulator.leader import _Leader

if TYPE_CHECKING:
    from replica_lens.simulator.plan import _Plan


class _PartitionSim:
    """One (topic, partition): every region's RT, and every region's leader consuming them."""

    def __init__(self, plan: "_Plan", ti: int, partition: int, folder: Path):
        cfg = plan.config
        self.plan = plan
        self.config = cfg
        self.regions = plan.regions
        self.letters = [r[3:] for r in self.regions]
        self.exporters = plan.exporters
        self.topic = plan.topics[ti]
        self.partition = partition
        self.seed_key = f"{cfg.seed}:{self.topic}:{partition}"
        self.rng = random.Random(f"partition:{self.seed_key}")
        self.warnings = plan.warnings
        self.used_keys: set[str] = set()
        tp = (ti, partition)
        self.keys_hot, self.keys_cold = plan.partition_keys(partition)
        self.counts = [plan.rt_writes[(ti, partition, x)] for x in range(len(self.regions))]
        total = sum(n + _heartbeats(n, cfg.heartbeat_every) for n in self.counts)
        self.conflicts = plan.conflicts.get(tp, [])
        for c in self.conflicts:
            self.used_keys.add(c["key"])
        self.failovers = plan.failovers.get(tp, {})
        self.leaders = []
        for i, name in enumerate(self.regions):
            limit = total - cfg.lag_messages if name == cfg.lagging_replica else total
            limit = max(0, limit)
            triggers = [(max(1, int(f * limit)), what) for f, what in plan.triggers.get((ti, partition, i), [])]
            sink = plan.make_sink(folder, name, self.topic, partition)
            if cfg.damaged:
                sink = _DamagedSink(sink, cfg, self.seed_key)
            self.leaders.append(_Leader(self, i, limit, triggers, sink))
        self.total = total

    def any_key(self) -> str:
        keys = self.keys_cold or self.keys_hot
        return keys[self.rng.randrange(len(keys))]

    def record_fault(self, leader: _Leader, fault: str, key: str, region: str, soff: int, vt_offset, **extra) -> None:
        entry = {
            "fault": fault, "replica": leader.name, "topic": self.topic, "partition": self.partition, "key": key,
            "source_region": region, "source_offset": soff, "vt_offset": vt_offset, **extra,
        }
        if fault in ("lost_write", "corrupted_value"):
            entry["final_state_differs"] = None  # filled when the partition is done
        self.plan.faults.append(entry)
        if fault == "duplicate_delivery":
            self.record_anomaly(leader, "DUPLICATE_OR_REWIND", "duplicate_delivery", vt_offset, key=key,
                                source_region=region, source_offset=soff,
                                original_offset=extra["original_vt_offset"])

    def record_anomaly(self, leader: _Leader, anomaly: str, cause: str, offset, **extra) -> None:
        entry = {"anomaly": anomaly, "cause": cause, "replica": leader.name, "topic": self.topic,
                 "partition": self.partition, "offset": offset, **extra}
        if offset is not None:
            entry["in_dump"] = offset >= (self.config.mid_stream_from or 0)
        self.plan.anomalies.append(entry)

    def _rt(self, x: int):
        """The messages of region x's RT, in order: (x, source_offset, kind, key, value, write_ts, t_us)."""
        cfg = self.config
        rng = random.Random(f"rt:{self.seed_key}:{self.regions[x]}")
        n = self.counts[x]
        every = cfg.heartbeat_every
        mean_us = cfg.write_interval_ms * 1000.0
        span = max(1, int(2 * mean_us) - 1)
        hot, cold = self.keys_hot, self.keys_cold
        if not cold:
            hot, cold = [], hot
        n_hot, n_cold = len(hot), len(cold)
        hot_share = cfg.hot_write_share if n_hot else 0.0
        del_frac = cfg.delete_fraction
        letter = self.letters[x]
        conflicts = sorted((c["t_us"], c["id"], c) for c in self.conflicts if x in c["region_idx"])
        ci = 0
        next_conflict = conflicts[0][0] if conflicts else _INF
        failover_times = self.failovers.get(x, [])
        fi = 0
        failover_at = failover_times[0] if failover_times else _INF
        t = int(rng.random() * mean_us)
        soff = 0
        last_phys = -1
        logical = 0
        rand = rng.random
        for i in range(n):
            t += 1 + int(rand() * span)
            phys = BASE_MS + t // 1000
            if phys == last_phys:
                logical += 1
            else:
                last_phys = phys
                logical = 0
            wts = (phys << LOGICAL_BITS) | logical
            if t >= next_conflict:
                c = conflicts[ci][2]
                ci += 1
                next_conflict = conflicts[ci][0] if ci < len(conflicts) else _INF
                k, val = c["key"], f"c{c['id']}{letter}"
                c["writes"].append({"source_region": self.regions[x], "source_offset": soff, "write_ts": wts,
                                    "value": val})
                yield (x, soff, PUT, k, val, wts, t)
            elif t >= failover_at:
                fi += 1
                failover_at = failover_times[fi] if fi < len(failover_times) else _INF
                yield (x, soff, FAILOVER, None, None, wts, t)
            else:
                if n_hot and rand() < hot_share:
                    k = hot[int(rand() * n_hot)]
                else:
                    k = cold[int(rand() * n_cold)]
                if rand() < del_frac:
                    yield (x, soff, DELETE, k, None, wts, t)
                else:
                    yield (x, soff, PUT, k, f"v{letter}{soff}", wts, t)
            soff += 1
            if (i + 1) % every == 0:
                yield (x, soff, HEARTBEAT, None, None, None, t)
                soff += 1
        if n == 0 or n % every:
            yield (x, soff, HEARTBEAT, None, None, None, t)

    def run(self) -> None:
        cfg = self.config
        nreg = len(self.regions)
        leaders = self.leaders
        # Replication delay from RT x to leader L: a fixed base per link plus jitter per message.
        delay_rng = random.Random(f"links:{self.seed_key}")
        base = [[0] * nreg for _ in range(nreg)]
        for L in range(nreg):
            for x in range(nreg):
                if L != x:
                    base[L][x] = int(cfg.replication_delay_ms * 1000 * (0.5 + delay_rng.random()))
        jitter = [[random.Random(f"jitter:{self.seed_key}:{L}:{x}").random for x in range(nreg)] for L in range(nreg)]
        last_arrival = [[0] * nreg for _ in range(nreg)]
        inflight: list[list] = [[] for _ in range(nreg)]
        gens = [self._rt(x) for x in range(nreg)]
        heads = []
        for x, gen in enumerate(gens):
            first = next(gen, None)
            if first is not None:
                heads.append((first[6], x, first))
        heapq.heapify(heads)
        push, pop = heapq.heappush, heapq.heappop
        pairs = [(leaders[L], inflight[L], base[L], jitter[L], last_arrival[L]) for L in range(nreg)]
        while heads:
            t, x, msg = heads[0]
            nxt = next(gens[x], None)
            if nxt is None:
                pop(heads)
            else:
                heapq.heapreplace(heads, (nxt[6], x, nxt))
            if msg[2] == FAILOVER:
                msg = leaders[x].make_retry(msg)
            soff = msg[1]
            for leader, queue, lbase, ljit, larr in pairs:
                b = lbase[x]
                arrival = t + (b + int(ljit[x]() * b) if b else int(ljit[x]() * 1000))
                if arrival < larr[x]:
                    arrival = larr[x]
                larr[x] = arrival
                push(queue, (arrival, x, soff, msg))
                # No later message can arrive before t: everything that arrived earlier is applied now.
                while queue and queue[0][0] < t:
                    item = pop(queue)
                    leader.apply(item[3], item[0])
        for leader, queue, *_ in pairs:
            while queue:
                item = pop(queue)
                leader.apply(item[3], item[0])
        for leader in leaders:
            leader.finish()
        self._finalize()

    def _finalize(self) -> None:
        plan = self.plan
        for leader in self.leaders:
            if leader.failover_soffs:
                self.warnings.append(
                    f"failover_clock_behind in {leader.name} {self.topic}/{self.partition} fell after the applied range"
                )
            pending = Counter(leader.armed + [w for _, w in leader.triggers])
            pending.update({
                "rewind": leader.rewinds, "heartbeat_under_report": leader.under, "stalled_heartbeat": leader.stalls,
                "wide_clock_interval": leader.wide, "exporter_regression": leader.exp_regress,
            })
            for what, n in pending.items():
                if n:
                    self.warnings.append(f"{n} {what} not injected in {leader.name} {self.topic}/{self.partition}")
            plan.natural_max_gap_ms = max(plan.natural_max_gap_ms, leader.natural_max_gap_ms)
            for k, clean in leader.shadow.items():
                actual = leader.win.get(k)
                differs = _final(actual) != _final(clean)
                for fault in plan.faults:
                    if (fault.get("final_state_differs", False) is None and fault["replica"] == leader.name
                            and fault["topic"] == self.topic and fault["partition"] == self.partition
                            and fault["key"] == k):
                        fault["final_state_differs"] = differs
                if differs:
                    plan.divergent.append({"topic": self.topic, "partition": self.partition, "key": k,
                                           "replicas": [leader.name]})
            for kind, n in leader.sink.counts.items():
                plan.rows[leader.name][kind] += n
            for kind, n in getattr(leader.sink, "records", {}).items():
                plan.venice_records.setdefault(leader.name, Counter())[kind] += n
            plan.files.extend(leader.sink.files)
        if self.config.damaged:
            damage, proofs = _complete_topic_proofs([leader.sink for leader in self.leaders])
            plan.damage.extend(damage)
            plan.complete_topic_proofs.extend(proofs)
        for c in self.conflicts:
            if len(c["writes"]) == 2:
                win = max(c["writes"], key=lambda w: (w["write_ts"], w["source_region"]))
                plan.conflict_entries.append({
                    "topic": self.topic, "partition": self.partition, "key": c["key"], "writes": c["writes"],
                    "winner": {"source_region": win["source_region"], "source_offset": win["source_offset"]},
                })
            else:
                self.warnings.append(f"conflicting write {c['id']} not injected: a region ran out of writes first")
        plan.upstream_messages += self.total
        plan.lagging.extend(
            {"replica": lead.name, "topic": self.topic, "partition": self.partition, "applied_messages": lead.n,
             "missing_messages": self.total - lead.n}
            for lead in self.leaders if lead.n < self.total
        )


def _final(state: Optional[tuple]) -> tuple:
    if state is None:
        return ("ABSENT",)
    return ("TOMBSTONE",) if state[2] is None else ("VALUE", state[2])


def _heartbeats(n: int, every: int) -> int:
    return n // every + (0 if n and n % every == 0 else 1)
