"""Validation before Kafka: encoding, JSON, unsupported parameters, ranges, and the context checked with the tokenizer."""
from __future__ import annotations

import asyncio
import json

import pytest

from schemas.events import ChatMessage, GenerateRequest, ReplyRoute, SamplingParams
from streams.edge import errors
from streams.edge.intake import ChatCompletionBody, CompletionBody, build_request, validate_body
from streams.edge.settings import EdgeOptions
from streams.edge.validation import TokenCounter, parse_json_object, prompt_hash, strip_unsupported

MODEL = "smollm2-135m-instruct"


def _error(fn, *args, **kwargs) -> errors.EdgeError:
    with pytest.raises(errors.EdgeError) as caught:
        fn(*args, **kwargs)
    return caught.value


@pytest.mark.parametrize(("raw", "code", "param"), [
    (b'{"model": "\xff\xfe"}', "invalid_encoding", None),
    ('{"model": "x", "messages": [{"role": "user", "content": "\\ud83d"}]}'.encode(), "invalid_encoding",
     "messages[0].content"),
    ('{"\\udc80": 1}'.encode(), "invalid_encoding", None),
    (b'{"temperature": NaN}', "invalid_json", None),
    (b'{"a": Infinity}', "invalid_json", None),
    (b"[" * 5000 + b"]" * 5000, "invalid_json", None),
    (b'{"a": ' + b'{"b": ' * 100 + b"1" + b"}" * 101, "invalid_json", None),
    (b"[1, 2]", "invalid_json", None),
    (b"   ", "invalid_json", None),
    ("\ufeff{}".encode(), "invalid_json", None),
])
def test_bodies_that_are_not_clean_utf8_json_objects_are_400_naming_the_problem(
        raw: bytes, code: str, param: str | None) -> None:
    error = _error(parse_json_object, raw)
    assert (error.status, error.code, error.param) == (400, code, param)
    json.dumps(error.body()).encode("utf-8")  # the error itself is always encodable


def test_valid_unicode_passes() -> None:
    assert parse_json_object('{"prompt": "caf\\u00e9 \\ud83d\\ude00 東京"}'.encode())["prompt"] == "café 😀 東京"


@pytest.mark.parametrize(("name", "value"), [
    ("tools", [{"type": "function", "function": {"name": "f"}}]), ("tool_choice", "auto"),
    ("response_format", {"type": "json_object"}), ("logit_bias", {"50256": -100}), ("top_logprobs", 2),
    ("functions", [{"name": "f"}]), ("parallel_tool_calls", True), ("audio", {"voice": "alloy"}),
    ("modalities", ["text", "audio"]), ("store", True), ("reasoning_effort", "low"), ("prediction", {"x": 1}),
])
def test_unsupported_openai_parameters_are_named(name: str, value) -> None:
    error = _error(strip_unsupported, {"model": MODEL, name: value}, "chat")
    assert (error.status, error.code, error.param) == (400, "unsupported_parameter", name)
    assert f"'{name}' is not supported" in error.message


def test_neutral_values_of_unsupported_parameters_are_dropped() -> None:
    data = {"model": MODEL, "tools": [], "tool_choice": "none", "response_format": {"type": "text"},
            "logit_bias": {}, "store": False, "parallel_tool_calls": None, "service_tier": "auto"}
    assert strip_unsupported(data, "chat") == {"model": MODEL}
    assert _error(strip_unsupported, {"best_of": 3}, "completions").param == "best_of"
    assert _error(strip_unsupported, {"suffix": "end"}, "completions").param == "suffix"
    assert strip_unsupported({"best_of": 3}, "chat") == {"best_of": 3}  # not a chat parameter: unknown, later


@pytest.mark.parametrize(("body", "code", "param"), [
    ({"max_tokens": 0}, "invalid_value", "max_tokens"),
    ({"max_tokens": 40000}, "invalid_value", "max_tokens"),
    ({"temperature": 2.5}, "invalid_value", "temperature"),
    ({"temperature": -0.1}, "invalid_value", "temperature"),
    ({"top_p": 0}, "invalid_value", "top_p"),
    ({"n": 2}, "unsupported_value", "n"),
    ({"logprobs": True}, "unsupported_value", "logprobs"),
    ({"presence_penalty": 0.5}, "unsupported_value", "presence_penalty"),
    ({"stop": ["a"] * 9}, "invalid_value", "stop"),
    ({"temprature": 0.5}, "unknown_parameter", "temprature"),
    ({"messages": []}, "invalid_value", "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "invalid_value", "messages[0].role"),
])
def test_out_of_range_and_unknown_parameters_name_the_field(body: dict, code: str, param: str) -> None:
    data = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **body}
    error = _error(validate_body, ChatCompletionBody, strip_unsupported(data, "chat"))
    assert (error.status, error.code, error.param) == (400, code, param), error.message


def test_the_tenant_goes_into_the_request() -> None:
    body = validate_body(CompletionBody, {"model": MODEL, "prompt": "hi"})
    request = build_request(body, EdgeOptions(auth_enabled=False), "replies", tenant="alice")
    assert request.tenant == "alice"


def _request(messages=None, prompt=None, max_tokens=8) -> GenerateRequest:
    return GenerateRequest(
        request_id="r", model=MODEL, prompt=prompt,
        messages=[ChatMessage(role="user", content=m) for m in messages] if messages else None,
        sampling=SamplingParams(max_tokens=max_tokens), reply_to=ReplyRoute(topic="t"),
    )


@pytest.fixture(scope="module")
def counter() -> TokenCounter:
    async def load() -> TokenCounter:
        tc = TokenCounter((MODEL,), max_model_len=64)
        tc.start()
        assert await tc.get(MODEL) is not None
        return tc

    return asyncio.run(load())


async def test_context_counted_with_the_models_tokenizer_and_chat_template(counter: TokenCounter) -> None:
    from engine.loader import load_tokenizer
    from streams.worker.intake import prompt_token_ids

    request = _request(messages=["What is Kafka?"])
    checked, n = await counter.check_context(request, input_param="messages", max_tokens_given=True)
    assert checked is request and n == len(prompt_token_ids(request, load_tokenizer(MODEL))) and n > 4

    raw = _request(prompt="one two three")
    assert (await counter.check_context(raw, input_param="prompt", max_tokens_given=True))[1] == 3


async def test_context_errors_name_the_prompt_or_max_tokens(counter: TokenCounter) -> None:
    long = _request(prompt="word " * 80, max_tokens=1)
    with pytest.raises(errors.EdgeError) as caught:
        await counter.check_context(long, input_param="prompt", max_tokens_given=True)
    assert (caught.value.status, caught.value.code, caught.value.param) == (400, "context_length_exceeded", "prompt")
    assert "maximum context length is 64 tokens" in caught.value.message

    fits = _request(prompt="word " * 20, max_tokens=60)
    with pytest.raises(errors.EdgeError) as caught:
        await counter.check_context(fits, input_param="prompt", max_tokens_given=True)
    assert caught.value.param == "max_tokens"
    # Without an explicit max_tokens the default is capped to what the context leaves.
    capped, n = await counter.check_context(fits, input_param="prompt", max_tokens_given=False)
    assert capped.sampling.max_tokens == 64 - n and n > 10


def test_draft_chars_counts_the_drafted_tokens_characters_or_estimates_them(counter: TokenCounter) -> None:
    tokenizer = counter.loaded(MODEL)
    ids = tokenizer(" the quick brown fox")["input_ids"]
    text = tokenizer.decode(ids)
    assert counter.draft_chars(MODEL, text, ids, len(ids) - 1) == len(tokenizer.decode(ids[:-1]))
    assert counter.draft_chars(MODEL, text, ids, 0) == 0
    assert counter.draft_chars(MODEL, text, ids, len(ids)) == len(text)
    # Text that does not start with the drafts' text (held back by a stop string): a proportional estimate.
    assert counter.draft_chars(MODEL, "abcdef", ids[:2], 1) == 3


def test_prompt_hash_is_stable_and_hides_the_prompt() -> None:
    a, b = _request(messages=["secret plan"]), _request(messages=["secret plan"])
    assert prompt_hash(a) == prompt_hash(b) != prompt_hash(_request(messages=["other"]))
    assert "secret" not in prompt_hash(a) and len(prompt_hash(a)) == 16


async def test_an_empty_prompt_is_refused_naming_it(counter: TokenCounter) -> None:
    with pytest.raises(errors.EdgeError) as caught:
        await counter.check_context(_request(prompt=""), input_param="prompt", max_tokens_given=True)
    assert (caught.value.status, caught.value.param) == (400, "prompt")
