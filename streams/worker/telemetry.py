"""What an engine worker tells telemetry at each stage of a request.

:class:`WorkerTelemetry` is built only when tracing or metrics are on; a worker without it
does no telemetry work at all (not even a call per step). With metrics only, per step it
observes one inter-token latency per request; with tracing, it also keeps a small tuple per
step for each traced request (see :mod:`streams.telemetry.request_trace`).

What every consumer gets (its consumer span, producer spans, message and bus metrics, the
/metrics server) comes from the foundation (:mod:`streams.service.consumer_telemetry`), sharing this
tracer and registry; the engine-specific calls (``received`` with the request, ``step``,
``engine_done``) are the worker's own.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from engine.outputs import RequestOutput, RequestStats
from schemas.events import Completion, GenerateRequest
from streams.config import Settings
from streams.service.delivery import Delivery
from streams.telemetry import tracing as tracing_mod
from streams.service.consumer_telemetry import never_raises
from streams.service.message_trace import MessageTrace
from streams.telemetry.metrics import WorkerMetrics
from streams.telemetry.request_trace import RequestTrace
from streams.telemetry.tracing import Tracing


class WorkerTelemetry:
    def __init__(self, tracing: Tracing | None, metrics: WorkerMetrics | None, *, group_id: str) -> None:
        self.tracing = tracing
        self.metrics = metrics
        self.group_id = group_id
        self._traces: dict[str, RequestTrace] = {}
        self._last_output: dict[str, float] = {}
        self._requests: dict[str, GenerateRequest] = {}

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

    @never_raises
    def received(self, request: GenerateRequest, delivery: Delivery) -> None:
        """The foundation admitted the request; its consumer span (``delivery.trace``) gets the engine's stages."""
        self._requests[request.request_id] = request
        if self.tracing is not None and isinstance(delivery.trace, MessageTrace):
            self._traces[request.request_id] = RequestTrace.within(
                self.tracing.tracer, delivery.trace.span, request, delivery.received_at)

    def trace_id(self, request_id: str) -> str | None:
        held = self._traces.get(request_id)
        return tracing_mod.trace_id_hex(held.span) if held is not None else None

    @never_raises
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

    @never_raises
    def engine_done(self, request_id: str, stats: RequestStats | None, final: Completion | None) -> None:
        """The engine finished the request (``final`` is its Completion; None for an ErrorEvent)."""
        self._last_output.pop(request_id, None)
        request = self._requests.get(request_id)
        held = self._traces.get(request_id)
        if held is not None:
            held.engine_done(stats, final.finish_reason if final is not None else None)
        if self.metrics is not None and request is not None and final is not None:
            self._count(self.metrics, request, stats, final)

    @never_raises
    def failed(self, request_id: str, code: str, message: str) -> None:
        held = self._traces.get(request_id)
        if held is not None:
            held.failed(code, message)
            held.engine_done(None, None)

    @never_raises
    def settled(self, request_id: str) -> None:
        """Answered and acknowledged, or handed back: the request is over here (the foundation ends its span)."""
        self._requests.pop(request_id, None)
        self._last_output.pop(request_id, None)
        self._traces.pop(request_id, None)

    # --- process -----------------------------------------------------------------------------------------------------

    def watch_engine(self, engine: Any) -> None:
        """Running/waiting requests and KV usage, read from the engine when Prometheus scrapes."""
        scheduler = getattr(engine, "scheduler", None)
        if self.metrics is None or scheduler is None:
            return
        self.metrics.watch_engine(engine.model_name, lambda: scheduler.num_running, lambda: scheduler.num_waiting,
                                  lambda: engine.cache_usage().fraction)

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
        if stats is not None:
            metrics.prefix_cache_queries.labels(model).inc(stats.prompt_tokens)
            metrics.prefix_cache_hits.labels(model).inc(stats.cached_prompt_tokens)
            metrics.preemptions.labels(model).inc(stats.preemptions)
        if stats is None or not stats.spec.drafted:
            return
        # drafted_at[0] counts the steps in which this request drafted at least one token: its drafts.
        metrics.num_drafts.labels(model).inc(stats.spec.drafted_at[0] if stats.spec.drafted_at else 0)
        metrics.draft_tokens.labels(model).inc(stats.spec.drafted)
        metrics.accepted_tokens.labels(model).inc(stats.spec.accepted)
        for position, accepted in enumerate(stats.spec.accepted_at):
            metrics.accepted_per_pos.labels(model, str(position)).inc(accepted)
        for source, counters in stats.spec.by_source.items():
            metrics.draft_tokens_by_source.labels(model, source).inc(counters.drafted)
            metrics.accepted_by_source.labels(model, source).inc(counters.accepted)

