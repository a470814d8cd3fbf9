"""Stage 3, build: a parsed body -> the wire ``GenerateRequest``, with the fields the edge assigns.

The edge assigns what the client does not give:

* ``request_id`` (``chatcmpl-<uuid>`` / ``cmpl-<uuid>``), unique per request;
* ``seed``, random, when the client gives none, so that a request redelivered
  to another worker after a crash regenerates the same text even when sampling;
* ``max_tokens``, ``edge.max_tokens_default`` when the client gives none (the
  validate stage caps it to what the context leaves);
* ``created_at`` and, when the edge has a request timeout, ``deadline``;
* ``reply_to``: this edge's reply topic;
* ``tenant``: the tenant of the caller's API key (:mod:`streams.edge.auth`);
* ``trace``: the client's W3C trace context, when it sent one.
"""
from __future__ import annotations

import secrets
import time
import uuid
from collections.abc import Mapping
from typing import Any, Protocol

from pydantic import ValidationError

from schemas.events import GenerateRequest, ReplyRoute, SamplingParams, TraceContext
from streams.config import EdgeSettings
from streams.wire import errors
from streams.wire.bodies import Body

# Body fields that go into SamplingParams under the same name when the client gives them.
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "speculation", "presence_penalty", "frequency_penalty",
                    "repetition_penalty", "min_p", "stop_token_ids", "min_tokens", "ignore_eos")


class Assigns(Protocol):
    """Where the assigned fields come from: the edge's options (:class:`streams.edge.settings.EdgeOptions`), or a
    batch line's (:mod:`streams.batch.lines`), whose reply route is the batch-results topic."""

    @property
    def edge(self) -> EdgeSettings: ...

    @property
    def reply_topic(self) -> str: ...


def new_request_id(kind: str = "chatcmpl") -> str:
    return f"{kind}-{uuid.uuid4().hex}"


# The conversation a request belongs to, for tools that can add a header but not a body field (a canary rollout
# routes a conversation's requests to one pool). The body's prompt_cache_key says the same; the header wins.
CONVERSATION_HEADER = "x-conversation-id"


def conversation_of(headers: Mapping[str, str]) -> str | None:
    return headers.get(CONVERSATION_HEADER) or None


def trace_context(headers: Mapping[str, str]) -> TraceContext | None:
    """The W3C trace context of an HTTP request (``traceparent``, ``tracestate``), if it has one."""
    traceparent = headers.get("traceparent")
    if not traceparent:
        return None
    return TraceContext(traceparent=traceparent, tracestate=headers.get("tracestate"))


def sampling_of(body: Body, max_tokens_default: int) -> SamplingParams:
    sampling: dict[str, Any] = {
        "max_tokens": max_tokens_default if body.max_new_tokens() is None else body.max_new_tokens(),
        "seed": body.seed if body.seed is not None else secrets.randbits(63),
    }
    sampling.update({name: getattr(body, name) for name in _SAMPLING_FIELDS if getattr(body, name) is not None})
    if body.wanted_logprobs() is not None:
        sampling["logprobs"] = body.wanted_logprobs()
        if body.echoes():  # echoed with logprobs: the prompt's too (none computed for a plain echo)
            sampling["prompt_logprobs"] = body.wanted_logprobs()
    if body.logit_bias:
        sampling["logit_bias"] = body.token_bias()
    if body.stop is not None:
        sampling["stop"] = [body.stop] if isinstance(body.stop, str) else body.stop
    return SamplingParams(**sampling)


def build_request(
    body: Body,
    options: Assigns,
    *,
    tenant: str = "default",
    log_prompt: bool = True,
    trace: TraceContext | None = None,
    conversation_id: str | None = None,
    request_id: str | None = None,
    now: float | None = None,
) -> GenerateRequest:
    """The GenerateRequest for a parsed client body, with the edge-assigned fields filled in."""
    now = time.time() if now is None else now
    messages = body.chat_input()
    timeout = options.edge.request_timeout_s
    try:
        return GenerateRequest(
            request_id=request_id or new_request_id("chatcmpl" if messages is not None else "cmpl"),
            prompt=body.prompt_input() if messages is None else None,
            prompt_token_ids=body.prompt_tokens_input(),  # their text is added by the validate stage
            messages=messages,
            model=body.model,
            sampling=sampling_of(body, options.edge.max_tokens_default),
            reply_to=ReplyRoute(topic=options.reply_topic),
            deadline=now + timeout if timeout else None,
            priority=body.priority or 0,
            tenant=tenant,
            log_prompt=log_prompt,
            trace=trace,
            conversation_id=conversation_id or body.conversation_key(),
            tools=body.wire_tools(),
            constraint=body.constraint(),
            echo=body.echoes(),
            created_at=now,
        )
    except ValidationError as exc:
        raise errors.from_validation_error(exc, loc_prefix_drop=("sampling",)) from None
