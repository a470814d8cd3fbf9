"""Lag-driven scaling simulated on an arrival trace: fixed replicas against the autoscaler, in SLO goodput and
worker-minutes.

The model, one tick (``dt_s``) at a time:

* **requests** wait in Kafka (FIFO) until a worker has a free slot; a worker decodes ``slots`` requests at once,
  each for ``service_s`` (a full batch's per-request time); latency = wait + service; a request is *good* when its
  latency is within ``slo_s``.
* **workers** cost from the moment they are asked for: ``start_s`` of cold start (scheduling, model load, joining the
  group), then serving; one told to go drains (takes nothing new, finishes what it holds) and costs until it is done.
* **rebalances**: every change of the group's members (a worker joins when ready, one leaves when drained) stops the
  whole group from taking new requests for ``rebalance_s`` (aiokafka's eager protocol: every member gives up its
  partitions and gets them back). Work in flight is not charged (specstream's worker keeps the requests of partitions
  it gets back; moved ones are regenerated: see docs/operations.md for the measured cost).
* **the autoscaler** observes every ``poll_s``: lag = requests waiting + held (specstream's workers commit only
  answered requests), and applies the same :class:`~streams.ops.scaling.Autoscaler` that ``specstream autoscale``
  runs, with the partition count as KEDA's cap.
"""
from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field

from streams.ops.scaling import Autoscaler, Load, ScalePolicy


@dataclass(frozen=True)
class WorkerModel:
    slots: int = 32
    service_s: float = 8.0
    start_s: float = 60.0
    rebalance_s: float = 3.0

    @property
    def capacity_rps(self) -> float:
        return self.slots / self.service_s


@dataclass(frozen=True)
class TraceShape:
    """A day compressed or not: a cosine between trough and peak, plus bursts of extra requests."""

    duration_s: float = 24 * 3600
    period_s: float = 24 * 3600
    trough_rps: float = 2.0
    peak_rps: float = 20.0
    bursts: int = 6
    burst_requests: int = 400
    burst_s: float = 30.0
    seed: int = 1


def arrivals(shape: TraceShape) -> list[float]:
    """Poisson arrivals with the shape's rate (thinning), plus the bursts; sorted times in seconds."""
    rng = random.Random(shape.seed)
    times: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(shape.peak_rps)
        if t >= shape.duration_s:
            break
        rate = shape.trough_rps + (shape.peak_rps - shape.trough_rps) * (1 - math.cos(2 * math.pi * t / shape.period_s)) / 2
        if rng.random() < rate / shape.peak_rps:
            times.append(t)
    for _ in range(shape.bursts):
        start = rng.uniform(0, shape.duration_s - shape.burst_s)
        times += [start + rng.uniform(0, shape.burst_s) for _ in range(shape.burst_requests)]
    return sorted(times)


@dataclass
class _Worker:
    ready_at: float
    busy: list[float] = field(default_factory=list)  # finish times (a heap)
    draining: bool = False
    joined: bool = False


@dataclass(frozen=True)
class SimulationResult:
    name: str
    requests: int
    good: int
    worker_minutes: float
    p50_s: float
    p99_s: float
    max_replicas: int
    scale_events: int

    @property
    def good_share(self) -> float:
        return self.good / self.requests if self.requests else 1.0


@dataclass
class Simulation:
    model: WorkerModel
    slo_s: float
    partitions: int
    dt_s: float = 1.0
    poll_s: float = 15.0

    def run(self, name: str, times: list[float], *, fixed: int | None = None,
            policy: ScalePolicy | None = None) -> SimulationResult:
        if (fixed is None) == (policy is None):
            raise ValueError("give either fixed replicas or a policy")
        scaler = Autoscaler(policy) if policy is not None else None
        workers = [_Worker(ready_at=0.0, joined=True) for _ in range(fixed or policy.min_replicas)]  # type: ignore[union-attr]
        queue: deque[float] = deque()
        latencies: list[float] = []
        paused_until = worker_s = 0.0
        next_poll, most, events, i = 0.0, len(workers), 0, 0
        end = (times[-1] if times else 0.0) + self.slo_s * 4
        t = 0.0
        while t < end or queue or any(w.busy for w in workers):
            while i < len(times) and times[i] < t + self.dt_s:
                queue.append(times[i])
                i += 1
            paused_until = self._membership(workers, t, paused_until)
            for w in workers:
                while w.busy and w.busy[0] <= t:
                    heapq.heappop(w.busy)
            if t >= paused_until:
                self._dispatch(workers, queue, latencies, t)
            if scaler is not None and t >= next_poll:
                next_poll = t + self.poll_s
                events += self._scale(scaler, workers, queue, t)
                most = max(most, sum(not w.draining for w in workers))
            worker_s += len(workers) * self.dt_s
            t += self.dt_s
        latencies.sort()
        good = sum(1 for x in latencies if x <= self.slo_s)
        pct = (lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else 0.0)
        return SimulationResult(name, len(latencies), good, worker_s / 60, pct(0.5), pct(0.99), most, events)

    def _membership(self, workers: list[_Worker], t: float, paused_until: float) -> float:
        """Workers that became ready join and drained ones leave; either is a rebalance of the whole group."""
        changed = False
        for w in workers:
            if not w.joined and not w.draining and t >= w.ready_at:
                w.joined = changed = True
        gone = [w for w in workers if w.draining and not w.busy]
        for w in gone:
            workers.remove(w)
            changed = changed or w.joined
        return t + self.model.rebalance_s if changed else paused_until

    def _dispatch(self, workers: list[_Worker], queue: deque[float], latencies: list[float], t: float) -> None:
        consuming = [w for w in workers if w.joined and not w.draining][: self.partitions]
        for w in consuming:
            while queue and len(w.busy) < self.model.slots:
                arrived = queue.popleft()
                finish = max(t, arrived) + self.model.service_s
                heapq.heappush(w.busy, finish)
                latencies.append(finish - arrived)

    def _scale(self, scaler: Autoscaler, workers: list[_Worker], queue: deque[float], t: float) -> int:
        serving = [w for w in workers if not w.draining]
        held = sum(len(w.busy) for w in serving)
        decision = scaler.decide(t, Load(len(queue) + held, held, self.partitions), len(serving))
        for _ in range(decision.replicas - len(serving)):
            workers.append(_Worker(ready_at=t + self.model.start_s))
        for w in reversed(serving[decision.replicas:]):
            w.draining = True
        return int(decision.replicas != len(serving))
