"""The edge's telemetry: one ASGI middleware and the /metrics route.

The middleware sees every HTTP exchange whole, which is what the edge's metrics and its server
span need, without touching the admission pipeline:

* a server span per API call (``POST /v1/chat/completions``), continuing the client's trace when
  it sends a ``traceparent`` header; the request's publish span (``streams.edge.publisher``) and
  relay span are its children, so one trace runs from the edge through Kafka and the worker;
* ``specstream:edge_requests_total{route,status}``;
* ``specstream:rate_limit_rejections_total{limit}``, from the 429's ``X-RateLimit-Limited``;
* the latencies the client sees, labelled ``measured_at="edge"``: time to the first byte of the
  answer (for a stream: the first token's event) and to the last byte.

Websocket traffic is passed through by the middleware (one socket carries many requests): the
socket's session reports each request it serves (:meth:`EdgeTelemetry.websocket_request`), counted
under the route ``/v1/ws`` with the HTTP status its error frame carries (200 when answered), and
its latencies measured from the request frame's arrival to the first chunk frame and to the done frame.
"""
from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from streams.config import TelemetrySettings
from streams.telemetry import tracing as tracing_mod
from streams.telemetry.metrics import EdgeMetrics
from streams.telemetry.tracing import Tracing

WS_ROUTE = "/v1/ws"
GENERATION_ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", WS_ROUTE})
# Probes and scrapes: counted, never traced (they would drown the traces that matter).
_UNTRACED = ("/metrics", "/healthz", "/readyz", "/static", "/favicon.ico")
# The limits a 429 names in X-RateLimit-Limited (a bounded label); anything else counts as "other".
_LIMITS = frozenset({"rpm", "tpm", "concurrency", "batch_tokens_per_day", "batch_queued_lines"})


class EdgeTelemetry:
    def __init__(self, tracing: Tracing | None, metrics: EdgeMetrics | None) -> None:
        self.tracing = tracing
        self.metrics = metrics

    @classmethod
    def from_settings(cls, settings: TelemetrySettings, *, tracing: Tracing | None = None,
                      registry: CollectorRegistry | None = None) -> EdgeTelemetry:
        tracing = tracing or tracing_mod.build_tracing(settings.tracing, "specstream-edge")
        metrics = EdgeMetrics(registry or CollectorRegistry()) if settings.metrics.enabled else None
        return cls(tracing, metrics)

    @property
    def tracer(self) -> trace.Tracer | None:
        return self.tracing.tracer if self.tracing is not None else None

    def install(self, app: FastAPI) -> None:
        """The middleware (when anything is on) and GET /metrics (when metrics are on)."""
        if self.metrics is not None:
            registry = self.metrics.registry

            async def metrics(_: Request) -> Response:
                return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

            app.add_route("/metrics", metrics, methods=["GET"], include_in_schema=False)
        if self.tracing is not None or self.metrics is not None:
            app.add_middleware(_Middleware, telemetry=self)

    def shutdown(self) -> None:
        if self.tracing is not None:
            self.tracing.shutdown()

    def websocket_request(self, status: int, started: float, first_byte: float | None,
                          limited: str | None = None) -> None:
        """One request served (or refused) on a websocket; ``started``/``first_byte`` on time.monotonic()."""
        if self.metrics is not None:
            _observe(self.metrics, WS_ROUTE, status, started, first_byte, limited)


class _Exchange:
    """One HTTP request/response as the middleware sees it."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.status = 500  # what the client gets when the app raises before answering
        self.limited: str | None = None
        self.first_byte: float | None = None


class _Middleware:
    def __init__(self, app: ASGIApp, telemetry: EdgeTelemetry) -> None:
        self.app = app
        self.telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange = _Exchange(time.monotonic())

        async def observe(message: Message) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
                if exchange.status == 429:
                    for name, value in message.get("headers", ()):
                        if name.lower() == b"x-ratelimit-limited":
                            exchange.limited = value.decode("latin-1")
            elif message["type"] == "http.response.body" and exchange.first_byte is None and message.get("body"):
                exchange.first_byte = time.monotonic()
            await send(message)

        tracer = self.telemetry.tracer
        path: str = scope.get("path", "")
        if tracer is None or path.startswith(_UNTRACED):
            try:
                await self.app(scope, receive, observe)
            finally:
                self._count(scope, exchange)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", ())
                   if k in (b"traceparent", b"tracestate")}
        with tracer.start_as_current_span(
            f"{scope.get('method', 'GET')} {path}", context=tracing_mod.extract_http(headers), kind=SpanKind.SERVER,
            attributes={"http.request.method": scope.get("method", ""), "url.path": path},
            record_exception=True,
        ) as span:
            try:
                await self.app(scope, receive, observe)
            finally:
                span.set_attribute("http.route", _route(scope))
                span.set_attribute("http.response.status_code", exchange.status)
                if exchange.status >= 500:
                    span.set_status(Status(StatusCode.ERROR))
                self._count(scope, exchange)

    def _count(self, scope: Scope, exchange: _Exchange) -> None:
        if self.telemetry.metrics is not None:
            _observe(self.telemetry.metrics, _route(scope), exchange.status, exchange.started, exchange.first_byte,
                     exchange.limited)


def _observe(metrics: EdgeMetrics, route: str, status: int, started: float, first_byte: float | None,
             limited: str | None) -> None:
    """Count one answered request; for a generation answered whole, the latencies its client saw."""
    metrics.requests.labels(route, str(status)).inc()
    if limited is not None:
        metrics.rate_limited.labels(limited if limited in _LIMITS else "other").inc()
    if route in GENERATION_ROUTES and status == 200:
        end = time.monotonic()
        metrics.ttft.labels("edge", route).observe((first_byte or end) - started)
        metrics.e2e.labels("edge", route).observe(end - started)


def _route(scope: Scope) -> str:
    """The matched route's template (bounded), not the raw path."""
    route: Any = scope.get("route")
    template = getattr(route, "path", None)
    return template if isinstance(template, str) else "unmatched"
