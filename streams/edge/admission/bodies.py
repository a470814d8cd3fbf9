"""Client input -> GenerateRequest: parsing, validation, and the fields the edge assigns.

The bodies accepted by the OpenAI-compatible routes and the websocket are
pydantic models that forbid unknown fields, so a misspelled parameter is a 400
naming it. A few OpenAI parameters the engine does not implement are accepted
only with their neutral value (``n=1``, penalties 0, no logprobs).

The edge assigns what the client does not give:

* ``request_id`` (``chatcmpl-<uuid>`` / ``cmpl-<uuid>``), unique per request;
* ``seed``, random, when the client gives none, so that a request redelivered
  to another worker after a crash regenerates the same text even when sampling;
* ``created_at`` and, when the edge has a request timeout, ``deadline``;
* ``reply_to``: this edge's reply topic;
* ``tenant``: the tenant of the caller's API key (:mod:`streams.edge.auth`).
"""
from __future__ import annotations

import json
import secrets
import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schemas.events import ChatMessage, GenerateRequest, ReplyRoute, SamplingParams, TraceContext
from streams.edge import errors
from streams.edge.settings import EdgeOptions


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ClientMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"] = Field(
        description="Author of the message; developer is treated as system.")
    content: str | list[TextPart] = Field(description="Text, or a list of text parts that are joined.")

    def to_schema(self) -> ChatMessage:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        role = "system" if self.role == "developer" else self.role
        return ChatMessage(role=role, content=content)


class StreamOptions(_Strict):
    include_usage: bool = Field(default=False, description="Send a last chunk with the usage and no choices.")


class _Common(_Strict):
    """Sampling fields shared by every API."""

    model: str = Field(min_length=1, description="A served model (GET /v1/models).")
    max_tokens: int | None = Field(
        default=None, ge=1, le=32768,
        description="Most tokens to generate; prompt + max_tokens must fit the model's context. "
        "Default: edge.max_tokens_default, capped to what the context leaves.")
    temperature: float | None = Field(default=None, ge=0.0, le=2.0, description="0 (the default) is greedy.")
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    top_k: int | None = Field(default=None, ge=0, description="Extension: keep the k most likely tokens; 0: off.")
    seed: int | None = Field(default=None, ge=0, le=2**63 - 1,
                             description="Same seed, same parameters: same text. Default: a random seed.")
    stop: str | Annotated[list[str], Field(max_length=8)] | None = Field(
        default=None, description="Up to 8 strings that end generation; they are not returned.")
    n: int | None = Field(default=None, description="Only 1 is supported.",
                          json_schema_extra={"minimum": 1, "maximum": 1})
    frequency_penalty: float | None = Field(default=None, description="Only 0 is supported.",
                                            json_schema_extra={"minimum": 0, "maximum": 0})
    presence_penalty: float | None = Field(default=None, description="Only 0 is supported.",
                                           json_schema_extra={"minimum": 0, "maximum": 0})
    user: str | None = Field(default=None, description="End-user id; accepted and ignored.")
    # Extensions (not in OpenAI's API).
    speculation: bool | None = Field(
        default=None, description="Extension: false turns speculative decoding off for this request.")
    priority: int | None = Field(default=None, ge=-10, le=10, description="Extension: lower runs first.")

    @model_validator(mode="after")
    def _neutral_only(self) -> "_Common":
        if self.n not in (None, 1):
            raise errors.EdgeError(400, "Only n=1 is supported.", param="n", code="unsupported_value")
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                raise errors.EdgeError(400, f"'{name}' is not supported; only 0 is accepted.", param=name,
                                       code="unsupported_value")
        return self

    def max_new_tokens(self) -> int | None:
        return self.max_tokens


class ChatCompletionBody(_Common):
    messages: list[ClientMessage] = Field(min_length=1, description="The conversation so far.")
    max_completion_tokens: int | None = Field(default=None, ge=1, le=32768, description="Alias of max_tokens.")
    stream: bool = Field(default=False, description="Stream chunks as Server-Sent Events.")
    stream_options: StreamOptions | None = None
    logprobs: bool | None = Field(default=None, description="Not supported: only false.",
                                  json_schema_extra={"enum": [False, None]})

    @model_validator(mode="after")
    def _no_logprobs(self) -> "ChatCompletionBody":
        if self.logprobs:
            raise errors.EdgeError(400, "logprobs are not supported.", param="logprobs", code="unsupported_value")
        return self

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionBody(_Common):
    prompt: Annotated[str, Field(min_length=1)] | Annotated[list[Annotated[str, Field(min_length=1)]],
                                                             Field(min_length=1, max_length=1)] = Field(
        description="The prompt: a non-empty string, or a list holding exactly one.")
    stream: bool = Field(default=False, description="Stream chunks as Server-Sent Events.")
    stream_options: StreamOptions | None = None
    echo: bool | None = Field(default=None, description="Not supported: only false.",
                              json_schema_extra={"enum": [False, None]})
    logprobs: int | None = Field(default=None, description="Not supported: only 0.",
                                 json_schema_extra={"enum": [0, None]})

    @model_validator(mode="after")
    def _one_prompt(self) -> "CompletionBody":
        if isinstance(self.prompt, list) and len(self.prompt) != 1:
            raise errors.EdgeError(400, "Exactly one prompt per request is supported.", param="prompt",
                                   code="unsupported_value")
        if self.echo:
            raise errors.EdgeError(400, "echo is not supported.", param="echo", code="unsupported_value")
        if self.logprobs:
            raise errors.EdgeError(400, "logprobs are not supported.", param="logprobs", code="unsupported_value")
        return self

    def prompt_text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class WsRequestBody(_Common):
    """A websocket request frame: the chat fields (or a raw ``prompt``) plus an optional client ``id``."""

    id: str | int | None = None
    type: Literal["request"] | None = None
    messages: list[ClientMessage] | None = Field(default=None, min_length=1)
    prompt: str | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1, le=32768)
    # Accepted so a chat body can be sent unchanged; a websocket always streams.
    stream: bool | None = None
    stream_options: StreamOptions | None = None

    @model_validator(mode="after")
    def _one_input(self) -> "WsRequestBody":
        if (self.messages is None) == (self.prompt is None):
            raise errors.EdgeError(400, "Give exactly one of 'messages' and 'prompt'.", param="messages",
                                   code="invalid_value")
        return self

    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def parse_json_body(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise errors.invalid_json("the body is empty")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise errors.invalid_json(str(exc)) from None
    if not isinstance(data, dict):
        raise errors.invalid_json(f"expected an object, got {type(data).__name__}")
    return data


def validate_body(model: type[_Strict], data: dict[str, Any]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        # An EdgeError raised by a validator arrives wrapped; unwrap it.
        for err in exc.errors(include_url=False):
            cause = (err.get("ctx") or {}).get("error")
            if isinstance(cause, errors.EdgeError):
                raise cause from None
        raise errors.from_validation_error(exc) from None


def check_model(model: str, settings: EdgeOptions) -> None:
    if model not in settings.models:
        raise errors.model_not_found(model, settings.models)


def new_request_id(kind: str = "chatcmpl") -> str:
    return f"{kind}-{uuid.uuid4().hex}"


def build_request(
    body: _Common,
    settings: EdgeOptions,
    reply_topic: str,
    *,
    request_id: str | None = None,
    traceparent: str | None = None,
    tracestate: str | None = None,
    now: float | None = None,
    tenant: str = "default",
) -> GenerateRequest:
    """The GenerateRequest for a validated client body, with the edge-assigned fields filled in."""
    check_model(body.model, settings)
    now = time.time() if now is None else now
    sampling: dict[str, Any] = {
        "max_tokens": body.max_new_tokens() or settings.max_tokens_default,
        "seed": body.seed if body.seed is not None else secrets.randbits(63),
    }
    for name in ("temperature", "top_p", "top_k", "speculation"):
        value = getattr(body, name)
        if value is not None:
            sampling[name] = value
    if body.stop is not None:
        sampling["stop"] = [body.stop] if isinstance(body.stop, str) else body.stop

    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    if isinstance(body, CompletionBody):
        prompt = body.prompt_text()
        kind = "cmpl"
    elif body.messages is not None:  # chat or websocket
        messages = [m.to_schema() for m in body.messages]
        kind = "chatcmpl"
    else:
        prompt = body.prompt
        kind = "cmpl"

    try:
        params = SamplingParams(**sampling)
        return GenerateRequest(
            request_id=request_id or new_request_id(kind),
            prompt=prompt,
            messages=messages,
            model=body.model,
            sampling=params,
            reply_to=ReplyRoute(topic=reply_topic),
            deadline=now + settings.request_timeout_s if settings.request_timeout_s else None,
            priority=body.priority or 0,
            tenant=tenant,
            trace=TraceContext(traceparent=traceparent, tracestate=tracestate) if traceparent else None,
            created_at=now,
        )
    except ValidationError as exc:
        raise errors.from_validation_error(exc, loc_prefix_drop=("sampling",)) from None
