"""OpenAI's Responses API objects, typed: the response object with its output items (a message's text, a function
call), its usage, and the deleted-response answer. The edge's builder (:mod:`streams.edge.responses.events`) makes
them, ``/v1/responses`` declares them as its ``response_model``, and the responses topic stores their JSON.

Fields are in the JSON's order; the stream's events (``response.output_text.delta``, ...) are described in the
route's ``responses=`` (each event's data carries its ``type`` and ``sequence_number``).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from streams.wire.completion_models import FileCitation

ItemStatus = Literal["in_progress", "completed", "incomplete"]


class ResponseOutputText(BaseModel):
    type: Literal["output_text"]
    text: str
    annotations: list[FileCitation] = Field(description="A grounded answer's passages (file_search).")
    logprobs: list[Any] = Field(description="Always empty: logprobs are not offered on this API.")


class ResponseOutputMessage(BaseModel):
    id: str
    type: Literal["message"]
    status: ItemStatus
    role: Literal["assistant"]
    content: list[ResponseOutputText]


class ResponseFunctionToolCall(BaseModel):
    id: str
    type: Literal["function_call"]
    status: ItemStatus
    call_id: str = Field(description="What the function_call_output item answering it names.")
    name: str
    arguments: str = Field(description="JSON text that validates against the function's parameters.")


OutputItem = Annotated[ResponseOutputMessage | ResponseFunctionToolCall, Field(discriminator="type")]


class InputTokensDetails(BaseModel):
    cached_tokens: int = Field(description="Prompt tokens the engine's prefix cache held.")
    cache_write_tokens: int = Field(description="Always 0: the cache is automatic, no write is billed.")


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseError(BaseModel):
    code: str | None
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class Reasoning(BaseModel):
    effort: None
    summary: None


class ResponseObject(BaseModel):
    """OpenAI's response object, with what the request asked (``temperature``/``top_p``: the values applied)."""

    id: str
    object: Literal["response"]
    created_at: int
    status: Literal["in_progress", "completed", "incomplete", "failed"]
    background: bool
    error: ResponseError | None
    incomplete_details: IncompleteDetails | None
    instructions: str | None
    max_output_tokens: int | None
    max_tool_calls: None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: Reasoning
    service_tier: Literal["default"]
    store: bool
    temperature: float | None
    text: dict[str, Any] = Field(description="The output's format ({type: text} or a JSON schema) and verbosity.")
    tool_choice: str | dict[str, Any]
    tools: list[dict[str, Any]] = Field(description="The request's tools, as OpenAI lists them.")
    top_p: float | None
    truncation: Literal["disabled"]
    usage: ResponseUsage | None
    user: str | None
    metadata: dict[str, str]


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"]
    deleted: bool
