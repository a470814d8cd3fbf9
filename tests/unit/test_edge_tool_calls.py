"""Tool-calling answers as OpenAI returns them: the whole message, and the streamed deltas
(index, id, type and name first, then argument fragments), however the text is cut into chunks."""
from __future__ import annotations

import json
from typing import Any

import pytest

from engine.grammar.constraint import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from streams.wire.tool_calls import ToolCallParser, finish_reason, parse_message

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


def tag_text(text: str) -> bool:
    """Whether text holds a tool-call tag, whole or as its cut-off start or end (a lone '<')."""
    return any(tag[:n] in text for tag in (TOOL_CALL_OPEN, TOOL_CALL_CLOSE) for n in (1, len(tag)))


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_an_answer_cut_anywhere_gives_only_whole_calls_and_no_tag_text(size: int) -> None:
    for cut in range(len(TWO) + 1):
        deltas, parser = streamed(TWO[:cut], size)
        assert not tag_text(parser.content), (cut, parser.content)
        for call in parser.calls:
            assert not tag_text(call["function"]["arguments"])
            json.loads(call["function"]["arguments"])
        assert "".join(d.get("content", "") for d in deltas) == parser.content
        assert [c for d in deltas for c in d.get("tool_calls", []) if "id" in c] == [
            {"index": i, "id": c["id"], "type": "function", "function": {"name": c["function"]["name"], "arguments": ""}}
            for i, c in enumerate(parser.calls)]


def test_a_call_cut_by_max_tokens_is_not_a_call_and_its_partial_text_is_content_without_the_tag() -> None:
    content, calls = parse_message(ONE[:60])
    assert calls == []
    assert content == ONE[len("<tool_call>\n"):60]
    content, calls = parse_message(TWO[:len(ONE) + 40])
    assert [c["function"]["name"] for c in calls] == ["get_weather"]
    assert content == TWO[len(ONE) + len("\n<tool_call>\n"):len(ONE) + 40]


def test_a_call_cut_inside_arguments_that_would_parse_alone_is_still_cut() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": 12}\n</tool_call>'
    assert parse_message(text)[1][0]["function"]["arguments"] == "12"
    assert parse_message(text[:text.index("2}")]) == ('{"name": "f", "arguments": 1', [])


def test_a_call_cut_only_in_its_closing_tag_is_a_whole_call() -> None:
    content, calls = parse_message(ONE[:-3])
    assert content is None and json.loads(calls[0]["function"]["arguments"]) == {"city": "Rome", "days": 1}


@pytest.mark.parametrize("tail", ["\n", "\n<", "\n<tool_", "\n<tool_call>", "\n<tool_call>\n"])
def test_the_cut_off_start_of_a_next_call_is_neither_content_nor_a_call(tail: str) -> None:
    for size in (1, 2, 1000):
        deltas, parser = streamed(ONE + tail, size)
        assert parser.message_content() is None and len(parser.calls) == 1
        assert not [d for d in deltas if "content" in d]


def test_a_call_streams_out_only_once_its_closing_tag_has_arrived() -> None:
    parser = ToolCallParser()
    assert parser.feed(ONE[:-1]) == []
    first, arguments = parser.feed(ONE[-1:])
    assert first["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    assert arguments == {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": "Rome", "days": 1}'}}]}


def test_finish_reason_is_tool_calls_only_when_an_answer_ended_after_calls() -> None:
    assert finish_reason("stop", parse_message(ONE)[1]) == "tool_calls"
    assert finish_reason("length", parse_message(ONE)[1]) == "length"
    assert finish_reason("stop", []) == "stop"
