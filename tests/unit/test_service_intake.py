"""From raw message bytes to a validated input event or a precise rejection (GenerateRequest as the example model)."""
from __future__ import annotations

import json

import pytest

from schemas.events import GenerateRequest
from streams.service.intake import Rejection, parse_message

LIMIT = 4096


def body(**fields: object) -> dict:
    request = {"request_id": "r1", "prompt": "hi", "model": "m", "reply_to": {"topic": "replies", "partition": 0}}
    request.update(fields)
    return request


def parse(value: bytes) -> GenerateRequest | Rejection:
    return parse_message(value, GenerateRequest, max_bytes=LIMIT)


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
    rejection = parse_message(None, GenerateRequest, max_bytes=LIMIT)
    assert isinstance(rejection, Rejection) and rejection.dead_letter


