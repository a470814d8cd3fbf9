"""Traces and metrics for every consumer, filled into the foundation's hooks (:mod:`streams.service.telemetry`).

A consumer written on the foundation gets, without a line of its own: a consumer span per message continuing the
producer's trace and producer spans on what it publishes (:mod:`streams.service.message_trace`); the metrics of
:class:`~streams.telemetry.metrics.ConsumerMetrics` (messages by outcome, handling latency, in flight, dead
letters, failed publishes, consumer lag per partition) on ``GET /metrics`` of its own port
(``telemetry.metrics.worker_host``/``worker_port``), announced as ``metrics_url``.

Every hook is guarded: a telemetry bug costs telemetry, never an answer.
"""
from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry

from schemas.events import ErrorEvent
from streams.config import TelemetrySettings
from streams.service.delivery import Delivery
from streams.service.intake import Rejection
from streams.service.telemetry import NO_HEADERS, Running, Telemetry
from streams.telemetry import tracing as tracing_mod
from streams.service.message_trace import MessageTrace, rejected_span
from streams.telemetry.metrics import ConsumerMetrics
from streams.telemetry.metrics_server import MetricsServer
from streams.telemetry.tracing import Tracing

LAG_INTERVAL_S = 5.0
log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])


def never_raises(method: F) -> F:
    """A telemetry bug must cost telemetry, never a reply: these run in the middle of a message's path."""
    failed = False

    @functools.wraps(method)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        nonlocal failed
        try:
            return method(*args, **kwargs)
        except Exception:  # noqa: BLE001 - logged (once per hook), the message goes on
            if not failed:
                failed = True
                log.exception("telemetry hook %s failed (reported once)", method.__name__)
            return None

    return guarded  # type: ignore[return-value]


class ConsumerTelemetry(Telemetry):
    def __init__(self, kind: str, group_id: str, tracing: Tracing | None, metrics: ConsumerMetrics | None, *,
                 host: str = "127.0.0.1", port: int | None = None) -> None:
        self.kind, self.group_id = kind, group_id
        self.tracing = tracing
        self.metrics = metrics
        self.host, self.port = host, port
        # False for a consumer beside another (beside()): that one serves the one /metrics (a second server would
        # take the same configured port) and shuts the tracer down.
        self.owned = True
        self._server: MetricsServer | None = None
        self._lag: asyncio.Task[None] | None = None

    @classmethod
    def from_settings(cls, settings: TelemetrySettings | None, *, kind: str, group_id: str,
                      tracing: Tracing | None = None, registry: CollectorRegistry | None = None) -> Telemetry:
        """From the ``telemetry`` section and the OTEL_* variables; the no-op base when both are off (or None).
        ``tracing``/``registry``: share the caller's (the engine worker's) instead of building new ones."""
        if settings is None:
            return Telemetry()
        tracing = tracing or tracing_mod.build_tracing(settings.tracing, f"specstream-{kind}")
        metrics = ConsumerMetrics(registry or CollectorRegistry(), kind) if settings.metrics.enabled else None
        if tracing is None and metrics is None:
            return Telemetry()
        return cls(kind, group_id, tracing, metrics, host=settings.metrics.worker_host,
                   port=settings.metrics.worker_port)

    def beside(self, kind: str, group_id: str) -> ConsumerTelemetry:
        """Another consumer of this process: its series (by its kind) on this one's registry and /metrics, its spans
        on this one's tracer; this one serves, announces and shuts down."""
        other = copy.copy(self)
        other.kind, other.group_id, other.owned = kind, group_id, False
        other.metrics = self.metrics.of(kind) if self.metrics is not None else None
        other._server, other._lag, other.metrics_url = None, None, None
        return other

    # --- the service's life -----------------------------------------------------------------------------------------

    def start(self, service: Running) -> None:
        if self.metrics is None or self._lag is not None:  # off, or started already
            return
        self.metrics.watch_in_flight(lambda: service.in_flight)
        self._lag = asyncio.create_task(self._sample_lag(service), name=f"{self.kind}-lag-sampler")
        if not self.owned:
            return
        self._server = MetricsServer(self.metrics.registry, self.host, self.port or 0)
        self.metrics_url = self._server.url
        log.info("%s metrics on %s", self.kind, self.metrics_url)

    def stop(self) -> None:
        if self._lag is not None:
            self._lag.cancel()
            self._lag = None
        if self._server is not None:
            self._server.close()
            self._server = None
        if self.tracing is not None and self.owned:
            self.tracing.shutdown()

    async def _sample_lag(self, service: Running) -> None:
        """Every few seconds: high watermark - position of each assigned input partition (aiokafka's consumer)."""
        assert self.metrics is not None
        gauge = self.metrics.consumer_lag
        while True:
            consumer = service.input_consumer()
            with contextlib.suppress(Exception):  # not started yet, or a rebalance in progress: next time
                for tp in consumer.assignment():
                    high = consumer.highwater(tp)
                    if high is not None:
                        position = await consumer.position(tp)
                        gauge.labels(self.group_id, tp.topic, str(tp.partition)).set(max(0, high - position))
            await asyncio.sleep(LAG_INTERVAL_S)

    # --- one message ------------------------------------------------------------------------------------------------

    @never_raises
    def admitted(self, delivery: Delivery) -> None:
        if self.tracing is not None:
            delivery.trace = MessageTrace.start(self.tracing.tracer, delivery, self.group_id)

    @never_raises
    def rejected(self, delivery: Delivery, rejection: Rejection) -> None:
        if self.metrics is not None:
            self.metrics.handled("rejected")
        if self.tracing is not None:
            rejected_span(self.tracing.tracer, delivery, self.group_id, rejection.code, rejection.message)

    def publishing(self, delivery: Delivery, topic: str) -> Mapping[str, str]:
        held = delivery.trace
        if not isinstance(held, MessageTrace):
            return NO_HEADERS
        try:
            return held.publishing(topic)
        except Exception:  # noqa: BLE001 - the event goes out without trace context
            log.exception("trace context for %s not added", topic)
            return NO_HEADERS

    @never_raises
    def dead_lettered(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.dead_lettered(reason)

    @never_raises
    def settled(self, delivery: Delivery, failures: int) -> None:
        if self.metrics is not None:
            if failures:
                self.metrics.producer_errors.labels(self.kind).inc(failures)
            outcome = "undelivered" if failures else (
                "error" if isinstance(delivery.final_event, ErrorEvent) else "answered")
            self.metrics.handled(outcome, max(0.0, time.time() - delivery.received_at))
        if isinstance(delivery.trace, MessageTrace):
            delivery.trace.end(delivery, failures)

    @never_raises
    def handed_back(self, delivery: Delivery) -> None:
        if self.metrics is not None:
            self.metrics.handled("handed_back")
        if isinstance(delivery.trace, MessageTrace):
            delivery.trace.span.add_event("handed back", attributes={"reason": "rebalance or drain"})
            delivery.trace.end(delivery, 0)
