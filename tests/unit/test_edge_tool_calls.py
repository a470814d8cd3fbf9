"""Tool-calling answers as OpenAI returns them: the whole message, and the streamed deltas
(index, id, type and name first, then argument fragments), however the text is cut into chunks."""
from __future__ import annotations

import json
from typing import Any

import pytest

from streams.edge.tool_calls import ToolCallParser, finish_reason, parse_message

ONE = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 1}}\n</tool_call>'
TWO = ONE + '\n<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>'


def streamed(text: str, size: int) -> tuple[list[dict[str, Any]], ToolCallParser]:
    parser = ToolCallParser()
    deltas: list[dict[str, Any]] = []
    for i in range(0, len(text), size):
        deltas += parser.feed(text[i:i + size])
    return deltas + parser.finish(), parser


def test_a_whole_answer_of_calls_has_null_content_and_the_calls() -> None:
    content, calls = parse_message(TWO)
    assert content is None
    assert [(c["type"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("function", "get_weather", {"city": "Rome", "days": 1}), ("function", "noop", {})]
    assert calls[0]["id"].startswith("call_") and calls[0]["id"] != calls[1]["id"]


def test_plain_text_stays_content_even_when_it_looks_like_the_start_of_a_tag() -> None:
    assert parse_message("Hello <tool") == ("Hello <tool", [])
    assert parse_message("") == ("", [])


@pytest.mark.parametrize("size", [1, 2, 5, 17, 1000])
def test_streamed_deltas_follow_openais_shape_whatever_the_chunking(size: int) -> None:
    deltas, parser = streamed(TWO, size)
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert not [d for d in deltas if "content" in d]
    firsts = [c for c in calls if "id" in c]
    assert [(c["index"], c["type"], c["function"]) for c in firsts] == [
        (0, "function", {"name": "get_weather", "arguments": ""}), (1, "function", {"name": "noop", "arguments": ""})]
    for index in (0, 1):
        fragments = "".join(c["function"]["arguments"] for c in calls if c["index"] == index and "id" not in c)
        assert fragments == parser.calls[index]["function"]["arguments"]
        assert all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"}
                   for c in calls if c["index"] == index and "id" not in c)
    assert json.loads(parser.calls[0]["function"]["arguments"]) == {"city": "Rome", "days": 1}


def test_a_call_cut_by_max_tokens_keeps_its_partial_arguments() -> None:
    _, parser = streamed(ONE[:60], 7)
    assert parser.calls[0]["function"]["arguments"] == ONE[ONE.index('{"city"'):60]


def test_finish_reason_is_tool_calls_only_when_an_answer_ended_after_calls() -> None:
    assert finish_reason("stop", parse_message(ONE)[1]) == "tool_calls"
    assert finish_reason("length", parse_message(ONE)[1]) == "length"
    assert finish_reason("stop", []) == "stop"
