"""Telemetry of a running stack (worker and edge as processes), seen by real receivers.

One stack serves every test here, started with tracing exported over OTLP/HTTP to a receiver in the test, JSON logs
at DEBUG, and metrics on. Debian's Prometheus scrapes the edge and the worker (found through its announcement on the
services topic) with infra/prometheus's rules loaded; its answers are compared with what the requests' Completions
reported.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect as ws_connect

from streams.telemetry.metrics import TTFT_BUCKETS
from streams.testing.stack import REPO, Stack, running_stack
from tests.edge_support import WORKER_ENV
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401
from streams.testing.otlp import OtlpReceiver
from tests.telemetry_support import Prometheus, histogram_quantile, prometheus_server

pytestmark = [pytest.mark.kafka, pytest.mark.model]

# Every prompt carries this marker: no log line may contain it.
SECRET = f"zebra-quartz-{uuid.uuid4().hex[:10]}"
# Repetitive text makes the n-gram proposer draft, so acceptance is measured.
PROMPTS = [f"{SECRET}: repeat this list twice: {', '.join(words)}." for words in (
    ["red", "green", "blue"] * 3, ["one", "two", "three", "four"] * 2, ["alpha", "beta"] * 4, ["sun", "moon"] * 3,
    ["cat", "dog", "fish"] * 2)]
# Every answer the stack gave, in order: what Prometheus' totals must add up to.
SERVED: list[dict[str, Any]] = []


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as r:
        yield r


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, receiver: OtlpReceiver, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:  # noqa: F811
    env = {
        **WORKER_ENV,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # export within a fraction of a second (the SDK's default is 5 s)
        "SPECSTREAM_LOG_FORMAT": "json",
        "SPECSTREAM_LOG_LEVEL": "DEBUG",
    }
    with running_stack(kafka_bootstrap, env=env, log_dir=tmp_path_factory.mktemp("telemetry-stack")) as s:
        yield s


def _chat(stack: Stack, prompt: str, *, headers: dict[str, str] | None = None, stream: bool = False) -> dict[str, Any]:
    body = {"model": stack.model, "max_tokens": 24, "stream": stream, "messages": [{"role": "user", "content": prompt}]}
    if not stream:
        response = httpx.post(stack.base_url + "/v1/chat/completions", json=body,
                              headers={**stack.headers, **(headers or {})}, timeout=180.0)
        assert response.status_code == 200, response.text
        SERVED.append(response.json())
        return SERVED[-1]
    with httpx.stream("POST", stack.base_url + "/v1/chat/completions", json=body,
                      headers={**stack.headers, **(headers or {})}, timeout=180.0) as response:
        assert response.status_code == 200
        events = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: {")]
    SERVED.append(events[-1])  # the finish chunk: its `specstream` holds the Completion's timings and spec
    return SERVED[-1]


def _ws_chat(stack: Stack, prompt: str, model: str | None = None) -> dict[str, Any]:
    """One request on the websocket: its done frame (counted in SERVED, like an HTTP answer), or its error frame."""
    with ws_connect(stack.ws_url, additional_headers=stack.headers) as ws:
        ws.send(json.dumps({"id": 1, "model": model or stack.model, "max_tokens": 24,
                            "messages": [{"role": "user", "content": prompt}]}))
        while (frame := json.loads(ws.recv(timeout=180)))["type"] == "chunk":
            pass
    if frame["type"] == "done":
        SERVED.append({"id": frame["request_id"], "specstream": {"spec": frame["spec"], "timings": frame["timings"]}})
    return frame


def _worker_targets(stack: Stack, out: Path) -> list[dict[str, Any]]:
    """The workers' file_sd, as `python -m streams.telemetry.targets` writes it from the services topic."""
    deadline = time.monotonic() + 60
    while True:
        subprocess.run([sys.executable, "-m", "streams.telemetry.targets", "--out", str(out)], cwd=REPO,
                       env=stack.env, check=True, timeout=60)
        entries = json.loads(out.read_text())
        if entries or time.monotonic() > deadline:
            return entries
        time.sleep(1)


def test_a_request_is_exported_as_one_trace_from_both_processes(stack: Stack, receiver: OtlpReceiver) -> None:
    trace_id = uuid.uuid4().hex
    _chat(stack, PROMPTS[0], headers={"traceparent": f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"})
    requests_topic, reply_topic = f"{stack.topic_prefix}.requests", f"{stack.topic_prefix}.replies.{stack.edge_id}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        names = {(s.service, s.name): s for s in receiver.trace(trace_id)}
        if ("specstream-worker", f"publish {reply_topic}") in names and ("specstream-edge", "POST /v1/chat/completions") in names:
            break
        time.sleep(0.3)
    spans = {(s.service, s.name): s for s in receiver.trace(trace_id)}
    expected = {("specstream-edge", "POST /v1/chat/completions"), ("specstream-edge", f"publish {requests_topic}"),
                ("specstream-worker", f"process {requests_topic}"), ("specstream-worker", "engine queue"),
                ("specstream-worker", "engine prefill"), ("specstream-worker", "engine decode"),
                ("specstream-worker", f"publish {reply_topic}"), ("specstream-edge", f"receive {reply_topic}")}
    assert expected <= set(spans), sorted(spans)
    # Across the process boundary, through Kafka: the worker's consumer span is the edge's producer span's child.
    publish, process = spans[("specstream-edge", f"publish {requests_topic}")], spans[("specstream-worker", f"process {requests_topic}")]
    assert process.parent_span_id == publish.span_id


@pytest.fixture(scope="module")
def scraped(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Prometheus, list[dict[str, Any]]]]:
    """Prometheus scraping the stack, and the answers of the requests it saw (a warm-up, then one per prompt)."""
    targets = tmp_path_factory.mktemp("prometheus-targets") / "workers.json"
    entries = _worker_targets(stack, targets)
    # The worker process, announced once: its batch lane (a second consumer) counts on the same /metrics.
    assert [e["labels"]["kind"] for e in entries] == ["engine-worker"], entries
    with prometheus_server(f"127.0.0.1:{stack.port}", targets) as prometheus:
        _chat(stack, "warm-up: " + PROMPTS[0])
        # Series born before the measured requests are in Prometheus first, so rate() sees all of those requests.
        _wait_until_counted(prometheus)
        measured = [_chat(stack, prompt, stream=i % 2 == 1) for i, prompt in enumerate(PROMPTS)]
        done = _ws_chat(stack, "on the websocket: " + PROMPTS[2])
        assert done["type"] == "done", done
        measured.append(SERVED[-1])
        assert _ws_chat(stack, PROMPTS[3], model="no-such-model")["status"] == 404
        _wait_until_counted(prometheus)
        yield prometheus, measured


def _wait_until_counted(prometheus: Prometheus) -> None:
    """Until both the worker's and the edge's histograms count every request served so far."""
    for measured_at in ("worker", "edge"):
        prometheus.wait_for(f'sum(specstream:e2e_request_latency_seconds_count{{measured_at="{measured_at}"}})',
                            float(len(SERVED)))


def _extras(answer: dict[str, Any]) -> dict[str, Any]:
    return answer.get("specstream") or answer["choices"][0].get("specstream") or {}


def test_prometheus_acceptance_rate_equals_what_the_completions_reported(scraped: tuple[Prometheus, list[dict]]) -> None:
    prometheus, _ = scraped
    drafted = sum(_extras(a)["spec"]["drafted"] for a in SERVED)
    accepted = sum(_extras(a)["spec"]["accepted"] for a in SERVED)
    assert drafted > 0
    rate = prometheus.value("sum(specstream:spec_decode_num_accepted_tokens_total)"
                            " / sum(specstream:spec_decode_num_draft_tokens_total)")
    assert rate == pytest.approx(accepted / drafted, rel=1e-9)
    # The recording rule (what the acceptance-collapse alert reads) is evaluated on these series. It divides two
    # rates, each extrapolated on its own from the samples in its window, so it is near, not at, the exact ratio,
    # and 0 when every accepted draft came before the window's first sample (the warm-up's); promtool's
    # infra/prometheus/rules_test.yml checks its value on series of known shape.
    recorded = prometheus.value("model_name:specstream_spec_decode_acceptance:ratio_rate5m")
    assert recorded is not None and 0.0 <= recorded <= 1.0


def test_prometheus_counts_prefix_cache_queries_and_hits_in_tokens_as_vllm_does(
        scraped: tuple[Prometheus, list[dict]]) -> None:
    prometheus, _ = scraped
    # Every prompt token is looked up; the chat template's system prompt, the same in every request, is found.
    queries = prometheus.value("sum(specstream:prefix_cache_queries_total)")
    assert queries == prometheus.value("sum(specstream:prompt_tokens_total)") and queries > 0
    hits = prometheus.value("sum(specstream:prefix_cache_hits_total)")
    assert hits is not None and 0 < hits < queries and hits % 16 == 0
    assert prometheus.value("sum(specstream:num_preemptions_total)") == 0


def test_prometheus_ttft_median_equals_the_completions_timings(scraped: tuple[Prometheus, list[dict]]) -> None:
    prometheus, measured_answers = scraped
    expected = histogram_quantile(0.5, [_extras(a)["timings"]["ttft_s"] for a in SERVED], TTFT_BUCKETS)
    measured = prometheus.value('histogram_quantile(0.5, sum by (le) '
                                '(specstream:time_to_first_token_seconds_bucket{measured_at="worker"}))')
    assert measured == pytest.approx(expected, rel=1e-9)
    # Over a window (what dashboards plot) the median stays among the measured requests' own buckets: rate()
    # extrapolates each bucket's counter on its own from the samples in the window, which moves the buckets' weights,
    # so with a handful of requests the median can cross a bucket's edge or two (runs read 0.258 for a median in
    # (0.1, 0.25], and 0.118 for one at 0.08), but never past the buckets the requests fell in.
    windowed = prometheus.value('histogram_quantile(0.5, sum by (le) '
                                '(rate(specstream:time_to_first_token_seconds_bucket{measured_at="worker"}[1m])))')
    ttfts = [_extras(a)["timings"]["ttft_s"] for a in measured_answers]
    edges = [0.0, *TTFT_BUCKETS]
    lower_edge = edges[max(0, next(i for i, b in enumerate(edges) if b >= min(ttfts)) - 1)]
    upper_edge = next((b for b in edges if b >= max(ttfts)), edges[-1])
    assert windowed is not None and lower_edge <= windowed <= upper_edge, (windowed, sorted(ttfts))


def test_prometheus_sees_the_edge_its_ready_worker_and_the_request_partitions_lag(
        stack: Stack, scraped: tuple[Prometheus, list]) -> None:
    prometheus, _ = scraped
    served = len(SERVED)
    assert prometheus.value('count(up == 1)') == 2  # the edge and the worker (its batch lane on the same port)
    assert prometheus.query('specstream:consumer_in_flight{consumer="batch-worker"}')
    assert prometheus.value("specstream:ready_workers") == 1
    assert prometheus.value('sum(specstream:edge_requests_total{route="/v1/chat/completions",status="200"})') == served - 1
    # A websocket carries many requests: each is counted, answered or refused, with its latencies.
    assert prometheus.value('sum(specstream:edge_requests_total{route="/v1/ws",status="200"})') == 1
    assert prometheus.value('sum(specstream:edge_requests_total{route="/v1/ws",status="404"})') == 1
    assert prometheus.value('sum(specstream:time_to_first_token_seconds_count{measured_at="edge",route="/v1/ws"})') == 1
    # The client-side histograms are kept apart from the workers' by their label.
    assert prometheus.value('sum(specstream:time_to_first_token_seconds_count{measured_at="edge"})') == served
    assert prometheus.value('sum(specstream:time_to_first_token_seconds_count{measured_at="worker"})') == served
    lag = prometheus.query("specstream:kafka_consumer_lag")
    assert {(s["metric"]["group"], s["metric"]["topic"]) for s in lag} == {
        (f"{stack.topic_prefix}.engine-workers", f"{stack.topic_prefix}.requests"),
        (f"{stack.topic_prefix}.batch-workers", f"{stack.topic_prefix}.batch-lines")}
    assert prometheus.value('ALERTS{alertname="SpecstreamNoReadyWorker"}') is None


def test_no_log_line_holds_a_prompt_or_the_key_and_every_line_names_its_request(
        stack: Stack, scraped: tuple[Prometheus, list[dict[str, Any]]]) -> None:
    trace_id = uuid.uuid4().hex
    answer = _chat(stack, PROMPTS[1], headers={"traceparent": f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"})
    time.sleep(1.0)  # the access log line is written when the response ends
    lines = [(p.name, line) for p in stack.processes for line in p.log.read_text(errors="replace").splitlines()]
    assert len(lines) > 20
    secret_key_part = stack.api_key.split("-", 3)[3]  # sk-ss-<public id>-<secret>: the secret may hold '-' too
    assert len(secret_key_part) >= 40
    for name, line in lines:
        assert SECRET not in line, f"{name} logged a prompt: {line}"
        assert stack.api_key not in line and secret_key_part not in line, f"{name} logged the API key: {line}"
    records = [(name, json.loads(line)) for name, line in lines if line.startswith("{")]
    plain = [line for _, line in lines if line.strip() and not line.startswith("{")]
    # Only the worker's model-loading progress is not a log record.
    assert [line for line in plain if not line.startswith(("engine: ", "Loading weights"))] == []
    assert all({"ts", "level", "logger", "message", "request_id", "trace_id"} <= set(r) for _, r in records)
    access = [r for name, r in records if r["logger"] == "streams.edge.access" and r["request_id"] == answer["id"]]
    assert len(access) == 1 and access[0]["trace_id"] == trace_id, access
    assert any(r["request_id"] == SERVED[0]["id"] for _, r in records if r["logger"] == "streams.edge.access")
