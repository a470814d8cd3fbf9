"""A field that OpenAI's JSON leaves out rather than sending as null (``tool_calls`` of a message without calls, a
delta's ``role`` after the first chunk, ...): declared in the model, so the schema names it, and absent when None.

Fields that OpenAI does send as null (``logprobs``, ``finish_reason`` of a chunk, ``system_fingerprint``) are
ordinary ``X | None`` fields: the answer models (:mod:`streams.wire.completion_models`,
:mod:`streams.wire.chunk_models`) say which is which, field by field.
"""
from __future__ import annotations

from typing import Any

from pydantic import Field


def _is_none(value: object) -> bool:
    return value is None


def omitted(description: str | None = None) -> Any:
    """A field absent from the serialized JSON when it is None (its default)."""
    return Field(default=None, exclude_if=_is_none, description=description)
