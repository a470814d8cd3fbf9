"""The edge's websocket, /v1/ws: many requests multiplexed by ``id`` over a few connections.

The client sends a request frame with an ``id`` and receives, for that id,
``{"type": "chunk", "id", "index", "text", "token_ids", "spec"}`` frames and a
final ``{"type": "done", ...}`` or ``{"type": "error", ...}``. Requests go to
the least busy of ``--ws-connections`` connections; a reader task per
connection routes frames to their request. A dropped connection fails the
requests it carried (``disconnect``) and is reopened for the next ones.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from streams.bench.backends.base import Backend, BackendOptions, error_code_of, error_message_of
from streams.bench.record import RequestRecord, StreamChecker

_CLOSED = object()


def ws_url(base_url: str) -> str:
    url = base_url.rstrip("/")
    if url.startswith("https://"):
        url = "wss://" + url[len("https://"):]
    elif url.startswith("http://"):
        url = "ws://" + url[len("http://"):]
    elif not url.startswith(("ws://", "wss://")):
        url = "ws://" + url
    return url if url.endswith("/v1/ws") else url + "/v1/ws"


class _Connection:
    def __init__(self, url: str, headers: dict[str, str]) -> None:
        self.url = url
        self.headers = headers
        self.ws: Any = None
        self.reader: asyncio.Task[None] | None = None
        self.routes: dict[str, asyncio.Queue[Any]] = {}
        self._lock = asyncio.Lock()

    async def ensure(self) -> None:
        async with self._lock:
            if self.ws is not None:
                return
            from websockets.asyncio.client import connect

            self.ws = await connect(self.url, additional_headers=self.headers or None, max_size=None,
                                    open_timeout=10, ping_interval=None)
            self.reader = asyncio.create_task(self._read(self.ws))

    async def _read(self, ws: Any) -> None:
        error: str = "connection closed"
        try:
            async for raw in ws:
                now = time.perf_counter()
                try:
                    msg = json.loads(raw)
                except ValueError:
                    msg = {"type": "_bad_json", "raw": str(raw)[:200]}
                rid = msg.get("id") if isinstance(msg, dict) else None
                queue = self.routes.get(str(rid)) if rid is not None else None
                if queue is not None:
                    queue.put_nowait((now, msg))
                elif isinstance(msg, dict) and msg.get("type") == "error" and rid is None:
                    # An error the edge could not tie to an id (e.g. unparsable frame): tell everyone waiting.
                    for q in self.routes.values():
                        q.put_nowait((now, msg))
        except Exception as exc:  # noqa: BLE001 - any failure of the socket ends its requests
            error = f"{type(exc).__name__}: {exc}"
        finally:
            if self.ws is ws:
                self.ws = None
            now = time.perf_counter()
            for q in self.routes.values():
                q.put_nowait((now, (_CLOSED, error)))

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.reader is not None:
            await asyncio.gather(self.reader, return_exceptions=True)


class WebSocketBackend(Backend):
    name = "ws"

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options)
        self.url = ws_url(options.base_url)
        headers = {"Authorization": f"Bearer {options.api_key}"} if options.api_key else {}
        self._connections = [_Connection(self.url, headers) for _ in range(max(1, options.ws_connections))]
        self._next = 0

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "url": self.url, "connections": len(self._connections)}

    async def start(self) -> None:
        # Connect eagerly so handshakes are not measured; an unreachable edge shows up per request.
        await asyncio.gather(*(c.ensure() for c in self._connections), return_exceptions=True)

    async def close(self) -> None:
        await asyncio.gather(*(c.close() for c in self._connections), return_exceptions=True)

    def _frame(self, record: RequestRecord) -> dict[str, Any]:
        req = record.request
        frame: dict[str, Any] = {
            "id": record.request_id, "model": self.options.model, "max_tokens": req.max_tokens,
            "temperature": req.sampling.temperature, "top_p": req.sampling.top_p, "seed": req.seed,
        }
        if req.sampling.top_k:
            frame["top_k"] = req.sampling.top_k
        if req.sampling.speculation is not None:
            frame["speculation"] = req.sampling.speculation
        if req.messages is not None:
            frame["messages"] = req.messages_list()
        else:
            frame["prompt"] = req.prompt
        return frame

    async def run(self, record: RequestRecord, checker: StreamChecker) -> None:
        # The least busy connection (round-robin among equals): the edge caps requests in flight per socket.
        self._next += 1
        n = len(self._connections)
        conn = min((self._connections[(self._next + i) % n] for i in range(n)), key=lambda c: len(c.routes))
        queue: asyncio.Queue[Any] = asyncio.Queue()
        conn.routes[record.request_id] = queue
        try:
            record.start = time.perf_counter()
            try:
                await conn.ensure()
                await conn.ws.send(json.dumps(self._frame(record)))
            except (OSError, asyncio.TimeoutError) as error:
                checker.error(time.perf_counter(), "connect", f"{type(error).__name__}: {error}")
                return
            except Exception as error:  # noqa: BLE001 - websockets' InvalidStatus, ConnectionClosed, ...
                status = getattr(getattr(error, "response", None), "status_code", None)
                kind = f"http_{status}" if status else "connect" if conn.ws is None else "disconnect"
                checker.error(time.perf_counter(), kind, f"{type(error).__name__}: {error}")
                return
            await self._consume(queue, checker)
        finally:
            conn.routes.pop(record.request_id, None)

    async def _consume(self, queue: asyncio.Queue[Any], checker: StreamChecker) -> None:
        while True:
            now, msg = await queue.get()
            if isinstance(msg, tuple) and msg and msg[0] is _CLOSED:
                checker.error(now, "disconnect", f"websocket closed before the final message: {msg[1]}")
                return
            kind = msg.get("type") if isinstance(msg, dict) else None
            if kind == "chunk":
                spec = msg.get("spec") or {}
                token_ids = msg.get("token_ids")
                if "index" not in msg or not isinstance(token_ids, list):
                    checker.record.fail("protocol:bad_chunk", f"chunk without index or token_ids: {str(msg)[:200]}")
                checker.chunk(
                    now, text=msg.get("text") or "", token_ids=token_ids if isinstance(token_ids, list) else None,
                    index=msg.get("index"), drafted=int(spec.get("drafted", 0) or 0), accepted=int(spec.get("accepted", 0) or 0),
                )
            elif kind == "done":
                usage = msg.get("usage") or {}
                checker.final(
                    now, finish_reason=msg.get("finish_reason"), num_chunks=msg.get("num_chunks"), text=msg.get("text"),
                    prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
                    server={k: msg[k] for k in ("timings", "spec") if isinstance(msg.get(k), dict)},
                )
                if not usage:
                    checker.record.fail("protocol:missing_usage", "done message without usage")
                return
            elif kind == "error":
                code = error_code_of(msg)
                err = msg.get("error")
                status = msg.get("status") or (err.get("status") if isinstance(err, dict) else None)
                checker.error(now, f"error:{code}" if code else (f"http_{status}" if status else "error:unknown"), error_message_of(msg))
                return
            else:
                checker.error(now, "protocol:bad_message", f"unexpected websocket message: {str(msg)[:200]}")
                return
