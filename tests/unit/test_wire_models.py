"""The answer models are the wire: every chunk the edge streams validates against the chunk model the OpenAPI
document names, fields OpenAI leaves out are absent rather than null, and the fast construction of a chunk's parts
makes exactly what pydantic's model_construct makes."""
from __future__ import annotations

import json
from typing import Any

import pytest

from schemas.events import SpecStats, SpecStepStats, Timings, Usage
from schemas.tools import ToolError
from streams.wire.chunk_models import (
    ChatCompletionChunk,
    ChatDelta,
    ChunkWriter,
    TextCompletionChunk,
    TokenExtras,
    ToolResultExtras,
    built,
)
from streams.wire.completion_models import (
    AssistantMessage,
    SpecstreamExtras,
    ToolResultView,
)

USAGE = Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5)
EXTRAS = SpecstreamExtras(edge_id="e1", spec=SpecStats(drafted=4, accepted=3), num_chunks=2,
                          timings=Timings(queued_s=0.0, ttft_s=0.1, total_s=0.2))
CITATION = {"type": "file_citation", "index": 3, "file_id": "f", "filename": "a.txt", "quote": "q", "char_start": 0,
            "char_end": 1, "vector_store_id": "vs_1", "score": 0.5}
CALL = [{"tool_calls": [{"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\": 1}"}}]}]
CHAT_LOGPROBS = {"content": [{"token": " é", "logprob": -1e-05, "bytes": [32, 195, 169], "top_logprobs": []}],
                 "refusal": None}
TEXT_LOGPROBS = {"tokens": ["The"], "token_logprobs": [None], "top_logprobs": [None], "text_offset": [0]}


def _events(writer: ChunkWriter) -> list[str]:
    step = built(TokenExtras, index=0, spec=SpecStepStats(drafted=2, accepted=1))
    result = ToolResultExtras(tool_result=ToolResultView(tool_call_id="call_1", name="calc", output=3,
                                                         error=ToolError(code="timeout", message="slow"),
                                                         truncated=False, duration_s=0.1))
    chat = writer.chat
    return [writer.event("", None, role=True), writer.event("Kafka ☃", None, extra=step,
                                                             logprobs=CHAT_LOGPROBS if chat else TEXT_LOGPROBS),
            *(writer.event(None, None, extra=step, fields=f) for f in (CALL if chat else [])),
            writer.event(None, None, extra=result),
            writer.event(None if chat else "", "stop", extra=EXTRAS, fields={"annotations": [CITATION]} if chat else None),
            writer.usage_event(USAGE)]


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("include_usage", [True, False])
def test_every_streamed_chunk_is_its_documented_model_and_nothing_more(chat: bool, include_usage: bool) -> None:
    model = ChatCompletionChunk if chat else TextCompletionChunk
    writer = ChunkWriter("chatcmpl-1", "m", 1, chat, include_usage)
    for event in _events(writer):
        assert event.startswith("data: ") and event.endswith("\n\n")
        data: dict[str, Any] = json.loads(event.removeprefix("data: "))
        typed = model.model_validate(data)  # what the document says a chunk is
        exclude = None if include_usage or data.get("usage") else {"usage"}
        assert typed.model_dump(exclude=exclude) == data
        assert ("usage" in data) == (include_usage or not data["choices"])


def test_fields_openai_leaves_out_are_absent_not_null() -> None:
    assert AssistantMessage(role="assistant", content="hi").model_dump() == {"role": "assistant", "content": "hi"}
    assert AssistantMessage(role="assistant", content=None).model_dump() == {"role": "assistant", "content": None}
    assert ChatDelta(content="x").model_dump() == {"content": "x"}
    streamed = json.loads(ChunkWriter("c", "m", 1, True, False).event("x", None).removeprefix("data: "))
    assert set(streamed) == {"id", "object", "created", "model", "choices"}
    assert streamed["choices"][0] == {"index": 0, "finish_reason": None, "logprobs": None, "delta": {"content": "x"}}


@pytest.mark.parametrize("values", [
    (ChatDelta, {"role": None, "content": "x", "tool_calls": None, "annotations": None}),
    (TokenExtras, {"index": 3, "spec": SpecStepStats(drafted=1, accepted=1)}),
])
def test_built_makes_what_model_construct_makes(values: tuple[type, dict[str, Any]]) -> None:
    model, fields = values
    fast, slow = built(model, **fields), model.model_construct(**fields)
    assert fast == slow and fast.model_dump() == slow.model_dump()
    assert fast.model_fields_set == slow.model_fields_set
