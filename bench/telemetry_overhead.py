"""What telemetry costs: the same load against three stacks, telemetry off / metrics / metrics + tracing at 100 %.

    .venv/bin/python -m bench.telemetry_overhead --concurrency 16 --requests 32 --rounds 4 --max-tokens 32

Three stacks (edge + worker each, the default model) run side by side on one broker, each on a topic prefix of its
own; only one is loaded at a time. Rounds go off, metrics, traced, traced, metrics, off, ... so a change in the
machine's load hits all three alike, and the figures are ratios to "off" measured in the same run. The traced
stack exports every span over OTLP/HTTP (``OTEL_TRACES_SAMPLER=always_on``) to a receiver in this process: the
real export path, including the exporter's thread.

Per configuration: output-token throughput over the rounds' wall time, and the p50 of client-side TTFT (first
content event of the SSE stream) and end-to-end latency over every request.

    .venv/bin/python -m bench.telemetry_overhead --micro

measures instead what the worker's telemetry adds per request on the event loop, in this process: the calls the
foundation (consumer span, a producer span's context per published event, message metrics) and the worker (engine
stages, per-step latencies) make for one request of ``--max-tokens`` steps in a batch of ``--concurrency`` (spans
exported for real by the SDK's batch processor to an OTLP/HTTP receiver, metrics observed).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from streams.testing.otlp import OtlpReceiver
from streams.testing.stack import Stack, running_stack

WORKER_ENV = {"SPECSTREAM_ENGINE__MAX_MODEL_LEN": "512", "SPECSTREAM_ENGINE__KV_CACHE_BYTES": "128MiB"}
PROMPTS = [
    "Explain in two sentences what a Kafka consumer group is.",
    "Repeat this list twice: red, green, blue, red, green, blue.",
    "Write a haiku about streaming tokens.",
    "List four prime numbers and say why each is prime.",
]


@dataclass
class Tally:
    name: str
    tokens: int = 0
    wall_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    e2e_s: list[float] = field(default_factory=list)
    errors: int = 0
    round_tps: list[float] = field(default_factory=list)  # tokens/s of each round, in order

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "requests": len(self.e2e_s), "errors": self.errors,
                "tokens_per_s": self.tokens / self.wall_s if self.wall_s else 0.0,
                "ttft_p50_ms": 1000 * statistics.median(self.ttft_s), "e2e_p50_ms": 1000 * statistics.median(self.e2e_s)}


def configurations(receiver: OtlpReceiver) -> dict[str, dict[str, str]]:
    return {
        "off": {"SPECSTREAM_TELEMETRY__METRICS__ENABLED": "false", "SPECSTREAM_TELEMETRY__TRACING__ENABLED": "false"},
        "metrics": {"SPECSTREAM_TELEMETRY__TRACING__ENABLED": "false"},
        "traced": {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                   "OTEL_TRACES_SAMPLER": "always_on"},
    }


async def one(client: httpx.AsyncClient, stack: Stack, prompt: str, max_tokens: int, tally: Tally) -> None:
    body = {"model": stack.model, "max_tokens": max_tokens, "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True}, "messages": [{"role": "user", "content": prompt}]}
    start = time.perf_counter()
    first: float | None = None
    async with client.stream("POST", stack.base_url + "/v1/chat/completions", json=body, headers=stack.headers) as r:
        if r.status_code != 200:
            tally.errors += 1
            await r.aread()
            return
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if first is None and any(c.get("delta", {}).get("content") for c in event.get("choices", [])):
                first = time.perf_counter()
            if event.get("usage"):
                tally.tokens += event["usage"]["completion_tokens"]
    end = time.perf_counter()
    tally.ttft_s.append((first or end) - start)
    tally.e2e_s.append(end - start)


async def round_of(stack: Stack, tally: Tally, *, requests: int, concurrency: int, max_tokens: int) -> None:
    queue = list(range(requests))
    async with httpx.AsyncClient(timeout=300.0) as client:
        async def worker() -> None:
            while queue:
                i = queue.pop()
                await one(client, stack, PROMPTS[i % len(PROMPTS)], max_tokens, tally)

        start, tokens = time.perf_counter(), tally.tokens
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
        tally.wall_s += wall
        tally.round_tps.append((tally.tokens - tokens) / wall)


@contextlib.contextmanager
def stacks(bootstrap: str, envs: dict[str, dict[str, str]]) -> Iterator[dict[str, Stack]]:
    with contextlib.ExitStack() as exit_stack:
        yield {name: exit_stack.enter_context(running_stack(bootstrap, env={**WORKER_ENV, **env}))
               for name, env in envs.items()}


async def measure(running: dict[str, Stack], args: argparse.Namespace) -> dict[str, Tally]:
    tallies = {name: Tally(name) for name in running}
    names = list(running)
    warm = {name: Tally(name) for name in running}
    for name in names:  # warm-up: first requests load lazily initialised parts everywhere
        await round_of(running[name], warm[name], requests=args.concurrency, concurrency=args.concurrency,
                       max_tokens=args.max_tokens)
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else reversed(names):
            await round_of(running[name], tallies[name], requests=args.requests, concurrency=args.concurrency,
                           max_tokens=args.max_tokens)
    return tallies


class _Outlet:
    """Where the micro benchmark's deliveries would publish: nowhere (only telemetry's calls are timed)."""

    def publish(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def settle(self, delivery: Any) -> None:
        pass

    def forget(self, delivery: Any) -> None:
        pass


def micro(args: argparse.Namespace) -> None:
    """CPU per request of the foundation's and the worker's telemetry calls (tracing + metrics), best of 5."""
    import os
    import timeit

    from engine.outputs import RequestOutput, RequestStats, SpecCounters, SpecTally
    from schemas.events import Completion, GenerateRequest, ReplyRoute, Timings, Usage
    from streams.config import Settings
    from streams.service.delivery import Delivery
    from streams.service.offsets import Source
    from streams.worker.telemetry import WorkerTelemetry
    from streams.worker.observers import ServiceTelemetry

    with OtlpReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_TRACES_SAMPLER": "always_on"}
        os.environ.update(env)
        try:
            variants = {}
            for name, settings in (("metrics", Settings.model_validate({"telemetry": {"tracing": {"enabled": False}}})),
                                   ("traced", Settings())):
                worker = WorkerTelemetry.from_settings(settings, group_id="g")
                assert worker is not None
                variants[name] = (worker, ServiceTelemetry(worker, settings.telemetry, kind="engine-worker"))
        finally:
            for name in env:
                os.environ.pop(name)
        batch, steps = args.concurrency, args.max_tokens
        requests = [GenerateRequest(request_id=f"r{i}", prompt="p", model="m", reply_to=ReplyRoute(topic="t"))
                    for i in range(batch)]
        outputs = [RequestOutput(r.request_id, [1, 2], "ab", spec=SpecCounters(3, 1)) for r in requests]
        stats = RequestStats(prompt_tokens=10, completion_tokens=steps, queued_s=0.01, ttft_s=0.1, total_s=1.0,
                             spec=SpecTally(3 * steps, steps, drafted_at=[steps, steps, steps],
                                            accepted_at=[steps, 0, 0]))
        completion = Completion(request_id="r", text="x", finish_reason="length", num_chunks=steps,
                                usage=Usage(prompt_tokens=10, completion_tokens=steps, total_tokens=10 + steps),
                                timings=Timings(queued_s=0.01, ttft_s=0.1, total_s=1.0))

        def one_batch(worker: WorkerTelemetry, service: ServiceTelemetry) -> None:
            now = time.time()
            deliveries = [Delivery([Source("requests", 0, i)], b"", None, received_at=now, published_at=now,
                                   outlet=_Outlet(), payload=r, request_id=r.request_id)
                          for i, r in enumerate(requests)]
            for request, delivery in zip(requests, deliveries):
                service.admitted(delivery)
                worker.received(request, delivery)
            for _ in range(steps):
                worker.step(outputs, time.time())
                for delivery in deliveries:
                    service.publishing(delivery, "replies")
            for request, delivery in zip(requests, deliveries):
                worker.engine_done(request.request_id, stats, completion)
                service.publishing(delivery, "replies")
                delivery.final_event = completion
                service.settled(delivery, 0)

        print(f"worker telemetry per request ({steps} steps in batches of {batch}), best of 5 x 20 batches:")
        for name, (worker, service) in variants.items():
            per_batch = min(timeit.repeat(lambda w=worker, s=service: one_batch(w, s), number=20, repeat=5)) / 20
            print(f"  {name}: {1e6 * per_batch / batch:.0f} us per request, "
                  f"{1e6 * per_batch / (batch * steps):.1f} us per request and step")
            service.stop()
        print(f"spans exported meanwhile: {len(receiver.spans)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--requests", type=int, default=32, help="requests per round and configuration")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--out", default=None, help="write the figures as JSON")
    parser.add_argument("--micro", action="store_true", help="only the per-request CPU cost of the worker's calls")
    args = parser.parse_args()
    if args.micro:
        micro(args)
        return
    with OtlpReceiver() as receiver:
        with stacks(args.bootstrap, configurations(receiver)) as running:
            tallies = asyncio.run(measure(running, args))
        # The stacks are stopped: their tracer providers flushed what they still held.
        spans = len(receiver.spans)
        traces = len({span.trace_id for span in receiver.spans})
    base = tallies["off"].summary()
    rows = []
    for name, tally in tallies.items():
        row = tally.summary()
        row["throughput_vs_off"] = row["tokens_per_s"] / base["tokens_per_s"]
        # Each cycle runs every configuration back to back: its ratio to "off" is the least exposed to load drift.
        row["round_ratios"] = [t / o for t, o in zip(tally.round_tps, tallies["off"].round_tps)]
        row["median_round_ratio"] = statistics.median(row["round_ratios"])
        row["ttft_p50_added_ms"] = row["ttft_p50_ms"] - base["ttft_p50_ms"]
        row["e2e_p50_added_ms"] = row["e2e_p50_ms"] - base["e2e_p50_ms"]
        rows.append(row)
    print("| configuration | requests | errors | tokens/s | vs off (all) | vs off (median of rounds; each round) "
          "| TTFT p50 ms (added) | E2E p50 ms (added) |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        rounds = ", ".join(f"{r:.2f}" for r in row["round_ratios"])
        print(f"| {row['name']} | {row['requests']} | {row['errors']} | {row['tokens_per_s']:.1f} | "
              f"{row['throughput_vs_off']:.3f}x | {row['median_round_ratio']:.3f}x ({rounds}) | "
              f"{row['ttft_p50_ms']:.0f} ({row['ttft_p50_added_ms']:+.0f}) | "
              f"{row['e2e_p50_ms']:.0f} ({row['e2e_p50_added_ms']:+.0f}) |")
    print(f"received over OTLP: {spans} spans in {traces} traces")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump({"args": vars(args), "rows": rows, "spans": spans, "traces": traces}, handle, indent=1)


if __name__ == "__main__":
    main()
