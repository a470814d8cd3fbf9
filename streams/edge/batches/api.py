"""OpenAI's Batch API on the edge: ``POST /v1/batches``, ``GET /v1/batches/{id}``, ``GET /v1/batches`` and
``POST /v1/batches/{id}/cancel``, every input error a precise 4xx in OpenAI's shape.

The work is done by :class:`~streams.edge.batches.desk.BatchDesk` (the edge's ``batches``); the output and error files
are ordinary files, downloaded with ``GET /v1/files/{id}/content``.
"""
from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from streams.edge.admission.read import read_body
from streams.edge.batches.desk import BatchDesk, batch_object
from streams.edge.keys import Principal
from streams.edge.openai_api import principal
from streams.edge.openapi import error_responses
from streams.wire import errors
from streams.wire.batch_models import BatchList, BatchObject
from streams.wire.parse import decode_json

# Bodies are read by hand (OpenAI-shaped errors naming the parameter); what every route may answer:
ERRORS = error_responses({
    400: "Invalid input, naming the parameter (invalid_json, unknown_parameter, invalid_value, "
         "missing_required_parameter), or a batch over a batch limit by itself (<limit>_exceeded).",
    404: "No such batch or input file for this tenant.",
    409: "Cancel: the batch has already ended.",
    429: "The tenant's batch limits (batch_tokens_per_day, batch_queued_lines) are reached for now; Retry-After "
         "says when the batch would fit.",
    503: "Kafka or the batches topic is not available yet.",
})
router = APIRouter(tags=["batches"], responses=ERRORS)
_MAX_BODY = 64 * 1024
_MAX_LIST = 100


class CreateBatchBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    input_file_id: StrictStr = Field(min_length=1, description="A file uploaded with purpose 'batch'.")
    endpoint: Literal["/v1/chat/completions", "/v1/completions"] = Field(description="What every line calls.")
    completion_window: Literal["24h"] = Field(description="Only 24h.")
    metadata: dict[str, Any] | None = Field(default=None, max_length=16, description="Up to 16 labels.")


def _desk(request: Request) -> BatchDesk:
    edge = request.app.state.edge
    desk: BatchDesk | None = getattr(edge, "batches", None)
    if desk is None or not edge.connected.is_set():
        raise errors.not_ready("the batch API is not connected to Kafka yet")
    return desk


def _metadata(metadata: dict[str, Any] | None) -> dict[str, str] | None:
    for key, value in (metadata or {}).items():
        if not isinstance(value, str) or len(key) > 64 or len(value) > 512:
            raise errors.EdgeError(400, f"metadata[{key!r}]: keys are strings of at most 64 characters and values "
                                   "strings of at most 512", param="metadata", code="invalid_value")
    return metadata


@router.post("/v1/batches", response_model=BatchObject, openapi_extra={"requestBody": {"required": True, "content": {
    "application/json": {"schema": CreateBatchBody.model_json_schema()}}}})
async def create_batch(request: Request, caller: Principal = Depends(principal)) -> BatchObject:
    """Create a batch from an uploaded JSONL file (OpenAI's Batch API)."""
    desk = _desk(request)
    data = decode_json(await read_body(request, _MAX_BODY))
    try:
        body = CreateBatchBody.model_validate(data)
    except ValidationError as exc:
        raise errors.from_validation_error(exc) from None
    state = await desk.create(caller.tenant, input_file_id=body.input_file_id, endpoint=body.endpoint,
                              metadata=_metadata(body.metadata), limits=caller.limits,
                              tokenizers=request.app.state.pipeline.tokenizers, log_prompt=caller.log_prompts)
    return batch_object(state)


# Read by hand (a 400 naming the parameter, not FastAPI's 422), so declared here.
_LIST_PARAMETERS: dict[str, Any] = {"parameters": [
    {"name": "after", "in": "query", "required": False, "schema": {"type": "string"},
     "description": "A batch id: list the batches after it (the cursor)."},
    {"name": "limit", "in": "query", "required": False,
     "schema": {"type": "integer", "minimum": 1, "maximum": _MAX_LIST, "default": 20}},
]}


@router.get("/v1/batches", response_model=BatchList, openapi_extra=_LIST_PARAMETERS)
async def list_batches(request: Request, caller: Principal = Depends(principal)) -> BatchList:
    """The caller's batches, newest first; ``after`` (a batch id) and ``limit`` (1-100, default 20) page them."""
    unknown = sorted(set(request.query_params) - {"after", "limit"})
    if unknown:
        raise errors.EdgeError(400, f"Unrecognized request argument supplied: {unknown[0]!r}", param=unknown[0],
                               code="unknown_parameter")
    count = _limit(request.query_params.get("limit"))
    states, has_more = await _desk(request).list(caller.tenant, after=request.query_params.get("after"), limit=count)
    data = [batch_object(s) for s in states]
    return BatchList(object="list", data=data, first_id=data[0].id if data else None,
                     last_id=data[-1].id if data else None, has_more=has_more)


def _limit(raw: str | None) -> int:
    if raw is None:
        return 20
    if not raw.isdigit() or not 1 <= int(raw) <= _MAX_LIST:
        raise errors.EdgeError(400, f"limit must be an integer from 1 to {_MAX_LIST}, got {raw!r}", param="limit",
                               code="invalid_value")
    return int(raw)


@router.get("/v1/batches/{batch_id}", response_model=BatchObject)
async def retrieve_batch(batch_id: str, request: Request, caller: Principal = Depends(principal)) -> BatchObject:
    """One batch: its status, request counts and files."""
    return batch_object(await _desk(request).get(caller.tenant, batch_id))


@router.post("/v1/batches/{batch_id}/cancel", response_model=BatchObject)
async def cancel_batch(batch_id: str, request: Request, caller: Principal = Depends(principal)) -> BatchObject:
    """Stop taking new lines; what finished is kept in the output file."""
    return batch_object(await _desk(request).cancel(caller.tenant, batch_id))
