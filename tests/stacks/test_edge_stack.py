"""The edge end to end: real broker, a real `specstream worker` subprocess on the default model, edges in-process.

The edges run in this process (uvicorn in a thread, ``streams.edge.server``) so
the tests can look inside their reply routers; the worker is the real one
(``python -m streams.cli worker``, via streams/testing/stack.py) on a topic prefix of
this module's own. Generation is kept short (a few tokens) so the module runs
in well under a minute once the model is cached.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from openai import OpenAI
from websockets.sync.client import connect as ws_connect

from schemas.events import CancelRequest, Completion
from streams.edge.server import RunningEdge, serve_in_thread
from streams.config import EdgeAuthSettings, EdgeSettings, KafkaSettings, Settings, WorkerSettings
from streams.edge.settings import EdgeOptions
from streams.kafka.clients import decode, decode_reply
from streams.testing.stack import DEFAULT_MODEL as MODEL
from streams.testing.stack import Stack, running_stack
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(300)]

HEARTBEAT_S = 1.0
WORKER_ENV = {
    "SPECSTREAM_WORKER__HEARTBEAT_S": str(HEARTBEAT_S),
    "SPECSTREAM_ENGINE__MAX_MODEL_LEN": "512",
    "SPECSTREAM_ENGINE__KV_CACHE_BYTES": "96MiB",
}
QUESTION = [{"role": "user", "content": "What is Apache Kafka? Answer in one sentence."}]


def _options(bootstrap: str, prefix: str, edge_id: str) -> EdgeOptions:
    return EdgeOptions(Settings(  # auth: tests/integration/test_edge_security.py
        kafka=KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=prefix),
        edge=EdgeSettings(edge_id=edge_id, request_timeout_s=120.0, auth=EdgeAuthSettings(enabled=False)),
        worker=WorkerSettings(heartbeat_s=HEARTBEAT_S),
    ))


def _wait(predicate, timeout_s: float, what: str, check=lambda: None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        check()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def prefix() -> str:
    return f"t-edge-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def edge_a(kafka_bootstrap: str, prefix: str) -> Iterator[RunningEdge]:  # noqa: F811
    with serve_in_thread(_options(kafka_bootstrap, prefix, f"{prefix}-a")) as running:
        yield running


@pytest.fixture(scope="module")
def readiness_before_worker(edge_a: RunningEdge) -> httpx.Response:
    """/readyz of edge A before any worker exists on its prefix (taken before `worker` starts one)."""
    return httpx.get(edge_a.base_url + "/readyz", timeout=5)


@pytest.fixture(scope="module")
def worker(kafka_bootstrap: str, prefix: str, edge_a: RunningEdge, readiness_before_worker) -> Iterator[Stack]:  # noqa: F811
    env = {**WORKER_ENV, "SPECSTREAM_KAFKA__TOPIC_PREFIX": prefix}
    with running_stack(kafka_bootstrap, edge=False, env=env) as stack:
        try:
            _wait(lambda: httpx.get(edge_a.base_url + "/readyz", timeout=5).status_code == 200, 240,
                  "the worker to announce itself ready", check=stack.check_alive)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{stack.logs()}") from None
        yield stack


# --- readiness -----------------------------------------------------------------------------------------------------


def test_readyz_503_before_a_worker_announced_and_200_after(edge_a, readiness_before_worker, worker):
    assert httpx.get(edge_a.base_url + "/healthz").status_code == 200
    before = readiness_before_worker
    assert before.status_code == 503, before.text
    assert before.json()["ready"] is False and "no worker announced ready" in before.json()["reason"]
    after = httpx.get(edge_a.base_url + "/readyz")
    assert after.status_code == 200, after.text
    assert after.json()["ready"] is True and MODEL in after.json()["models"] and len(after.json()["workers"]) == 1


# --- websocket -----------------------------------------------------------------------------------------------------


def test_websocket_streams_chunks_in_order_two_requests_on_one_socket(edge_a, worker):
    with ws_connect(edge_a.ws_url) as ws:
        ws.send(json.dumps({"id": "kafka", "model": MODEL, "messages": QUESTION, "max_tokens": 8}))
        ws.send(json.dumps({"id": 2, "model": MODEL, "prompt": "The capital of France is", "max_tokens": 6}))
        chunks: dict[object, list[dict]] = {"kafka": [], 2: []}
        done: dict[object, dict] = {}
        while len(done) < 2:
            message = json.loads(ws.recv(timeout=120))
            assert message["type"] in ("chunk", "done"), message
            assert message["id"] in chunks and message["id"] not in done, message  # nothing after a request's done
            if message["type"] == "chunk":
                chunks[message["id"]].append(message)
            else:
                done[message["id"]] = message
    assert done["kafka"]["request_id"] != done[2]["request_id"]
    for tag, expected_tokens in (("kafka", 8), (2, 6)):
        got = chunks[tag]
        assert len(got) >= 2, f"{tag}: fewer than two chunks before done: {got}"
        assert [c["index"] for c in got] == list(range(len(got)))
        assert "".join(c["text"] for c in got) == done[tag]["text"] != ""
        assert all(c["token_ids"] and set(c["spec"]) == {"drafted", "accepted"} for c in got)
        final = done[tag]
        assert final["finish_reason"] in ("length", "stop") and final["num_chunks"] == len(got)
        assert final["usage"]["completion_tokens"] <= expected_tokens and final["usage"]["prompt_tokens"] > 0
        assert set(final["timings"]) == {"queued_s", "ttft_s", "total_s"} and "acceptance_rate" in final["spec"]


def test_websocket_malformed_frame_keeps_the_socket_open(edge_a, worker):
    with ws_connect(edge_a.ws_url) as ws:
        ws.send("this is not json")
        error = json.loads(ws.recv(timeout=10))
        assert (error["type"], error["id"], error["code"]) == ("error", None, "invalid_json")
        ws.send(json.dumps({"id": "x", "model": MODEL, "messages": QUESTION, "max_tokens": 2}))
        messages = []
        while not messages or messages[-1]["type"] == "chunk":
            messages.append(json.loads(ws.recv(timeout=120)))
        assert messages[-1]["type"] == "done" and messages[-1]["id"] == "x"


# --- OpenAI-compatible HTTP ----------------------------------------------------------------------------------------


def test_the_openai_client_gets_the_same_text_streamed_and_not_and_completions_work(edge_a, worker):
    client = OpenAI(base_url=edge_a.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    assert [m.id for m in client.models.list().data] == [MODEL]

    full = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, seed=7)
    assert full.object == "chat.completion" and full.model == MODEL
    assert full.choices[0].message.role == "assistant" and full.choices[0].message.content
    assert full.choices[0].finish_reason in ("length", "stop")
    assert 0 < full.usage.completion_tokens <= 8 and full.usage.total_tokens > full.usage.completion_tokens

    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, seed=7, stream=True,
                                            stream_options={"include_usage": True})
    deltas, finish, usage = [], None, None
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk" and chunk.id.startswith("chatcmpl-")
        usage = chunk.usage or usage
        for choice in chunk.choices:
            deltas.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert sum(1 for d in deltas if d) >= 2
    # Same seed, greedy default: the streamed text is the non-streamed text.
    assert "".join(deltas) == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason and usage.completion_tokens == full.usage.completion_tokens

    completion = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4)
    assert completion.object == "text_completion" and completion.id.startswith("cmpl-")
    assert completion.choices[0].text and completion.choices[0].finish_reason in ("length", "stop")
    assert completion.usage.completion_tokens <= 4


@pytest.mark.parametrize(
    ("raw", "status", "code", "param"),
    [
        (b'{"model": "smollm2-135m-instruct", "messages": [', 400, "invalid_json", None),
        (json.dumps({"model": MODEL, "messages": QUESTION, "max_tokens": 2, "temprature": 0.2}).encode(), 400,
         "unknown_parameter", "temprature"),
        (json.dumps({"model": "gpt-9", "messages": QUESTION, "max_tokens": 2}).encode(), 404, "model_not_found",
         "model"),
        # Errors the worker finds (the model's context is 512 tokens in this module):
        (json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "word " * 600}], "max_tokens": 2}).encode(),
         400, "context_length_exceeded", "messages"),
        (json.dumps({"model": MODEL, "messages": QUESTION, "max_tokens": 600}).encode(), 400,
         "context_length_exceeded", "max_tokens"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_errors_are_precise_4xx_in_openai_shape(edge_a, worker, raw, status, code, param, stream):
    if stream and raw.endswith(b"}"):
        raw = raw[:-1] + b', "stream": true}'
    r = httpx.post(edge_a.base_url + "/v1/chat/completions", content=raw,
                   headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["type"], error["code"], error["param"]) == ("invalid_request_error", code, param)


def test_openai_client_raises_on_unknown_model(edge_a, worker):
    import openai

    client = OpenAI(base_url=edge_a.base_url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=QUESTION, max_tokens=2)
    assert info.value.code == "model_not_found"


# --- cancellation --------------------------------------------------------------------------------------------------


async def _final_event(bootstrap: str, topic: str, request_id: str, timeout_s: float):
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.seek_to_beginning(TopicPartition(topic, 0))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for records in batch.values():
                for record in records:
                    event = decode_reply(record.value)
                    if event.request_id == request_id and event.type != "chunk":
                        return event
        return None
    finally:
        await consumer.stop()


async def _cancellations(bootstrap: str, topic: str) -> set[str]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        await consumer.seek_to_beginning(TopicPartition(topic, 0))
        batch = await consumer.getmany(timeout_ms=2000)
        return {decode(r.value, CancelRequest).request_id for records in batch.values() for r in records}
    finally:
        await consumer.stop()


def test_http_stream_abort_cancels_the_generation(kafka_bootstrap, prefix, edge_a, worker):  # noqa: F811
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 400, "stream": True}
    with httpx.Client(timeout=120) as client:
        with client.stream("POST", edge_a.base_url + "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            request_id = response.headers["x-request-id"]
            contents = 0
            for line in response.iter_lines():
                if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                    contents += 1
                    if contents == 2:
                        break  # leaving the block closes the connection mid-stream
    final = asyncio.run(_final_event(kafka_bootstrap, edge_a.edge.reply_topic, request_id, timeout_s=60))
    assert isinstance(final, Completion), final
    assert final.finish_reason == "abort" and final.usage.completion_tokens < 400
    assert request_id in asyncio.run(_cancellations(kafka_bootstrap, f"{prefix}.cancellations"))


def test_websocket_close_cancels_its_requests(kafka_bootstrap, edge_a, worker):  # noqa: F811
    with ws_connect(edge_a.ws_url) as ws:
        ws.send(json.dumps({"id": 1, "model": MODEL, "messages": QUESTION, "max_tokens": 400}))
        request_id = json.loads(ws.recv(timeout=120))["request_id"]
    final = asyncio.run(_final_event(kafka_bootstrap, edge_a.edge.reply_topic, request_id, timeout_s=60))
    assert isinstance(final, Completion) and final.finish_reason == "abort", final


# --- several edges -------------------------------------------------------------------------------------------------


def test_two_edges_each_receive_only_their_own_replies(kafka_bootstrap, prefix, edge_a, worker):  # noqa: F811
    idle_seen_before = set(edge_a.edge.router.seen)
    with serve_in_thread(_options(kafka_bootstrap, prefix, f"{prefix}-b")) as edge_b, \
            serve_in_thread(_options(kafka_bootstrap, prefix, f"{prefix}-c")) as edge_c:
        edges = {"b": edge_b, "c": edge_c}
        assert edge_b.port != edge_c.port and edge_b.edge.reply_topic != edge_c.edge.reply_topic
        issued: dict[str, set[str]] = {"b": set(), "c": set()}
        texts: dict[str, list[tuple[str, str]]] = {"b": [], "c": []}
        failures: list[BaseException] = []

        def drive(name: str) -> None:
            try:
                client = OpenAI(base_url=edges[name].base_url + "/v1", api_key="x", max_retries=0, timeout=120)
                for i in range(3):
                    prompt = f"Edge {name}, request {i}: name a colour."
                    if i % 2:
                        r = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                                           max_tokens=4)
                        rid, text = r.id, r.choices[0].message.content
                    else:
                        parts, rid = [], None
                        for chunk in client.chat.completions.create(
                                model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=4, stream=True):
                            rid = chunk.id
                            parts += [c.delta.content or "" for c in chunk.choices]
                        text = "".join(parts)
                    issued[name].add(rid)
                    texts[name].append((rid, text))
            except BaseException as error:  # noqa: BLE001 - re-raised in the test thread
                failures.append(error)

        threads = [threading.Thread(target=drive, args=(name,)) for name in edges]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert not failures, failures
        assert all(len(issued[n]) == 3 and all(text for _, text in texts[n]) for n in edges), texts
        # Each router read exactly the events of its own requests: no foreign request_id ever reached it.
        assert set(edge_b.edge.router.seen) == issued["b"]
        assert set(edge_c.edge.router.seen) == issued["c"]
        assert edge_b.edge.router.stats.unknown == edge_c.edge.router.stats.unknown == 0
    # ...and the idle edge A saw none of them.
    assert not (set(edge_a.edge.router.seen) - idle_seen_before) & (issued["b"] | issued["c"])
