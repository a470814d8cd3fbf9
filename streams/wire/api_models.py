"""OpenAI's error object and model cards, typed: what every route's 4xx/5xx answers (:mod:`streams.wire.errors`
builds it) and what ``/v1/models`` lists."""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ErrorDetail(BaseModel):
    message: str = Field(description="What is wrong, in words.")
    type: str = Field(description="invalid_request_error, rate_limit_error, server_error or timeout_error.")
    param: str | None = Field(description="The request parameter at fault, e.g. 'max_tokens' or 'messages[0].content'.")
    code: str | None = Field(
        description="Machine-readable cause: missing_api_key, invalid_api_key, invalid_json, invalid_encoding, "
        "unknown_parameter, unsupported_parameter, unsupported_value, invalid_value, missing_required_parameter, "
        "model_not_found, context_length_exceeded, request_too_large, rate_limit_exceeded, service_unavailable, "
        "deadline_exceeded, ...")


class ErrorResponse(BaseModel):
    """OpenAI's error shape; every error the edge returns has it."""

    error: ErrorDetail


class ModelCard(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str | None = Field(default=None, description="The model this card serves (its own id here).")
    parent: str | None = Field(default=None, description="A LoRA adapter's base model; null for a base model.")


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[ModelCard]
