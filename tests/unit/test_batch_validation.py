"""A batch input file is checked on upload; every problem names its line."""
from __future__ import annotations

import json

import pytest

from streams.batch.validation import InvalidBatchFile, dumps_line, parse_batch_file
from streams.config.batch import BatchSettings
from streams.wire.bodies import ChatCompletionBody, CompletionBody

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def problems_of(text: str, limits: BatchSettings | None = None) -> list[str]:
    with pytest.raises(InvalidBatchFile) as caught:
        parse_batch_file(text.encode(), limits or BatchSettings())
    return [str(p) for p in caught.value.problems]


def test_good_lines_parse_with_the_endpoints_own_body_models() -> None:
    text = "\n".join([dumps_line("a", "/v1/chat/completions", CHAT),
                      dumps_line("b", "/v1/completions", {"model": "m", "prompt": "x", "seed": 3}), ""])
    lines = parse_batch_file(text.encode(), BatchSettings())
    assert [(ln.number, ln.custom_id) for ln in lines] == [(1, "a"), (2, "b")]
    assert isinstance(lines[0].body, ChatCompletionBody) and isinstance(lines[1].body, CompletionBody)


def test_each_bad_line_is_named_with_its_problem() -> None:
    text = "\n".join([
        dumps_line("a", "/v1/chat/completions", CHAT),
        "{not json",
        dumps_line("b", "/v1/embeddings", CHAT),
        dumps_line("a", "/v1/chat/completions", CHAT),
        dumps_line("c", "/v1/chat/completions", {**CHAT, "max_tokens": 0}),
        dumps_line("d", "/v1/chat/completions", {**CHAT, "bogus": 1}),
        json.dumps({"custom_id": "e", "method": "GET", "url": "/v1/completions", "body": {}}),
        dumps_line("f", "/v1/completions", {"model": "m", "prompt": "x", "stream": True}),
        dumps_line("g", "/v1/chat/completions", {**CHAT, "n": 2}),
    ])
    found = problems_of(text)
    assert [p.split(":")[0] for p in found] == [
        "line 2", "line 3 (url)", "line 4 (custom_id)", "line 5 (body.max_tokens)", "line 6 (body.bogus)",
        "line 7 (method)", "line 8 (body.stream)", "line 9 (body.n)"]
    assert "also on line 1" in found[2]


def test_the_error_message_lists_the_lines() -> None:
    with pytest.raises(InvalidBatchFile) as caught:
        parse_batch_file(b'{"custom_id": "a"}\n[1]\n', BatchSettings())
    error = caught.value.edge_error()
    assert error.status == 400 and error.code == "invalid_batch_file"
    assert "line 1" in error.message and "line 2" in error.message


def test_file_and_line_limits_come_from_the_batch_section() -> None:
    lines = [dumps_line(str(i), "/v1/chat/completions", CHAT) for i in range(30)]
    assert "batch.max_lines" in problems_of("\n".join(lines[:3]), BatchSettings(max_lines=2))[0]
    assert "batch.max_file_bytes" in problems_of("\n".join(lines), BatchSettings(max_file_bytes=1024))[0]
    long_line = dumps_line("x", "/v1/completions", {"model": "m", "prompt": "y" * 2000})
    assert problems_of(long_line, BatchSettings(max_line_bytes=1024))[0].startswith("line 1: the line is")


def test_an_empty_file_is_refused() -> None:
    assert problems_of("\n\n") == ["line 1: the file has no lines"]
