"""The engine worker's two inputs (requests and the batch lane) share one /metrics, one tracer and the worker's
per-request telemetry: a configured metrics port is bound once, and a batch line is forgotten when it is over. A
port that cannot be bound is refused naming the settings."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from schemas.events import GenerateRequest, ReplyRoute
from streams.config.services import MetricsSettings, TelemetrySettings
from streams.service.delivery import Delivery
from streams.service.offsets import Source
from streams.telemetry.metrics import WorkerMetrics
from streams.telemetry.tracing import Tracing
from streams.testing.stack import free_port
from streams.worker.observers import ServiceTelemetry
from streams.worker.telemetry import WorkerTelemetry
from tests.telemetry_support import by_consumer


class _Running:
    def __init__(self, kind: str, in_flight: int) -> None:
        self.kind, self.group_id, self.in_flight = kind, f"g.{kind}", in_flight

    def input_consumer(self) -> Any:
        return None


def _worker(exporter: InMemorySpanExporter) -> WorkerTelemetry:
    tracing = Tracing.with_processor(SimpleSpanProcessor(exporter), "specstream-worker")
    return WorkerTelemetry(tracing, WorkerMetrics(CollectorRegistry(), max_tenants=5), group_id="g.engine-workers")


def _settings(port: int) -> TelemetrySettings:
    return TelemetrySettings(metrics=MetricsSettings(worker_port=port))


def test_both_inputs_count_on_the_one_configured_metrics_port() -> None:
    port = free_port()
    requests = ServiceTelemetry(_worker(InMemorySpanExporter()), _settings(port), kind="engine-worker")
    lane = requests.beside("batch-worker", "g.batch-workers")

    async def scrape() -> dict[str, float]:
        requests.start(_Running("engine-worker", 2))
        lane.start(_Running("batch-worker", 3))  # binding the same port again would raise EADDRINUSE
        try:
            async with httpx.AsyncClient() as client:
                text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
        finally:
            lane.stop()
            requests.stop()
        return by_consumer(text, "specstream:consumer_in_flight")

    assert asyncio.run(scrape()) == {"engine-worker": 2.0, "batch-worker": 3.0}
    assert requests.metrics_url == f"http://127.0.0.1:{port}/metrics"
    assert lane.metrics_url is None  # announced once, by the worker's requests service


def test_a_batch_line_over_is_forgotten_by_the_workers_telemetry() -> None:
    worker = _worker(InMemorySpanExporter())
    lane = ServiceTelemetry(worker, _settings(0), kind="engine-worker").beside("batch-worker", "g.batch-workers")
    request = GenerateRequest(request_id="batch_1.3", prompt="hi", model="m", reply_to=ReplyRoute(topic="t"))
    delivery = Delivery([Source("lines", 0, 7)], b"{}", None, received_at=time.time(), published_at=time.time(),
                        outlet=None, request_id=request.request_id)  # type: ignore[arg-type]
    worker.received(request, delivery)
    lane.admitted(delivery)
    lane.settled(delivery, 0)
    assert worker._requests == {} and worker._traces == {}


def test_the_lane_stopping_leaves_the_tracer_to_the_worker() -> None:
    exporter = InMemorySpanExporter()
    worker = _worker(exporter)
    requests = ServiceTelemetry(worker, _settings(0), kind="engine-worker")
    requests.beside("batch-worker", "g.batch-workers").stop()
    assert worker.tracing is not None
    worker.tracing.tracer.start_span("after the lane stopped").end()
    requests.stop()
    worker.tracing.tracer.start_span("after the worker stopped").end()
    assert [span.name for span in exporter.get_finished_spans()] == ["after the lane stopped"]


def test_a_metrics_port_in_use_is_refused_naming_the_settings() -> None:
    import socket

    from streams.telemetry.metrics_server import MetricsPortError, MetricsServer

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsPortError) as refused:
            MetricsServer(CollectorRegistry(), "127.0.0.1", port)
    assert str(refused.value) == (f"cannot serve /metrics on 127.0.0.1:{port} (telemetry.metrics.worker_host, "
                                  "worker_port): Address already in use")
