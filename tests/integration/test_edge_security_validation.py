"""Every malformed request gets its precise 4xx naming the field, and nothing reaches Kafka.

An edge (auth on, the model's tokenizer, a 512-token context like the test
worker's) runs in-process on a topic prefix of this module's own with no
worker at all: valid requests are never sent, so every request below must be
refused by the edge itself. At the end the module reads the prefix's request
topic from the start and finds it empty.
"""
from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from streams.edge.keys import create_key
from streams.edge.server import RunningEdge, serve_in_thread
from streams.testing.stack import DEFAULT_MODEL as MODEL
from tests.edge_support import edge_options, request_topic_messages
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(300)]

BODY_LIMIT = 64 * 1024
FRAME_LIMIT = 16 * 1024
USER = [{"role": "user", "content": "What is Kafka?"}]
LONG = [{"role": "user", "content": "word " * 600}]  # > 512 tokens


@pytest.fixture(scope="module")
def prefix() -> str:
    return f"t-edge-val-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def key_and_edge(kafka_bootstrap: str, prefix: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, RunningEdge]]:  # noqa: F811
    keys_file = tmp_path_factory.mktemp("keys") / "keys.json"
    key, _ = create_key(keys_file, "validator")
    options = edge_options(kafka_bootstrap, prefix, f"{prefix}-edge", keys_file, max_body_bytes=BODY_LIMIT,
                           max_ws_frame_bytes=FRAME_LIMIT)
    with serve_in_thread(options) as running:
        yield key, running  # requests wait for the tokenizer while it loads; no worker is needed


@pytest.fixture(scope="module")
def nothing_published(kafka_bootstrap: str, prefix: str, key_and_edge) -> Iterator[None]:  # noqa: F811
    """Checked after every test of the module has sent its requests."""
    yield
    messages = asyncio.run(request_topic_messages(kafka_bootstrap, prefix))
    assert messages == [], f"{len(messages)} request(s) reached Kafka: {messages[:3]}"


def _post(edge: RunningEdge, key: str, path: str, content: bytes, **headers: str) -> httpx.Response:
    return httpx.post(edge.base_url + path, content=content, timeout=120,
                      headers={"Authorization": f"Bearer {key}", "content-type": "application/json", **headers})


def _j(**body) -> bytes:
    return json.dumps(body).encode()


CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"

CASES = [
    # (id, path, raw body, status, code, param)
    ("not-json", CHAT, b'{"model": "x", "messages": [', 400, "invalid_json", None),
    ("not-an-object", CHAT, b'["a"]', 400, "invalid_json", None),
    ("nan", CHAT, b'{"model": "m", "temperature": NaN}', 400, "invalid_json", None),
    ("latin-1", CHAT, b'{"model": "caf\xe9", "messages": []}', 400, "invalid_encoding", None),
    ("utf-16", CHAT, json.dumps({"model": MODEL}).encode("utf-16"), 400, "invalid_encoding", None),
    ("lone-surrogate", CHAT, b'{"model": "m", "messages": [{"role": "user", "content": "\\udc00"}]}', 400,
     "invalid_encoding", "messages[0].content"),
    ("unknown-param", CHAT, _j(model=MODEL, messages=USER, temprature=0.5), 400, "unknown_parameter", "temprature"),
    ("functions", CHAT, _j(model=MODEL, messages=USER, functions=[{"name": "f"}]), 400,
     "unsupported_parameter", "functions"),
    ("tool_choice-not-in-tools", CHAT, _j(model=MODEL, messages=USER, tools=[{"type": "function", "function": {
        "name": "f"}}], tool_choice={"type": "function", "function": {"name": "g"}}), 400, "invalid_value",
     "tool_choice"),
    ("response_format-bad-schema", CHAT, _j(model=MODEL, messages=USER, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}), 400, "invalid_schema",
     "response_format.json_schema.schema"),
    ("logit_bias", CHAT, _j(model=MODEL, messages=USER, logit_bias={"1": 101}), 400, "invalid_value",
     "logit_bias"),
    ("n=2-streamed", CHAT, _j(model=MODEL, messages=USER, n=2, stream=True), 400, "unsupported_value", "n"),
    ("top_logprobs", CHAT, _j(model=MODEL, messages=USER, logprobs=True, top_logprobs=21), 400, "invalid_value",
     "top_logprobs"),
    ("best_of", COMPLETIONS, _j(model=MODEL, prompt="hi", best_of=2), 400, "unsupported_parameter", "best_of"),
    ("echo-n=2", COMPLETIONS, _j(model=MODEL, prompt="hi", echo=True, n=2, stream=False), 400, "unsupported_value", "echo"),
    ("max_tokens=0-without-echo", COMPLETIONS, _j(model=MODEL, prompt="hi", max_tokens=0), 400, "invalid_value",
     "max_tokens"),
    ("max_tokens=0", CHAT, _j(model=MODEL, messages=USER, max_tokens=0), 400, "invalid_value", "max_tokens"),
    ("max_tokens-huge", CHAT, _j(model=MODEL, messages=USER, max_tokens=10**6), 400, "invalid_value", "max_tokens"),
    ("max_tokens-string", CHAT, _j(model=MODEL, messages=USER, max_tokens="ten"), 400, "invalid_value", "max_tokens"),
    ("temperature>2", CHAT, _j(model=MODEL, messages=USER, temperature=2.5), 400, "invalid_value", "temperature"),
    ("temperature<0", COMPLETIONS, _j(model=MODEL, prompt="hi", temperature=-1), 400, "invalid_value", "temperature"),
    ("top_p=0", CHAT, _j(model=MODEL, messages=USER, top_p=0), 400, "invalid_value", "top_p"),
    ("no-messages", CHAT, _j(model=MODEL), 400, "missing_required_parameter", "messages"),
    ("bad-role", CHAT, _j(model=MODEL, messages=[{"role": "robot", "content": "x"}]), 400, "invalid_value",
     "messages[0].role"),
    ("two-prompts", COMPLETIONS, _j(model=MODEL, prompt=["a", "b"]), 400, "unsupported_value", "prompt"),
    ("empty-prompt", COMPLETIONS, _j(model=MODEL, prompt=""), 400, "invalid_value", "prompt"),
    ("unknown-model", CHAT, _j(model="gpt-9", messages=USER), 404, "model_not_found", "model"),
    ("context-messages", CHAT, _j(model=MODEL, messages=LONG, max_tokens=4), 400, "context_length_exceeded",
     "messages"),
    ("context-prompt", COMPLETIONS, _j(model=MODEL, prompt="word " * 600, max_tokens=4), 400,
     "context_length_exceeded", "prompt"),
    ("context-max_tokens", CHAT, _j(model=MODEL, messages=USER, max_tokens=600), 400, "context_length_exceeded",
     "max_tokens"),
    ("body-too-large", COMPLETIONS, _j(model=MODEL, prompt="x" * BODY_LIMIT), 413, "request_too_large", None),
]


@pytest.mark.parametrize(("path", "raw", "status", "code", "param"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_each_case_gets_its_4xx_naming_the_field(key_and_edge, nothing_published, path: str, raw: bytes,
                                                 status: int, code: str, param: str | None, stream: bool) -> None:
    key, edge = key_and_edge
    # A case that sets stream itself keeps it (streamed, echo with n=2 is refused for n first).
    if stream and raw.startswith(b"{") and raw.endswith(b"}") and b"NaN" not in raw and b'"stream"' not in raw:
        raw = raw[:-1] + b', "stream": true}'
    response = _post(edge, key, path, raw)
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["code"], error["param"]) == (code, param), error["message"]


def test_a_chunked_body_over_the_limit_is_413(key_and_edge, nothing_published) -> None:
    key, edge = key_and_edge

    def chunks():
        yield b'{"model": "' + MODEL.encode() + b'", "prompt": "'
        for _ in range(BODY_LIMIT // 1024 + 2):
            yield b"x" * 1024
        yield b'"}'

    response = httpx.post(edge.base_url + COMPLETIONS, content=chunks(), timeout=60,
                          headers={"Authorization": f"Bearer {key}", "content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"


def _ws(edge: RunningEdge, key: str):
    return ws_connect(edge.ws_url, additional_headers={"Authorization": f"Bearer {key}"}, max_size=None)


WS_CASES = [
    ("not-json", "nope", "invalid_json", None),
    ("latin-1-bytes", b'{"model": "caf\xe9"}', "invalid_encoding", None),
    ("unknown-param", json.dumps({"id": 1, "model": MODEL, "messages": USER, "temprature": 1}), "unknown_parameter",
     "temprature"),
    ("functions", json.dumps({"id": 1, "model": MODEL, "messages": USER, "functions": [{"name": "f"}]}),
     "unsupported_parameter", "functions"),
    ("tools-schema", json.dumps({"id": 1, "model": MODEL, "messages": USER, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "string", "format": "no-such-format"}}}]}), "invalid_schema",
     "tools[0].function.parameters"),
    ("temperature", json.dumps({"id": 1, "model": MODEL, "messages": USER, "temperature": 9}), "invalid_value",
     "temperature"),
    ("context", json.dumps({"id": 1, "model": MODEL, "messages": LONG, "max_tokens": 4}), "context_length_exceeded",
     "messages"),
    ("context-max_tokens", json.dumps({"id": 1, "model": MODEL, "prompt": "hi", "max_tokens": 600}),
     "context_length_exceeded", "max_tokens"),
]


@pytest.mark.parametrize(("frame", "code", "param"), [c[1:] for c in WS_CASES], ids=[c[0] for c in WS_CASES])
def test_websocket_frames_get_error_frames_and_the_socket_stays_open(key_and_edge, nothing_published, frame,
                                                                      code: str, param: str | None) -> None:
    key, edge = key_and_edge
    with _ws(edge, key) as ws:
        ws.send(frame)
        error = json.loads(ws.recv(timeout=60))
        assert (error["type"], error["code"], error["param"]) == ("error", code, param), error
        assert 400 <= error["status"] < 500
        ws.send(json.dumps({"type": "cancel", "id": "nothing"}))  # still open: answered
        assert json.loads(ws.recv(timeout=10))["code"] == "unknown_id"


def test_websocket_frame_over_the_limit_closes_1009(key_and_edge, nothing_published) -> None:
    key, edge = key_and_edge
    with _ws(edge, key) as ws:
        ws.send(json.dumps({"id": 1, "model": MODEL, "prompt": "x" * (FRAME_LIMIT + 10)}))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009
