"""What an engine worker tells telemetry at each stage of a request.

:class:`WorkerTelemetry` is built only when tracing or metrics are on; a worker without it
does no telemetry work at all (not even a call per step). With metrics only, per step it
observes one inter-token latency per request; with tracing, it also keeps a small tuple per
step for each traced request (see :mod:`streams.telemetry.request_trace`).

The same calls fit the consumer foundation's hooks (received, rejected, settled, handed back);
the engine-specific ones (``step``, ``engine_done``) are the worker's own.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from engine.outputs import RequestOutput, RequestStats
from schemas.events import Completion, GenerateRequest
from streams.config import Settings
from streams.telemetry import tracing as tracing_mod
from streams.telemetry.metrics import WorkerMetrics
from streams.telemetry.metrics_server import MetricsServer
from streams.telemetry.request_trace import RequestTrace
from streams.telemetry.tracing import KafkaHeaders, Tracing

LAG_INTERVAL_S = 5.0
log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


def _never_raises(method: F) -> F:
    """A telemetry bug must cost telemetry, never a reply: the worker calls these in the middle of its reply path."""
    failed = False

    @functools.wraps(method)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        nonlocal failed
        try:
            return method(*args, **kwargs)
        except Exception:  # noqa: BLE001 - logged (once per hook), the request goes on
            if not failed:
                failed = True
                log.exception("telemetry hook %s failed (reported once)", method.__name__)
            return None

    return guarded  # type: ignore[return-value]


class WorkerTelemetry:
    def __init__(self, tracing: Tracing | None, metrics: WorkerMetrics | None, *, group_id: str) -> None:
        self.tracing = tracing
        self.metrics = metrics
        self.group_id = group_id
        self._traces: dict[str, RequestTrace] = {}
        self._last_output: dict[str, float] = {}
        self._requests: dict[str, GenerateRequest] = {}
        self._server: MetricsServer | None = None
        self.metrics_url: str | None = None

    @classmethod
    def from_settings(cls, settings: Settings, *, group_id: str, tracing: Tracing | None = None,
                      registry: CollectorRegistry | None = None) -> WorkerTelemetry | None:
        """None when both tracing and metrics are off. ``tracing``/``registry`` replace what the settings build."""
        tracing = tracing or tracing_mod.build_tracing(settings.telemetry.tracing, "specstream-worker")
        metrics_settings = settings.telemetry.metrics
        metrics = (WorkerMetrics(registry or CollectorRegistry(), max_tenants=metrics_settings.max_tenants)
                   if metrics_settings.enabled else None)
        if tracing is None and metrics is None:
            return None
        return cls(tracing, metrics, group_id=group_id)

    # --- a request's life -------------------------------------------------------------------------------------------

    @_never_raises
    def received(self, request: GenerateRequest, headers: KafkaHeaders | None, topic: str, partition: int,
                 received_at: float) -> None:
        self._requests[request.request_id] = request
        if self.tracing is not None:
            parent = tracing_mod.extract(headers, request.trace)
            self._traces[request.request_id] = RequestTrace.start(
                self.tracing.tracer, request, topic, partition, parent, received_at)

    def trace_id(self, request_id: str) -> str | None:
        held = self._traces.get(request_id)
        return tracing_mod.trace_id_hex(held.span) if held is not None else None

    @_never_raises
    def step(self, outputs: Sequence[RequestOutput], now: float) -> None:
        """One engine step's outputs, on the event loop."""
        batch = len(outputs)
        metrics = self.metrics
        itl = metrics.itl if metrics is not None else None
        for output in outputs:
            request_id = output.request_id
            previous = self._last_output.get(request_id)
            self._last_output[request_id] = now
            request = self._requests.get(request_id)
            if metrics is not None and itl is not None and previous is not None and request is not None:
                itl.labels(metrics.model(request.model)).observe(now - previous)
            held = self._traces.get(request_id)
            if held is not None:
                held.step(now, batch, len(output.token_ids), output.spec.drafted, output.spec.accepted)

    @_never_raises
    def engine_done(self, request_id: str, stats: RequestStats | None, final: Completion | None, now: float) -> None:
        """The engine finished the request (``final`` is its Completion; None for an ErrorEvent)."""
        self._last_output.pop(request_id, None)
        request = self._requests.get(request_id)
        held = self._traces.get(request_id)
        if held is not None:
            held.engine_done(stats, final.finish_reason if final is not None else None, now)
        if self.metrics is not None and request is not None and final is not None:
            self._count(self.metrics, request, stats, final)

    @_never_raises
    def failed(self, request_id: str, code: str, message: str) -> None:
        held = self._traces.get(request_id)
        if held is not None:
            held.failed(code, message)
            held.engine_done(None, None, time.time())

    @_never_raises
    def settled(self, request_id: str, undelivered: int) -> None:
        """The final reply is acknowledged (or given up): the request is over here."""
        self._requests.pop(request_id, None)
        self._last_output.pop(request_id, None)
        held = self._traces.pop(request_id, None)
        if held is not None:
            held.end(undelivered)

    @_never_raises
    def handed_back(self, request_id: str, why: str) -> None:
        """Not answered here (rebalance, shutdown): another worker redoes it."""
        held = self._traces.get(request_id)
        if held is not None:
            held.span.add_event("handed back", attributes={"reason": why})
        self.settled(request_id, 0)

    # --- the bus ----------------------------------------------------------------------------------------------------

    @_never_raises
    def dead_lettered(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.bus.dead_lettered(reason)

    @_never_raises
    def publish_failed(self, kind: str) -> None:
        if self.metrics is not None:
            self.metrics.bus.producer_errors.labels(kind).inc()

    async def sample_lag(self, consumer: Any) -> None:
        """Every few seconds: high watermark - position of each assigned partition (aiokafka's consumer)."""
        if self.metrics is None:
            return
        gauge = self.metrics.bus.consumer_lag
        while True:
            with contextlib.suppress(Exception):  # a rebalance in progress: next time
                for tp in consumer.assignment():
                    high = consumer.highwater(tp)
                    if high is not None:
                        position = await consumer.position(tp)
                        gauge.labels(self.group_id, tp.topic, str(tp.partition)).set(max(0, high - position))
            await asyncio.sleep(LAG_INTERVAL_S)

    # --- process -----------------------------------------------------------------------------------------------------

    def serve_metrics(self, host: str, port: int | None) -> str | None:
        """Serve /metrics on its own port (a thread of prometheus_client's); returns its URL."""
        if self.metrics is None:
            return None
        self._server = MetricsServer(self.metrics.registry, host, port or 0)
        self.metrics_url = self._server.url
        return self.metrics_url

    def watch_engine(self, engine: Any) -> None:
        """Running/waiting requests and KV usage, read from the engine when Prometheus scrapes."""
        scheduler = getattr(engine, "scheduler", None)
        if self.metrics is None or scheduler is None:
            return
        self.metrics.watch_engine(engine.model_name, lambda: scheduler.num_running, lambda: scheduler.num_waiting,
                                  lambda: engine.cache_usage().fraction)

    def shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        if self.tracing is not None:
            self.tracing.shutdown()

    def _count(self, metrics: WorkerMetrics, request: GenerateRequest, stats: RequestStats | None,
               final: Completion) -> None:
        model, tenant = metrics.model(request.model), metrics.tenant(request.tenant)
        timings = final.timings
        metrics.ttft.labels("worker", model, tenant).observe(timings.ttft_s)
        metrics.e2e.labels("worker", model, tenant).observe(timings.total_s)
        metrics.queue_time.labels(model).observe(timings.queued_s)
        metrics.prompt_tokens.labels(model, tenant).inc(final.usage.prompt_tokens)
        metrics.generation_tokens.labels(model, tenant).inc(final.usage.completion_tokens)
        metrics.request_success.labels(model, final.finish_reason).inc()
        if stats is None or not stats.spec.drafted:
            return
        # drafted_at[0] counts the steps in which this request drafted at least one token: its drafts.
        metrics.num_drafts.labels(model).inc(stats.spec.drafted_at[0] if stats.spec.drafted_at else 0)
        metrics.draft_tokens.labels(model).inc(stats.spec.drafted)
        metrics.accepted_tokens.labels(model).inc(stats.spec.accepted)
        for position, accepted in enumerate(stats.spec.accepted_at):
            metrics.accepted_per_pos.labels(model, str(position)).inc(accepted)

