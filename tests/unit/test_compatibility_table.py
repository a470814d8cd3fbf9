"""docs/compatibility.md's table is what the edge does: supported fields are accepted, refused ones are a 400
naming the field, fields of the other API are unknown, and every field a body knows is in the table."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from streams.wire import errors
from streams.wire.bodies import Body, ChatCompletionBody, CompletionBody
from streams.wire.parse import parse_body
from streams.wire.unsupported import _UNSUPPORTED

TABLE = Path(__file__).resolve().parents[2] / "docs" / "compatibility.md"
MODEL = "smollm2-135m-instruct"
BASES: dict[str, tuple[type[Body], dict[str, Any]]] = {
    "chat": (ChatCompletionBody, {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
    "completions": (CompletionBody, {"model": MODEL, "prompt": "hi"}),
}
# A value each refused field cannot take (not its neutral one).
REFUSED_VALUES: dict[str, Any] = {
    "best_of": 2, "suffix": "end",
    "functions": [{"name": "f"}], "function_call": "auto", "audio": {"voice": "alloy"}, "modalities": ["audio"],
    "prediction": {"type": "content"}, "reasoning_effort": "low", "web_search_options": {"x": 1}, "store": True,
    "metadata": {"a": "b"}, "service_tier": "flex", "verbosity": "low", "moderation": True,
}

# A value each supported field takes that is not neutral (a neutral-only field would refuse it).
SUPPORTED_VALUES: dict[str | tuple[str, str], Any] = {
    "max_tokens": 8, "max_completion_tokens": 8, "temperature": 0.7, "top_p": 0.9, "seed": 3, "stop": ["x"],
    "stream": True, "stream_options": {"include_usage": True}, "presence_penalty": 0.5, "frequency_penalty": 0.5,
    "logit_bias": {"12": 5}, "user": "u", "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "auto", "parallel_tool_calls": False, "response_format": {"type": "json_object"},
    "prompt_cache_key": "conversation-1", "safety_identifier": "u", "prompt_cache_retention": "24h",
    "prompt_cache_options": {"x": 1}, "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2, "stop_token_ids": [2],
    "min_tokens": 2, "ignore_eos": True, "priority": 1, "speculation": False, "logprobs": True, "top_logprobs": 0,
    ("logprobs", "completions"): 2, "n": 2,  # completions' logprobs is a count, chat's a boolean
    "echo": True,
}


def _rows() -> list[tuple[str, str, str]]:
    rows = []
    for line in TABLE.read_text().splitlines():
        m = re.match(r"^\| `([a-z_]+)` \| (supported|refused|—) \| (supported|refused|—) \|", line)
        if m:
            rows.append((m.group(1), m.group(2), m.group(3)))
    return rows


def _cases() -> list[tuple[str, str, str]]:
    return [(name, api, row[i]) for name, *row in _rows() for i, api in enumerate(("chat", "completions"))]


@pytest.mark.parametrize(("name", "api", "verdict"), _cases())
def test_the_table_says_what_the_edge_does(name: str, api: str, verdict: str) -> None:
    body_type, base = BASES[api]
    known = name in body_type.model_fields or name in body_type.unsupported
    if verdict == "supported":
        assert name in body_type.model_fields or (name in body_type.unsupported and _UNSUPPORTED[name][1](object()))
        if name not in base:
            value = SUPPORTED_VALUES.get((name, api), SUPPORTED_VALUES.get(name))
            parse_body(body_type, {**base, name: value})  # accepted, not refused
        return
    if verdict == "—":
        assert not known and name not in base
    value = REFUSED_VALUES.get(name, True)
    with pytest.raises(errors.EdgeError) as caught:
        parse_body(body_type, {**base, name: value})
    assert (caught.value.status, caught.value.param) == (400, name)
    if verdict == "—":
        assert caught.value.code == "unknown_parameter"


def test_every_field_a_body_knows_is_in_the_table() -> None:
    listed = {name for name, _, _ in _rows()}
    for body_type in (ChatCompletionBody, CompletionBody):
        assert set(body_type.model_fields) - listed == set(), body_type.__name__
        assert set(body_type.unsupported) - listed == set(), body_type.__name__
