"""The chaos run's faults: a seeded, reproducible schedule (the same seed and length give the same faults at the
same offsets), built before anything starts so the report can print it."""
from __future__ import annotations

import random
from dataclasses import dataclass

# Every service kind the deployment runs, and how many instances of each.
SERVICE_KINDS: dict[str, int] = {
    "edge": 2, "worker": 2, "parser": 1, "rag": 1, "tool-runner": 1, "batch-assembler": 1,
}

# Faults land in this part of the run: the first stretch warms every flow up, the last lets them finish.
WINDOW = (0.08, 0.82)
# A broker fault and the next one are this far apart (so at most one broker is out at a time: min ISR 2 of 3).
BROKER_GAP_S = 25.0
# Two kills of one service kind are at least this far apart (both workers are never down at once by design).
SAME_KIND_GAP_S = 20.0
# Edge restarts (kill -9 or SIGTERM) are this far apart: an edge takes 10-20 s to serve again on a loaded machine,
# and clients fall over to the other edge meanwhile, as behind a load balancer.
EDGE_GAP_S = 45.0


@dataclass(frozen=True)
class Fault:
    at_s: float  # seconds into the load
    kind: str  # kill | term | broker-kill | broker-pause | redis-restart | poison | reply-topic-delete
    target: str = ""  # a service instance ("worker-2"), or "" where the kind names it
    hold_s: float = 0.0  # broker down / paused for, restart delay of a killed service

    def describe(self) -> str:
        what = f"{self.kind} {self.target}".strip()
        return f"{self.at_s:7.1f}s  {what}" + (f" ({self.hold_s:g}s)" if self.hold_s else "")


def instances(kind: str) -> list[str]:
    count = SERVICE_KINDS[kind]
    return [kind] if count == 1 else [f"{kind}-{i + 1}" for i in range(count)]


def build(seed: int, seconds: float, *, kills_per_kind: int, broker_down_s: float, broker_pause_s: float,
          poison_rounds: int) -> list[Fault]:
    """Every fault the issue lists, at seeded offsets within WINDOW of a ``seconds``-long load, sorted by time."""
    rng = random.Random(seed)
    lo, hi = WINDOW[0] * seconds, WINDOW[1] * seconds
    faults: list[Fault] = []
    for kind in SERVICE_KINDS:
        if kind == "edge":
            continue
        for at in _spread(rng, lo, hi, kills_per_kind, SAME_KIND_GAP_S):
            faults.append(Fault(round(at, 1), "kill", rng.choice(instances(kind)), hold_s=round(rng.uniform(1, 4), 1)))
    # Edges: the kills, and one edge stopped gracefully while its websockets are open, one edge at a time.
    edge_kinds = ["kill"] * kills_per_kind + ["term"]
    rng.shuffle(edge_kinds)
    for at, kind in zip(_spread(rng, lo, hi, len(edge_kinds), EDGE_GAP_S), edge_kinds, strict=True):
        hold = round(rng.uniform(1, 4), 1) if kind == "kill" else 0.0
        faults.append(Fault(round(at, 1), kind, rng.choice(instances("edge")), hold_s=hold))
    broker = _spread(rng, lo, hi, 2, BROKER_GAP_S + max(broker_down_s, broker_pause_s))
    order = ["broker-kill", "broker-pause"]
    rng.shuffle(order)
    for at, kind in zip(broker, order, strict=True):
        hold = broker_down_s if kind == "broker-kill" else broker_pause_s
        faults.append(Fault(round(at, 1), kind, hold_s=hold))
    faults.append(Fault(round(rng.uniform(lo, hi), 1), "redis-restart", hold_s=round(rng.uniform(1, 3), 1)))
    for at in _spread(rng, lo, hi, poison_rounds, 5.0):
        faults.append(Fault(round(at, 1), "poison"))
    faults.append(Fault(round(rng.uniform(lo, hi), 1), "reply-topic-delete", rng.choice(instances("edge"))))
    return sorted(faults, key=lambda f: f.at_s)


def _spread(rng: random.Random, lo: float, hi: float, count: int, gap: float) -> list[float]:
    """``count`` offsets in [lo, hi], at least ``gap`` apart (evenly spaced slots, each jittered within its own)."""
    if count <= 0:
        return []
    slot = (hi - lo) / count
    if slot < gap:
        raise ValueError(f"{count} faults {gap:g}s apart do not fit in {hi - lo:.0f}s: run longer")
    return [lo + i * slot + rng.uniform(0, slot - gap) for i in range(count)]
