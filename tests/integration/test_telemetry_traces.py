"""One request, one trace: the client's traceparent runs through the edge, Kafka, the worker and the engine.

A real worker (real model) and a real edge app share the local broker in this process; both export into the SDK's
in-memory exporter. The OTLP export path of separate processes is tested in test_telemetry_stack.py.
"""
from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import httpx
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from streams.kafka import clients
from streams.config import EdgeAuthSettings, EdgeSettings
from streams.edge.app import create_app
from streams.edge.settings import EdgeOptions
from streams.telemetry.edge import EdgeTelemetry
from streams.telemetry.tracing import Tracing
from streams.worker.telemetry import WorkerTelemetry
from tests.conftest import worker_test_settings

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.asyncio(loop_scope="session")]

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
# Repetitive text: the n-gram proposer drafts from it, so the trace shows drafted and accepted tokens.
PROMPT = "Repeat exactly, ten times: red green blue, red green blue, red green blue."


def _one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, f"expected one span {name!r}, got {[s.name for s in spans]}"
    return found[0]


def _parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


async def _spans_once_finished(exporter: InMemorySpanExporter, name: str, timeout_s: float = 30.0) -> list[ReadableSpan]:
    # The worker ends its spans when Kafka acknowledged the final reply, which may be just after the edge relayed it.
    for _ in range(int(timeout_s / 0.1)):
        spans = list(exporter.get_finished_spans())
        if any(s.name == name for s in spans):
            return spans
        await asyncio.sleep(0.1)
    raise AssertionError(f"no finished span {name!r}: {[s.name for s in exporter.get_finished_spans()]}")


async def test_a_traced_request_is_one_trace_from_the_client_through_edge_kafka_worker_and_engine(
        kafka_bootstrap: str) -> None:
    from streams.worker import EngineWorker

    exporter = InMemorySpanExporter()
    prefix = f"trace-{uuid.uuid4().hex[:8]}"
    settings = worker_test_settings(kafka_bootstrap, prefix, worker_id=f"traced-{uuid.uuid4().hex[:6]}")
    worker_tracing = Tracing.with_processor(SimpleSpanProcessor(exporter), "specstream-worker")
    telemetry = WorkerTelemetry.from_settings(settings, group_id=f"{prefix}.engine-workers", tracing=worker_tracing)
    edge_telemetry = EdgeTelemetry(Tracing.with_processor(SimpleSpanProcessor(exporter), "specstream-edge"), None)
    options = EdgeOptions(settings.model_copy(update={"edge": EdgeSettings(
        edge_id=f"e-{uuid.uuid4().hex[:6]}", auth=EdgeAuthSettings(enabled=False))}))
    app = create_app(options, telemetry=edge_telemetry)
    try:
        async with EngineWorker(settings, telemetry=telemetry) as worker:
            assert worker.engine is not None
            async with app.router.lifespan_context(app):
                async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://edge",
                                             timeout=120.0) as client:
                    response = await client.post(
                        "/v1/chat/completions",
                        headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"},
                        json={"model": options.models[0], "max_tokens": 24,
                              "messages": [{"role": "user", "content": PROMPT}]})
                assert response.status_code == 200, response.text
                answer = response.json()
                spans = await _spans_once_finished(exporter, f"process {prefix}.requests")
    finally:
        await clients.delete_topics(kafka_bootstrap, [t.name for t in settings.catalog.shared_topics()]
                                     + [options.reply_topic])

    assert {format(s.context.trace_id, "032x") for s in spans} == {CLIENT_TRACE}
    server = _one(spans, "POST /v1/chat/completions")
    publish = _one(spans, f"publish {prefix}.requests")
    process = _one(spans, f"process {prefix}.requests")
    queue, prefill, decode = (_one(spans, f"engine {stage}") for stage in ("queue", "prefill", "decode"))
    reply = _one(spans, f"publish {options.reply_topic}")
    record = _one(spans, f"publish {prefix}.completions")
    relay = _one(spans, f"receive {options.reply_topic}")

    # The tree: client -> edge server span -> producer -> (Kafka) -> worker consumer -> engine stages and the reply.
    assert _parent_of(server) == int(CLIENT_SPAN, 16) and server.kind is SpanKind.SERVER
    assert _parent_of(publish) == server.context.span_id and publish.kind is SpanKind.PRODUCER
    assert _parent_of(process) == publish.context.span_id and process.kind is SpanKind.CONSUMER
    assert [link.context.span_id for link in process.links] == [publish.context.span_id]
    assert {_parent_of(s) for s in (queue, prefill, decode, reply, record)} == {process.context.span_id}
    assert reply.kind is SpanKind.PRODUCER and record.kind is SpanKind.PRODUCER
    # One producer span for all of the request's replies (a chunk per token, then the Completion).
    assert reply.attributes["messaging.batch.message_count"] == answer["specstream"]["num_chunks"] + 1
    assert _parent_of(relay) == server.context.span_id
    assert server.resource.attributes["service.name"] == "specstream-edge"
    assert process.resource.attributes["service.name"] == "specstream-worker"

    # The stages follow each other in time.
    assert publish.start_time <= process.start_time
    assert process.start_time == queue.start_time <= queue.end_time == prefill.start_time
    assert prefill.end_time == decode.start_time <= decode.end_time
    assert decode.start_time <= reply.start_time and reply.end_time <= process.end_time

    # One event per engine step that produced output, together accounting for the whole answer.
    steps = [e for e in decode.events if e.name == "engine step"]
    assert steps and all(e.attributes["batch_size"] >= 1 for e in steps)
    assert sum(e.attributes["tokens"] for e in steps) == answer["usage"]["completion_tokens"]
    spec = answer["specstream"]["spec"]
    assert sum(e.attributes["drafted"] for e in steps) == spec["drafted"]
    assert sum(e.attributes["accepted"] for e in steps) == spec["accepted"]
    assert spec["drafted"] > 0, "the prompt should make the n-gram proposer draft"
    assert process.attributes["specstream.request_id"] == answer["id"]
