"""Telemetry comes from the foundation: the toy consumer (no telemetry code of its own) is traced and measured on
the real broker: its message continues the producer's trace, its reply carries the trace on, and /metrics counts it."""
from __future__ import annotations

import asyncio
import json
import uuid

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from streams.kafka import clients
from streams.service import ServiceOptions
from streams.service.runner import ConsumerService
from streams.telemetry import tracing as tracing_mod
from streams.service.consumer_telemetry import ConsumerTelemetry
from streams.telemetry.metrics import ConsumerMetrics
from streams.telemetry.tracing import Tracing
from tests.integration.test_service_foundation import Toy, harness, toy  # noqa: F401
from tests.kafka_fixtures import kafka_bootstrap  # noqa: F401

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.kafka]


def _traced_toy(harness: Toy, exporter: InMemorySpanExporter) -> ConsumerService:  # noqa: F811
    options = ServiceOptions(kafka=harness.bootstrap, catalog=harness.catalog, service_id=f"toy-{uuid.uuid4().hex[:6]}",
                             max_message_bytes=2048, heartbeat_s=1.0, max_inflight=4)
    group_id = f"{harness.catalog.prefix}.toys"
    telemetry = ConsumerTelemetry("toy", group_id, Tracing.with_processor(SimpleSpanProcessor(exporter), "toy"),
                                  ConsumerMetrics(CollectorRegistry(), "toy"))
    return ConsumerService(options, toy(harness.catalog, harness.gate), telemetry=telemetry)


async def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with httpx.AsyncClient() as client:
        text = (await client.get(url)).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def _until(check, timeout_s: float = 20.0):  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        result = await check()
        if result or loop.time() > deadline:
            return result
        await asyncio.sleep(0.3)


async def test_a_toy_consumer_continues_the_producers_trace_and_passes_it_on_in_its_replies(
        harness: Toy) -> None:  # noqa: F811
    harness.gate.open.set()
    exporter = InMemorySpanExporter()
    client = Tracing.with_processor(SimpleSpanProcessor(exporter), "client")
    service = _traced_toy(harness, exporter)
    await service.start()
    try:
        request_id = f"p-{uuid.uuid4().hex[:8]}"
        body = {"request_id": request_id, "reply_to": {"topic": harness.reply_topic}, "text": "traced"}
        with client.tracer.start_as_current_span("client send", kind=SpanKind.PRODUCER) as sent:
            headers = tracing_mod.kafka_headers(tracing_mod.carrier_of())
            await harness.producer.send_and_wait(harness.input_topic, json.dumps(body).encode(), headers=headers)
        assert (await harness.pong(request_id)).text == "TRACED"
        process_name, publish_name = f"process {harness.input_topic}", f"publish {harness.reply_topic}"

        async def finished() -> list[ReadableSpan]:
            spans = [s for s in exporter.get_finished_spans() if s.context.trace_id == sent.get_span_context().trace_id]
            return spans if {process_name, publish_name} <= {s.name for s in spans} else []

        spans = {s.name: s for s in await _until(finished)}
        reply = next(r for r in await clients.read_partition(harness.bootstrap, harness.reply_topic, timeout_s=5)
                     if json.loads(r.value).get("request_id") == request_id)
    finally:
        await service.stop()

    process, publish = spans[process_name], spans[publish_name]
    # producer (client) -> Kafka -> the toy's consumer span -> its producer span -> Kafka -> whoever reads the reply.
    assert process.kind is SpanKind.CONSUMER and process.parent is not None
    assert process.parent.span_id == sent.get_span_context().span_id
    assert process.attributes["specstream.request_id"] == request_id
    assert publish.kind is SpanKind.PRODUCER and publish.parent is not None
    assert publish.parent.span_id == process.context.span_id
    assert publish.attributes["messaging.batch.message_count"] == 1
    carried = {name: value.decode() for name, value in reply.headers}
    assert carried["traceparent"].startswith(f"00-{publish.context.trace_id:032x}-{publish.context.span_id:016x}-")
    assert carried["content-type"] == "application/json"


async def test_the_toy_consumers_metrics_are_served_and_announced_with_outcomes_dead_letters_and_lag(
        harness: Toy) -> None:  # noqa: F811
    harness.gate.open.set()
    service = _traced_toy(harness, InMemorySpanExporter())
    await service.start()
    try:
        url = service.telemetry.metrics_url
        assert url is not None and (await harness.announcement(service, "ready")).metrics_url == url
        request_id, _ = await harness.ping("counted")
        await harness.pong(request_id)
        await harness.dead_letter(await harness.send_raw(b"{nope"))
        answered = ("specstream:consumer_messages_total", (("consumer", "toy"), ("outcome", "answered")))
        rejected = ("specstream:consumer_messages_total", (("consumer", "toy"), ("outcome", "rejected")))
        lag = ("specstream:kafka_consumer_lag", (("group", service.group_id), ("partition", "0"),
                                                 ("topic", harness.input_topic)))

        async def counted() -> dict:  # type: ignore[type-arg]
            samples = await _scrape(url)
            return samples if samples.get(answered) == 1 and samples.get(rejected) == 1 and lag in samples else {}

        samples = await _until(counted)
    finally:
        await service.stop()
    assert samples, "the toy's outcomes and lag never showed on /metrics"
    assert samples[("specstream:dead_letters_total", (("consumer", "toy"), ("reason", "invalid_request")))] == 1
    assert samples[("specstream:consumer_handling_seconds_count", (("consumer", "toy"),))] == 1
    assert samples[("specstream:consumer_in_flight", (("consumer", "toy"),))] == 0
    assert samples[lag] == 0
