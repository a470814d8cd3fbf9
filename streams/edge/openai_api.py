"""OpenAI-compatible HTTP routes: /v1/chat/completions, /v1/completions, /v1/models.

Bodies are parsed by hand (not by FastAPI) so every input error is a precise
OpenAI-shaped 4xx: invalid JSON, an unknown field (named in ``param``), an
unknown model (404 ``model_not_found``). Worker errors (``ErrorEvent``) become
the status their code calls for (see :mod:`streams.wire.errors`).

With ``stream: true`` the edge waits for the request's first event before it
sends the response headers, so an error the worker reports up front (context
too long, unknown model) is still a proper 4xx; after that, chunks go out as
Server-Sent Events in OpenAI's chunk format, ending with ``data: [DONE]``; an
error after the first chunk is sent as ``data: {"error": {...}}``.

A client that goes away (an aborted stream, or a dropped connection while a
non-streamed request runs) makes the edge publish a ``CancelRequest``.
Speculation statistics travel in an extra ``specstream`` field that OpenAI
clients ignore.

Every ``/v1/*`` route needs an API key (:func:`principal`, 401 otherwise);
generation requests then pass the admission pipeline
(:mod:`streams.edge.admission.pipeline`: size, encoding, parameters, model,
context length, the tenant's limits) before anything is published.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator, Awaitable, TypeVar

from fastapi import APIRouter, Depends, Request, Security
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from schemas.events import Completion, ErrorEvent, GenerateRequest, TokenChunk
from schemas.retrieval import Retrieved
from streams.edge import openapi
from streams.edge.admission.admit import Ticket
from streams.edge.admission.pipeline import Pipeline
from streams.edge.auth import key_from_headers
from streams.edge.choices import choice_requests, for_ticket, merged_body
from streams.edge.core import Edge
from streams.edge.keys import Principal
from streams.edge.rag_client import submit
from streams.edge.replies import ReplyStream, ReplyTimeout
from streams.rag.grounding import citations
from streams.wire import errors
from streams.wire.answers import answered_calls, completion, completion_body
from streams.wire.api_models import ErrorResponse, ModelCard, ModelList
from streams.wire.bodies import Body, ChatCompletionBody, CompletionBody
from streams.wire.chunk_models import (
    ChatCompletionChunk,
    ChunkWriter,
    TextCompletionChunk,
    TokenExtras,
    ToolResultExtras,
    built,
    sse_data,
)
from streams.wire.completion_models import (
    ChatCompletion,
    SpecstreamChoiceExtras,
    SpecstreamExtras,
    TextCompletion,
)
from streams.wire.logprobs import StreamedEcho, chat_logprobs, completion_logprobs
from streams.wire.tool_calls import (
    ToolCallParser,
    calls_tools,
    finish_reason,
    result_view,
)

log = logging.getLogger(__name__)
router = APIRouter()
T = TypeVar("T")


class ClientGone(Exception):
    pass


def _edge(request: Request) -> Edge:
    return request.app.state.edge


def _pipeline(request: Request) -> Pipeline:
    return request.app.state.pipeline


bearer = HTTPBearer(
    auto_error=False, scheme_name="ApiKey", bearerFormat="sk-ss-...",
    description="An API key from `specstream keys create --tenant NAME` (or the one `specstream up` prints).",
)


def _api_of(path: str) -> str:
    if path.startswith("/v1/files"):
        return "files"
    if path.startswith("/v1/responses"):
        return "responses"
    return {"/v1/chat/completions": "chat", "/v1/completions": "completions"}.get(path, "models")


async def principal(request: Request, credentials: HTTPAuthorizationCredentials | None = Security(bearer)) -> Principal:
    """The caller, from ``Authorization: Bearer <key>``; 401 in OpenAI's shape without a valid key."""
    key = credentials.credentials if credentials is not None else key_from_headers(request.headers)
    return _pipeline(request).authenticate(key, api=_api_of(request.url.path))


@router.get("/v1/models", response_model=ModelList, responses={**openapi.AUTH_ERRORS})
async def list_models(request: Request, caller: Principal = Depends(principal)) -> ModelList:
    """The served models."""
    edge = _edge(request)
    adapters = edge.readiness.adapters()
    served = (*edge.settings.models, *adapters)
    return ModelList(object="list", data=[_model_card(m, edge, adapters.get(m)) for m in served])


@router.get("/v1/models/{model:path}", response_model=ModelCard,
            responses={**openapi.AUTH_ERRORS, 404: {"model": ErrorResponse,
                                                    "description": "Not a served model (model_not_found)."}})
async def get_model(model: str, request: Request, caller: Principal = Depends(principal)) -> ModelCard:
    """One served model."""
    edge = _edge(request)
    adapters = edge.readiness.adapters()
    if model not in edge.settings.models and model not in adapters:
        raise errors.model_not_found(model, (*edge.settings.models, *adapters))
    return _model_card(model, edge, adapters.get(model))


def _model_card(model: str, edge: Edge, parent: str | None = None) -> ModelCard:
    """vLLM's card: a LoRA adapter names its base model in `parent` (null for a base model)."""
    return ModelCard(id=model, object="model", created=int(edge.started_at), owned_by="specstream", root=model,
                     parent=parent)


@router.post("/v1/chat/completions", response_model=ChatCompletion,
             openapi_extra=openapi.request_body("ChatCompletionBody"),
             responses=openapi.generation_responses(ChatCompletion, ChatCompletionChunk))
async def chat_completions(request: Request, caller: Principal = Depends(principal)) -> Response:
    """Chat completion (OpenAI-compatible), streamed with `stream: true`."""
    return await _generate(request, caller, ChatCompletionBody)


@router.post("/v1/completions", response_model=TextCompletion, openapi_extra=openapi.request_body("CompletionBody"),
             responses=openapi.generation_responses(TextCompletion, TextCompletionChunk))
async def completions(request: Request, caller: Principal = Depends(principal)) -> Response:
    """Text completion of a raw prompt (OpenAI-compatible), streamed with `stream: true`."""
    return await _generate(request, caller, CompletionBody)


async def _generate(request: Request, caller: Principal, body_type: type[Body]) -> Response:
    edge = _edge(request)
    ticket = await _pipeline(request).admit_http(caller, body_type, request)
    gen, body, chat = ticket.request, ticket.body, body_type is ChatCompletionBody
    if body.choices > 1:
        return await _choices(request, edge, ticket, chat=chat)
    started = await start_generation(request, ticket)
    if isinstance(started, Response):
        return started
    if started.final is not None:
        ticket.finish(200, started.final)
        answer = _full_response(gen, started.final, chat=chat, edge=edge, retrieved=started.stream.retrieved)
        return JSONResponse(answer.model_dump())
    # The passages of a grounded request came before its first event: known by now.
    sse = _sse(edge, gen, started.stream, started.first, started.events, chat=chat, include_usage=body.include_usage,
               input_param=ticket.input_param, ticket=ticket, retrieved=started.stream.retrieved)
    return StreamingResponse(sse, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Request-Id": gen.request_id})


@dataclass
class Started:
    """A published request: its final event when not streamed, else its first event and the ones after it."""

    stream: ReplyStream
    final: Completion | None = None
    first: TokenChunk | Completion | None = None
    events: AsyncIterator | None = None


async def start_generation(request: Request, ticket: Ticket) -> Started | Response:
    """Publish an admitted request and wait for what its answer starts with (every generation API's first half).

    An error the worker reports up front is raised as the status its code calls for; a client gone meanwhile is
    a 499 response (the request cancelled)."""
    edge, gen, body = _edge(request), ticket.request, ticket.body
    try:
        stream = await submit(getattr(request.app.state, "rag", None), edge, gen, body.file_search())
    except BaseException as exc:
        ticket.finish(exc.status if isinstance(exc, errors.EdgeError) else 499, code="not_published")
        raise
    input_param = ticket.input_param
    try:
        if not body.streams:
            try:
                final = await _unless_disconnected(request, _final_event(stream, ticket))
            except ReplyTimeout:
                edge.abandon(stream, "deadline passed at the edge")
                raise errors.reply_timeout(gen.request_id) from None
            if isinstance(final, ErrorEvent):
                raise errors.from_worker_error(final, input_param=input_param)
            return Started(stream, final=final)

        events = stream.events()
        try:
            first = await _unless_disconnected(request, anext(events))
        except ReplyTimeout:
            edge.abandon(stream, "deadline passed at the edge")
            raise errors.reply_timeout(gen.request_id) from None
        if isinstance(first, ErrorEvent):
            raise errors.from_worker_error(first, input_param=input_param)
        return Started(stream, first=first, events=events)
    except ClientGone:
        edge.abandon(stream)
        ticket.finish(499, code="client_gone")
        return Response(status_code=499)
    except BaseException as exc:
        edge.abandon(stream) if not stream.finished else stream.close()
        ticket.finish(exc.status if isinstance(exc, errors.EdgeError) else 500,
                      code=exc.code if isinstance(exc, errors.EdgeError) else type(exc).__name__)
        raise


async def _choices(request: Request, edge: Edge, ticket: Ticket, *, chat: bool) -> Response:
    """n > 1 (not streamed): each choice's request published, all awaited together, answered as one response."""
    gens = choice_requests(ticket.request, ticket.body.choices)
    rag = getattr(request.app.state, "rag", None)
    streams: list[ReplyStream] = []
    try:
        for gen in gens:
            streams.append(await submit(rag, edge, gen, ticket.body.file_search()))
        events = await _unless_disconnected(request, asyncio.gather(*(_final_event(s, ticket) for s in streams)))
        finals: list[Completion] = []
        for event in events:
            if isinstance(event, ErrorEvent):
                raise errors.from_worker_error(event, input_param=ticket.input_param)
            finals.append(event)
    except ClientGone:
        for stream in streams:
            edge.abandon(stream)
        ticket.finish(499, code="client_gone")
        return Response(status_code=499)
    except ReplyTimeout:
        for stream in streams:
            edge.abandon(stream, "deadline passed at the edge")
        ticket.finish(504, code="deadline_exceeded")
        raise errors.reply_timeout(ticket.request.request_id) from None
    except BaseException as exc:
        for stream in streams:
            edge.abandon(stream) if not stream.finished else stream.close()
        ticket.finish(exc.status if isinstance(exc, errors.EdgeError) else 500,
                      code=exc.code if isinstance(exc, errors.EdgeError) else type(exc).__name__)
        raise
    ticket.finish(200, for_ticket(finals))
    bodies = [completion_body(g, f, chat=chat, retrieved=s.retrieved) for g, f, s in zip(gens, finals, streams)]
    extras = SpecstreamChoiceExtras(choices=[_extras(f, edge, s.retrieved) for f, s in zip(finals, streams)])
    answer_type = ChatCompletion if chat else TextCompletion
    answer = answer_type.model_validate({**merged_body(bodies, finals), "specstream": extras})
    return JSONResponse(answer.model_dump())


async def _final_event(stream: ReplyStream, ticket: Ticket) -> Completion | ErrorEvent:
    async for event in stream:
        if not isinstance(event, TokenChunk):
            return event
        ticket.saw(event)
    raise RuntimeError("reply stream ended without a final event")  # pragma: no cover


async def _until_disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _unless_disconnected(request: Request, awaitable: Awaitable[T]) -> T:
    """Await ``awaitable``; raise ClientGone (and cancel it) if the client disconnects first."""
    task = asyncio.ensure_future(awaitable)
    watcher = asyncio.ensure_future(_until_disconnected(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    raise ClientGone()


def _full_response(gen: GenerateRequest, final: Completion, *, chat: bool, edge: Edge,
                   retrieved: Retrieved | None = None) -> ChatCompletion | TextCompletion:
    answer = completion(gen, final, chat=chat, retrieved=retrieved)
    return answer.model_copy(update={"specstream": _extras(final, edge, retrieved)})


def _extras(final: Completion, edge: Edge, retrieved: Retrieved | None = None) -> SpecstreamExtras:
    return SpecstreamExtras(
        edge_id=edge.edge_id, spec=final.spec, timings=final.timings, num_chunks=final.num_chunks,
        # the server-side calls the answer made, answered (see docs/tools.md)
        tool_results=[result_view(r) for r in final.tool_results] or None,
        # which version of each store's index grounded the answer
        index_versions=retrieved.index_versions if retrieved is not None else None)


async def _sse(
    edge: Edge, gen: GenerateRequest, stream: ReplyStream, first: TokenChunk | Completion,
    events: AsyncIterator, *, chat: bool, include_usage: bool, input_param: str, ticket: Ticket,
    retrieved: Retrieved | None = None,
) -> AsyncIterator[str]:
    chunks = ChunkWriter(gen.request_id, gen.model, int(gen.created_at or time.time()), chat, include_usage)
    chunk = chunks.event

    # A tool-calling answer's text becomes content and tool_calls deltas as it arrives.
    parser = ToolCallParser(gen.request_id) if chat and calls_tools(gen) else None

    # What is ready goes out as one write: the role chunk with the first token's, and the last token's chunk, the
    # finish chunk, the usage chunk and [DONE] together. Each write is one trip through the ASGI stack and the socket
    # and one wakeup of the client, so the stream's last byte (the client's end-to-end latency) comes sooner.
    pending: list[str] = [chunk("", None, role=True)] if chat else []
    echo = StreamedEcho(gen.prompt or "") if gen.echo and not chat else None
    try:
        async for event in chained(first, events):
            echoed = echo.prompt_chunk(event) if echo is not None and not isinstance(event, ErrorEvent) else None
            if echoed is not None:
                pending.append(chunk(echoed[0], None, logprobs=echoed[1]))
            if isinstance(event, TokenChunk):
                ticket.saw(event)
                if event.tool_result is not None:
                    # A server-side call's result: an event of its own, with an empty delta, between the call's
                    # tool_calls deltas and the next round's.
                    tool_result = ToolResultExtras(tool_result=result_view(event.tool_result))
                    pending.append(chunk(None, None, extra=tool_result))
                if event.text or event.logprobs:
                    extra = built(TokenExtras, index=event.index, spec=event.spec)
                    if parser is None:
                        start = (event.text_offset or 0) + (echo.answer_start if echo is not None else 0)
                        logprobs = chat_logprobs(event.logprobs) if chat else completion_logprobs(event.logprobs, start)
                        pending.append(chunk(event.text, None, extra=extra, logprobs=logprobs))
                    else:
                        pending.extend(chunk(None, None, extra=extra, fields=f) for f in parser.feed(event.text))
                if event.finish_reason is None and pending:
                    # The last chunk waits for the Completion that follows it at once.
                    yield "".join(pending)
                    pending.clear()
            elif isinstance(event, Completion):
                ticket.finish(200, event)
                reason: str = event.finish_reason
                if parser is not None:
                    pending.extend(chunk(None, None, fields=f) for f in parser.finish())
                    reason = finish_reason(reason, parser.calls, answered_calls(event))
                cited = ({"annotations": citations(event.text, retrieved.passages)}
                         if chat and retrieved is not None else None)
                pending.append(chunk(None if chat else "", reason, extra=_extras(event, edge, retrieved),
                                     fields=cited))
                if include_usage:
                    pending.append(chunks.usage_event(event.usage))
            else:
                error = errors.from_worker_error(event, input_param=input_param)
                ticket.finish(error.status, event)
                pending.append(sse_data(error.body()))
        pending.append("data: [DONE]\n\n")
        yield "".join(pending)
    except ReplyTimeout:
        edge.abandon(stream, "deadline passed at the edge")
        ticket.finish(504, code="deadline_exceeded")
        pending.append(sse_data(errors.reply_timeout(gen.request_id).body()))
        pending.append("data: [DONE]\n\n")
        yield "".join(pending)
    finally:
        released(edge, stream, ticket)


async def chained(first: TokenChunk | Completion | None, events: AsyncIterator) -> AsyncIterator:
    """A streamed reply's events: the first one (already awaited, if any), then the rest."""
    if first is not None:
        yield first
    async for e in events:
        yield e


def released(edge: Edge, stream: ReplyStream, ticket: Ticket) -> None:
    """The end of a relay, however it ended: a stream unfinished here means the client went away (the relay was
    cancelled), so the worker stops it; a ticket not finished yet is the client's 499."""
    if stream.finished:
        stream.close()
    else:
        edge.abandon(stream)
    ticket.finish(499, code="client_gone")
