"""Load generation: closed loop (a fixed number of clients) or open loop (arrivals at a rate).

* Closed loop, ``--concurrency N``: N clients each send a request, wait for its
  last event, and send the next.
* Open loop, ``--request-rate R``: requests leave at seeded gamma/Poisson
  arrival times whether or not earlier ones have finished (optionally capped by
  ``--max-concurrency``). If the client itself falls behind its schedule the
  lag is recorded, so an overloaded client is visible rather than hidden.

Warmup requests run first (from their own seeded stream, so the measured
requests are the same whatever the warmup count) and are left out of every
figure. The measured window runs from the first measured send to the last
measured completion.
"""
from __future__ import annotations

import asyncio
import itertools
import math
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from streams.bench import arrivals
from streams.bench.backends.base import Backend
from streams.bench.record import RequestRecord, StreamChecker
from streams.bench.workload import BenchRequest


@dataclass(frozen=True)
class LoadSpec:
    concurrency: int | None = None  # closed loop
    rate: float | None = None  # open loop, requests per second (inf: all at once)
    burstiness: float = 1.0
    max_concurrency: int | None = None  # open loop: cap on requests in flight
    num_requests: int | None = None
    duration_s: float | None = None
    warmup: int = 0
    timeout_s: float = 120.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rate is None and not self.concurrency:
            raise ValueError("give --concurrency N (closed loop) or --request-rate R (open loop)")
        if self.rate is not None and self.concurrency:
            raise ValueError("--concurrency and --request-rate exclude each other (use --max-concurrency with a rate)")
        if self.num_requests is None and self.duration_s is None:
            raise ValueError("give --num-requests or --duration")
        if self.num_requests is not None and self.num_requests < 1:
            raise ValueError("--num-requests must be at least 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("--duration must be positive")

    @property
    def mode(self) -> str:
        return "closed" if self.rate is None else "open"

    def describe(self) -> dict[str, object]:
        return {
            "mode": self.mode, "concurrency": self.concurrency,
            "request_rate": None if self.rate is None else (self.rate if math.isfinite(self.rate) else "inf"),
            "burstiness": self.burstiness if self.rate is not None else None, "max_concurrency": self.max_concurrency,
            "num_requests": self.num_requests, "duration_s": self.duration_s, "warmup": self.warmup,
            "timeout_s": self.timeout_s, "seed": self.seed,
        }


@dataclass
class LoadRun:
    label: str
    load: LoadSpec
    records: list[RequestRecord]
    warmup_records: list[RequestRecord]
    t0: float
    t1: float
    schedule_lag: list[float] = field(default_factory=list)  # open loop: actual send - scheduled send
    active_s: float | None = None  # several measured windows (rounds): their total length

    @property
    def duration_s(self) -> float:
        return max(self.active_s if self.active_s is not None else self.t1 - self.t0, 1e-9)


def merge_outcomes(label: str, outcomes: list[LoadRun], load: LoadSpec | None = None) -> LoadRun:
    """One outcome from several measured windows of the same backend (the rounds of --compare-inprocess).

    Throughput divides by the windows' total length, so time spent measuring
    the other backend between them is not counted.
    """
    first = outcomes[0]
    records = sorted((r for o in outcomes for r in o.records), key=lambda r: r.request.index)
    return LoadRun(
        label=label, load=load or first.load, records=records, warmup_records=[r for o in outcomes for r in o.warmup_records],
        t0=first.t0, t1=outcomes[-1].t1, schedule_lag=[x for o in outcomes for x in o.schedule_lag],
        active_s=sum(o.duration_s for o in outcomes),
    )


class ProgressSink:
    """What the runner reports to (a rich progress bar in the CLI; nothing in tests)."""

    def phase(self, name: str, total: int | None) -> None: ...

    def done(self, record: RequestRecord) -> None: ...


async def run_one(backend: Backend, record: RequestRecord, timeout_s: float) -> RequestRecord:
    checker = StreamChecker(record)
    record.start = time.perf_counter()
    try:
        await asyncio.wait_for(backend.run(record, checker), timeout_s)
    except (asyncio.TimeoutError, TimeoutError):
        checker.error(time.perf_counter(), "timeout", f"no final message within {timeout_s:g}s")
    except asyncio.CancelledError:
        raise
    except Exception as error:  # noqa: BLE001 - a client-side bug fails the request, not the run
        checker.error(time.perf_counter(), f"client:{type(error).__name__}", str(error))
    checker.close(time.perf_counter())
    return record


def _records(tag: str, backend: str, warmup: bool) -> Callable[[BenchRequest], RequestRecord]:
    def make(req: BenchRequest) -> RequestRecord:
        rid = f"{tag}-{'w' if warmup else ''}{req.index}"
        return RequestRecord(request=req, request_id=rid, backend=backend, warmup=warmup)

    return make


async def _closed(
    backend: Backend, source: Iterator[BenchRequest], make: Callable[[BenchRequest], RequestRecord], clients: int,
    timeout_s: float, stop_at: float | None, sink: ProgressSink, out: list[RequestRecord],
) -> None:
    async def client() -> None:
        while True:
            if stop_at is not None and time.perf_counter() >= stop_at:
                return
            try:
                req = next(source)
            except StopIteration:
                return
            record = make(req)
            out.append(record)
            await run_one(backend, record, timeout_s)
            sink.done(record)
            if stop_at is not None and getattr(backend, "dead", False):
                return  # a backend that never started: one failure per client says it, not a flood of them

    await asyncio.gather(*(client() for _ in range(clients)))


async def _open(
    backend: Backend, source: Iterator[BenchRequest], make: Callable[[BenchRequest], RequestRecord], load: LoadSpec,
    t0: float, sink: ProgressSink, out: list[RequestRecord], lag: list[float],
) -> None:
    assert load.rate is not None
    gaps = arrivals.gaps(load.rate, load.burstiness, load.seed)
    limit = asyncio.Semaphore(load.max_concurrency) if load.max_concurrency else None
    tasks: list[asyncio.Task[None]] = []
    offset = 0.0

    async def send(record: RequestRecord) -> None:
        try:
            await run_one(backend, record, load.timeout_s)
            sink.done(record)
        finally:
            if limit is not None:
                limit.release()

    for i in itertools.count():
        if i:
            offset += next(gaps)
        if load.duration_s is not None and offset >= load.duration_s:
            break
        try:
            req = next(source)
        except StopIteration:
            break
        delay = t0 + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if limit is not None:
            await limit.acquire()
        if load.duration_s is not None and time.perf_counter() - t0 >= load.duration_s:
            if limit is not None:
                limit.release()
            break  # the schedule is behind (capped concurrency or an infinite rate): the window is over
        lag.append(max(0.0, time.perf_counter() - (t0 + offset)))
        record = make(req)
        record.scheduled_s = offset
        out.append(record)
        tasks.append(asyncio.create_task(send(record)))
    await asyncio.gather(*tasks)


async def run_load(
    backend: Backend,
    requests: Iterator[BenchRequest],
    load: LoadSpec,
    *,
    warmup_requests: list[BenchRequest] = (),  # type: ignore[assignment]
    sink: ProgressSink | None = None,
    label: str = "",
    tag: str | None = None,
) -> LoadRun:
    """Run warmup then the measured load on a started backend."""
    sink = sink or ProgressSink()
    tag = tag or f"bench-{uuid.uuid4().hex[:8]}"
    warm = await warm_up(backend, list(warmup_requests), load, sink=sink, tag=tag)
    source: Iterator[BenchRequest] = requests
    if load.num_requests is not None:
        source = itertools.islice(requests, load.num_requests)
    sink.phase(label or "measure", load.num_requests)
    records: list[RequestRecord] = []
    lag: list[float] = []
    t0 = time.perf_counter()
    make = _records(tag, backend.name, False)
    if load.rate is None:
        stop_at = t0 + load.duration_s if load.duration_s is not None else None
        await _closed(backend, source, make, load.concurrency or 1, load.timeout_s, stop_at, sink, records)
    else:
        await _open(backend, source, make, load, t0, sink, records, lag)
    t1 = time.perf_counter()
    records.sort(key=lambda r: r.request.index)
    return LoadRun(label=label, load=load, records=records, warmup_records=warm, t0=t0, t1=t1, schedule_lag=lag)


async def warm_up(
    backend: Backend, requests: list[BenchRequest], load: LoadSpec, *, sink: ProgressSink | None = None, tag: str | None = None,
) -> list[RequestRecord]:
    """Send ``requests`` closed-loop (at the run's concurrency, 4 for open loop) and wait for all; nothing is measured."""
    if not requests:
        return []
    sink = sink or ProgressSink()
    tag = tag or f"bench-{uuid.uuid4().hex[:8]}"
    sink.phase(f"warmup {backend.name}", len(requests))
    clients = min(len(requests), load.concurrency or load.max_concurrency or 4)
    warm: list[RequestRecord] = []
    await _closed(backend, iter(requests), _records(tag, backend.name, True), clients, load.timeout_s, None, sink, warm)
    return warm
