"""Running the edge inside another program: uvicorn in a background thread, on a free port.

For tests, benchmarks and notebooks::

    with serve_in_thread(EdgeOptions(Settings(kafka=..., edge=EdgeSettings(edge_id="a")))) as edge:
        httpx.get(edge.base_url + "/healthz")

The server owns its own event loop in its thread; ``edge.edge`` (the
:class:`~streams.edge.core.Edge`) may be inspected from the caller's thread for
diagnostics (e.g. ``edge.edge.router.seen``).
"""
from __future__ import annotations

import math
import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import uvicorn
from fastapi import FastAPI

from streams.edge.app import create_app
from streams.edge.core import Edge
from streams.edge.settings import EdgeOptions


@dataclass
class RunningEdge:
    options: EdgeOptions
    app: FastAPI
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def port(self) -> int:
        return self.options.edge.port

    @property
    def base_url(self) -> str:
        return f"http://{self.options.edge.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.options.edge.host}:{self.port}/v1/ws"

    @property
    def edge(self) -> Edge:
        return self.app.state.edge


@contextmanager
def serve_in_thread(options: EdgeOptions, *, port: int | None = None, start_timeout_s: float = 60.0,
                    log_level: str = "warning") -> Iterator[RunningEdge]:
    """Serve the edge on ``port`` (default: a free one) until the block exits."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((options.edge.host, port or 0))
    options = options.with_edge(port=sock.getsockname()[1])
    app = create_app(options)
    config = uvicorn.Config(app, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=int(math.ceil(options.edge.shutdown_grace_s)),
                            ws_max_size=options.edge.max_ws_frame_bytes)
    server = uvicorn.Server(config)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"edge-{options.edge_id}", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if failure or not thread.is_alive():
            sock.close()
            raise RuntimeError(f"edge {options.edge_id} failed to start: {failure[0] if failure else 'exited'}")
        if time.monotonic() > deadline:
            server.should_exit = True
            raise TimeoutError(f"edge {options.edge_id} did not start within {start_timeout_s:.0f} s")
        time.sleep(0.02)
    try:
        yield RunningEdge(options, app, server, thread)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
