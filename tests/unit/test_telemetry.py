"""Telemetry without Kafka: when tracing is on, how context is read, bounded labels, JSON log lines, the edge's
middleware on a toy app."""
from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from schemas.events import TraceContext
from streams.config import MetricsSettings, TelemetrySettings, TracingSettings, load_settings, ConfigError
from streams.telemetry import logs, tracing
from streams.telemetry.edge import EdgeTelemetry
from streams.telemetry.metrics import OTHER, BoundedLabel
from streams.telemetry.tracing import Tracing

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"


def test_tracing_is_off_without_an_endpoint_and_builds_nothing() -> None:
    assert tracing.build_tracing(TracingSettings(), "svc", env={}) is None


def test_an_otlp_endpoint_variable_turns_tracing_on_unless_the_sdk_is_disabled() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert tracing.tracing_enabled(TracingSettings(), env)
    assert not tracing.tracing_enabled(TracingSettings(), {**env, "OTEL_SDK_DISABLED": "true"})
    assert not tracing.tracing_enabled(TracingSettings(enabled=False), env)
    assert tracing.tracing_enabled(TracingSettings(enabled=True), {})


def test_yaml_keys_win_over_otel_variables() -> None:
    built = tracing.build_tracing(
        TracingSettings(endpoint="http://127.0.0.1:1", service_name="from-yaml", sampler="parentbased_traceidratio",
                        sampler_arg=0.25),
        "default-name", env={"OTEL_SERVICE_NAME": "from-env"})
    assert built is not None
    try:
        assert built.provider.resource.attributes["service.name"] == "from-yaml"
        assert "TraceIdRatioBased{0.25}" in built.provider.sampler.get_description()
    finally:
        built.shutdown()


def test_the_service_name_comes_from_otel_service_name_when_the_yaml_has_none() -> None:
    built = tracing.build_tracing(TracingSettings(enabled=True), "default-name",
                                  env={"OTEL_SERVICE_NAME": "from-env", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"})
    assert built is not None
    try:
        assert built.provider.resource.attributes["service.name"] == "from-env"
    finally:
        built.shutdown()


def test_an_unsupported_otlp_protocol_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL: 'http/json' is not supported"):
        tracing.build_tracing(TracingSettings(enabled=True), "svc", env={"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"})


def test_a_bad_telemetry_key_fails_at_load_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECSTREAM_TELEMETRY__TRACING__SAMPLER", "sometimes")
    with pytest.raises(ConfigError, match=r"^telemetry\.tracing\.sampler: "):
        load_settings("/dev/null")


def test_kafka_headers_carry_the_parent_before_the_request_field() -> None:
    other = "00-11111111111111111111111111111111-2222222222222222-01"
    parent = tracing.extract([("traceparent", CLIENT_PARENT.encode())], TraceContext(traceparent=other))
    assert parent is not None
    from opentelemetry import trace

    assert format(trace.get_current_span(parent).get_span_context().trace_id, "032x") == CLIENT_TRACE
    from_field = tracing.extract(None, TraceContext(traceparent=other))
    assert format(trace.get_current_span(from_field).get_span_context().trace_id, "032x") == "1" * 32


def test_a_malformed_traceparent_is_no_parent() -> None:
    assert tracing.extract([("traceparent", b"garbage")], None) is None
    assert tracing.extract_http({"traceparent": "00-zz-yy-01"}) is None


def test_client_chosen_label_values_are_bounded() -> None:
    tenant = BoundedLabel(2)
    assert [tenant("a"), tenant("b"), tenant("c"), tenant("a")] == ["a", "b", OTHER, "a"]


@pytest.fixture
def root_logging() -> Iterator[None]:
    """configure_logging replaces the root's handlers and levels: give pytest's back afterwards."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    payload = {name: logging.getLogger(name).level for name in logs._PAYLOAD_LOGGERS}
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        for name, payload_level in payload.items():
            logging.getLogger(name).setLevel(payload_level)


def test_json_log_lines_carry_the_bound_request_id_and_trace_id(root_logging: None) -> None:
    stream = io.StringIO()
    logs.configure_logging("INFO", "json")
    handler = logging.getLogger().handlers[0]
    handler.setStream(stream)  # type: ignore[attr-defined]
    log = logging.getLogger("test.telemetry")
    with logs.request_scope():
        log.info("before any request")
        logs.bind_request("chatcmpl-1", CLIENT_TRACE)
        log.info("handling %s", "it")
    log.info("after it")
    first, second, third = (json.loads(line) for line in stream.getvalue().splitlines())
    assert (first["request_id"], first["trace_id"]) == (None, None)
    assert (second["request_id"], second["trace_id"], second["message"]) == ("chatcmpl-1", CLIENT_TRACE, "handling it")
    assert second["logger"] == "test.telemetry" and second["level"] == "INFO"
    assert (third["request_id"], third["trace_id"]) == (None, None)  # the scope ended with the request


def test_debug_logging_keeps_the_kafka_clients_payload_loggers_at_info(root_logging: None) -> None:
    logs.configure_logging("DEBUG", "text")
    assert not logging.getLogger("aiokafka.producer.producer").isEnabledFor(logging.DEBUG)
    assert not logging.getLogger("aiokafka.consumer.fetcher").isEnabledFor(logging.DEBUG)


def test_every_process_logs_a_missing_topic_once_a_minute_not_per_metadata_refresh(root_logging: None) -> None:
    cluster_log = logging.getLogger("aiokafka.cluster")
    cluster_log.removeFilter(logs._missing_topic_throttle)  # what the edge had: nothing had installed it
    logs.configure_logging("INFO")
    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    keep = Keep()
    root = logging.getLogger()
    root.addHandler(keep)
    try:
        for _ in range(500):  # what aiokafka's fetcher of a deleted topic logs in a fraction of a second
            cluster_log.error("Topic %s not found in cluster metadata", "watch-test.gone")
            cluster_log.error("Topic %s not found in cluster metadata", "watch-test.also-gone")
    finally:
        root.removeHandler(keep)
    assert sorted(seen) == [f"Topic watch-test.{name} not found in cluster metadata" for name in ("also-gone", "gone")]


def test_trace_ids_are_read_from_a_traceparent_only_when_well_formed() -> None:
    assert logs.trace_id_of(CLIENT_PARENT) == CLIENT_TRACE
    assert logs.trace_id_of("00-short-00f067aa0ba902b7-01") is None
    assert logs.trace_id_of(None) is None


def _toy_edge(telemetry: EdgeTelemetry) -> FastAPI:
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat() -> StreamingResponse:
        async def body():  # type: ignore[no-untyped-def]
            yield "data: first\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(body(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def limited() -> JSONResponse:
        return JSONResponse({"error": {}}, status_code=429, headers={"X-RateLimit-Limited": "tpm"})

    telemetry.install(app)
    return app


async def test_the_edge_counts_routes_statuses_rate_limits_and_client_latencies() -> None:
    registry = CollectorRegistry()
    telemetry = EdgeTelemetry.from_settings(TelemetrySettings(tracing=TracingSettings(enabled=False)),
                                            registry=registry)
    app = _toy_edge(telemetry)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://edge") as client:
        assert (await client.post("/v1/chat/completions")).status_code == 200
        assert (await client.post("/v1/completions")).status_code == 429
        scraped = (await client.get("/metrics")).text
    sample = registry.get_sample_value
    assert sample("specstream:edge_requests_total", {"route": "/v1/chat/completions", "status": "200"}) == 1
    assert sample("specstream:edge_requests_total", {"route": "/v1/completions", "status": "429"}) == 1
    assert sample("specstream:rate_limit_rejections_total", {"limit": "tpm"}) == 1
    labels = {"measured_at": "edge", "route": "/v1/chat/completions"}
    assert sample("specstream:time_to_first_token_seconds_count", labels) == 1
    assert sample("specstream:e2e_request_latency_seconds_count", labels) == 1
    assert "specstream:edge_requests_total" in scraped


async def test_the_edge_continues_the_clients_trace_in_its_server_span() -> None:
    exporter = InMemorySpanExporter()
    telemetry = EdgeTelemetry(Tracing.with_processor(SimpleSpanProcessor(exporter), "edge"), None)
    app = _toy_edge(telemetry)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://edge") as client:
        await client.post("/v1/chat/completions", headers={"traceparent": CLIENT_PARENT})
        await client.get("/healthz")
    (span,) = exporter.get_finished_spans()  # probes are not traced
    assert span.name == "POST /v1/chat/completions"
    assert format(span.context.trace_id, "032x") == CLIENT_TRACE
    assert span.attributes["http.route"] == "/v1/chat/completions"
    assert span.attributes["http.response.status_code"] == 200


def test_metrics_can_be_turned_off() -> None:
    telemetry = EdgeTelemetry.from_settings(TelemetrySettings(metrics=MetricsSettings(enabled=False),
                                                              tracing=TracingSettings(enabled=False)))
    assert telemetry.metrics is None and telemetry.tracing is None


def test_a_failing_worker_telemetry_hook_costs_telemetry_never_the_reply(caplog: pytest.LogCaptureFixture) -> None:
    from schemas.events import Completion, GenerateRequest, ReplyRoute, Timings, Usage
    from streams.config import Settings
    from streams.worker.telemetry import WorkerTelemetry

    telemetry = WorkerTelemetry.from_settings(Settings(telemetry=TelemetrySettings(
        tracing=TracingSettings(enabled=False))), group_id="g", registry=CollectorRegistry())
    assert telemetry is not None
    request = GenerateRequest(request_id="r", prompt="p", model="m", reply_to=ReplyRoute(topic="t"))
    telemetry.received(request, None, "topic", 0, 0.0)
    completion = Completion(request_id="r", text="", finish_reason="stop", num_chunks=0,
                            usage=Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2),
                            timings=Timings(queued_s=0, ttft_s=0, total_s=0))
    broken_stats = object()  # not a RequestStats: the metrics code raises on it
    with caplog.at_level(logging.ERROR, logger="streams.worker.telemetry"):
        telemetry.engine_done("r", broken_stats, completion, 1.0)  # type: ignore[arg-type]
    assert "telemetry hook engine_done failed" in caplog.text


def test_worker_metrics_count_drafts_and_acceptances_by_draft_source() -> None:
    from engine.outputs import RequestStats, SpecTally
    from schemas.events import Completion, GenerateRequest, ReplyRoute, Timings, Usage
    from streams.config import Settings
    from streams.worker.telemetry import WorkerTelemetry

    registry = CollectorRegistry()
    telemetry = WorkerTelemetry.from_settings(Settings(telemetry=TelemetrySettings(
        tracing=TracingSettings(enabled=False))), group_id="g", registry=registry)
    assert telemetry is not None
    request = GenerateRequest(request_id="r", prompt="p", model="m", reply_to=ReplyRoute(topic="t"))
    telemetry.received(request, None)  # type: ignore[arg-type]
    spec = SpecTally()
    spec.record(4, 4, 0.0, 0.0, "suffix")
    spec.record(4, 1, 0.0, 0.0, "head")
    spec.record(2, 2, 0.0, 0.0, "suffix")
    stats = RequestStats(prompt_tokens=1, completion_tokens=12, queued_s=0, ttft_s=0, total_s=0, spec=spec)
    completion = Completion(request_id="r", text="", finish_reason="stop", num_chunks=0,
                            usage=Usage(prompt_tokens=1, completion_tokens=12, total_tokens=13),
                            timings=Timings(queued_s=0, ttft_s=0, total_s=0))
    telemetry.engine_done("r", stats, completion)

    def value(name: str, source: str) -> float | None:
        return registry.get_sample_value(f"specstream:spec_decode_num_{name}_by_source_total",
                                         {"model_name": "m", "source": source})

    assert (value("draft_tokens", "suffix"), value("accepted_tokens", "suffix")) == (6.0, 6.0)
    assert (value("draft_tokens", "head"), value("accepted_tokens", "head")) == (4.0, 1.0)
