"""Stage 2, parse: bytes -> a strict JSON object -> the API's typed body, each failure a precise 400 naming the field.

In order:

1. encoding: the bytes must be UTF-8 (``invalid_encoding``), and no string in
   the JSON may hold an unpaired surrogate escape (``"\\ud800"``), which could
   not be re-encoded for Kafka (``invalid_encoding`` naming the field);
2. JSON: an object, no ``NaN``/``Infinity``, nested at most
   :data:`MAX_JSON_DEPTH` deep (``invalid_json``);
3. OpenAI parameters the engine does not implement: ``unsupported_parameter``
   unless neutral (:mod:`streams.wire.unsupported`);
4. the body (:mod:`streams.wire.bodies`): an unknown field is
   ``unknown_parameter``, a missing one ``missing_required_parameter``, a value
   out of range ``invalid_value``, a neutral-only one ``unsupported_value``.
"""
from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import ValidationError

from streams.wire import errors
from streams.wire.bodies import Body
from streams.wire.unsupported import strip_unsupported

MAX_JSON_DEPTH = 64
BodyT = TypeVar("BodyT", bound=Body)


def parse_body(body_type: type[BodyT], data: dict[str, Any]) -> BodyT:
    """A decoded JSON object as the API's body."""
    try:
        return body_type.model_validate(strip_unsupported(data, body_type.unsupported))
    except ValidationError as exc:
        # An EdgeError raised by a validator (unsupported_value, ...) arrives wrapped; unwrap it.
        for err in exc.errors(include_url=False):
            cause = (err.get("ctx") or {}).get("error")
            if isinstance(cause, errors.EdgeError):
                raise cause from None
        raise errors.from_validation_error(exc) from None


def invalid_encoding(message: str, param: str | None = None) -> errors.EdgeError:
    return errors.EdgeError(400, message, param=param, code="invalid_encoding")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def decode_json(raw: bytes | str, *, what: str = "body") -> dict[str, Any]:
    """Strict UTF-8 JSON object (400 invalid_encoding / invalid_json otherwise); ``what``: body or frame."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise invalid_encoding(f"The request {what} is not valid UTF-8 ({error.reason} at byte {error.start}).") from None
    else:
        text = raw
    if not text.strip():
        raise errors.invalid_json(f"the {what} is empty")
    try:
        data = json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as error:
        raise errors.invalid_json(f"{error.msg} at line {error.lineno} column {error.colno}") from None
    except ValueError as error:
        raise errors.invalid_json(str(error)) from None
    except RecursionError:
        raise errors.invalid_json("nested too deeply") from None
    if not isinstance(data, dict):
        raise errors.invalid_json(f"expected an object, got {type(data).__name__}")
    _check_strings(data)
    return data


def _check_strings(data: Any) -> None:
    """Every string (and key) must be encodable as UTF-8; the JSON must not nest beyond MAX_JSON_DEPTH."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise errors.invalid_json(f"nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(value, str):
            _encodable(value, path)
        elif isinstance(value, dict):
            for key, item in value.items():
                _encodable(key, path or None)
                stack.append((item, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))


def _encodable(text: str, path: str | None) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        where = f"'{path}'" if path else "a parameter name"
        raise invalid_encoding(
            f"Invalid string in {where}: an unpaired surrogate escape at character {error.start} is not valid "
            "Unicode text.", param=path or None,
        ) from None
