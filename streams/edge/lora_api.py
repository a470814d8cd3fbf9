"""vLLM's LoRA adapter routes: POST /v1/load_lora_adapter and /v1/unload_lora_adapter, through the bus.

The edge does not load anything itself: it publishes an `AdapterCommand` to the
compacted adapters topic (every engine worker applies it, those started later
too) and waits for the workers' announcements to say how it went:

* load: 200 "Success: LoRA adapter 'NAME' added successfully." once every live worker
  of the base model announces the adapter (a request for it may land on any of them);
  400 `lora_load_failed` with the worker's reason when one
  reports the load failed (missing path, broken or unsupported adapter); 504 when
  no worker answered in time (the command stays on the topic and applies when a
  worker can). 400 when the name is already served (unless `load_inplace`).
* unload: 200 "Success: LoRA adapter 'NAME' removed successfully." once no live
  worker announces it any more; 404 when it is not served. Requests in flight on
  the adapter finish; new ones get 404 `model_not_found`.
"""
from __future__ import annotations

import asyncio
import re
import time
import uuid
from typing import TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ValidationError

from schemas.adapters import (
    ADAPTER_NAME_PATTERN,
    AdapterCommand,
    LoadLoRAAdapterBody,
    UnloadLoRAAdapterBody,
)
from streams.edge.admission.read import read_body
from streams.edge.core import Edge
from streams.edge.keys import Principal
from streams.edge.openai_api import principal
from streams.kafka import clients
from streams.wire import errors
from streams.wire.parse import decode_json

# Out of the OpenAPI document (docs/lora.md describes them): they are operator routes with side effects on every
# worker, which the document's consumers (SDK generators, the fuzz test) should not call.
router = APIRouter(include_in_schema=False)
BodyT = TypeVar("BodyT", bound=BaseModel)
# Reading an adapter takes well under a second for small ranks; a large one on a busy worker, a few.
ANSWER_WAIT_S = 30.0
_POLL_S = 0.1


def _edge(request: Request) -> Edge:
    return request.app.state.edge


async def _body(request: Request, body_type: type[BodyT]) -> BodyT:
    """The JSON body as body_type: 400 naming the field that is missing, unknown or of the wrong type."""
    data = decode_json(await read_body(request, _edge(request).settings.edge.max_body_bytes))
    try:
        return body_type.model_validate(data)
    except ValidationError as exc:
        raise errors.from_validation_error(exc) from None


def _check_allowed(edge: Edge) -> None:
    # Loading reads a folder on every worker's machine: an operator opts in, as vLLM asks for
    # VLLM_ALLOW_RUNTIME_LORA_UPDATING.
    if not edge.settings.settings.engine.lora.runtime_updates:
        raise errors.EdgeError(403, "runtime LoRA updates are off: set engine.lora.runtime_updates: true "
                               "(SPECSTREAM_ENGINE__LORA__RUNTIME_UPDATES) to allow them, or use `specstream adapters`",
                               code="lora_updates_disabled", type="permission_error")


def _check_name(edge: Edge, name: str) -> None:
    if not re.match(ADAPTER_NAME_PATTERN, name):
        raise errors.EdgeError(400, f"lora_name {name!r} must match {ADAPTER_NAME_PATTERN}", param="lora_name",
                               code="invalid_value")
    if name in edge.settings.models:
        raise errors.EdgeError(400, f"lora_name {name!r} is the base model's name", param="lora_name",
                               code="invalid_value")


async def _publish(edge: Edge, command: AdapterCommand) -> None:
    try:
        producer = edge.publisher.producer
    except RuntimeError:
        raise errors.not_ready("not connected to Kafka") from None
    await producer.send_and_wait(edge.settings.catalog.adapters.name, clients.encode(command),
                                 key=command.lora_name.encode())


def _command(edge: Edge, action: str, name: str, path: str | None = None) -> AdapterCommand:
    return AdapterCommand(command_id=uuid.uuid4().hex, action=action, lora_name=name, lora_path=path,  # type: ignore[arg-type]
                          base_model=edge.settings.models[0], at=time.time())


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse)
async def load_lora_adapter(request: Request, caller: Principal = Depends(principal)) -> PlainTextResponse:
    """Serve a LoRA adapter under `lora_name` on every worker (vLLM's route and body)."""
    edge = _edge(request)
    _check_allowed(edge)
    body: LoadLoRAAdapterBody = await _body(request, LoadLoRAAdapterBody)
    name = body.lora_name
    _check_name(edge, name)
    if not body.lora_path.strip():
        raise errors.EdgeError(400, "lora_path is empty", param="lora_path", code="invalid_value")
    if name in edge.readiness.adapters() and not body.load_inplace:
        raise errors.EdgeError(400, f"The lora adapter '{name}' has already been loaded.", param="lora_name",
                               code="lora_already_loaded")
    command = _command(edge, "load", name, body.lora_path)
    await _publish(edge, command)
    deadline = time.monotonic() + ANSWER_WAIT_S
    while time.monotonic() < deadline:
        failure = edge.readiness.adapter_error(command.command_id)
        if failure is not None:
            raise errors.EdgeError(400, f"Loading LoRA adapter '{name}' failed: {failure}", param="lora_path",
                                   code="lora_load_failed")
        if _served_everywhere(edge, command, fresh=body.load_inplace):
            return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")
        await asyncio.sleep(_POLL_S)
    raise errors.EdgeError(504, f"Not every worker confirmed loading '{name}' within {ANSWER_WAIT_S:g} s; the load "
                           "stays registered and applies when a worker can.", type="server_error",
                           code="lora_load_timeout")


def _served_everywhere(edge: Edge, command: AdapterCommand, *, fresh: bool) -> bool:
    """Every live worker of the adapter's base model announces it (``fresh``: announced after the command, so after
    applying a reload in place). Not one of them: the requests topic does not route by adapter, and a chat sent
    right after the 200 must not land on a worker that has not loaded it yet."""
    workers = [w for w in edge.readiness.live_workers() if command.base_model in w.models]
    return bool(workers) and all(command.lora_name in w.adapters and (not fresh or w.at > command.at)
                                 for w in workers)


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse)
async def unload_lora_adapter(request: Request, caller: Principal = Depends(principal)) -> PlainTextResponse:
    """Stop serving a LoRA adapter (vLLM's route and body); requests in flight on it finish."""
    edge = _edge(request)
    _check_allowed(edge)
    body: UnloadLoRAAdapterBody = await _body(request, UnloadLoRAAdapterBody)
    name = body.lora_name
    if name not in edge.readiness.adapters():
        raise errors.EdgeError(404, f"The lora adapter '{name}' cannot be found.", param="lora_name",
                               code="lora_not_found")
    await _publish(edge, _command(edge, "unload", name))
    deadline = time.monotonic() + ANSWER_WAIT_S
    while time.monotonic() < deadline:
        if name not in edge.readiness.adapters():
            return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
        await asyncio.sleep(_POLL_S)
    raise errors.EdgeError(504, f"No worker confirmed unloading '{name}' within {ANSWER_WAIT_S:g} s; the unload "
                           "stays registered and applies when a worker can.", type="server_error",
                           code="lora_unload_timeout")
