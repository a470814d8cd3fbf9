"""The admission pipeline (read -> parse -> build -> validate -> admit) in one process, with no broker: what comes
out of it is a valid request charged to the caller's tenant, and whatever any stage refuses is neither charged nor
left out of the access log. The HTTP routes and the websocket feed it the same way (tests/integration cover them)."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from starlette.requests import Request

from engine.config import EngineConfig
from schemas.events import Completion, Timings, Usage
from streams.config import EdgeAuthSettings, EdgeSettings, Settings
from streams.edge.admission.admit import Ticket
from streams.edge.admission.pipeline import Pipeline
from streams.edge.admission.read import FrameTooLarge, read_body, read_frame
from streams.edge.keys import Principal, TenantLimits
from streams.edge.settings import EdgeOptions
from streams.edge.tokenizers import Tokenizers
from streams.wire import errors
from streams.wire.bodies import ChatCompletionBody, CompletionBody, WsRequestBody
from tests.tokenizer_support import loaded_tokenizers

MODEL = "smollm2-135m-instruct"
CONTEXT = 64
ALICE = Principal("alice", "k1", TenantLimits(rpm=3, tpm=1000, concurrency=2))


def _options(**edge) -> EdgeOptions:
    return EdgeOptions(Settings(edge=EdgeSettings(edge_id="adm", auth=EdgeAuthSettings(enabled=False), **edge),
                                engine=EngineConfig(max_model_len=CONTEXT)))


@pytest.fixture(scope="module")
def tokenizers() -> Tokenizers:
    return loaded_tokenizers(MODEL, CONTEXT)


@pytest_asyncio.fixture(loop_scope="function")
async def pipeline(tokenizers: Tokenizers) -> AsyncIterator[Pipeline]:
    """A pipeline with limits of its own, so each test starts with nothing charged."""
    fresh = Pipeline(_options(max_tokens_default=100))
    fresh.tokenizers = tokenizers
    await fresh.limiter.start()
    yield fresh
    await fresh.limiter.stop()


def _chat(content: str = "What is Kafka?", **fields) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}], **fields}


async def _finish(ticket: Ticket, final: Completion | None = None) -> None:
    ticket.finish(200, final)
    await asyncio.sleep(0.01)  # the lease is returned by a task of its own (safe from a cancelled relay)


def _refusal(caplog: pytest.LogCaptureFixture) -> str:
    lines = [r.getMessage() for r in caplog.records if r.name == "streams.edge.access"]
    assert len(lines) == 1, lines
    return lines[0]


async def test_an_admitted_request_is_valid_charged_and_its_default_max_tokens_fits_the_context(pipeline) -> None:
    ticket = await pipeline.admit(ALICE, ChatCompletionBody, _chat())
    request = ticket.request
    assert (request.tenant, request.model, request.reply_to.topic) == ("alice", MODEL, "specstream.replies.adm")
    # No max_tokens given: the default (100) is capped to what the 64-token context leaves after the prompt.
    assert ticket.prompt_tokens and request.sampling.max_tokens == CONTEXT - ticket.prompt_tokens
    assert ticket.body.streams is False and ticket.input_param == "messages"
    ticket.finish(200)


async def test_http_and_websocket_bodies_go_through_the_same_stages(pipeline) -> None:
    ws = await pipeline.admit(ALICE, WsRequestBody, {"id": 1, "model": MODEL, "prompt": "Kafka is", "max_tokens": 4})
    http = await pipeline.admit(ALICE, CompletionBody, {"model": MODEL, "prompt": "Kafka is", "max_tokens": 4})
    assert ws.request.prompt == http.request.prompt == "Kafka is"
    assert ws.prompt_tokens == http.prompt_tokens and ws.input_param == http.input_param == "prompt"
    for ticket in (ws, http):
        ticket.finish(200)


@pytest.mark.parametrize(("body_type", "data", "status", "code", "param"), [
    (ChatCompletionBody, _chat(temprature=1), 400, "unknown_parameter", "temprature"),
    (ChatCompletionBody, _chat(functions=[{"name": "f"}]), 400, "unsupported_parameter", "functions"),
    # A bad field is reported before the unknown model: the stages' order is the errors' order.
    (ChatCompletionBody, {**_chat(max_tokens=0), "model": "gpt-9"}, 400, "invalid_value", "max_tokens"),
    (ChatCompletionBody, {**_chat(), "model": "gpt-9"}, 404, "model_not_found", "model"),
    (CompletionBody, {"model": MODEL, "prompt": "word " * 80, "max_tokens": 1}, 400, "context_length_exceeded",
     "prompt"),
    (WsRequestBody, _chat(max_tokens=CONTEXT), 400, "context_length_exceeded", "max_tokens"),
])
async def test_a_refusal_at_any_stage_is_logged_and_not_charged(pipeline, caplog, body_type, data, status, code,
                                                                param) -> None:
    caplog.set_level(logging.INFO, logger="streams.edge.access")
    with pytest.raises(errors.EdgeError) as caught:
        await pipeline.admit(ALICE, body_type, data)
    assert (caught.value.status, caught.value.code, caught.value.param) == (status, code, param)
    line = _refusal(caplog)
    assert f"status={status}" in line and f"code={code}" in line and "tenant=alice" in line
    assert f"api={body_type.api}" in line and "What is Kafka" not in line
    # Nothing was charged: the tenant still has all three of its requests per minute.
    tickets = [await pipeline.admit(ALICE, ChatCompletionBody, _chat(max_tokens=4)) for _ in range(2)]
    await _finish(tickets[0])
    tickets.append(await pipeline.admit(ALICE, ChatCompletionBody, _chat(max_tokens=4)))
    for ticket in tickets:
        ticket.finish(200)


async def test_over_the_tenants_limits_is_429_and_the_lease_returns_when_the_ticket_finishes(pipeline) -> None:
    limited = Principal("bob", "k2", TenantLimits(concurrency=1))
    first = await pipeline.admit(limited, CompletionBody, {"model": MODEL, "prompt": "a", "max_tokens": 2})
    with pytest.raises(errors.EdgeError) as caught:
        await pipeline.admit(limited, CompletionBody, {"model": MODEL, "prompt": "b", "max_tokens": 2})
    assert (caught.value.status, caught.value.headers["X-RateLimit-Limited"]) == (429, "concurrency")
    usage = Usage(prompt_tokens=first.prompt_tokens, completion_tokens=2, total_tokens=first.prompt_tokens + 2)
    await _finish(first, Completion(request_id=first.request.request_id, text="xy", finish_reason="length",
                                    num_chunks=2, usage=usage, timings=Timings(queued_s=0, ttft_s=0, total_s=0)))
    (await pipeline.admit(limited, CompletionBody, {"model": MODEL, "prompt": "b", "max_tokens": 2})).finish(200)


def _http_request(body: bytes, *, content_length: int | None = -1, parts: int = 1) -> Request:
    """A request whose body arrives in ``parts`` pieces; Content-Length: the body's (-1), the given one, or none."""
    step = -(-len(body) // parts) or 1
    chunks = [body[i:i + step] for i in range(0, len(body), step)] or [b""]
    messages = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]

    async def receive() -> dict:
        return messages.pop(0)

    declared = len(body) if content_length == -1 else content_length
    headers = [] if declared is None else [(b"content-length", str(declared).encode())]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers}, receive)


async def test_the_read_stage_refuses_an_oversized_body_by_its_length_or_while_reading() -> None:
    assert await read_body(_http_request(b"x" * 2000), 2000) == b"x" * 2000
    for request in (_http_request(b"{}", content_length=5000), _http_request(b"x" * 3000, content_length=None, parts=3)):
        with pytest.raises(errors.EdgeError) as caught:
            await read_body(request, 2000)
        assert (caught.value.status, caught.value.code) == (413, "request_too_large")


async def test_admit_http_reads_and_decodes_the_body_and_logs_what_it_refuses(pipeline, caplog) -> None:
    caplog.set_level(logging.INFO, logger="streams.edge.access")
    with pytest.raises(errors.EdgeError) as caught:
        await pipeline.admit_http(ALICE, ChatCompletionBody, _http_request(b'{"model": NaN}'))
    assert caught.value.code == "invalid_json" and "body_bytes=14" in _refusal(caplog)


def test_the_read_stage_measures_a_text_frame_in_utf8_bytes() -> None:
    assert read_frame({"type": "websocket.receive", "text": "é" * 10}, 20) == "é" * 10
    with pytest.raises(FrameTooLarge):
        read_frame({"type": "websocket.receive", "text": "é" * 11}, 20)
    assert read_frame({"type": "websocket.receive", "bytes": b"{}"}, 20) == b"{}"
    assert read_frame({"type": "websocket.receive"}, 20) == b""


def test_the_pipeline_is_built_from_the_settings() -> None:
    pipeline = Pipeline(_options(request_timeout_s=60.0, deadline_grace_s=5.0))
    assert pipeline.tokenizers.models == (MODEL,) and pipeline.tokenizers.max_model_len == CONTEXT
    assert pipeline.lease_ttl_s == 95.0 and not pipeline.auth.enabled
