"""OpenAI's Responses API on the edge: ``POST /v1/responses``, ``GET`` and ``DELETE /v1/responses/{id}``.

A response is generated exactly as a chat completion is (the same admission pipeline, publish and relay:
:func:`streams.edge.openai_api.start_generation`); only its shapes differ (:mod:`streams.edge.responses.body`,
:mod:`streams.edge.responses.events`). With ``stream: true`` the events go out as Server-Sent Events with their
``event:`` name, as OpenAI sends them (no ``[DONE]``).

``store`` (true unless false, as OpenAI) keeps the response and its conversation on the responses topic
(:mod:`streams.edge.responses.store`) before the client hears it is complete, so a ``previous_response_id`` sent
right after finds it, on any edge. ``previous_response_id`` naming nothing the tenant stored is 400
``previous_response_not_found``, as OpenAI answers; GET and DELETE of such an id are 404.
"""
from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from schemas.events import Completion, ErrorEvent, TokenChunk
from schemas.responses import StoredResponse
from streams.edge import openapi
from streams.edge.admission.admit import Ticket
from streams.edge.core import Edge
from streams.edge.keys import Principal
from streams.edge.openai_api import chained, principal, released, start_generation
from streams.edge.replies import ReplyStream, ReplyTimeout
from streams.edge.responses.body import ResponsesBody
from streams.edge.responses.events import ResponseBuilder, answer
from streams.edge.responses.store import ResponseStore, ResponsesUnavailable
from streams.wire import errors
from streams.wire.response_models import DeletedResponse, ResponseObject

router = APIRouter()


def _store(request: Request) -> ResponseStore:
    edge = request.app.state.edge
    if not edge.connected.is_set():
        raise errors.not_ready("the responses store is not connected to Kafka yet")
    return edge.responses


def response_not_found(response_id: str) -> errors.EdgeError:
    return errors.EdgeError(404, f"Response with id '{response_id}' not found.", param="response_id")


async def _stored(store: ResponseStore, tenant: str, response_id: str) -> StoredResponse | None:
    try:
        return await store.get(tenant, response_id)
    except ResponsesUnavailable as error:
        raise errors.not_ready(str(error)) from None


def continuation(store: ResponseStore, tenant: str) -> Callable[[ResponsesBody], Awaitable[None]]:
    """The pipeline's ``prepare`` step: a ``previous_response_id`` puts the stored conversation before the input."""

    async def prepare(body: ResponsesBody) -> None:
        if body.previous_response_id is None:
            return
        stored = await _stored(store, tenant, body.previous_response_id)
        if stored is None:
            raise errors.EdgeError(400, f"Previous response with id '{body.previous_response_id}' not found.",
                                   param="previous_response_id", code="previous_response_not_found")
        body.continue_from([*stored.conversation, *stored.response["output"]])

    return prepare


async def keep(store: ResponseStore, ticket: Ticket, response: ResponseObject) -> None:
    """Store a finished response when its request asked to (a store that cannot be written is a 503)."""
    body = ticket.body
    assert isinstance(body, ResponsesBody)
    if not body.stores:
        return
    stored = StoredResponse(id=response.id, tenant=ticket.principal.tenant, created_at=time.time(),
                            conversation=body.conversation(), response=response.model_dump())
    try:
        await store.put(stored)
    except ResponsesUnavailable as error:
        raise errors.not_ready(str(error)) from None


@router.post("/v1/responses", response_model=ResponseObject, openapi_extra=openapi.request_body("ResponsesBody"),
             responses=openapi.responses_api_responses())
async def create_response(request: Request, caller: Principal = Depends(principal)) -> Response:
    """Create a model response (OpenAI's Responses API), streamed with `stream: true`."""
    store = _store(request)
    ticket = await request.app.state.pipeline.admit_http(caller, ResponsesBody, request,
                                                         prepare=continuation(store, caller.tenant))
    started = await start_generation(request, ticket)
    if isinstance(started, Response):
        return started
    body, gen = ticket.body, ticket.request
    assert isinstance(body, ResponsesBody)
    if started.final is not None:
        ticket.finish(200, started.final)
        response = answer(body, gen, started.final, started.stream.retrieved)
        await keep(store, ticket, response)
        return JSONResponse(response.model_dump())
    events = relay(request.app.state.edge, store, ticket, started.stream, started.first, started.events)
    return StreamingResponse(_as_sse(events), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Request-Id": gen.request_id})


def _sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


async def _as_sse(events: AsyncGenerator[list[dict[str, Any]], None]) -> AsyncIterator[str]:
    # Closed explicitly, so a client gone mid-stream ends the relay (and cancels the request) at once, not at GC.
    async with contextlib.aclosing(events) as batches:
        async for batch in batches:
            yield "".join(_sse(e) for e in batch)


async def relay(edge: Edge, store: ResponseStore, ticket: Ticket, stream: ReplyStream,
                first: TokenChunk | Completion | None, events: AsyncIterator[Any],
                ) -> AsyncGenerator[list[dict[str, Any]], None]:
    """A streamed response's events, in batches (what is ready goes out as one write), from the reply stream.

    The HTTP stream and the websocket both relay this; it ends the ticket and the stream, however it ends."""
    body, gen = ticket.body, ticket.request
    assert isinstance(body, ResponsesBody)
    builder = ResponseBuilder(body, gen)
    pending = builder.start()
    try:
        async for event in chained(first, events):
            if isinstance(event, TokenChunk):
                ticket.saw(event)
                if event.text:
                    pending += builder.feed(event.text)
                if event.finish_reason is None and pending:
                    yield pending
                    pending = []
            elif isinstance(event, Completion):
                ticket.finish(200, event)
                done = builder.finish(event, stream.retrieved)
                try:
                    assert builder.final is not None
                    await keep(store, ticket, builder.final)
                except errors.EdgeError as error:
                    done = [builder.error(error)]
                yield pending + done
                return
            elif isinstance(event, ErrorEvent):
                error = errors.from_worker_error(event, input_param=ticket.input_param)
                ticket.finish(error.status, event)
                yield pending + [builder.error(error)]
                return
    except ReplyTimeout:
        edge.abandon(stream, "deadline passed at the edge")
        ticket.finish(504, code="deadline_exceeded")
        error = errors.reply_timeout(gen.request_id)
        yield pending + [builder.error(error)]
    finally:
        released(edge, stream, ticket)


@router.get("/v1/responses/{response_id}", response_model=ResponseObject,
            responses=openapi.stored_response_responses())
async def get_response(response_id: str, request: Request, caller: Principal = Depends(principal)) -> Response:
    """A stored response (only the tenant that created it sees it)."""
    stored = await _stored(_store(request), caller.tenant, response_id)
    if stored is None:
        raise response_not_found(response_id)
    return JSONResponse(stored.response)  # as it was answered when created (the record keeps its JSON)


@router.delete("/v1/responses/{response_id}", response_model=DeletedResponse,
               responses=openapi.stored_response_responses())
async def delete_response(response_id: str, request: Request, caller: Principal = Depends(principal)) -> DeletedResponse:
    """Delete a stored response."""
    try:
        deleted = await _store(request).delete(caller.tenant, response_id)
    except ResponsesUnavailable as error:
        raise errors.not_ready(str(error)) from None
    if not deleted:
        raise response_not_found(response_id)
    return DeletedResponse(id=response_id, object="response", deleted=True)

