"""The edge: a thin ASGI service between clients and the Kafka bus.

It does no model work. For every client request it publishes a
``GenerateRequest`` to the request topic and relays the ``TokenChunk`` /
``Completion`` / ``ErrorEvent`` events that workers send to its own reply
topic (see :mod:`streams.edge.replies` for the routing design).

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``,
``GET /v1/models`` (:mod:`streams.edge.openai_api`), websocket ``/v1/ws``
(:mod:`streams.edge.ws`), ``/v1/files`` (:mod:`streams.edge.files_api`), ``GET /healthz`` (the process is alive) and
``GET /readyz`` (200 when Kafka is reachable and a worker announced ready
recently, else 503 with the reason; :mod:`streams.edge.readiness`), ``GET /``
(the browser chat page, ``streams/edge/static``) and ``GET /openapi.json``
(:mod:`streams.edge.openapi`; ``/docs`` renders it).

Security and validation: :mod:`streams.edge.auth` (API keys, per tenant)
and the admission pipeline every generation request passes
(:mod:`streams.edge.admission.pipeline`: sizes, encoding, parameters, model,
context length, the tenant's limits from :mod:`streams.edge.limits`), which
writes the access log (:mod:`streams.edge.access`; never keys or prompts).
"""
from __future__ import annotations

import asyncio
import logging
import math
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

from aiokafka.errors import KafkaError
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from streams.config import Settings
from streams.edge import files_api, lora_api, openai_api, openapi, vector_stores, ws
from streams.edge.admission.pipeline import Pipeline
from streams.edge.batches import api as batch_api
from streams.edge.core import Edge, prepare_edge
from streams.edge.rag_client import RagEdge
from streams.edge.readiness import Health, Readiness
from streams.edge.responses import api as responses_api
from streams.edge.settings import EdgeOptions
from streams.kafka.connection import KafkaAccessError
from streams.service.gc_pauses import freeze_startup_heap
from streams.telemetry.edge import EdgeTelemetry
from streams.wire import errors

STATIC_DIR = Path(__file__).resolve().parent / "static"

log = logging.getLogger(__name__)


def create_app(settings: Settings | EdgeOptions | None = None, *, telemetry: EdgeTelemetry | None = None) -> FastAPI:
    """The edge's ASGI app. ``settings``: the project's, an EdgeOptions, or None (load_settings()).

    ``telemetry``: traces and metrics; by default from the settings' ``telemetry`` section and the OTEL_* variables.
    """
    edge_settings = EdgeOptions.from_settings(settings)
    if telemetry is None:
        telemetry = EdgeTelemetry.from_settings(edge_settings.settings.telemetry)

    # Built here, not in the lifespan: a bad keys file or Redis URL fails the start, not the first request.
    pipeline = Pipeline(edge_settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        edge = Edge(edge_settings, tracer=telemetry.tracer)
        app.state.edge = edge
        pipeline.served_adapters = edge.readiness.adapters
        if telemetry.metrics is not None:
            telemetry.metrics.watch_ready_workers(lambda: len(edge.readiness.live_workers()))
        await pipeline.start()
        try:
            await edge.start()
            app.state.rag = await start_rag(edge)
            freeze_startup_heap("edge")
            try:
                yield
            finally:
                if app.state.rag is not None:
                    await app.state.rag.stop()
                await edge.stop()
        finally:
            await pipeline.stop()
            telemetry.shutdown()

    app = FastAPI(title="specstream edge", version="0.1.0", lifespan=lifespan)
    app.state.settings = edge_settings
    app.state.pipeline = pipeline
    app.state.telemetry = telemetry
    telemetry.install(app)
    openapi.install(app, edge_settings.models, edge_settings.max_model_len)

    @app.exception_handler(errors.EdgeError)
    async def _edge_error(request: Request, exc: errors.EdgeError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = errors.EdgeError(exc.status_code, str(exc.detail), code=None).body()
        return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.get("/healthz", response_model=Health)
    async def healthz() -> dict[str, Any]:
        """The process is alive."""
        return {"status": "ok", "edge_id": edge_settings.edge_id}

    @app.get("/readyz", response_model=Readiness, responses={
        503: {"model": Readiness, "description": "Not ready: `reason` says why."}})
    async def readyz(request: Request) -> JSONResponse:
        """200 when Kafka is reachable and a worker announced itself recently; else 503 with the reason."""
        state = await request.app.state.edge.ready_state()
        body = {**state.body(), "edge_id": edge_settings.edge_id}
        return JSONResponse(body, status_code=200 if state.ready else 503)

    @app.get("/", include_in_schema=False)
    async def page() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.include_router(openai_api.router)
    app.include_router(responses_api.router)
    app.include_router(files_api.router)
    app.include_router(batch_api.router)
    app.include_router(lora_api.router)
    app.include_router(vector_stores.router)
    app.include_router(ws.router)
    return app


async def start_rag(edge: Edge) -> RagEdge | None:
    """The vector store API's tables; without Kafka at start, those routes answer 503 (the rest serves)."""
    rag = RagEdge(edge, search_timeout_s=edge.settings.settings.rag.search_timeout_s)
    try:
        await rag.start()
    except (KafkaError, OSError, TimeoutError) as error:
        log.warning("edge %s: vector stores unavailable (%s)", edge.edge_id, error)
        return None
    return rag


def _check_access(options: EdgeOptions) -> None:
    """Before serving: Kafka refusing this edge (credentials, certificate, ACLs) raises KafkaAccessError, in one line.

    Kafka being unreachable does not stop the start: the edge then serves 503 and keeps connecting.
    """
    try:
        asyncio.run(prepare_edge(options))
    except KafkaAccessError:
        raise
    except KafkaError as error:
        log.warning("edge %s: Kafka not ready at start (%s); connecting in the background", options.edge_id, error)


def run_edge(settings: Settings | EdgeOptions | None = None) -> None:
    """Serve the edge with uvicorn on settings.edge host:port (default 127.0.0.1:8000) until interrupted."""
    import uvicorn

    options = EdgeOptions.from_settings(settings)
    _check_access(options)
    host, port = options.edge.host, options.edge.port
    log.info("edge %s on http://%s:%d", options.edge_id, host, port)
    # With logging configured (the CLI: text or JSON), uvicorn's records go through it instead of its own format.
    log_config = None if logging.getLogger().handlers else uvicorn.config.LOGGING_CONFIG
    uvicorn.run(create_app(options), host=host, port=port, log_level="info", log_config=log_config,
                ws_max_size=options.edge.max_ws_frame_bytes,
                timeout_graceful_shutdown=int(math.ceil(options.edge.shutdown_grace_s)))
