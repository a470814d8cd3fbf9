"""From raw request bytes to a validated request or a precise rejection; prompts rendered with the real tokenizer."""
from __future__ import annotations

import json

import pytest

from schemas.events import GenerateRequest
from streams.worker.intake import Rejection, parse_request, prompt_token_ids, to_engine_request

LIMIT = 4096


def body(**fields: object) -> dict:
    request = {"request_id": "r1", "prompt": "hi", "model": "m", "reply_to": {"topic": "replies", "partition": 0}}
    request.update(fields)
    return request


def parse(value: bytes) -> GenerateRequest | Rejection:
    return parse_request(value, max_bytes=LIMIT)


def test_a_valid_request_parses_with_its_sampling_parameters() -> None:
    parsed = parse(json.dumps(body(sampling={"max_tokens": 4, "stop": ["\n"]})).encode())
    assert isinstance(parsed, GenerateRequest)
    assert parsed.sampling.stop == ["\n"]


@pytest.mark.parametrize(
    ("value", "code", "fragment", "routed"),
    [
        (b"{nope", "invalid_request", "malformed JSON", False),
        (b"\xff\xfe", "invalid_request", "not UTF-8", False),
        (b"[1, 2]", "invalid_request", "expected a JSON object", False),
        (json.dumps(body(colour="red")).encode(), "invalid_request", "unknown field 'colour'", True),
        (json.dumps(body(sampling={"top_p": "high"})).encode(), "invalid_request", "sampling.top_p", True),
        (json.dumps(body(messages=[{"role": "user", "content": "x"}])).encode(), "invalid_request",
         "exactly one of 'prompt' and 'messages'", True),
        (json.dumps(body(schema_version=2)).encode(), "unsupported_schema_version", "schema_version 2", True),
        (json.dumps(body(schema_version="1")).encode(), "unsupported_schema_version", "'1'", True),
        (json.dumps(body(prompt="x" * LIMIT)).encode(), "message_too_large", f"limit is {LIMIT} bytes", True),
    ],
)
def test_rejections_are_precise(value: bytes, code: str, fragment: str, routed: bool) -> None:
    rejection = parse(value)
    assert isinstance(rejection, Rejection)
    assert rejection.code == code
    assert fragment in rejection.message
    assert rejection.dead_letter
    if routed:
        assert rejection.route is not None and rejection.route.topic == "replies" and rejection.route.partition == 0
        assert rejection.request_id == "r1"
    else:
        assert rejection.route is None


def test_route_is_not_guessed_from_a_bad_reply_to() -> None:
    rejection = parse(json.dumps(body(reply_to={"topic": ""}, colour=1)).encode())
    assert isinstance(rejection, Rejection) and rejection.route is None and rejection.request_id == "r1"


def test_an_empty_message_is_rejected_and_dead_lettered() -> None:
    rejection = parse_request(None, max_bytes=LIMIT)
    assert isinstance(rejection, Rejection) and rejection.dead_letter


@pytest.fixture(scope="module")
def tokenizer():
    from engine.loader import load_tokenizer

    return load_tokenizer("smollm2-135m-instruct")


@pytest.mark.model
def test_chat_messages_use_the_chat_template(tokenizer) -> None:
    request = GenerateRequest.model_validate(body(prompt=None, messages=[{"role": "user", "content": "Hello"}]))
    ids = prompt_token_ids(request, tokenizer)
    text = tokenizer.decode(ids)
    assert text.endswith("<|im_start|>assistant\n")  # add_generation_prompt=True
    assert "<|im_start|>user\nHello<|im_end|>" in text


@pytest.mark.model
def test_raw_prompt_is_tokenized_as_is(tokenizer) -> None:
    request = GenerateRequest.model_validate(body(prompt="Once upon a time"))
    ids = prompt_token_ids(request, tokenizer)
    assert tokenizer.decode(ids) == "Once upon a time"


@pytest.mark.model
def test_engine_request_carries_the_sampling_parameters(tokenizer) -> None:
    request = GenerateRequest.model_validate(body(
        sampling={"max_tokens": 9, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 3, "stop": ["."],
                  "speculation": False},
        priority=-2, deadline=123.0,
    ))
    engine_request = to_engine_request(request, tokenizer, arrival_time=100.0)
    sampling = engine_request.sampling
    assert (sampling.max_tokens, sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed) == (
        9, 0.7, 0.9, 5, 3)
    assert sampling.stop == (".",)
    assert (engine_request.priority, engine_request.deadline, engine_request.speculation) == (-2, 123.0, False)
    assert engine_request.arrival_time == 100.0 and engine_request.request_id == "r1"
