"""The edge's SSE writer: the bytes a client reads are OpenAI's chunk stream, and what is ready together goes out
in one write (the role chunk with the first token's; the last token's chunk, the finish chunk, the usage chunk and
[DONE] together), so a stream's end costs one trip through the ASGI stack and one client wakeup, not four; a
tool-calling stream cut off by max_tokens shows only whole calls, and no tag text."""
from __future__ import annotations

import json
from typing import Any, AsyncIterator

from schemas.events import Completion, ErrorEvent, GenerateRequest, OutputConstraint, ReplyRoute, SamplingParams
from schemas.events import TokenChunk
from schemas.events import Timings, Usage
from streams.edge.openai_api import _sse


class FakeEdge:
    edge_id = "e1"

    def __init__(self) -> None:
        self.abandoned: list[str] = []

    def abandon(self, stream: Any, reason: str = "") -> None:
        self.abandoned.append(stream.request_id)


class FakeStream:
    request_id = "chatcmpl-1"
    finished = True

    def close(self) -> None:
        pass


class FakeTicket:
    def __init__(self) -> None:
        self.seen: list[int] = []
        self.finished: list[int] = []

    def saw(self, chunk: TokenChunk) -> None:
        self.seen.append(chunk.index)

    def finish(self, status: int, final: Any = None, *, code: str | None = None) -> None:
        self.finished.append(status)


def _request(constraint: OutputConstraint | None = None) -> GenerateRequest:
    return GenerateRequest(request_id="chatcmpl-1", messages=[{"role": "user", "content": "hi"}], model="m",
                           sampling=SamplingParams(max_tokens=8, seed=1), reply_to=ReplyRoute(topic="r"),
                           created_at=1.0, constraint=constraint)


def _chunk(index: int, text: str, finish: str | None = None) -> TokenChunk:
    return TokenChunk(request_id="chatcmpl-1", index=index, text=text, token_ids=[index], finish_reason=finish)


def _completion(text: str, chunks: int) -> Completion:
    return Completion(request_id="chatcmpl-1", text=text, finish_reason="length", num_chunks=chunks,
                      usage=Usage(prompt_tokens=3, completion_tokens=chunks, total_tokens=3 + chunks),
                      timings=Timings(queued_s=0.0, ttft_s=0.1, total_s=0.2))


async def _writes(events: list, *, chat: bool = True, include_usage: bool = True,
                  request: GenerateRequest | None = None) -> tuple[list[str], FakeTicket]:
    async def rest() -> AsyncIterator:
        for event in events[1:]:
            yield event

    ticket = FakeTicket()
    writes = [w async for w in _sse(FakeEdge(), request or _request(), FakeStream(), events[0], rest(), chat=chat,  # type: ignore[arg-type]
                                   include_usage=include_usage, input_param="messages", ticket=ticket)]  # type: ignore[arg-type]
    return writes, ticket


def _events(write: str) -> list[str]:
    assert write.endswith("\n\n")
    return [part.removeprefix("data: ") for part in write[:-2].split("\n\n")]


async def test_first_and_last_writes_carry_everything_ready() -> None:
    writes, ticket = await _writes([_chunk(0, "Kafka"), _chunk(1, " is"), _chunk(2, "", None),
                                    _chunk(3, " a log.", "length"), _completion("Kafka is a log.", 4)])

    assert len(writes) == 3  # role + "Kafka"; " is"; " a log." + finish + usage + [DONE] (the empty step sends nothing)
    first = [json.loads(e) for e in _events(writes[0])]
    assert first[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert first[1]["choices"][0]["delta"] == {"content": "Kafka"} and first[1]["specstream"]["index"] == 0
    assert json.loads(_events(writes[1])[0])["choices"][0]["delta"] == {"content": " is"}
    last = _events(writes[2])
    assert [json.loads(e)["choices"][0].get("delta") for e in last[:2]] == [{"content": " a log."}, {}]
    assert json.loads(last[1])["choices"][0]["finish_reason"] == "length"
    assert json.loads(last[1])["specstream"]["num_chunks"] == 4
    assert json.loads(last[2])["usage"]["completion_tokens"] == 4 and json.loads(last[2])["choices"] == []
    assert last[3] == "[DONE]"
    assert ticket.seen == [0, 1, 2, 3] and ticket.finished[0] == 200


async def test_the_text_stream_is_unchanged_by_the_grouping() -> None:
    events = [_chunk(0, "a"), _chunk(1, "b"), _chunk(2, "c", "length"), _completion("abc", 3)]
    writes, _ = await _writes(events, chat=False, include_usage=False)
    texts = [json.loads(e)["choices"][0]["text"] for w in writes for e in _events(w) if e != "[DONE]"]
    assert texts == ["a", "b", "c", ""]
    assert "".join(writes).endswith("data: [DONE]\n\n") and "".join(writes).count("[DONE]") == 1


async def test_an_error_after_chunks_goes_out_with_done() -> None:
    error = ErrorEvent(request_id="chatcmpl-1", code="internal_error", message="boom")
    writes, ticket = await _writes([_chunk(0, "x"), error])
    assert len(writes) == 2
    tail = _events(writes[1])
    assert json.loads(tail[0])["error"]["message"] and tail[1] == "[DONE]"
    assert ticket.finished[0] == 500


async def test_a_tool_call_stream_cut_off_by_max_tokens_gives_whole_calls_then_the_partial_one_as_content() -> None:
    call = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    text = call + '\n<tool_call>\n{"name": "f", "arguments": {"a'
    pieces = [text[i:i + 5] for i in range(0, len(text), 5)]  # tags split across chunks
    events = [_chunk(i, piece, "length" if i == len(pieces) - 1 else None) for i, piece in enumerate(pieces)]
    request = _request(OutputConstraint(kind="tool_calls", tool_choice="required"))
    writes, _ = await _writes([*events, _completion(text, len(pieces))], include_usage=False, request=request)
    choices = [json.loads(e)["choices"][0] for w in writes for e in _events(w) if e != "[DONE]"]
    deltas = [c["delta"] for c in choices if c["delta"] not in ({}, {"role": "assistant", "content": ""})]
    assert [d["tool_calls"][0]["function"] for d in deltas[:2]] == [{"name": "f", "arguments": ""},
                                                                    {"arguments": '{"a": 1}'}]
    assert deltas[2:] == [{"content": '{"name": "f", "arguments": {"a'}]
    assert choices[-1]["finish_reason"] == "length"
