"""The websocket API, ``/v1/ws``: many requests in flight on one socket, each tagged by the client's id.

Client -> edge, one JSON object per text frame:

* a request: the chat API's fields (``model``, ``messages`` or ``prompt``,
  ``max_tokens``, ``temperature``, ``seed``, ``stop``, ...) plus an optional
  ``id`` (string or number; the edge's request id is used when absent);
* ``{"type": "response.create", "id": ..., ...}``: a Responses API request (the fields of ``POST /v1/responses``
  beside ``type`` and ``id``), answered with the Responses API's stream events (``response.created`` ...
  ``response.completed``), each a frame with the request's ``id`` added; stored as on HTTP;
* ``{"type": "cancel", "id": ...}`` to cancel one in-flight request.

Edge -> client:

* ``{"type": "chunk", "id", "request_id", "index", "text", "token_ids", "spec"}``
  for every TokenChunk, in order;
* ``{"type": "done", "id", "request_id", "text", "finish_reason", "usage",
  "timings", "spec"}`` once, at the end;
* with ``logprobs: true`` (and ``top_logprobs``): chunk frames carry their tokens' ``logprobs`` and the done frame
  the answer's, in the chat API's shape (``{"content": [...]}``);
* with ``tools``: chunk frames also carry ``deltas``, the chat API's delta fields
  (``content`` or ``tool_calls`` fragments, as OpenAI streams them), and the done
  frame the last ``deltas``, ``content`` and ``tool_calls`` (OpenAI's message form), with
  ``finish_reason: "tool_calls"`` when the answer ended after calls the client must answer;
* a server-side tool call's result (docs/tools.md) is a chunk frame with empty ``text``
  and a ``tool_result`` (tool_call_id, name, output, error, truncated, duration_s); the done
  frame lists them all in ``tool_results``;
* with a ``file_search`` tool (``{"type": "file_search", "vector_store_ids": [...]}``): the done frame also carries
  ``annotations`` (file_citation, as on HTTP) and ``index_versions``;
* ``{"type": "error", "id", "code", "message", "param", "status"}`` for a request
  that failed (``id`` null when the frame could not be read, or a request
  without an ``id`` was refused before admission). A malformed frame
  gets an error and the socket stays open.

When the socket closes, every request still in flight on it is cancelled
(a ``CancelRequest`` is published for it).

Authentication (:mod:`streams.edge.auth`): an ``Authorization`` header, the
subprotocols ``specstream.v1`` + ``specstream.key.<key>``, or a first frame
``{"type": "auth", "api_key": ...}`` (answered ``{"type": "auth", "ok": true,
"tenant": ...}``). Without a valid key the socket is closed with 1008; a frame
larger than ``edge.max_ws_frame_bytes`` closes it with 1009. Each request
passes the same admission pipeline as on HTTP
(:mod:`streams.edge.admission.pipeline`; a refusal is an error frame, over a
limit it carries ``retry_after``), and chunk
frames carry ``draft_chars``: how many leading characters of ``text`` came
from accepted draft tokens.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from schemas.events import Completion, ErrorEvent, TokenChunk
from streams.edge.admission.admit import Ticket
from streams.edge.admission.pipeline import Pipeline
from streams.edge.admission.read import FrameTooLarge, read_frame
from streams.edge.auth import (
    WS_CLOSE_POLICY,
    WS_CLOSE_TOO_BIG,
    WS_PROTOCOL,
    key_from_headers,
    key_from_subprotocols,
)
from streams.edge.core import Edge
from streams.edge.keys import Principal
from streams.edge.rag_client import submit
from streams.edge.replies import ReplyStream, ReplyTimeout
from streams.edge.responses.api import continuation, relay
from streams.edge.responses.body import ResponsesBody
from streams.rag.grounding import citations
from streams.telemetry.edge import EdgeTelemetry
from streams.wire import errors
from streams.wire.bodies import WsRequestBody
from streams.wire.logprobs import chat_logprobs
from streams.wire.parse import decode_json
from streams.wire.tool_calls import (
    ToolCallParser,
    calls_tools,
    finish_reason,
    result_view,
)

log = logging.getLogger(__name__)
router = APIRouter()

MAX_IN_FLIGHT_PER_SOCKET = 64
RESPONSE_CREATE = "response.create"  # a Responses API request (streams/edge/responses), answered with its events
AUTH_FRAME_TIMEOUT_S = 30.0


@router.websocket("/v1/ws")
async def websocket_endpoint(websocket: WebSocket) -> None:
    pipeline: Pipeline = websocket.app.state.pipeline
    offered = list(websocket.scope.get("subprotocols") or [])
    # Only specstream.v1 is ever chosen: the key subprotocol is never echoed back.
    await websocket.accept(subprotocol=WS_PROTOCOL if WS_PROTOCOL in offered else None)
    session = WsSession(websocket.app.state.edge, websocket, pipeline)
    key = key_from_headers(websocket.headers) or key_from_subprotocols(offered)
    if key is not None or not pipeline.auth.enabled:
        try:
            session.principal = pipeline.authenticate(key, api=WsRequestBody.api)
        except errors.EdgeError as exc:
            await session.close(WS_CLOSE_POLICY, exc.code or "unauthorized")
            return
    await session.run()


class WsSession:
    def __init__(self, edge: Edge, websocket: WebSocket, pipeline: Pipeline) -> None:
        self.edge = edge
        self.websocket = websocket
        self.pipeline = pipeline
        self.principal: Principal | None = None
        self._send_lock = asyncio.Lock()
        self._tasks: dict[Any, asyncio.Task] = {}
        self.closed = False
        # Each request on the socket is counted like an HTTP request (route /v1/ws); None: metrics off.
        self.telemetry: EdgeTelemetry | None = getattr(websocket.app.state, "telemetry", None)

    def _count(self, status: int, started: float, first_byte: float | None = None,
               refusal: errors.EdgeError | None = None) -> None:
        if self.telemetry is not None:
            limited = (refusal.headers or {}).get("X-RateLimit-Limited") if refusal is not None else None
            self.telemetry.websocket_request(status, started, first_byte, limited)

    async def close(self, code: int, reason: str) -> None:
        with contextlib.suppress(Exception):
            await self.websocket.close(code=code, reason=reason[:120])
        self.closed = True

    async def _receive(self) -> dict[str, Any]:
        if self.principal is None:
            # Not authenticated yet: the first frame must be {"type": "auth", ...}, and soon.
            try:
                return await asyncio.wait_for(self.websocket.receive(), timeout=AUTH_FRAME_TIMEOUT_S)
            except TimeoutError:
                return {"type": "timeout"}
        return await self.websocket.receive()

    async def run(self) -> None:
        try:
            while not self.closed:
                message = await self._receive()
                if message["type"] == "websocket.disconnect":
                    break
                if message["type"] == "timeout":
                    await self.close(WS_CLOSE_POLICY, "missing_api_key: no auth frame")
                    break
                try:
                    raw = read_frame(message, self.pipeline.options.edge.max_ws_frame_bytes)
                except FrameTooLarge as exc:
                    await self.close(WS_CLOSE_TOO_BIG, str(exc))
                    break
                await self._on_frame(raw)
        except WebSocketDisconnect:
            pass
        finally:
            self.closed = True
            tasks = list(self._tasks.values())
            for task in tasks:
                task.cancel()  # each task's finally publishes the CancelRequest
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _authenticate(self, data: dict[str, Any]) -> None:
        key = data.get("api_key")
        try:
            self.principal = self.pipeline.authenticate(key if isinstance(key, str) else None, api=WsRequestBody.api)
        except errors.EdgeError as exc:
            await self.close(WS_CLOSE_POLICY, exc.code or "unauthorized")
            return
        await self._send({"type": "auth", "ok": True, "tenant": self.principal.tenant})

    async def _on_frame(self, raw: str | bytes) -> None:
        try:
            data = decode_json(raw, what="frame")
        except errors.EdgeError as exc:
            if self.principal is None:
                await self.close(WS_CLOSE_POLICY, "missing_api_key")
                return
            exc = errors.invalid_json("each frame must be a JSON object") if exc.code == "invalid_json" and \
                "expected an object" in exc.message else exc
            await self._error(None, exc)
            return
        if data.get("type") == "auth":
            await self._authenticate(data)
            return
        if self.principal is None:
            await self.close(WS_CLOSE_POLICY, "missing_api_key: send an auth frame first")
            return
        client_id = data.get("id")
        if client_id is not None and not isinstance(client_id, (str, int)):
            await self._error(None, errors.EdgeError(400, "'id' must be a string or a number", param="id",
                                                     code="invalid_value"))
            return
        if data.get("type") == "cancel":
            await self._cancel(client_id)
            return
        started = time.monotonic()
        refusal = self._over_socket_limits(client_id)
        if refusal is not None:
            self._count(refusal.status, started, refusal=refusal)
            await self._error(client_id, refusal)
            return
        respond = data.get("type") == RESPONSE_CREATE
        try:
            if respond:
                fields = {k: v for k, v in data.items() if k not in ("type", "id")}
                ticket = await self.pipeline.admit(self.principal, ResponsesBody, fields, prepare=continuation(
                    self.edge.responses, self.principal.tenant))
            else:
                ticket = await self.pipeline.admit(self.principal, WsRequestBody, data)
        except errors.EdgeError as exc:
            self._count(exc.status, started, refusal=exc)
            await self._error(client_id, exc)
            return
        tag = client_id if client_id is not None else ticket.request.request_id
        serve = self._serve_response if respond else self._serve
        task = asyncio.create_task(serve(tag, ticket, started), name=f"ws-{ticket.request.request_id}")
        self._tasks[tag] = task
        task.add_done_callback(lambda _t, tag=tag: self._tasks.pop(tag, None))

    def _over_socket_limits(self, client_id: str | int | None) -> errors.EdgeError | None:
        """Checked before admission, so that a request the socket refuses is not charged to the tenant."""
        if client_id is not None and client_id in self._tasks:
            return errors.EdgeError(400, f"request id {client_id!r} is already in flight on this socket", param="id",
                                    code="duplicate_id")
        if len(self._tasks) >= MAX_IN_FLIGHT_PER_SOCKET:
            return errors.EdgeError(
                429, f"at most {MAX_IN_FLIGHT_PER_SOCKET} requests may be in flight on one socket",
                type="rate_limit_error", code="too_many_requests", headers={"Retry-After": "1"})
        return None

    async def _cancel(self, tag: Any) -> None:
        task = self._tasks.get(tag)
        if task is None:
            await self._error(tag, errors.EdgeError(400, f"no request with id {tag!r} is in flight", param="id",
                                                    code="unknown_id"))
            return
        task.cancel()
        await self._error(tag, errors.EdgeError(499, "cancelled by the client", code="cancelled"))

    async def _serve(self, tag: Any, ticket: Ticket, started: float) -> None:
        request = ticket.request
        first_chunk: float | None = None
        stream: ReplyStream | None = None
        status, final, code = 499, None, "client_gone"
        parser = ToolCallParser(request.request_id) if calls_tools(request) else None
        try:
            stream = await submit(getattr(self.websocket.app.state, "rag", None), self.edge, request,
                                  ticket.body.file_search())
            async for event in stream:
                if isinstance(event, TokenChunk):
                    ticket.saw(event)
                    draft_chars = event.draft_chars
                    if draft_chars is None:
                        draft_chars = self.pipeline.tokenizers.draft_chars(
                            request.model, event.text, event.token_ids, event.spec.accepted)
                    frame = {
                        "type": "chunk", "id": tag, "request_id": request.request_id, "index": event.index,
                        "text": event.text, "token_ids": event.token_ids, "spec": event.spec.model_dump(),
                        "draft_chars": draft_chars,
                    }
                    if event.logprobs is not None:
                        frame["logprobs"] = chat_logprobs(event.logprobs)
                    if parser is not None:
                        frame["deltas"] = parser.feed(event.text)
                    if event.tool_result is not None:
                        frame["tool_result"] = result_view(event.tool_result).model_dump()
                    await self._send(frame)
                    first_chunk = first_chunk or time.monotonic()
                elif isinstance(event, Completion):
                    status, final, code = 200, event, None
                    done: dict[str, Any] = {
                        "type": "done", "id": tag, "request_id": request.request_id, "text": event.text,
                        "finish_reason": event.finish_reason, "usage": event.usage.model_dump(),
                        "timings": event.timings.model_dump(), "spec": event.spec.model_dump(),
                        "num_chunks": event.num_chunks, "model": request.model,
                    }
                    if event.logprobs is not None:
                        done["logprobs"] = chat_logprobs(event.logprobs)
                    if stream.retrieved is not None:  # a file_search request: what grounded it
                        done.update(annotations=citations(event.text, stream.retrieved.passages),
                                    index_versions=stream.retrieved.index_versions)
                    if parser is not None:
                        done.update(deltas=parser.finish(), content=parser.message_content(), tool_calls=parser.calls,
                                    finish_reason=finish_reason(event.finish_reason, parser.calls,
                                                                {r.call_id for r in event.tool_results}),
                                    tool_results=[result_view(r).model_dump() for r in event.tool_results])
                    await self._send(done)
                elif isinstance(event, ErrorEvent):
                    error = errors.from_worker_error(event, input_param=ticket.input_param)
                    status, final, code = error.status, event, None
                    await self._error(tag, error)
        except ReplyTimeout:
            status, code = 504, "deadline_exceeded"
            if stream is not None:
                self.edge.abandon(stream, "deadline passed at the edge")
            await self._error(tag, errors.reply_timeout(request.request_id))
        except errors.EdgeError as exc:
            status, code = exc.status, exc.code
            await self._error(tag, exc)
        except (WebSocketDisconnect, OSError, RuntimeError) as exc:
            log.debug("ws %s: send failed, client gone: %r", request.request_id, exc)
        finally:
            if stream is not None:
                reason = "socket closed" if self.closed else "cancelled by the client"
                self.edge.abandon(stream, reason)
            ticket.finish(status, final, code=code)
            self._count(status, started, first_chunk)

    async def _serve_response(self, tag: Any, ticket: Ticket, started: float) -> None:
        """A ``response.create`` frame: the Responses API's stream events, each a frame tagged with ``id``."""
        status, first_event = 499, None
        try:
            stream = await submit(getattr(self.websocket.app.state, "rag", None), self.edge, ticket.request,
                                  ticket.body.file_search())
            # Closed explicitly: a cancel or a closed socket ends the relay (and the request) at once.
            async with contextlib.aclosing(relay(self.edge, self.edge.responses, ticket, stream, None,
                                                 stream)) as batches:
                async for batch in batches:
                    for event in batch:
                        await self._send({**event, "id": tag})
                    first_event = first_event or time.monotonic()
            status = 200
        except errors.EdgeError as exc:
            status = exc.status
            ticket.finish(exc.status, code=exc.code)
            await self._error(tag, exc)
        except (WebSocketDisconnect, OSError, RuntimeError) as exc:
            log.debug("ws %s: send failed, client gone: %r", ticket.request.request_id, exc)
        finally:
            self._count(status, started, first_event)

    async def _send(self, message: dict[str, Any]) -> None:
        if self.websocket.application_state != WebSocketState.CONNECTED:
            raise RuntimeError("websocket is closed")
        async with self._send_lock:
            await self.websocket.send_text(json.dumps(message, separators=(",", ":")))

    async def _error(self, tag: Any, exc: errors.EdgeError) -> None:
        message: dict[str, Any] = {"type": "error", "id": tag, "code": exc.code or exc.type, "message": exc.message,
                                   "param": exc.param, "status": exc.status}
        if exc.headers and "Retry-After" in exc.headers:
            message["retry_after"] = int(exc.headers["Retry-After"])
        try:
            await self._send(message)
        except (WebSocketDisconnect, OSError, RuntimeError):
            pass
