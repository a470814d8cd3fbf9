"""The edge's OpenAPI document (``/openapi.json``, browsable at ``/docs``): complete and accurate.

The generation routes parse their bodies by hand (for precise OpenAI-shaped
errors, see :mod:`streams.edge.openai_api`), so FastAPI cannot infer their
request bodies: :func:`install` adds them from the same pydantic models the
routes validate with (``ChatCompletionBody``, ``CompletionBody``), with
``model`` restricted to the served models. Responses are documented per
status with the OpenAI wire contract's models (:mod:`streams.wire`): the JSON replies, the ``text/event-stream``
replies of ``stream: true``, and OpenAI's error shape for every 4xx/5xx the
route can return. The bearer security scheme comes from the auth dependency
(:func:`streams.edge.openai_api.principal`) and applies to the ``/v1/*`` HTTP
routes; ``/healthz``, ``/readyz``, ``/`` and the document itself are public.
The websocket (``/v1/ws``) cannot be described in OpenAPI; its protocol is in
the document's description.
"""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from streams.edge.responses.body import ResponsesBody
from streams.wire.api_models import ErrorResponse
from streams.wire.bodies import ChatCompletionBody, CompletionBody
from streams.wire.chunk_models import STREAM_MODELS, ChatCompletionChunk
from streams.wire.completion_models import ChatCompletion
from streams.wire.response_models import ResponseObject

_SSE_DESCRIPTION = (
    "With `stream: true`: Server-Sent Events, one `data: {json}` line per chunk in OpenAI's chunk format "
    "(`chat.completion.chunk` / `text_completion`, each with an extra `specstream` field holding the chunk's "
    "index and speculation stats), a last chunk with `finish_reason`, a usage-only chunk when "
    "`stream_options.include_usage`, then `data: [DONE]`. An error after the first chunk is sent as "
    "`data: {\"error\": {...}}`."
)


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: _error("Missing (missing_api_key) or wrong/revoked (invalid_api_key) API key."),
}


def error_responses(descriptions: dict[int, str]) -> dict[int | str, dict[str, Any]]:
    """The 401 and each status's OpenAI-shaped error, for routes that read their input by hand (so FastAPI cannot
    infer what they answer)."""
    return {**AUTH_ERRORS, **{status: _error(text) for status, text in descriptions.items()}}


def sse_event_schema(chunk_model: type[BaseModel]) -> dict[str, Any]:
    """One event of the stream (OpenAPI 3.1 ``schema`` of text/event-stream, i.e. 3.2's ``itemSchema``): its data is
    a JSON chunk, an error object, or the literal ``[DONE]``."""
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {
                "description": "A JSON chunk (" + chunk_model.__name__ + "), an error (ErrorResponse) after the first "
                "chunk, or `[DONE]` at the end.",
                "anyOf": [
                    {"type": "string", "const": "[DONE]"},
                    {"type": "string", "contentMediaType": "application/json",
                     "contentSchema": {"anyOf": [{"$ref": f"#/components/schemas/{chunk_model.__name__}"},
                                                 {"$ref": "#/components/schemas/ErrorResponse"}]}},
                ],
            },
            "event": {"type": "string", "description": "Always the default, message."},
            "id": {"type": "string"},
            "retry": {"type": "integer"},
        },
    }


def generation_responses(ok_model: type[BaseModel], chunk_model: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    return {
        200: {"model": ok_model, "description": "The completion; with `stream: true`, a stream of events. "
              + _SSE_DESCRIPTION,
              "content": {"text/event-stream": {"schema": sse_event_schema(chunk_model)}}},
        400: _error("Invalid input, naming the parameter: invalid_json, invalid_encoding, unknown_parameter, "
                    "unsupported_parameter, unsupported_value, invalid_value, missing_required_parameter, "
                    "context_length_exceeded."),
        **AUTH_ERRORS,
        404: _error("The model is not served (model_not_found)."),
        413: _error("The body is larger than edge.max_body_bytes (request_too_large)."),
        429: {**_error("The tenant is over a limit (rate_limit_exceeded): requests or tokens per minute, or "
                       "requests in flight."),
              "headers": {"Retry-After": {"description": "Seconds until the request would fit.",
                                          "schema": {"type": "integer"}}}},
        499: _error("The request was cancelled (the client went away)."),
        500: _error("The worker failed (internal_error)."),
        503: _error("Kafka, the workers or the rate limiter are unavailable (service_unavailable, overloaded)."),
        504: _error("No reply before the request's deadline (deadline_exceeded)."),
    }


# One event of a streamed response: `event:` names its type, `data:` is the event object (OpenAI's
# ResponseStreamEvent shapes: every event has its type and a sequence number counting from 0).
_RESPONSES_SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["event", "data"],
    "properties": {
        "event": {"type": "string", "description": "The event's type, as in its data (response.created, ...)."},
        "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": {
            "type": "object", "required": ["type", "sequence_number"],
            "properties": {"type": {"type": "string"}, "sequence_number": {"type": "integer", "minimum": 0}}}},
    },
}


def responses_api_responses() -> dict[int | str, dict[str, Any]]:
    """POST /v1/responses: the chat path's statuses; its 200 is OpenAI's response object (or its event stream)."""
    statuses = generation_responses(ChatCompletion, ChatCompletionChunk)
    statuses[200] = {"model": ResponseObject,
                     "description": "OpenAI's response object; with `stream: true`, its events as Server-Sent "
                     "Events (`event:` the event's type), ending with response.completed or response.incomplete.",
                     "content": {"text/event-stream": {"schema": _RESPONSES_SSE_EVENT}}}
    statuses[400] = _error("Invalid input, naming the parameter (as for chat completions), or "
                           "previous_response_not_found.")
    return statuses


def stored_response_responses() -> dict[int | str, dict[str, Any]]:
    """GET / DELETE /v1/responses/{id}."""
    return {**AUTH_ERRORS, 404: _error("No stored response of the caller's tenant has this id."),
            503: _error("The responses topic cannot be read or written now (service_unavailable).")}


DESCRIPTION = """OpenAI-compatible LLM generation served over Apache Kafka.

**Authentication**: every `/v1/*` call needs `Authorization: Bearer <API key>`; keys are managed with
`specstream keys create|list|revoke` and map to a tenant with its own limits (requests and tokens per minute,
requests in flight; over a limit: 429 with `Retry-After`).

**Websocket** `/v1/ws` (not describable in OpenAPI): one JSON object per text frame. Authenticate with the
`Authorization` header, or by offering the subprotocols `specstream.v1` and `specstream.key.<key>`, or with a
first frame `{"type": "auth", "api_key": "<key>"}` (answered `{"type": "auth", "ok": true, "tenant": ...}`);
without a valid key the socket closes with code 1008, and a frame over the size limit closes it with 1009.
Requests are the chat body's fields (or `prompt`) plus an optional `id`; `{"type": "cancel", "id": ...}` cancels
one. Replies: `{"type": "chunk", "id", "request_id", "index", "text", "token_ids", "spec": {"drafted",
"accepted"}, "draft_chars"}` per chunk (`draft_chars`: leading characters of `text` that came from accepted
drafts), `{"type": "done", "id", "text", "finish_reason", "usage", "timings", "spec", ...}` at the end, or
`{"type": "error", "id", "code", "message", "param", "status"}` (plus `retry_after` on 429).

**Browser page**: `/` serves a chat page that streams over the websocket and shows which tokens came from
accepted drafts, live tokens/s and the acceptance rate.
"""


def install(app: FastAPI, served_models: tuple[str, ...], max_model_len: int | None = None) -> None:
    """Replace ``app.openapi`` with one that adds the request bodies, the served-model enum and, when the context
    length is configured, the largest max_tokens that can ever fit it."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, description=DESCRIPTION, routes=app.routes)
        components = doc.setdefault("components", {}).setdefault("schemas", {})
        _, defs = models_json_schema(
            [(ChatCompletionBody, "validation"), (CompletionBody, "validation"), (ResponsesBody, "validation"),
             *((model, "serialization") for model in STREAM_MODELS)],
            ref_template="#/components/schemas/{model}")
        for name, schema in defs.get("$defs", {}).items():
            components.setdefault(name, schema)
        for name in ("ChatCompletionBody", "CompletionBody", "ResponsesBody"):
            properties = components[name]["properties"]
            properties["model"]["enum"] = list(served_models)
            if max_model_len is not None:
                for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
                    for option in properties.get(field, {}).get("anyOf", []):
                        if option.get("type") == "integer":
                            option["maximum"] = min(option.get("maximum", max_model_len), max_model_len - 1)
        for parameter in doc["paths"].get("/v1/models/{model}", {}).get("get", {}).get("parameters", []):
            if parameter.get("name") == "model":
                parameter["schema"]["enum"] = list(served_models)
        doc["components"] = {"schemas": components, **{k: v for k, v in doc["components"].items() if k != "schemas"}}
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]


def request_body(model_name: str) -> dict[str, Any]:
    """``openapi_extra`` for a route whose JSON body is the named component."""
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{model_name}"}}}}}
