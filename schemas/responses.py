"""A stored response of the Responses API (``/v1/responses``), as the compacted responses topic keeps it.

Keyed ``<tenant>/<response id>``, so one tenant's lookup can never find another's; a tombstone deletes it. The
response object and the conversation are OpenAI's JSON shapes, kept as they are: the edge wrote them, the edge
reads them back, and a field OpenAI adds later needs no new version of this record.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from schemas.base import Event


class StoredResponse(Event):
    type: Literal["response"] = "response"
    id: str = Field(description="The response's id, `resp_` and a suffix.")
    tenant: str = Field(description="The tenant of the API key that created it; only that tenant may read it.")
    created_at: float = Field(ge=0, description="Unix time (seconds) the response was created.")
    conversation: list[dict[str, Any]] = Field(
        description="The input items the model was given (the previous responses' input and output first, without "
        "`instructions`), so that a later `previous_response_id` continues from it.")
    response: dict[str, Any] = Field(description="The response object, as GET /v1/responses/{id} returns it.")


def response_key(tenant: str, response_id: str) -> str:
    """The record's key: per tenant, so another tenant's id is simply not there."""
    return f"{tenant}/{response_id}"
