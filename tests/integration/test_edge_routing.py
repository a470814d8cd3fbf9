"""Edge routing on the real broker, against a TEST DOUBLE of the engine worker.

`FakeWorker` below is not the engine worker: it consumes the request topic and
answers every GenerateRequest with canned TokenChunk/Completion events on the
request's ``reply_to`` topic, over real Kafka. It exists only to test the
edge's routing, error mapping and cancellation in isolation, quickly. The
end-to-end evidence with the real worker and model is in
tests/integration/test_edge_*.py.

Prompts steer the double: ``ERROR:<code>`` makes it answer with an ErrorEvent
of that code; ``SLOW`` makes it stream 40 chunks, 0.1 s apart, stopping when a
CancelRequest arrives; ``DUP`` makes it send every chunk twice.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

import httpx
import pytest
from aiokafka import AIOKafkaConsumer
from websockets.sync.client import connect as ws_connect

from schemas.events import (
    CancelRequest, Completion, ErrorEvent, GenerateRequest, SpecStats, SpecStepStats, Timings, TokenChunk, Usage,
)
from schemas.topics import TopicCatalog
from streams.edge.server import serve_in_thread
from streams.config import EdgeAuthSettings, EdgeSettings, KafkaSettings, Settings
from streams.edge.settings import EdgeOptions
from streams.kafka.clients import decode, encode, ensure_topics, make_producer, request_key
from streams.service.announcer import Announcer
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]

MODEL = "smollm2-135m-instruct"


class LoopThread:
    """An asyncio loop in a daemon thread; `call` runs a coroutine there and returns its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="fake-worker-loop")
        self.thread.start()

    def call(self, coro, timeout: float = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


class FakeWorker:
    """TEST DOUBLE of the engine worker, for edge-routing unit tests only (see the module docstring)."""

    def __init__(self, bootstrap: str, catalog: TopicCatalog, worker_id: str = "fake-worker") -> None:
        self.bootstrap = bootstrap
        self.catalog = catalog
        self.worker_id = worker_id
        self.requests: list[GenerateRequest] = []
        self.placed: dict[str, tuple[bytes | None, int]] = {}  # request_id -> the record's key and partition
        self.cancelled: set[str] = set()
        self._tasks: set[asyncio.Task] = set()

    async def start(self) -> None:
        await ensure_topics(self.bootstrap, self.catalog.shared_topics())
        self.producer = make_producer(self.bootstrap, client_id=self.worker_id)
        await self.producer.start()
        self.consumer = AIOKafkaConsumer(
            self.catalog.requests.name, bootstrap_servers=self.bootstrap, group_id=f"{self.catalog.prefix}.fake",
            auto_offset_reset="earliest",
        )
        self.cancels = AIOKafkaConsumer(
            self.catalog.cancellations.name, bootstrap_servers=self.bootstrap, auto_offset_reset="earliest",
        )
        await self.consumer.start()
        await self.cancels.start()
        self._tasks.add(asyncio.create_task(self._serve()))
        self._tasks.add(asyncio.create_task(self._watch_cancels()))

    async def announce(self, state: str = "ready", models: tuple[str, ...] = (MODEL,)) -> None:
        announcer = Announcer(self._publish, self.catalog.services.name, kind="engine-worker",
                              service_id=self.worker_id, heartbeat_s=5.0, models=lambda: list(models))
        await announcer.announce(state)

    async def _publish(self, topic: str, key: bytes, value: bytes) -> None:
        await self.producer.send_and_wait(topic, value, key=key)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.consumer.stop()
        await self.cancels.stop()
        await self.producer.stop()

    async def _serve(self) -> None:
        async for message in self.consumer:
            request = decode(message.value, GenerateRequest)
            self.requests.append(request)
            self.placed[request.request_id] = (message.key, message.partition)
            task = asyncio.create_task(self._answer(request))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _watch_cancels(self) -> None:
        async for message in self.cancels:
            self.cancelled.add(decode(message.value, CancelRequest).request_id)

    async def _send(self, request: GenerateRequest, event) -> None:
        await self.producer.send_and_wait(request.reply_to.topic, encode(event), key=request_key(request.request_id))

    async def _answer(self, request: GenerateRequest) -> None:
        prompt = request.prompt or request.messages[-1].content
        rid = request.request_id
        if prompt.startswith("ERROR:"):
            code, _, message = prompt[len("ERROR:"):].partition(" ")
            await self._send(request, ErrorEvent(request_id=rid, code=code, message=message or code))
            return
        slow = "SLOW" in prompt
        n = 40 if slow else min(request.sampling.max_tokens, 4)
        pieces = [f"w{i}-{rid[-4:]} " for i in range(n)]
        for i, piece in enumerate(pieces):
            if rid in self.cancelled:
                return
            chunk = TokenChunk(request_id=rid, index=i, text=piece, token_ids=[i], spec=SpecStepStats(drafted=2, accepted=1))
            await self._send(request, chunk)
            if "DUP" in prompt:
                await self._send(request, chunk)
            await asyncio.sleep(0.1 if slow else 0.005)
        await self._send(request, Completion(
            request_id=rid, text="".join(pieces), finish_reason="length", num_chunks=n,
            usage=Usage(prompt_tokens=3, completion_tokens=n, total_tokens=3 + n),
            timings=Timings(queued_s=0.0, ttft_s=0.01, total_s=0.02), spec=SpecStats(drafted=2 * n, accepted=n),
        ))


@pytest.fixture(scope="module")
def loop_thread():
    lt = LoopThread()
    yield lt
    lt.close()


@pytest.fixture(scope="module")
def catalog() -> TopicCatalog:
    return TopicCatalog(prefix=f"t-edge-{uuid.uuid4().hex[:8]}")


def options(bootstrap: str, catalog: TopicCatalog, edge_id: str) -> EdgeOptions:
    return EdgeOptions(Settings(
        kafka=KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=catalog.prefix,
                            request_partitions=catalog.request_partitions),
        edge=EdgeSettings(edge_id=edge_id, auth=EdgeAuthSettings(enabled=False)),
    ))


@pytest.fixture(scope="module")
def edge_a(kafka_bootstrap, catalog):
    with serve_in_thread(options(kafka_bootstrap, catalog, "edge-a")) as running:
        yield running


@pytest.fixture(scope="module")
def worker(kafka_bootstrap, catalog, loop_thread, edge_a):
    fake = FakeWorker(kafka_bootstrap, catalog)
    loop_thread.call(fake.start())
    yield fake
    loop_thread.call(fake.stop())


def _wait(predicate, timeout: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# --- readiness (first: before the double announces) ---------------------------------------------------------------


def test_readyz_503_until_a_worker_announces_then_200(edge_a, worker, loop_thread):
    assert httpx.get(edge_a.base_url + "/healthz").status_code == 200
    r = httpx.get(edge_a.base_url + "/readyz")
    assert r.status_code == 503, r.text
    assert "no worker announced ready" in r.json()["reason"]
    loop_thread.call(worker.announce("ready", models=("another-model",)))  # serves nothing this edge offers
    time.sleep(1.0)
    r = httpx.get(edge_a.base_url + "/readyz")
    assert r.status_code == 503 and "fake-worker=ready serving another-model" in r.json()["reason"], r.text
    loop_thread.call(worker.announce("ready"))
    _wait(lambda: httpx.get(edge_a.base_url + "/readyz").status_code == 200, what="/readyz 200")
    assert httpx.get(edge_a.base_url + "/readyz").json()["workers"] == ["fake-worker"]
    loop_thread.call(worker.announce("draining"))
    _wait(lambda: httpx.get(edge_a.base_url + "/readyz").status_code == 503, what="/readyz 503 after draining")
    loop_thread.call(worker.announce("ready"))
    _wait(lambda: httpx.get(edge_a.base_url + "/readyz").status_code == 200, what="/readyz 200 again")


# --- websocket -----------------------------------------------------------------------------------------------------


def test_websocket_two_requests_in_flight_tagged_by_id(edge_a, worker):
    with ws_connect(edge_a.ws_url) as ws:
        for tag in ("one", "two"):
            ws.send(json.dumps({"id": tag, "model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                "max_tokens": 4}))
        chunks: dict[str, list[dict]] = {"one": [], "two": []}
        done: dict[str, dict] = {}
        while len(done) < 2:
            msg = json.loads(ws.recv(timeout=20))
            assert msg["type"] in ("chunk", "done"), msg
            if msg["type"] == "chunk":
                assert msg["id"] not in done
                chunks[msg["id"]].append(msg)
            else:
                done[msg["id"]] = msg
    for tag in ("one", "two"):
        assert [c["index"] for c in chunks[tag]] == [0, 1, 2, 3]
        assert "".join(c["text"] for c in chunks[tag]) == done[tag]["text"]
        assert done[tag]["finish_reason"] == "length" and done[tag]["usage"]["completion_tokens"] == 4
        assert chunks[tag][0]["spec"] == {"drafted": 2, "accepted": 1}
    assert done["one"]["request_id"] != done["two"]["request_id"]


def test_websocket_malformed_frame_gets_error_and_socket_stays_open(edge_a, worker):
    with ws_connect(edge_a.ws_url) as ws:
        ws.send("{not json")
        err = json.loads(ws.recv(timeout=10))
        assert err["type"] == "error" and err["id"] is None and err["code"] == "invalid_json"
        ws.send(json.dumps({"id": 7, "model": MODEL, "messages": [{"role": "user", "content": "x"}], "bogus": 1}))
        err = json.loads(ws.recv(timeout=10))
        assert (err["id"], err["code"], err["param"]) == (7, "unknown_parameter", "bogus")
        ws.send(json.dumps({"id": 8, "model": "nope", "prompt": "x"}))
        err = json.loads(ws.recv(timeout=10))
        assert (err["id"], err["code"], err["status"]) == (8, "model_not_found", 404)
        ws.send(json.dumps({"id": 9, "model": MODEL, "prompt": "hello", "max_tokens": 2}))
        msgs = [json.loads(ws.recv(timeout=20)) for _ in range(3)]
        assert [m["type"] for m in msgs] == ["chunk", "chunk", "done"] and all(m["id"] == 9 for m in msgs)


def test_websocket_close_cancels_in_flight_requests(edge_a, worker):
    with ws_connect(edge_a.ws_url) as ws:
        ws.send(json.dumps({"id": "s", "model": MODEL, "prompt": "SLOW", "max_tokens": 64}))
        first = json.loads(ws.recv(timeout=20))
        assert first["type"] == "chunk"
        request_id = first["request_id"]
    _wait(lambda: request_id in worker.cancelled, what="CancelRequest after the socket closed")


def test_websocket_duplicate_chunks_are_dropped(edge_a, worker):
    with ws_connect(edge_a.ws_url) as ws:
        ws.send(json.dumps({"id": "d", "model": MODEL, "prompt": "DUP", "max_tokens": 3}))
        msgs = []
        while not msgs or msgs[-1]["type"] != "done":
            msgs.append(json.loads(ws.recv(timeout=20)))
    assert [m["index"] for m in msgs[:-1]] == [0, 1, 2]
    assert "".join(m["text"] for m in msgs[:-1]) == msgs[-1]["text"]


# --- OpenAI-compatible HTTP ----------------------------------------------------------------------------------------


def test_the_openai_client_is_served_chat_streamed_and_not_and_completions(edge_a, worker):
    from openai import OpenAI

    client = OpenAI(base_url=edge_a.base_url + "/v1", api_key="x", max_retries=0)
    models = client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    full = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert full.choices[0].message.content.startswith("w0-")
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 4
    assert full.id.startswith("chatcmpl-")
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                                            stream=True, stream_options={"include_usage": True})
    parts, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(parts).count("w") == 3 and finish == "length" and usage.completion_tokens == 3
    completion = client.completions.create(model=MODEL, prompt="hello", max_tokens=2)
    assert completion.choices[0].text.startswith("w0-") and completion.id.startswith("cmpl-")


def test_a_conversations_turns_share_its_key_and_partition_so_one_worker_holds_its_prefix(edge_a, worker):
    conversation = f"conv-{uuid.uuid4().hex[:8]}"
    request_ids = []
    with httpx.Client(timeout=20) as client:
        for turn, extra in enumerate([{"prompt_cache_key": conversation}, {"prompt_cache_key": conversation}, {}]):
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"turn {turn}"}], "max_tokens": 2, **extra}
            headers = {"x-conversation-id": conversation} if not extra else {}
            response = client.post(edge_a.base_url + "/v1/chat/completions", json=body, headers=headers)
            assert response.status_code == 200, response.text
            request_ids.append(response.json()["id"])
        lone = client.post(edge_a.base_url + "/v1/chat/completions",
                           json={"model": MODEL, "messages": [{"role": "user", "content": "alone"}], "max_tokens": 2})
        assert lone.status_code == 200, lone.text
    lone_id = lone.json()["id"]
    _wait(lambda: all(r in worker.placed for r in [*request_ids, lone_id]), what="the requests at the worker")
    # The body's prompt_cache_key and the X-Conversation-Id header both key the record by the conversation.
    assert {worker.placed[r] for r in request_ids} == {(conversation.encode(), worker.placed[request_ids[0]][1])}
    assert worker.placed[lone_id][0] == lone_id.encode()  # no conversation: keyed by its own id, as before


def test_http_stream_abort_publishes_cancel(edge_a, worker):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "SLOW"}], "stream": True}
    with httpx.Client(timeout=20) as client:
        with client.stream("POST", edge_a.base_url + "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            request_id = response.headers["x-request-id"]
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
    _wait(lambda: request_id in worker.cancelled, what="CancelRequest after the HTTP client aborted")


def test_http_non_stream_client_gone_publishes_cancel(edge_a, worker):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "SLOW"}]}
    before = {r.request_id for r in worker.requests}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(edge_a.base_url + "/v1/chat/completions", json=body, timeout=1.0)
    _wait(lambda: len(worker.requests) > len(before), what="the request to reach the worker")
    (request_id,) = {r.request_id for r in worker.requests} - before
    _wait(lambda: request_id in worker.cancelled, what="CancelRequest after the client gave up")


@pytest.mark.parametrize(
    ("content", "kwargs", "status", "code", "param"),
    [
        (b"{bad json", {}, 400, "invalid_json", None),
        (None, {"temprature": 0.5}, 400, "unknown_parameter", "temprature"),
        (None, {"model": "gpt-9"}, 404, "model_not_found", "model"),
        (None, {"messages": []}, 400, "invalid_value", "messages"),
        (None, {"messages": [{"role": "user", "content": "x", "nme": "a"}]}, 400, "unknown_parameter",
         "messages[0].nme"),
        (None, {"n": 2, "stream": True}, 400, "unsupported_value", "n"),
        (None, {"stop": ["a"] * 9}, 400, "invalid_value", "stop"),
    ],
)
def test_http_client_errors_are_precise(edge_a, content, kwargs, status, code, param):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **kwargs}
    r = httpx.post(edge_a.base_url + "/v1/chat/completions", content=content or json.dumps(body).encode(),
                   headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["code"], error["param"]) == (code, param)
    assert error["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("prompt", "status", "code", "param"),
    [
        ("ERROR:context_length_exceeded prompt has 9000 tokens and max_tokens is 8: 9000+8 exceeds the model's "
         "context of 2048 tokens", 400, "context_length_exceeded", "messages"),
        ("ERROR:context_length_exceeded prompt has 9 tokens and max_tokens is 4000: 9+4000 exceeds the model's "
         "context of 2048 tokens", 400, "context_length_exceeded", "max_tokens"),
        ("ERROR:unknown_model not served", 404, "model_not_found", "model"),
        ("ERROR:overloaded busy", 503, "overloaded", None),
        ("ERROR:internal_error boom", 500, "internal_error", None),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
def test_worker_errors_map_to_http_status(edge_a, worker, prompt, status, code, param, stream):
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "stream": stream}
    r = httpx.post(edge_a.base_url + "/v1/chat/completions", json=body, timeout=20)
    assert r.status_code == status, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == (code, param)


# --- two edges -----------------------------------------------------------------------------------------------------


def test_two_edges_each_receive_only_their_own_replies(kafka_bootstrap, catalog, edge_a, worker):
    from openai import OpenAI

    with serve_in_thread(options(kafka_bootstrap, catalog, "edge-b")) as edge_b:
        assert edge_b.edge.reply_topic != edge_a.edge.reply_topic
        seen_before = {"a": set(edge_a.edge.router.seen), "b": set(edge_b.edge.router.seen)}
        issued: dict[str, set[str]] = {"a": set(), "b": set()}
        errors: list[BaseException] = []

        def drive(name: str, running) -> None:
            try:
                client = OpenAI(base_url=running.base_url + "/v1", api_key="x", max_retries=0)
                for i in range(4):
                    r = client.chat.completions.create(
                        model=MODEL, messages=[{"role": "user", "content": f"{name}{i}"}], max_tokens=3)
                    issued[name].add(r.id)
                    assert r.id[-4:] in r.choices[0].message.content  # the reply is to this request
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

        threads = [threading.Thread(target=drive, args=("a", edge_a)), threading.Thread(target=drive, args=("b", edge_b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        seen_a = set(edge_a.edge.router.seen) - seen_before["a"]
        seen_b = set(edge_b.edge.router.seen) - seen_before["b"]
        assert issued["a"] <= seen_a and seen_b == issued["b"]
        # Every id that reached a router belongs to a request that named that edge's topic in reply_to.
        reply_topic_of = {r.request_id: r.reply_to.topic for r in worker.requests}
        assert {reply_topic_of[i] for i in set(edge_a.edge.router.seen)} == {edge_a.edge.reply_topic}
        assert {reply_topic_of[i] for i in set(edge_b.edge.router.seen)} == {edge_b.edge.reply_topic}
        assert edge_b.edge.router.stats.unknown == 0
