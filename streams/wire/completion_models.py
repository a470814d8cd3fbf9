"""OpenAI's answer objects, typed: ``chat.completion`` and ``text_completion`` with their choices, messages,
logprobs and the ``specstream`` extension field. The builders (:mod:`streams.wire.answers`, the edge's routes) build
them, the routes declare them as their ``response_model`` (so the OpenAPI document is these classes) and batch output
files hold them (:mod:`streams.batch.outputs`).

Fields are declared in the order the JSON has always had them, and fields OpenAI leaves out when unset are
:func:`~streams.wire.omitted.omitted`: ``model_dump()`` is the answer's JSON as clients have always read it.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from schemas.events import FinishReason, SpecStats, Timings, Usage
from schemas.tools import ToolError
from streams.wire.omitted import omitted

# A chat answer's finish_reason adds OpenAI's "tool_calls" to the bus's reasons (streams.wire.tool_calls).
ChatFinishReason = Literal[FinishReason, "tool_calls"]


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(description="JSON text that validates against the function's parameters.")


class MessageToolCall(BaseModel):
    """OpenAI's nested tool call of an answer's message (the bus's is flat: schemas.events.ToolCall)."""

    id: str
    type: Literal["function"]
    function: FunctionCall


class FileCitation(BaseModel):
    """A passage a grounded answer was given (streams.rag.grounding): ``index`` is where the answer cites it."""

    type: Literal["file_citation"]
    index: int
    file_id: str
    filename: str
    quote: str
    char_start: int
    char_end: int
    vector_store_id: str
    score: float


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None = Field(description="Null when the answer is only tool calls.")
    tool_calls: list[MessageToolCall] | None = omitted()


class GroundedAssistantMessage(AssistantMessage):
    """The message of an answer grounded on vector stores (``file_search``): the passages it was given."""

    annotations: list[FileCitation]


class ChatTopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] = Field(description="The token's UTF-8 bytes.")


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob] = Field(description="The top_logprobs most likely tokens at this position.")


class ChatLogprobs(BaseModel):
    """Chat's logprobs (with logprobs: true): one entry per answer token, the model's raw log_softmax."""

    content: list[ChatTokenLogprob]
    refusal: None


class TextLogprobs(BaseModel):
    """Completions' logprobs: parallel lists, one entry per token (an echoed prompt's first, with nulls, first)."""

    tokens: list[str]
    token_logprobs: list[float | None] = Field(description="Null for an echoed prompt's first token.")
    top_logprobs: list[dict[str, float] | None] = Field(description="Null for an echoed prompt's first token.")
    text_offset: list[int]


class ChatChoice(BaseModel):
    index: int
    finish_reason: ChatFinishReason
    logprobs: ChatLogprobs | None
    message: GroundedAssistantMessage | AssistantMessage


class TextChoice(BaseModel):
    index: int
    finish_reason: FinishReason
    logprobs: TextLogprobs | None
    text: str = Field(description="The completion; with echo, the prompt before it.")


class ToolResultView(BaseModel):
    """A server-side tool call's result, as the client sees it (docs/tools.md)."""

    tool_call_id: str
    name: str
    output: Any
    error: ToolError | None
    truncated: bool
    duration_s: float


class SpecstreamExtras(BaseModel):
    """Extension field that OpenAI clients ignore: how the answer was produced."""

    edge_id: str
    spec: SpecStats = Field(description="Speculative decoding: drafted and accepted tokens, acceptance rate.")
    timings: Timings
    num_chunks: int
    tool_results: list[ToolResultView] | None = omitted("The server-side tool calls the answer made, answered.")
    index_versions: dict[str, int] | None = omitted("A grounded answer: the version of each store's index it read.")


class SpecstreamChoiceExtras(BaseModel):
    """The extension field of an answer with n > 1 choices: each choice's, in order."""

    choices: list[SpecstreamExtras]


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: None
    specstream: SpecstreamExtras | SpecstreamChoiceExtras | None = omitted(
        "The edge's extension field (absent from a batch's output lines).")


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage
    system_fingerprint: None
    specstream: SpecstreamExtras | SpecstreamChoiceExtras | None = omitted(
        "The edge's extension field (absent from a batch's output lines).")


Answer = ChatCompletion | TextCompletion
