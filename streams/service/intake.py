"""From raw message bytes to a validated input event, or to a precise rejection.

Input from the bus is untrusted: anything a client (or a bug) publishes must end
as either a validated event of the consumer's input model or a
:class:`Rejection` that says exactly what is wrong, never as an exception in the
consumer. Checks run cheapest first: size, UTF-8 and JSON, ``schema_version``,
then the schema.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from schemas.events import SCHEMA_VERSION, ErrorCode, ReplyRoute
from streams.kafka.clients import validation_summary

InputT = TypeVar("InputT", bound=BaseModel)

# Longest request id echoed back from a message that failed validation.
_MAX_ECHOED_ID = 128
# Oversized messages up to this many times the limit are parsed for a reply route; beyond, they are only dead-lettered.
_HINT_PARSE_FACTOR = 16


@dataclass(frozen=True)
class Rejection:
    """Why a message is not served, and whom to tell."""

    code: ErrorCode
    message: str
    # Read from the raw JSON when possible, so the sender still hears why.
    request_id: str | None = None
    route: ReplyRoute | None = None
    # Malformed input goes to the dead-letter topic too; a valid message the consumer cannot serve (unknown
    # model, deadline passed) does not.
    dead_letter: bool = False


class Rejected(Exception):
    """Raised by the decoder (inside FastStream's consume path) so the foundation can dead-letter the message."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(f"{rejection.code}: {rejection.message}")
        self.rejection = rejection


def parse_message(value: bytes | None, model: type[InputT], *, max_bytes: int) -> InputT | Rejection:
    """Validate one message as ``model``; every failure is a dead-lettered :class:`Rejection`."""
    if value is None:
        return Rejection("invalid_request", "empty message (no value)", dead_letter=True)
    # An oversized message is still parsed (up to a bound) to find where to send the error.
    raw = _loads(value) if len(value) <= _HINT_PARSE_FACTOR * max_bytes else None
    request_id, route = _reply_hints(raw)
    if len(value) > max_bytes:
        return Rejection(
            "message_too_large", f"message is {len(value)} bytes; the limit is {max_bytes} bytes",
            request_id, route, dead_letter=True,
        )
    if isinstance(raw, _Malformed):
        return Rejection("invalid_request", f"malformed JSON: {raw.reason}", dead_letter=True)
    if not isinstance(raw, dict):
        return Rejection("invalid_request", f"expected a JSON object, got {type(raw).__name__}", dead_letter=True)
    version = raw.get("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION or isinstance(version, bool):
        return Rejection(
            "unsupported_schema_version",
            f"schema_version {version!r} is not supported; this consumer reads schema_version {SCHEMA_VERSION}",
            request_id, route, dead_letter=True,
        )
    try:
        return model.model_validate_json(value)
    except ValidationError as error:
        return Rejection("invalid_request", validation_summary(error), request_id, route, dead_letter=True)


@dataclass(frozen=True)
class _Malformed:
    reason: str


def _loads(value: bytes) -> Any:
    try:
        # Decode explicitly: json.loads would also accept UTF-16/32 bytes, which the schema parser does not.
        return json.loads(value.decode("utf-8"))
    except UnicodeDecodeError as error:
        return _Malformed(f"not UTF-8 ({error.reason} at byte {error.start})")
    except json.JSONDecodeError as error:
        return _Malformed(f"{error.msg} at line {error.lineno} column {error.colno}")
    except RecursionError:
        return _Malformed("nested too deeply")


def _reply_hints(raw: Any) -> tuple[str | None, ReplyRoute | None]:
    """The request id and reply route, if they can be read from an otherwise invalid message."""
    if not isinstance(raw, dict):
        return None, None
    request_id = raw.get("request_id")
    if not isinstance(request_id, str) or not request_id:
        request_id = None
    else:
        request_id = request_id[:_MAX_ECHOED_ID]
    try:
        route = ReplyRoute.model_validate(raw.get("reply_to"))
    except ValidationError:
        route = None
    return request_id, route
