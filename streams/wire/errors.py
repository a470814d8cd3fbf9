"""Errors the edge returns, in OpenAI's error shape, and where they come from.

Every error a client sees is an :class:`EdgeError`: an HTTP status plus the
body ``{"error": {"message", "type", "param", "code"}}``. They come from three
places: the client's own input (invalid JSON, a pydantic validation error,
an unknown model), the worker (an ``ErrorEvent`` on the reply topic, mapped by
its ``code``), and the edge itself (deadline passed without a reply, Kafka
unavailable).
"""
from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError

from schemas.events import BusErrorCode, ErrorEvent
from streams.wire.api_models import ErrorDetail, ErrorResponse


class EdgeError(Exception):
    def __init__(
        self, status: int, message: str, *, type: str = "invalid_request_error",
        param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers  # e.g. Retry-After on a 429, WWW-Authenticate on a 401

    def answer(self) -> ErrorResponse:
        """OpenAI's error object (:class:`~streams.wire.api_models.ErrorResponse`)."""
        return ErrorResponse(error=ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code))

    def body(self) -> dict[str, Any]:
        return self.answer().model_dump()

    def __repr__(self) -> str:
        return f"EdgeError({self.status}, {self.code!r}, {self.message!r}, param={self.param!r})"


def invalid_json(detail: str) -> EdgeError:
    return EdgeError(
        400, f"We could not parse the JSON body of your request: {detail}. "
        "The request body must be a JSON object.", code="invalid_json",
    )


def model_not_found(model: str, served: tuple[str, ...]) -> EdgeError:
    return EdgeError(
        404, f"The model `{model}` does not exist or you do not have access to it. "
        f"Served models: {', '.join(served) or 'none'}.", param="model", code="model_not_found",
    )


def missing_api_key() -> EdgeError:
    return EdgeError(
        401, "You didn't provide an API key. Send it in an Authorization header using Bearer auth "
        "(Authorization: Bearer YOUR_KEY); create one with `specstream keys create --tenant NAME`.",
        code="missing_api_key", headers={"WWW-Authenticate": 'Bearer realm="specstream"'},
    )


def invalid_api_key() -> EdgeError:
    # Never echo the key, not even masked: error bodies end up in client logs.
    return EdgeError(
        401, "Incorrect API key provided (unknown or revoked). List keys with `specstream keys list`.",
        code="invalid_api_key", headers={"WWW-Authenticate": 'Bearer realm="specstream", error="invalid_token"'},
    )


def body_too_large(limit: int) -> EdgeError:
    return EdgeError(413, f"The request body exceeds the limit of {limit} bytes (edge.max_body_bytes).",
                     code="request_too_large")


def rate_limited(message: str, retry_after_s: int, *, limit: str) -> EdgeError:
    return EdgeError(429, message, type="rate_limit_error", code="rate_limit_exceeded", param=None,
                     headers={"Retry-After": str(retry_after_s), "X-RateLimit-Limited": limit})


def not_ready(reason: str) -> EdgeError:
    return EdgeError(503, f"The service is not ready: {reason}", type="server_error", code="service_unavailable")


def reply_timeout(request_id: str) -> EdgeError:
    return EdgeError(
        504, f"No reply to request {request_id} before its deadline; it was cancelled.",
        type="timeout_error", code="deadline_exceeded",
    )


def loc_to_param(loc: tuple[Any, ...]) -> str:
    """('messages', 0, 'content') -> 'messages[0].content'."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


_ROLE_TAGS = frozenset({"system", "developer", "user", "assistant", "tool"})
# A tool's model is picked by its type (function or file_search): pydantic puts that tag in the location too.
_TOOL_TAGS = frozenset({"function", "file_search"})


def _is_tag(loc: tuple[Any, ...], i: int) -> bool:
    if i == 0 or not isinstance(loc[i - 1], int):
        return False
    return loc[i] in _ROLE_TAGS or (loc[i] in _TOOL_TAGS and i >= 2 and loc[i - 2] == "tools")


def from_validation_error(exc: ValidationError, *, loc_prefix_drop: tuple[str, ...] = ()) -> EdgeError:
    """The first error of a pydantic validation, naming its field."""
    errs = exc.errors(include_url=False)
    # For a union (prompt: str | list[str]) pydantic reports every member; a type mismatch with one member is
    # the least telling of them ("should be a valid string" for a list), so prefer another error when there is one.
    err = next((e for e in errs if not e["type"].endswith("_type")), errs[0])
    loc = tuple(p for p in err["loc"] if p not in loc_prefix_drop)
    # pydantic puts the union member's tag in the location ("str", "list[str]", "constrained-str"); drop those.
    loc = tuple(p for p in loc if not (isinstance(p, str) and (
        "[" in p or p in {"str", "int", "float", "bool"} or p.startswith(("constrained-", "function-")))))
    # A message's model is picked by its role (a tagged union), and pydantic puts the role in the location too.
    loc = tuple(p for i, p in enumerate(loc) if not _is_tag(loc, i))
    if err["type"] in ("union_tag_invalid", "union_tag_not_found"):  # a missing or unknown role: name the field
        loc = (*loc, str(err.get("ctx", {}).get("discriminator", "")).strip("'"))
    param = loc_to_param(loc) or None
    if err["type"] == "extra_forbidden":
        return EdgeError(400, f"Unrecognized request argument supplied: {param}", param=param, code="unknown_parameter")
    if err["type"] == "missing":
        return EdgeError(400, f"Missing required parameter: '{param}'.", param=param, code="missing_required_parameter")
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, "):]
    where = f"'{param}'" if param else "request body"
    return EdgeError(400, f"Invalid value for {where}: {message}", param=param, code="invalid_value")


# Worker error codes -> (HTTP status, OpenAI error type).
_WORKER_ERRORS: dict[BusErrorCode, tuple[int, str]] = {
    "invalid_request": (400, "invalid_request_error"),
    "unknown_model": (404, "invalid_request_error"),
    "context_length_exceeded": (400, "invalid_request_error"),
    "message_too_large": (413, "invalid_request_error"),
    "deadline_exceeded": (504, "timeout_error"),
    "cancelled": (499, "invalid_request_error"),
    "overloaded": (503, "server_error"),
    "internal_error": (500, "server_error"),
    "unsupported_schema_version": (500, "server_error"),
}


def from_worker_error(event: ErrorEvent, *, input_param: str = "messages") -> EdgeError:
    """Map a worker's ErrorEvent to the status and shape an OpenAI client expects.

    ``input_param`` is the name of the prompt field in the client's API
    ("messages" for chat, "prompt" for completions). For
    ``context_length_exceeded`` the param is the prompt field when the prompt
    alone does not fit, and ``max_tokens`` when the prompt fits but not
    together with the requested completion (see :func:`_context_param`).
    """
    status, type_ = _WORKER_ERRORS.get(event.code, (500, "server_error"))
    code: str = event.code
    param: str | None = event.param
    if event.code == "unknown_model":
        code, param = "model_not_found", "model"
    elif event.code == "context_length_exceeded" and param is None:
        # Older workers do not set ErrorEvent.param: read it from the engine's message.
        param = _context_param(event.message, input_param)
    elif event.code == "context_length_exceeded" and param == "prompt":
        param = input_param  # the worker names the prompt generically; the client knows it as messages or prompt
    elif event.code == "message_too_large":
        param = input_param
    return EdgeError(status, event.message, type=type_, param=param, code=code)


# The engine's wording: "prompt has N tokens and max_tokens is M: ... context of C tokens" (or "... holds C tokens").
_CONTEXT = re.compile(r"prompt has (\d+) tokens and max_tokens is (\d+).*?(\d+) tokens\s*$")


def _context_param(message: str, input_param: str) -> str:
    """Which parameter made the request too long: the prompt itself, or max_tokens on top of it."""
    match = _CONTEXT.search(message)
    if match is None:
        return "max_tokens" if "max_tokens" in message and "prompt" not in message else input_param
    prompt_tokens, _max_tokens, capacity = (int(g) for g in match.groups())
    return input_param if prompt_tokens >= capacity else "max_tokens"
