"""Edge logic that needs no broker: the edge's options, client input -> GenerateRequest, error mapping,
reply-stream ordering."""
from __future__ import annotations

import asyncio
import time

import pytest

from engine.config import EngineConfig
from schemas.events import Completion, ErrorEvent, Timings, TokenChunk, TraceContext, Usage
from streams.config import EdgeSettings, KafkaSettings, Settings, WorkerSettings
from streams.edge.admission.validate import check_model
from streams.edge.replies import ReplyRouter, ReplyTimeout
from streams.edge.settings import EdgeOptions, default_edge_id
from streams.kafka.clients import encode
from streams.wire import errors
from streams.wire.bodies import ChatCompletionBody, CompletionBody, WsRequestBody
from streams.wire.build import build_request, conversation_of, trace_context
from streams.wire.parse import decode_json, parse_body

MODEL = "smollm2-135m-instruct"
OPTS = EdgeOptions(Settings(edge=EdgeSettings(edge_id="e1", request_timeout_s=30.0, max_tokens_default=17)))


def chat(**kw):
    return parse_body(ChatCompletionBody, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **kw})


def test_options_are_the_project_settings_plus_what_the_edge_derives():
    s = Settings(kafka=KafkaSettings(topic_prefix="p"), edge=EdgeSettings(port=8123, edge_id="edge-7"),
                 worker=WorkerSettings(heartbeat_s=2.0), engine=EngineConfig(max_model_len=300))
    o = EdgeOptions.from_settings(s)
    assert o.kafka is s.kafka and o.edge is s.edge  # read as they are, not copied
    assert (o.kafka.topic_prefix, o.edge.port, o.edge_id, o.heartbeat_s, o.max_model_len, o.models) == (
        "p", 8123, "edge-7", 2.0, 300, (MODEL,))
    assert o.reply_topic == "p.replies.edge-7"
    assert EdgeOptions.from_settings(o) is o
    assert EdgeOptions(Settings()).edge_id == default_edge_id("127.0.0.1", 8000)
    assert EdgeOptions(Settings(edge=EdgeSettings(host="10.0.0.5", port=9000))).edge_id == "10.0.0.5-9000"
    assert EdgeOptions(s, models=("a", "b")).models == ("a", "b")


def test_options_with_other_edge_settings_are_validated_again():
    bound = EdgeOptions(Settings(edge=EdgeSettings(host="10.0.0.5"))).with_edge(port=9001)
    assert (bound.edge.port, bound.edge_id) == (9001, "10.0.0.5-9001")
    with pytest.raises(ValueError):
        OPTS.with_edge(port=0)


def test_edge_assigns_id_seed_deadline_and_reply_topic():
    now = 1_000.0
    a = build_request(chat(), OPTS, now=now)
    b = build_request(chat(), OPTS, now=now)
    assert a.request_id.startswith("chatcmpl-") and a.request_id != b.request_id
    assert a.sampling.seed is not None and a.sampling.seed != b.sampling.seed
    assert a.sampling.max_tokens == 17
    assert (a.created_at, a.deadline, a.reply_to.topic) == (now, now + 30.0, "specstream.replies.e1")
    given = build_request(chat(seed=5, max_completion_tokens=3, stop="\n", temperature=0.7), OPTS)
    assert (given.sampling.seed, given.sampling.max_tokens, given.sampling.stop, given.sampling.temperature) == (
        5, 3, ["\n"], 0.7)
    no_timeout = EdgeOptions(Settings(edge=EdgeSettings(request_timeout_s=None)))
    assert build_request(chat(), no_timeout).deadline is None


def test_the_tenant_and_trace_context_go_into_the_request():
    trace = trace_context({"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
                           "tracestate": "k=v"})
    request = build_request(chat(), OPTS, tenant="alice", trace=trace)
    assert request.tenant == "alice" and request.trace == trace
    assert trace_context({"tracestate": "k=v"}) is None
    assert isinstance(trace, TraceContext) and trace.tracestate == "k=v"


def test_the_conversation_comes_from_the_header_or_prompt_cache_key_and_the_header_wins():
    assert build_request(chat(), OPTS).conversation_id is None
    assert build_request(chat(prompt_cache_key="conv-1"), OPTS).conversation_id == "conv-1"
    header = conversation_of({"x-conversation-id": "conv-h"})
    assert build_request(chat(prompt_cache_key="conv-1"), OPTS, conversation_id=header).conversation_id == "conv-h"
    assert conversation_of({"x-conversation-id": ""}) is None
    ws = parse_body(WsRequestBody, {"model": MODEL, "prompt": "x", "prompt_cache_key": "conv-ws"})
    assert build_request(ws, OPTS).conversation_id == "conv-ws"
    with pytest.raises(errors.EdgeError) as refused:
        build_request(chat(), OPTS, conversation_id="c" * 129)
    assert refused.value.status == 400 and refused.value.param == "conversation_id"


def test_completion_and_websocket_bodies_become_requests_and_prompt_with_messages_is_refused():
    c = build_request(parse_body(CompletionBody, {"model": MODEL, "prompt": ["once"]}), OPTS)
    assert c.prompt == "once" and c.messages is None and c.request_id.startswith("cmpl-")
    w = parse_body(WsRequestBody, {"id": 3, "model": MODEL, "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
        {"role": "user", "content": "q"}]})
    r = build_request(w, OPTS)
    assert r.messages[0].role == "system" and r.messages[0].content == "be brief"
    assert (w.input_param, w.streams) == ("messages", True)
    raw = parse_body(WsRequestBody, {"model": MODEL, "prompt": "a"})
    assert (raw.input_param, build_request(raw, OPTS).request_id[:5]) == ("prompt", "cmpl-")
    with pytest.raises(errors.EdgeError) as info:
        parse_body(WsRequestBody, {"model": MODEL, "prompt": "a", "messages": [{"role": "user", "content": "b"}]})
    assert info.value.param == "messages"


def test_each_body_names_its_prompt_field_and_says_whether_it_streams():
    completion = parse_body(CompletionBody, {"model": MODEL, "prompt": "x", "stream": True,
                                              "stream_options": {"include_usage": True}})
    assert (completion.input_param, completion.streams, completion.include_usage) == ("prompt", True, True)
    assert (chat().input_param, chat().streams, chat().include_usage) == ("messages", False, False)
    assert chat(max_tokens=7, max_completion_tokens=7).max_new_tokens() == 7  # both given: they must agree


@pytest.mark.parametrize(
    ("raw", "code", "param"),
    [
        (b"", "invalid_json", None),
        (b"[1]", "invalid_json", None),
        (b"{\"model\": ", "invalid_json", None),
    ],
)
def test_a_body_that_is_not_a_json_object_is_400_invalid_json(raw, code, param):
    with pytest.raises(errors.EdgeError) as info:
        decode_json(raw)
    assert (info.value.status, info.value.code, info.value.param) == (400, code, param)


@pytest.mark.parametrize(
    ("body", "status", "code", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, 400, "missing_required_parameter", "model"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "invalid_value",
         "max_tokens"),
        ({"model": MODEL, "messages": [{"role": "robot", "content": "x"}]}, 400, "invalid_value", "messages[0].role"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "top_k": "many"}, 400, "invalid_value",
         "top_k"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "presence_penalty": 3}, 400,
         "invalid_value", "presence_penalty"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "logprobs": 1}, 400,
         "invalid_value", "logprobs"),
    ],
)
def test_body_validation_errors_name_the_field(body, status, code, param):
    with pytest.raises(errors.EdgeError) as info:
        parse_body(ChatCompletionBody, body)
    assert (info.value.status, info.value.code, info.value.param) == (status, code, param)


def test_unknown_model_is_404():
    request = build_request(parse_body(CompletionBody, {"model": "gpt-9", "prompt": "x"}), OPTS)
    with pytest.raises(errors.EdgeError) as info:
        check_model(request, OPTS.models)
    assert (info.value.status, info.value.code, info.value.param) == (404, "model_not_found", "model")
    assert info.value.body()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("code", "message", "status", "param"),
    [
        ("context_length_exceeded", "prompt has 3000 tokens and max_tokens is 16: 3000+16 exceeds the model's "
         "context of 2048 tokens", 400, "messages"),
        ("context_length_exceeded", "prompt has 30 tokens and max_tokens is 4000: 30+4000 exceeds the model's "
         "context of 2048 tokens", 400, "max_tokens"),
        ("context_length_exceeded", "prompt has 30 tokens and max_tokens is 900: the request needs 940 KV cache "
         "slots but the whole KV cache holds 512 tokens", 400, "max_tokens"),
        ("context_length_exceeded", "the prompt is too long", 400, "messages"),
        ("invalid_request", "bad", 400, None),
        ("message_too_large", "2 MiB", 413, "messages"),
        ("deadline_exceeded", "late", 504, None),
        ("overloaded", "busy", 503, None),
        ("internal_error", "boom", 500, None),
    ],
)
def test_worker_errors_map_to_an_http_status_and_the_offending_param(code, message, status, param):
    e = errors.from_worker_error(ErrorEvent(request_id="r", code=code, message=message))
    assert (e.status, e.param, e.code, e.message) == (status, param, code, message)


def _completion(rid: str, text: str, n: int) -> Completion:
    return Completion(request_id=rid, text=text, finish_reason="stop", num_chunks=n,
                      usage=Usage(prompt_tokens=1, completion_tokens=n, total_tokens=n + 1),
                      timings=Timings(queued_s=0, ttft_s=0, total_s=0))


async def test_reply_stream_orders_dedupes_and_drops_unknown_ids():
    router = ReplyRouter(OPTS)
    stream = router.open("r1")
    for event in [TokenChunk(request_id="r1", index=0, text="a", token_ids=[1]),
                  TokenChunk(request_id="other", index=0, text="zz", token_ids=[9]),
                  TokenChunk(request_id="r1", index=0, text="a", token_ids=[1]),  # a redelivery's duplicate
                  TokenChunk(request_id="r1", index=1, text="b", token_ids=[2]),
                  _completion("r1", "ab", 2)]:
        router.dispatch(encode(event))
    router.dispatch(b"{not an event")
    got = [e async for e in stream]
    assert [type(e).__name__ for e in got] == ["TokenChunk", "TokenChunk", "Completion"]
    assert "".join(e.text for e in got[:-1]) == got[-1].text
    assert (router.stats.unknown, router.stats.duplicates, router.stats.undecodable) == (1, 1, 1)
    assert router.in_flight == 0 and stream.closed and list(router.seen) == ["r1", "other", "r1", "r1", "r1"]
    with pytest.raises(ValueError):
        router.open("r2"), router.open("r2")


async def test_reply_stream_times_out_after_deadline_and_grace():
    router = ReplyRouter(OPTS)
    stream = router.open("late", deadline=time.time(), grace_s=0.05)
    with pytest.raises(ReplyTimeout):
        await asyncio.wait_for(anext(stream.events()), 5)
