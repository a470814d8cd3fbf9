"""A scripted OpenAI-compatible streaming server, for testing the benchmark itself.

It is not specstream: it serves canned streams in the edge's SSE format (with
the ``specstream`` extension fields) so the client side of ``specstream bench``
(timing, stream checks, error kinds) can be tested quickly and without a model.
The ``model`` field of a request picks the behaviour:

``ok`` (default)    n chunks ``delay_s`` apart, final chunk, usage, ``[DONE]``
``http500``         HTTP 500 with an OpenAI error body
``repeat``          sends chunk index 1 twice
``no_done``         closes the stream after the chunks, without final chunk or ``[DONE]``
``mid_error``       one chunk, then ``data: {"error": ...}`` and ``[DONE]``
``hang``            sends headers and one chunk, then nothing
``bad_usage``       usage counts one token more than was streamed
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any


@dataclass
class FakeOptions:
    chunks: int = 4
    delay_s: float = 0.005
    tokens_per_chunk: int = 1


class FakeOpenAIServer:
    def __init__(self, options: FakeOptions | None = None) -> None:
        self.options = options or FakeOptions()
        self.requests: list[dict[str, Any]] = []
        self._server: asyncio.AbstractServer | None = None
        self.port = 0

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._server = await asyncio.start_server(self._handle, host, port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:  # keep-alive: several requests per connection
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                request = json.loads(body or b"{}")
                self.requests.append(request)
                keep = await self._respond(request, lines[0].split(" ")[1], writer)
                if not keep:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _respond(self, request: dict[str, Any], path: str, writer: asyncio.StreamWriter) -> bool:
        mode = request.get("model", "ok")
        chat = path.endswith("/chat/completions")
        if mode == "http500":
            body = json.dumps({"error": {"message": "boom", "type": "server_error", "param": None, "code": "internal_error"}}).encode()
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
                         b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
            return True
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")

        async def send(obj: Any) -> None:
            data = ("data: " + (obj if isinstance(obj, str) else json.dumps(obj)) + "\n\n").encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()

        def chunk(text: str | None, finish: str | None = None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if chat:
                choice["delta"] = {} if text is None else {"content": text}
            else:
                choice["text"] = text or ""
            out: dict[str, Any] = {"id": "x", "object": "chunk", "choices": [choice]}
            if extra is not None:
                out["specstream"] = extra
            return out

        opts = self.options
        n = opts.chunks if mode != "mid_error" else 1
        if chat:
            await send(chunk(""))
        indices = list(range(n))
        if mode == "repeat" and n > 1:
            indices.insert(2, 1)
        for i in indices:
            await asyncio.sleep(opts.delay_s)
            spec = {"drafted": 4 if opts.tokens_per_chunk > 1 else 0, "accepted": opts.tokens_per_chunk - 1}
            await send(chunk(f"w{i} ", extra={"index": i, "spec": spec}))
            if mode == "hang":
                await asyncio.sleep(3600)
        if mode == "no_done":
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return False
        if mode == "mid_error":
            await send({"error": {"message": "engine failed", "type": "server_error", "code": "internal_error"}})
            await send("[DONE]")
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            return True
        tokens = n * opts.tokens_per_chunk + (1 if mode == "bad_usage" else 0)
        await asyncio.sleep(opts.delay_s)
        await send(chunk(None if chat else "", "length", extra={"num_chunks": n, "spec": {}, "timings": {"ttft_s": 0.001}}))
        await send({"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": tokens, "total_tokens": tokens + 5}})
        await send("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


@contextlib.contextmanager
def fake_server_in_thread(options: FakeOptions | None = None) -> Iterator[FakeOpenAIServer]:
    """Run a fake server on a free port in a background thread (for synchronous callers such as the CLI)."""
    server = FakeOpenAIServer(options)
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.start())
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=run, daemon=True, name="fake-openai")
    thread.start()
    ready.wait(10)
    try:
        yield server
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
