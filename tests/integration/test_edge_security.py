"""Authentication and per-tenant limits end to end: real Kafka, the real worker (tests/edge_support.py), edges in-process.

* 401 for missing and wrong keys on every HTTP route, websocket close 1008 for
  each way of (not) authenticating, revocation taking effect on a running edge;
* keys and prompts never in any log, the access log carrying request id,
  tenant, sizes, timings and a prompt hash; the tenant reaching GenerateRequest;
* 429 with Retry-After for each limit (rpm, tpm, concurrency) while other
  tenants are served;
* the limits holding across two edges that share a real redis-server.

Generation is kept to a token or two, except where a request must stay in
flight (concurrency), so the module runs in well under a minute once the
worker is up.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from schemas.events import GenerateRequest
from streams.edge.keys import create_key, revoke_keys
from streams.edge.server import RunningEdge, serve_in_thread
from streams.kafka.clients import decode
from streams.testing.stack import DEFAULT_MODEL as MODEL
from streams.testing.stack import Stack
from tests.edge_support import edge_options, redis_server, request_topic_messages, shared_worker, wait_ready
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(400)]

SECRET_MARKER = "zebra-papaya-7781"  # appears in prompts; must never appear in a log
HI = [{"role": "user", "content": "Say hi."}]


@pytest.fixture(scope="session")
def edge_worker(kafka_bootstrap: str) -> Iterator[Stack]:  # noqa: F811
    yield from shared_worker(kafka_bootstrap)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("keys")
    path = folder / "keys.json"
    tenants = {
        "alice": {}, "other": {}, "rpm2": {"rpm": 2}, "tpm100": {"tpm": 100}, "conc1": {"concurrency": 1},
        "shared-rpm": {"rpm": 3}, "shared-conc": {"concurrency": 1}, "leaver": {},
    }
    out = {"_file": str(path)}
    for tenant, limits in tenants.items():
        out[tenant], _ = create_key(path, tenant, **limits)
    return out


@pytest.fixture(scope="module")
def edge(kafka_bootstrap: str, edge_worker: Stack, keys: dict[str, str]) -> Iterator[RunningEdge]:  # noqa: F811
    options = edge_options(kafka_bootstrap, edge_worker.topic_prefix, f"sec-{uuid.uuid4().hex[:6]}",
                           Path(keys["_file"]))
    with serve_in_thread(options) as running:
        wait_ready(running.base_url, edge_worker)
        yield running


def _chat(edge: RunningEdge, key: str | None, *, max_tokens: int = 1, messages=HI, **extra) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, **extra}
    return httpx.post(edge.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=120)


# --- 401 ------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [
    ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", f"/v1/models/{MODEL}"),
])
@pytest.mark.parametrize("auth", [None, "Bearer sk-ss-00000000-not-a-real-key", "Bearer", "Basic dXNlcjpwYXNz"])
def test_http_401_for_missing_and_wrong_keys(edge: RunningEdge, method: str, path: str, auth: str | None) -> None:
    headers = {"Authorization": auth} if auth is not None else {}
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 1} if method == "POST" else None
    response = httpx.request(method, edge.base_url + path, json=body, headers=headers, timeout=30)
    assert response.status_code == 401, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == ("missing_api_key" if auth in (None, "Bearer") else "invalid_api_key")
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert "not-a-real-key" not in response.text


def test_public_routes_need_no_key(edge: RunningEdge) -> None:
    for path in ("/healthz", "/readyz", "/", "/openapi.json", "/static/app.js"):
        assert httpx.get(edge.base_url + path, timeout=10).status_code == 200, path


def test_a_valid_key_is_served_and_its_tenant_reaches_the_request(kafka_bootstrap: str, edge: RunningEdge,  # noqa: F811
                                                                   edge_worker: Stack, keys: dict[str, str]) -> None:
    response = _chat(edge, keys["alice"])
    assert response.status_code == 200, response.text
    request_id = response.json()["id"]
    published = [decode(raw, GenerateRequest) for raw in asyncio.run(request_topic_messages(kafka_bootstrap, edge_worker.topic_prefix))]
    mine = [r for r in published if getattr(r, "request_id", None) == request_id]
    assert len(mine) == 1 and mine[0].tenant == "alice"


def _ws_closed_with(ws, code: int) -> str:
    with pytest.raises(ConnectionClosed) as closed:
        for _ in range(5):
            ws.recv(timeout=30)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == code, closed.value
    return closed.value.rcvd.reason


def test_websocket_closes_1008_without_a_valid_key(edge: RunningEdge, keys: dict[str, str]) -> None:
    # A wrong key in the header: closed at once.
    with ws_connect(edge.ws_url, additional_headers={"Authorization": "Bearer sk-ss-wrong"}) as ws:
        assert _ws_closed_with(ws, 1008) == "invalid_api_key"
    # A wrong key in the subprotocols.
    with ws_connect(edge.ws_url, subprotocols=["specstream.v1", "specstream.key.sk-ss-wrong"]) as ws:
        assert ws.subprotocol == "specstream.v1"
        assert _ws_closed_with(ws, 1008) == "invalid_api_key"
    # No key at all, and a request as the first frame.
    with ws_connect(edge.ws_url) as ws:
        ws.send(json.dumps({"id": 1, "model": MODEL, "messages": HI, "max_tokens": 1}))
        assert "missing_api_key" in _ws_closed_with(ws, 1008)
    # A wrong key in the auth frame.
    with ws_connect(edge.ws_url) as ws:
        ws.send(json.dumps({"type": "auth", "api_key": "sk-ss-wrong"}))
        assert _ws_closed_with(ws, 1008) == "invalid_api_key"
    # An auth frame without a key.
    with ws_connect(edge.ws_url) as ws:
        ws.send(json.dumps({"type": "auth"}))
        assert _ws_closed_with(ws, 1008) == "missing_api_key"


def _ws_generate(ws, **body) -> list[dict]:
    ws.send(json.dumps({"id": "q", "model": MODEL, "messages": HI, "max_tokens": 2, **body}))
    frames = []
    while not frames or frames[-1]["type"] == "chunk":
        frames.append(json.loads(ws.recv(timeout=120)))
    return frames


@pytest.mark.parametrize("how", ["header", "subprotocol", "first_frame"])
def test_websocket_authenticates_three_ways(edge: RunningEdge, keys: dict[str, str], how: str) -> None:
    key = keys["alice"]
    kwargs = {"header": {"additional_headers": {"Authorization": f"Bearer {key}"}},
              "subprotocol": {"subprotocols": ["specstream.v1", f"specstream.key.{key}"]},
              "first_frame": {}}[how]
    with ws_connect(edge.ws_url, **kwargs) as ws:
        if how == "subprotocol":
            assert ws.subprotocol == "specstream.v1"  # the key is never echoed
        if how == "first_frame":
            ws.send(json.dumps({"type": "auth", "api_key": key}))
            assert json.loads(ws.recv(timeout=10)) == {"type": "auth", "ok": True, "tenant": "alice"}
        frames = _ws_generate(ws)
    assert frames[-1]["type"] == "done", frames
    assert all("draft_chars" in f for f in frames[:-1])


def test_revoked_key_stops_working_on_a_running_edge(edge: RunningEdge, keys: dict[str, str]) -> None:
    assert _chat(edge, keys["leaver"]).status_code == 200
    revoke_keys(Path(keys["_file"]), tenant="leaver")
    time.sleep(1.2)  # the store re-reads the file at most once a second
    response = _chat(edge, keys["leaver"])
    assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"


# --- logs -------------------------------------------------------------------------------------------------------------


def test_keys_and_prompts_never_appear_in_logs(edge: RunningEdge, edge_worker: Stack, keys: dict[str, str],
                                               caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = f"sk-ss-deadbeef-{uuid.uuid4().hex}"
    secret_messages = [{"role": "user", "content": f"Repeat after me: {SECRET_MARKER}"}]
    ok = _chat(edge, keys["alice"], messages=secret_messages, max_tokens=3)
    assert ok.status_code == 200
    streamed = _chat(edge, keys["alice"], messages=secret_messages, max_tokens=2, stream=True)
    assert streamed.status_code == 200
    assert _chat(edge, wrong, messages=secret_messages).status_code == 401
    assert _chat(edge, keys["alice"], messages=secret_messages, max_tokens=2, temprature=1).status_code == 400
    too_long = [{"role": "user", "content": f"{SECRET_MARKER} " * 200}]
    assert _chat(edge, keys["alice"], messages=too_long).status_code == 400
    with ws_connect(edge.ws_url) as ws:
        ws.send(json.dumps({"type": "auth", "api_key": keys["alice"]}))
        ws.recv(timeout=10)
        assert _ws_generate(ws, messages=secret_messages)[-1]["type"] == "done"
    with ws_connect(edge.ws_url, subprotocols=["specstream.v1", f"specstream.key.{wrong}"]) as ws:
        _ws_closed_with(ws, 1008)
    time.sleep(0.5)  # let the access-log lines of the websocket requests land

    captured = capfd.readouterr()
    # Everything the server side logged, at every level (the test's own clients log their requests: not ours).
    client_side = ("websockets.client", "httpx", "httpcore")
    server_records = [r for r in caplog.records if not r.name.startswith(client_side)]
    logged = "\n".join([*(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in server_records),
                        captured.out, captured.err])
    assert any(r.levelno == logging.DEBUG for r in caplog.records)  # DEBUG really was captured
    for secret in (keys["alice"], wrong, keys["alice"].split("-", 3)[-1], SECRET_MARKER):
        assert secret not in logged, f"{secret[:12]}... appears in the logs"
    # The worker's log sees prompts (it runs the model), but it must not log them either.
    worker_log = "\n".join(p.log.read_text(errors="replace") for p in edge_worker.processes)
    assert SECRET_MARKER not in worker_log and keys["alice"] not in worker_log

    access = [r.getMessage() for r in caplog.records if r.name == "streams.edge.access"]
    served = [line for line in access if f"request_id={ok.json()['id']}" in line]
    assert len(served) == 1, access
    line = served[0]
    for field in ("tenant=alice", "api=chat", "status=200", "prompt_sha256=", "prompt_chars=", "prompt_tokens=",
                  "body_bytes=", "completion_tokens=", "ttft_ms=", "total_ms="):
        assert field in line, (field, line)
    assert any("status=401" in a and "code=invalid_api_key" in a for a in access)
    assert any("status=400" in a and "code=context_length_exceeded" in a and "tenant=alice" in a for a in access)
    assert any("api=ws" in a and "status=200" in a for a in access)


# --- 429 ---------------------------------------------------------------------------------------------------------------


def _assert_429(response: httpx.Response, limit: str) -> int:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert response.headers["x-ratelimit-limited"] == limit
    retry_after = int(response.headers["retry-after"])
    assert 1 <= retry_after <= 120
    return retry_after


def test_rpm_limit_429_with_retry_after_other_tenants_unaffected(edge: RunningEdge, keys: dict[str, str]) -> None:
    assert _chat(edge, keys["rpm2"]).status_code == 200
    assert _chat(edge, keys["rpm2"]).status_code == 200
    _assert_429(_chat(edge, keys["rpm2"]), "rpm")
    assert _chat(edge, keys["other"]).status_code == 200
    # Nothing is charged for a refused request, and the websocket applies the same limit.
    with ws_connect(edge.ws_url, additional_headers={"Authorization": f"Bearer {keys['rpm2']}"}) as ws:
        frames = _ws_generate(ws)
    assert frames[-1]["type"] == "error" and frames[-1]["status"] == 429 and frames[-1]["retry_after"] >= 1


def test_tpm_limit_429_counts_prompt_and_max_tokens(edge: RunningEdge, keys: dict[str, str]) -> None:
    prompt = "word " * 60  # ~60 tokens; with max_tokens=1 nothing can be refunded
    first = httpx.post(edge.base_url + "/v1/completions", headers={"Authorization": f"Bearer {keys['tpm100']}"},
                       json={"model": MODEL, "prompt": prompt, "max_tokens": 1}, timeout=120)
    assert first.status_code == 200, first.text
    second = httpx.post(edge.base_url + "/v1/completions", headers={"Authorization": f"Bearer {keys['tpm100']}"},
                        json={"model": MODEL, "prompt": prompt, "max_tokens": 1}, timeout=120)
    _assert_429(second, "tpm")
    assert "100 tokens per minute" in second.json()["error"]["message"]
    huge = httpx.post(edge.base_url + "/v1/completions", headers={"Authorization": f"Bearer {keys['tpm100']}"},
                      json={"model": MODEL, "prompt": "hi", "max_tokens": 200}, timeout=120)
    _assert_429(huge, "tpm")
    assert "more than your tenant's limit" in huge.json()["error"]["message"]
    assert _chat(edge, keys["other"]).status_code == 200


class _Streaming:
    """A streamed request held open in a thread until released."""

    def __init__(self, base_url: str, key: str, max_tokens: int = 400) -> None:
        self.first_chunk = threading.Event()
        self.release = threading.Event()
        self.status: int | None = None
        self._thread = threading.Thread(target=self._run, args=(base_url, key, max_tokens), daemon=True)
        self._thread.start()

    def _run(self, base_url: str, key: str, max_tokens: int) -> None:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Count from 1 to 200."}],
                "max_tokens": max_tokens, "stream": True}
        with httpx.stream("POST", base_url + "/v1/chat/completions", json=body, timeout=120,
                          headers={"Authorization": f"Bearer {key}"}) as response:
            self.status = response.status_code
            for _ in response.iter_lines():
                self.first_chunk.set()
                if self.release.is_set():
                    break  # closing the response cancels the request

    def __enter__(self) -> "_Streaming":
        assert self.first_chunk.wait(120), f"no chunk (status {self.status})"
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self._thread.join(60)


def _eventually(predicate, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_concurrency_limit_429_while_a_stream_is_in_flight(edge: RunningEdge, keys: dict[str, str]) -> None:
    with _Streaming(edge.base_url, keys["conc1"]):
        _assert_429(_chat(edge, keys["conc1"]), "concurrency")
        assert _chat(edge, keys["other"]).status_code == 200
    # The stream's lease is returned when its client goes away.
    _eventually(lambda: _chat(edge, keys["conc1"]).status_code == 200)


# --- two edges, one Redis -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_edges(kafka_bootstrap: str, edge_worker: Stack, keys: dict[str, str]) -> Iterator[tuple[RunningEdge, RunningEdge]]:  # noqa: F811
    with redis_server() as url:
        tag = uuid.uuid4().hex[:6]
        make = lambda name: edge_options(kafka_bootstrap, edge_worker.topic_prefix, f"sec-{tag}-{name}",  # noqa: E731
                                         Path(keys["_file"]), redis_url=url)
        with serve_in_thread(make("b")) as b, serve_in_thread(make("c")) as c:
            wait_ready(b.base_url, edge_worker)
            wait_ready(c.base_url, edge_worker)
            yield b, c


def test_limits_hold_across_two_edges_sharing_redis(redis_edges: tuple[RunningEdge, RunningEdge],
                                                    keys: dict[str, str]) -> None:
    b, c = redis_edges
    key = keys["shared-rpm"]
    assert _chat(b, key).status_code == 200
    assert _chat(c, key).status_code == 200
    assert _chat(b, key).status_code == 200
    _assert_429(_chat(c, key), "rpm")  # in memory, edge C alone would have let this one through
    _assert_429(_chat(b, key), "rpm")
    assert _chat(c, keys["other"]).status_code == 200

    with _Streaming(b.base_url, keys["shared-conc"]):
        _assert_429(_chat(c, keys["shared-conc"]), "concurrency")
    _eventually(lambda: _chat(c, keys["shared-conc"]).status_code == 200)
