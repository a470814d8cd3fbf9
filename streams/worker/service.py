"""The engine worker: a consumer on the foundation (:mod:`streams.service`) that serves GenerateRequests.

Flow of one request::

    request topic ──► foundation (intake, slot) ──► _on_request ──► EngineDriver.add ──► engine thread
                                                                                          │ step()
    reply topic  ◄── foundation lanes ◄── TokenChunk / Completion (replies.Generation) ◄───┘

* The foundation reads the request topic as one consumer group (a second
  ``specstream worker`` joins it), validates each message, dead-letters what is
  malformed, bounds how many requests are held (``worker.max_inflight``), and
  commits a request's offset once its Completion or ErrorEvent is acknowledged.
* The handler only hands the request to the engine thread and defers the
  answer: the next message is read at once, so requests arriving together join
  the running batch at the next step (continuous batching).
* Every worker reads the whole cancellations topic (a listener, no group) and
  aborts the requests it holds.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable
from typing import Any, get_args

from faststream import FastStream

from engine.outputs import RequestOutput
from engine.request import RequestRejected
from schemas.adapters import AdapterCommand
from schemas.events import (
    ENGINE_WORKER_KIND,
    BusErrorCode,
    CancelRequest,
    Completion,
    CompletionRecord,
    ErrorEvent,
    GenerateRequest,
    TokenChunk,
)
from schemas.tools import ToolIntent, ToolResult
from streams.config import Settings
from streams.worker.completions_log import config_fingerprint
from streams.kafka.acls import worker_grants
from streams.service import Consumer, Delivery, Listener, Output, Rejection, ServiceOptions
from streams.service.app import create_app as create_service_app
from streams.service.app import serve
from streams.service.runner import ConsumerService
from streams.telemetry.logs import bind_request, request_scope, trace_id_of
from streams.worker.telemetry import WorkerTelemetry
from streams.worker.adapters import WorkerAdapters
from streams.worker.batch_lane import BatchLane
from streams.worker.engine_driver import Engine, EngineDriver
from streams.worker.intake import to_engine_request
from streams.worker.observers import CompletionsLog, ServiceTelemetry
from streams.worker.replies import Generation
from streams.worker.suffix_feed import SuffixFeed
from streams.worker.tool_rounds import ToolRounds

log = logging.getLogger("specstream.worker")

Progress = Callable[[str], None]
EngineFactory = Callable[[Any, Progress | None], Engine]

# Cancellations remembered for requests not (yet) seen here: a cancel may overtake its request.
_REMEMBERED_CANCELS = 10_000
_ERROR_CODES = frozenset(get_args(BusErrorCode))


def load_engine(config: Any, progress: Progress | None) -> Engine:
    """The configured backend's engine (imported lazily: torch takes seconds to import)."""
    if config.backend == "vllm":
        from streams.worker.vllm_backend import load_vllm_engine

        return load_vllm_engine(config, progress)
    from engine.llm_engine import LLMEngine

    engine: Engine = LLMEngine.from_config(config, progress=progress)
    return engine


class EngineWorker:
    """One engine worker process. ``create_app`` wraps it in a FastStream app; tests drive it with ``async with``."""

    def __init__(self, settings: Settings, *, engine_factory: EngineFactory = load_engine,
                 progress: Progress | None = None, telemetry: WorkerTelemetry | None = None) -> None:
        self.settings = settings
        self.catalog = catalog = settings.catalog
        self.worker_id = settings.worker.resolved_id()
        self.group_id = settings.worker.resolved_group_id(settings.kafka.topic_prefix)
        self._engine_factory = engine_factory
        self._progress = progress
        self.engine: Engine | None = None
        # The configured name until the engine loads (it may resolve another too): the suffix feed reads meanwhile.
        self._base_models: list[str] = [settings.engine.model]
        self.adapters = WorkerAdapters(settings.engine.model, dict(settings.engine.lora.adapters), self._announce)
        self._driver: EngineDriver | None = None
        # Generations running in the engine, by request id (the foundation holds their deliveries).
        self._generations: dict[str, Generation] = {}
        self._cancelled: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._tasks: set[asyncio.Task[Any]] = set()
        # None when tracing and metrics are both off: then no telemetry call is made at all.
        self.telemetry = telemetry or WorkerTelemetry.from_settings(settings, group_id=self.group_id)
        self.completions = CompletionsLog(catalog.completions.name, worker_id=self.worker_id,
                                          fingerprint=config_fingerprint(settings.engine),
                                          enabled=settings.eval.log_completions)
        # Suffix decoding fed by every worker's answers (streams.worker.suffix_feed); None: not drafting by it.
        self.suffix_feed = SuffixFeed.from_settings(settings, self.worker_id, served=lambda: self.served_models)
        self._shared_outputs = settings.engine.speculation.suffix_shared
        # Server-side tool calls: intents out, results in (streams.worker.tool_rounds).
        self.tool_rounds = ToolRounds(settings.tools, catalog.tool_intents.name, proceed=self._continue,
                                      spawn=self._spawn)
        service_telemetry = (ServiceTelemetry(self.telemetry, settings.telemetry, kind=ENGINE_WORKER_KIND)
                             if self.telemetry is not None else None)
        self.service = ConsumerService(ServiceOptions.from_settings(settings, settings.worker), Consumer(
            kind=ENGINE_WORKER_KIND, topic=catalog.requests, input_model=GenerateRequest, handle=self._on_request,
            outputs=[Output(catalog.replies("<edge-id>"), TokenChunk | Completion | ErrorEvent),
                     Output(catalog.completions, CompletionRecord), Output(catalog.tool_intents, ToolIntent)],
            group_id=self.group_id, check=self._precheck, grants=worker_grants,
            listeners=[Listener(catalog.cancellations, CancelRequest, self._on_cancel),
                       Listener(catalog.tool_results, ToolResult, self.tool_rounds.on_result),
                       Listener(catalog.adapters, AdapterCommand, self.adapters.on_command, from_beginning=True)],
            prepare=self._load_engine, started=self._started, close=self._stop_engine,
            models=lambda: self.served_models,
        ), telemetry=service_telemetry)
        self.broker = self.service.broker
        self.batch_lane = BatchLane(settings, self.worker_id, handle=self._on_request, precheck=self._precheck,
                                    models=lambda: self.served_models, stop_lines=self._stop_batch,
                                    telemetry=service_telemetry)
        self.service.announcer.extra = self.adapters.announcement

    @property
    def served_models(self) -> list[str]:
        """The base model (by its configured and resolved names) and the LoRA adapters held."""
        return [*self._base_models, *sorted(self.adapters.held)]

    async def _announce(self) -> None:
        await self.service.announcer.announce()

    # --- lifecycle --------------------------------------------------------------------------------------------------

    async def _load_engine(self) -> None:
        config = self.settings.engine
        if self.suffix_feed is not None:  # the completions backlog is read while the model loads
            await self.suffix_feed.start(self.settings.kafka, self.catalog.completions.name)
        # Loading takes seconds to minutes (conversion on first use); keep the loop free meanwhile.
        try:
            self.engine = await asyncio.to_thread(self._engine_factory, config, self._progress)
        except BaseException:
            if self.suffix_feed is not None:
                await self.suffix_feed.stop()
            raise
        self._base_models = sorted({self.engine.model_name, self.settings.engine.model})
        if self.telemetry is not None:
            self.telemetry.watch_engine(self.engine)
        self._driver = EngineDriver(
            self.engine, asyncio.get_running_loop(), self._on_outputs, self._on_engine_failure,
            name=f"engine-{self.worker_id}",
        )
        self._driver.start()
        self.adapters.attach(self.engine, self._driver.call)
        if self.suffix_feed is not None:
            self.suffix_feed.attach(self._driver.call, self.engine.tokenizer)

    async def _started(self) -> None:
        log.info(
            "worker %s ready: model %s, group %s, requests from %s",
            self.worker_id, self.engine.model_name if self.engine else "?", self.group_id, self.catalog.requests.name,
        )

    async def _stop_engine(self) -> None:
        if self.suffix_feed is not None:
            await self.suffix_feed.stop()
        if self._driver is not None:
            await asyncio.to_thread(self._driver.stop)
            self._driver = None

    async def start(self) -> None:
        await self.service.start()
        await self.batch_lane.start()

    async def stop(self) -> None:
        try:
            await self.batch_lane.stop()
        finally:
            await self.service.stop()

    async def __aenter__(self) -> EngineWorker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def in_flight(self) -> int:
        return self.service.in_flight

    # --- requests ---------------------------------------------------------------------------------------------------

    def _precheck(self, request: GenerateRequest) -> Rejection | None:
        """Checks before a request waits for a slot: none of these needs the engine."""
        now, route = time.time(), request.reply_to
        if request.model not in self.served_models:
            return Rejection(
                "unknown_model",
                f"model '{request.model}' is not served; available: {', '.join(self.served_models)}",
                request.request_id, route,
            )
        if request.deadline is not None and request.deadline <= now:
            return Rejection(
                "deadline_exceeded", f"deadline passed {now - request.deadline:.3f}s before the request was read",
                request.request_id, route,
            )
        if request.request_id in self._cancelled:
            return Rejection("cancelled", "cancelled before it started", request.request_id, route)
        return None

    async def _on_request(self, request: GenerateRequest, delivery: Delivery) -> None:
        with request_scope():  # this loop serves message after message: each one's ids end with it
            self._start(request, delivery)

    def _start(self, request: GenerateRequest, delivery: Delivery) -> None:
        if self.telemetry is not None:
            self.telemetry.received(request, delivery)
        bind_request(request.request_id, self._trace_id(request))
        if request.request_id in self._cancelled:  # the cancel arrived while it waited for a slot
            delivery.fail("cancelled", "cancelled before it started")
            return
        published_at = request.created_at if request.created_at is not None else delivery.published_at
        generation = Generation(request, delivery, transit_s=max(0.0, delivery.received_at - published_at))
        assert self._driver is not None
        try:
            added = self._driver.add(
                lambda engine: to_engine_request(request, engine.tokenizer, arrival_time=delivery.received_at,
                                                 lora=self._adapter_of(request), shared_outputs=self._shared_outputs)
            )
        except RuntimeError:  # driver stopped: shutting down, leave it uncommitted for redelivery
            delivery.hand_back()
            return
        self._generations[request.request_id] = generation
        delivery.defer()
        delivery.on_handback(lambda: self._abort(request.request_id))
        # Not awaited here: the engine thread applies adds between steps, and reading the next request
        # meanwhile is what lets requests arriving together share a batch.
        self._spawn(self._await_admission(generation, added))

    def _continue(self, generation: Generation, request: GenerateRequest) -> None:
        """The next round of a generation, after its server-side tool calls (same request id, same stream)."""
        if self._driver is None or generation.delivery.done:
            return
        try:
            added = self._driver.add(lambda engine: to_engine_request(
                request, engine.tokenizer, arrival_time=time.time(), lora=self._adapter_of(request),
                shared_outputs=self._shared_outputs))
        except RuntimeError:  # driver stopped: shutting down, leave it uncommitted for redelivery
            generation.delivery.hand_back()
            return
        self._spawn(self._await_admission(generation, added))

    def _adapter_of(self, request: GenerateRequest) -> str | None:
        return None if request.model in self._base_models else request.model

    async def _await_admission(self, generation: Generation, added: Any) -> None:
        try:
            generation.engine_request = await added
        except RequestRejected as rejected:
            code = rejected.code if rejected.code in _ERROR_CODES else "invalid_request"
            message = rejected.message if code == rejected.code else f"{rejected.code}: {rejected.message}"
            self._fail(generation, code, message)
        except RuntimeError as error:  # driver stopped while queued
            log.info("request %s not started: %s", generation.request_id, error)
        except Exception as error:  # noqa: BLE001 - e.g. the tokenizer choked on the input
            log.exception("could not start request %s", generation.request_id)
            self._fail(generation, "internal_error", f"could not start the request: {type(error).__name__}: {error}")

    def _abort(self, request_id: str) -> None:
        """The foundation handed the request back (rebalance, drain timeout): stop generating it."""
        self._generations.pop(request_id, None)
        self.tool_rounds.forget(request_id)
        if self._driver is not None:
            # The inbox is FIFO: a request still being added is aborted right after its add.
            self._driver.abort(request_id)

    def _fail(self, generation: Generation, code: Any, message: str) -> None:
        self._generations.pop(generation.request_id, None)
        self.tool_rounds.forget(generation.request_id)
        if self.telemetry is not None:
            self.telemetry.failed(generation.request_id, code, message)
        delivery = generation.delivery
        if delivery.done:
            return
        delivery.reply(ErrorEvent(request_id=generation.request_id, code=code, message=message))
        self._spawn(self.completions.finish(delivery, self._model_name()))

    # --- engine outputs ---------------------------------------------------------------------------------------------

    def _on_outputs(self, outputs: list[RequestOutput]) -> None:
        """Called on the loop once per engine step: one TokenChunk per output, then a Completion when finished."""
        if self.telemetry is not None:
            self.telemetry.step(outputs, time.time())
        for output in outputs:
            generation = self._generations.get(output.request_id)
            if generation is None or generation.delivery.done:
                continue  # handed back, or failed
            if output.error is not None:  # e.g. its LoRA adapter could not be read again after an eviction
                self._fail(generation, output.error[0], output.error[1])
                continue
            self._emit(generation, output)

    def _emit(self, generation: Generation, output: RequestOutput) -> None:
        if output.finished and self.tool_rounds.takes_over(generation, output):
            return  # its calls run on the bus; the generation goes on with their results
        finish_reason = (output.finish_reason or "stop") if output.finished else None
        delivery = generation.delivery
        chunk = generation.chunk(output, finish_reason, self._decode_token)
        if not self.batch_lane.is_batch_line(generation.request):  # a batch line's answer is written whole
            delivery.reply(chunk)
        if output.finished:
            adapter = self._adapter_of(generation.request)
            completion = self.tool_rounds.finish(generation, generation.completion(
                output, finish_reason or "stop", adapter or self._model_name(), adapter=adapter))
            if self.telemetry is not None:
                self.telemetry.engine_done(generation.request_id, output.stats, completion)
            delivery.reply(completion)
            self._generations.pop(generation.request_id, None)
            self._spawn(self.completions.finish(delivery, self._model_name()))

    def _decode_token(self, token_id: int) -> str:
        """One token's text, as vLLM reports it in logprobs."""
        return self.engine.tokenizer.decode([token_id]) if self.engine else str(token_id)

    def _model_name(self) -> str | None:
        return self.engine.model_name if self.engine else None

    def _trace_id(self, request: GenerateRequest) -> str | None:
        """For log lines: this worker's span's trace id, else the one the request carries."""
        traced = self.telemetry.trace_id(request.request_id) if self.telemetry is not None else None
        return traced or trace_id_of(request.trace.traceparent if request.trace is not None else None)

    def _on_engine_failure(self, error: BaseException) -> None:
        """A step raised: the engine's view of its requests is unknown, so fail and abort all of them."""
        for generation in list(self._generations.values()):
            if generation.engine_request is None or generation.delivery.done:
                continue
            if self._driver is not None:
                self._driver.abort(generation.request_id)
            self._fail(generation, "internal_error", f"engine step failed: {type(error).__name__}: {error}")

    # --- cancellations ----------------------------------------------------------------------------------------------

    async def _on_cancel(self, cancel: CancelRequest) -> None:
        generation = self._generations.get(cancel.request_id)
        if generation is None or generation.delivery.done:
            self._remember_cancel(cancel.request_id)
            return
        bind_request(cancel.request_id, self._trace_id(generation.request))
        log.info("cancelling %s: %s", cancel.request_id, cancel.reason)
        if self._driver is None:
            return
        # The inbox is FIFO, so this abort reaches the engine after the request's add. None back means the
        # engine no longer held it (finished in the meantime, or rejected): its own reply is on its way.
        final = await self._driver.abort(cancel.request_id)
        log.info("cancelled %s after %d token(s); KV cache in use: %s", cancel.request_id, generation.tokens,
                 self._cache_in_use())
        if final is not None and not generation.delivery.done:
            if not final.finished:
                final.finished, final.finish_reason = True, "abort"
            self._emit(generation, final)

    def _stop_batch(self, batch_id: str) -> None:
        """A batch is being cancelled: its lines in the engine stop now, answered ``cancelled`` (its error file)."""
        running = [g for rid, g in self._generations.items() if rid.startswith(f"{batch_id}.")]
        for generation in running:
            if self._driver is not None:
                self._driver.abort(generation.request_id)  # FIFO inbox: after its add, if that is still queued
            self._fail(generation, "cancelled", f"batch {batch_id} was cancelled while this line ran")
        if running:
            log.info("batch %s cancelled: %d line(s) aborted here", batch_id, len(running))

    def _cache_in_use(self) -> str:
        """'<used> of <total> tokens', read right after an abort (the engine frees a request's KV region in abort)."""
        usage = getattr(self.engine, "cache_usage", None)
        if usage is None:
            return "unknown"
        try:
            current = usage()
        except Exception:  # noqa: BLE001 - diagnostics only
            return "unknown"
        return f"{current.used_tokens} of {current.total_tokens} tokens"

    def _remember_cancel(self, request_id: str) -> None:
        self._cancelled[request_id] = None
        while len(self._cancelled) > _REMEMBERED_CANCELS:
            self._cancelled.popitem(last=False)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def create_app(settings: Settings, *, engine_factory: EngineFactory = load_engine, progress: Progress | None = None,
               telemetry: WorkerTelemetry | None = None) -> tuple[FastStream, EngineWorker]:
    """The worker as a FastStream application: hooks load the engine before consuming and drain on shutdown."""
    worker = EngineWorker(settings, engine_factory=engine_factory, progress=progress, telemetry=telemetry)
    return create_service_app(worker.service, companions=[worker.batch_lane.service]), worker


async def run_worker(settings: Settings, *, progress: Progress | None = None) -> None:
    """Serve until SIGINT/SIGTERM, then drain and stop (exit 0, also when the broker is gone)."""
    worker = EngineWorker(settings, progress=progress)
    await serve(worker.service, companions=[worker.batch_lane.service])
