"""The websocket API, ``/v1/ws``: many requests in flight on one socket, each tagged by the client's id.

Client -> edge, one JSON object per text frame:

* a request: the chat API's fields (``model``, ``messages`` or ``prompt``,
  ``max_tokens``, ``temperature``, ``seed``, ``stop``, ...) plus an optional
  ``id`` (string or number; the edge's request id is used when absent);
* ``{"type": "cancel", "id": ...}`` to cancel one in-flight request.

Edge -> client:

* ``{"type": "chunk", "id", "request_id", "index", "text", "token_ids", "spec"}``
  for every TokenChunk, in order;
* ``{"type": "done", "id", "request_id", "text", "finish_reason", "usage",
  "timings", "spec"}`` once, at the end;
* ``{"type": "error", "id", "code", "message", "param", "status"}`` for a request
  that failed (``id`` null when the frame could not be read). A malformed frame
  gets an error and the socket stays open.

When the socket closes, every request still in flight on it is cancelled
(a ``CancelRequest`` is published for it).
"""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fastapi import APIRouter, WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from schemas.events import Completion, ErrorEvent, TokenChunk
from streams.edge import errors
from streams.edge.core import Edge
from streams.edge.intake import WsRequestBody, build_request, validate_body
from streams.edge.replies import ReplyStream, ReplyTimeout

log = logging.getLogger(__name__)
router = APIRouter()

MAX_IN_FLIGHT_PER_SOCKET = 64


@router.websocket("/v1/ws")
async def websocket_endpoint(websocket: WebSocket) -> None:
    await websocket.accept()
    await WsSession(websocket.app.state.edge, websocket).run()


class WsSession:
    def __init__(self, edge: Edge, websocket: WebSocket) -> None:
        self.edge = edge
        self.websocket = websocket
        self._send_lock = asyncio.Lock()
        self._tasks: dict[Any, asyncio.Task] = {}
        self.closed = False

    async def run(self) -> None:
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                raw = message.get("text")
                if raw is None and message.get("bytes") is not None:
                    raw = message["bytes"]
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

    async def _on_frame(self, raw: str | bytes | None) -> None:
        try:
            data = json.loads(raw) if raw else None
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            await self._error(None, errors.invalid_json(str(exc)))
            return
        if not isinstance(data, dict):
            await self._error(None, errors.invalid_json("each frame must be a JSON object"))
            return
        client_id = data.get("id")
        if client_id is not None and not isinstance(client_id, (str, int)):
            await self._error(None, errors.EdgeError(400, "'id' must be a string or a number", param="id",
                                                     code="invalid_value"))
            return
        if data.get("type") == "cancel":
            await self._cancel(client_id)
            return
        try:
            body = validate_body(WsRequestBody, data)
            request = build_request(body, self.edge.settings, self.edge.reply_topic)
        except errors.EdgeError as exc:
            await self._error(client_id, exc)
            return
        tag = client_id if client_id is not None else request.request_id
        if tag in self._tasks:
            await self._error(tag, errors.EdgeError(400, f"request id {tag!r} is already in flight on this socket",
                                                    param="id", code="duplicate_id"))
            return
        if len(self._tasks) >= MAX_IN_FLIGHT_PER_SOCKET:
            await self._error(tag, errors.EdgeError(
                429, f"at most {MAX_IN_FLIGHT_PER_SOCKET} requests may be in flight on one socket",
                type="rate_limit_error", code="too_many_requests"))
            return
        task = asyncio.create_task(self._serve(tag, request), name=f"ws-{request.request_id}")
        self._tasks[tag] = task
        task.add_done_callback(lambda _t, tag=tag: self._tasks.pop(tag, None))

    async def _cancel(self, tag: Any) -> None:
        task = self._tasks.get(tag)
        if task is None:
            await self._error(tag, errors.EdgeError(400, f"no request with id {tag!r} is in flight", param="id",
                                                    code="unknown_id"))
            return
        task.cancel()
        await self._error(tag, errors.EdgeError(499, "cancelled by the client", code="cancelled"))

    async def _serve(self, tag: Any, request) -> None:
        stream: ReplyStream | None = None
        try:
            stream = await self.edge.submit(request)
            async for event in stream:
                if isinstance(event, TokenChunk):
                    await self._send({
                        "type": "chunk", "id": tag, "request_id": request.request_id, "index": event.index,
                        "text": event.text, "token_ids": event.token_ids, "spec": event.spec.model_dump(),
                    })
                elif isinstance(event, Completion):
                    await self._send({
                        "type": "done", "id": tag, "request_id": request.request_id, "text": event.text,
                        "finish_reason": event.finish_reason, "usage": event.usage.model_dump(),
                        "timings": event.timings.model_dump(), "spec": event.spec.model_dump(),
                        "num_chunks": event.num_chunks, "model": request.model,
                    })
                elif isinstance(event, ErrorEvent):
                    input_param = "messages" if request.messages is not None else "prompt"
                    await self._error(tag, errors.from_worker_error(event, input_param=input_param))
        except ReplyTimeout:
            if stream is not None:
                self.edge.abandon(stream, "deadline passed at the edge")
            await self._error(tag, errors.reply_timeout(request.request_id))
        except errors.EdgeError as exc:
            await self._error(tag, exc)
        except (WebSocketDisconnect, OSError, RuntimeError) as exc:
            log.debug("ws %s: send failed, client gone: %r", request.request_id, exc)
        finally:
            if stream is not None:
                reason = "socket closed" if self.closed else "cancelled by the client"
                self.edge.abandon(stream, reason)

    async def _send(self, message: dict[str, Any]) -> None:
        if self.websocket.application_state != WebSocketState.CONNECTED:
            raise RuntimeError("websocket is closed")
        async with self._send_lock:
            await self.websocket.send_text(json.dumps(message, separators=(",", ":")))

    async def _error(self, tag: Any, exc: errors.EdgeError) -> None:
        try:
            await self._send({"type": "error", "id": tag, "code": exc.code or exc.type, "message": exc.message,
                              "param": exc.param, "status": exc.status})
        except (WebSocketDisconnect, OSError, RuntimeError):
            pass
