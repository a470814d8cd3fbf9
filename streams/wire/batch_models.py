"""OpenAI's Batch API objects, typed: the Batch object and its list (what ``/v1/batches`` answers,
:func:`streams.edge.batches.desk.batch_object`), and a line of a batch's output or error file
(:mod:`streams.batch.outputs`), whose body is the very answer model the endpoint returns interactively.

Fields are in the JSON's order (the Batch object's are :class:`schemas.batch.BatchState`'s, then OpenAI's).
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from schemas.batch import BatchLineError, BatchRequestCounts, BatchStatus
from streams.wire.api_models import ErrorResponse
from streams.wire.completion_models import ChatCompletion, TextCompletion


class BatchErrors(BaseModel):
    object: Literal["list"]
    data: list[BatchLineError]


class BatchObject(BaseModel):
    """OpenAI's Batch object."""

    id: str
    endpoint: Literal["/v1/chat/completions", "/v1/completions"]
    input_file_id: str
    completion_window: Literal["24h"]
    status: BatchStatus
    created_at: int
    expires_at: int
    in_progress_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: BatchRequestCounts
    output_file_id: str | None
    error_file_id: str | None
    metadata: dict[str, str] | None
    object: Literal["batch"]
    errors: BatchErrors | None = Field(description="Why the batch failed as a whole; null otherwise.")
    model: None
    usage: None


class BatchList(BaseModel):
    """The caller's batches, newest first (OpenAI's cursor page)."""

    object: Literal["list"]
    data: list[BatchObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class BatchLineResponse(BaseModel):
    status_code: int
    request_id: str
    body: ChatCompletion | TextCompletion | ErrorResponse = Field(
        description="What the endpoint would have answered: the completion, or OpenAI's error object.")


class BatchLineNotRun(BaseModel):
    code: Literal["batch_expired", "batch_cancelled"]
    message: str


class BatchOutputLine(BaseModel):
    """One line of a batch's output file (answered) or error file (failed, or not run: ``response`` null)."""

    id: str
    custom_id: str
    response: BatchLineResponse | None
    error: BatchLineNotRun | None
