"""OpenAI's streamed chunks, typed: one Server-Sent Event's data with ``stream: true`` (``chat.completion.chunk``,
``text_completion``), built per token by the edge's relay (:mod:`streams.edge.openai_api`).

A chunk is built with ``model_construct`` from values already valid (the bus's events were validated on arrival),
so a typed chunk costs what a dict did. As in :mod:`streams.wire.completion_models`, fields are in the JSON's order
and those OpenAI leaves out are :func:`~streams.wire.omitted.omitted`; ``usage`` is the one field whose presence is
the request's choice (``stream_options.include_usage``: null in every chunk, set in the last), so
:func:`chunk_json` leaves it out unless asked.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, Field

from schemas.events import FinishReason, SpecStepStats, Usage
from streams.wire.completion_models import (
    ChatFinishReason,
    ChatLogprobs,
    FileCitation,
    SpecstreamExtras,
    TextLogprobs,
    ToolResultView,
)
from streams.wire.omitted import omitted


class TokenExtras(BaseModel):
    """The ``specstream`` field of a chunk with text: its index and the speculation in the step that produced it."""

    index: int
    spec: SpecStepStats


class ToolResultExtras(BaseModel):
    """The ``specstream`` field of a server-side call's result event (its chunk's delta is empty)."""

    tool_result: ToolResultView


ChunkExtras = TokenExtras | ToolResultExtras | SpecstreamExtras  # the last chunk's: the whole answer's extras


class FunctionCallDelta(BaseModel):
    name: str | None = omitted()
    arguments: str | None = omitted()


class ToolCallDelta(BaseModel):
    """A call's first delta has id, type and name (arguments empty); the next one its arguments: calls go out whole."""

    index: int
    id: str | None = omitted()
    type: Literal["function"] | None = omitted()
    function: FunctionCallDelta


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = omitted("The first chunk's only.")
    content: str | None = omitted()
    tool_calls: list[ToolCallDelta] | None = omitted()
    annotations: list[FileCitation] | None = omitted("A grounded answer's last chunk: the passages it was given.")


class ChatChunkChoice(BaseModel):
    index: int
    finish_reason: ChatFinishReason | None
    logprobs: ChatLogprobs | None
    delta: ChatDelta


class TextChunkChoice(BaseModel):
    index: int
    finish_reason: FinishReason | None
    logprobs: TextLogprobs | None
    text: str


ObjectT = TypeVar("ObjectT", bound=str)
ChoiceT = TypeVar("ChoiceT", ChatChunkChoice, TextChunkChoice)


class _CompletionChunk(BaseModel, Generic[ObjectT, ChoiceT]):
    """A chunk of either API: they differ in their ``object`` and their choices only."""

    id: str
    object: ObjectT
    created: int
    model: str
    choices: list[ChoiceT] = Field(description="Empty in the usage-only chunk.")
    usage: Usage | None = Field(default=None, description="With stream_options.include_usage: null, and set in the "
                                "last chunk; absent otherwise.")
    specstream: ChunkExtras | None = omitted()


class ChatCompletionChunk(_CompletionChunk[Literal["chat.completion.chunk"], ChatChunkChoice]):
    """One Server-Sent Event's data with `stream: true` on /v1/chat/completions."""


class TextCompletionChunk(_CompletionChunk[Literal["text_completion"], TextChunkChoice]):
    """One Server-Sent Event's data with `stream: true` on /v1/completions."""


Chunk = ChatCompletionChunk | TextCompletionChunk
STREAM_MODELS: tuple[type[BaseModel], ...] = (ChatCompletionChunk, TextCompletionChunk)
_NO_USAGE = frozenset({"usage"})
M = TypeVar("M", bound=BaseModel)
_set = object.__setattr__


def built(model_type: type[M], /, **values: Any) -> M:
    """``model_type.model_construct(**values)`` for a chunk's parts, given every field: what model_construct sets, without
    its per-call look-ups of defaults and aliases, which cost more than the rest of a chunk (a chunk goes out per
    token). Nothing is checked: the values come from the bus's events, validated on arrival."""
    instance = model_type.__new__(model_type)
    _set(instance, "__dict__", values)
    _set(instance, "__pydantic_fields_set__", set(values))
    _set(instance, "__pydantic_extra__", None)
    _set(instance, "__pydantic_private__", None)
    return instance


def sse_data(obj: dict[str, Any]) -> str:
    """One Server-Sent Event of a JSON object (compact, ASCII: as the edge has always written them)."""
    return f"data: {json.dumps(obj, separators=(',', ':'))}\n\n"


@dataclass(frozen=True)
class ChunkWriter:
    """One streamed answer's chunks, each as its Server-Sent Event: what every chunk of the answer shares, once."""

    request_id: str
    model: str
    created: int
    chat: bool
    include_usage: bool  # stream_options.include_usage: every chunk has usage (null until the usage-only chunk)

    def event(self, text: str | None, reason: str | None, *, role: bool = False, extra: ChunkExtras | None = None,
              fields: dict[str, Any] | None = None, logprobs: dict[str, Any] | None = None) -> str:
        """A chunk of one choice: chat's delta (``role`` on the first, ``content`` unless None, then ``fields``:
        tool_calls or annotations) or a completion's text; ``extra`` its specstream field."""
        chunk: Chunk
        if self.chat:
            if fields:  # tool-call deltas, citations: dicts of the parser's, checked into their models
                delta = ChatDelta.model_validate({"role": "assistant" if role else None, "content": text, **fields})
            else:
                delta = built(ChatDelta, role="assistant" if role else None, content=text, tool_calls=None,
                              annotations=None)
            choice = built(ChatChunkChoice, index=0, finish_reason=reason,
                           logprobs=None if logprobs is None else ChatLogprobs.model_validate(logprobs), delta=delta)
            chunk = built(ChatCompletionChunk, id=self.request_id, object="chat.completion.chunk",
                          created=self.created, model=self.model, choices=[choice], usage=None, specstream=extra)
        else:
            text_choice = built(TextChunkChoice, index=0, finish_reason=reason,
                                logprobs=None if logprobs is None else TextLogprobs.model_validate(logprobs),
                                text=text or "")
            chunk = built(TextCompletionChunk, id=self.request_id, object="text_completion", created=self.created,
                          model=self.model, choices=[text_choice], usage=None, specstream=extra)
        return sse_data(chunk.model_dump(exclude=None if self.include_usage else _NO_USAGE))

    def usage_event(self, usage: Usage) -> str:
        """The usage-only chunk after the last one (with include_usage): no choices."""
        model = ChatCompletionChunk if self.chat else TextCompletionChunk
        chunk = model.model_construct(id=self.request_id, object="chat.completion.chunk" if self.chat else
                                      "text_completion", created=self.created, model=self.model, choices=[],
                                      usage=usage)
        return sse_data(chunk.model_dump())
