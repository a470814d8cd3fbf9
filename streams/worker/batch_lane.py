"""The engine worker's second input: the lines of batch jobs, read from ``<prefix>.batch-lines``.

A batch's backlog waits on its own topic, so it never stands ahead of interactive requests in a request
partition, and the worker reads it as its own consumer group (``<prefix>.batch-workers``) holding at most
``batch.worker_slots`` lines: that bounds the batch work queued in the engine, and the engine's scheduler bounds
how many of them run (``engine.batch_max_share``, lowest priority, yielding at admission). A line is handed to the
same engine and the same path as an interactive request (:meth:`EngineWorker._on_request`); its answer goes to its
reply route, the batch-results topic, without token chunks (nobody streams a batch line).

Lines of a batch that is being cancelled or is over are answered ``cancelled`` without running: the lane follows
the batches topic (:class:`~streams.batch.book.BatchBook`) from its start, so a restarted worker knows too. Lines
of such a batch already in the engine are aborted the moment the lane reads the cancel (``stop_lines``, the
worker's): they are answered ``cancelled`` too, so a cancelled batch stops generating within a poll of the topic.
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from schemas.batch import BatchState, parse_line_request_id
from schemas.events import Completion, CompletionRecord, ErrorEvent, GenerateRequest
from streams.batch.book import BatchBook
from streams.config import Settings
from streams.kafka.acls import worker_grants
from streams.service import Consumer, Delivery, Output, Rejection, ServiceOptions
from streams.service.runner import ConsumerService
from streams.service.telemetry import Telemetry

BATCH_WORKER_KIND = "batch-worker"


class BatchLane:
    def __init__(self, settings: Settings, worker_id: str, *,
                 handle: Callable[[GenerateRequest, Delivery], Awaitable[None]],
                 precheck: Callable[[GenerateRequest], Rejection | None],
                 models: Callable[[], list[str]], stop_lines: Callable[[str], None],
                 telemetry: Telemetry | None = None) -> None:
        """telemetry: the worker's requests service's, which the lane's shares (one /metrics, one tracer)."""
        catalog = settings.catalog
        self.results_topic = catalog.batch_results.name
        self.book = BatchBook(settings.kafka, catalog.batches, on_change=self._changed)
        self._precheck = precheck
        self._handle = handle
        self._stop_lines = stop_lines
        self._stopped: set[str] = set()
        options = replace(ServiceOptions.from_settings(settings, settings.worker),
                          service_id=f"{worker_id}-batch", max_inflight=settings.batch.worker_slots,
                          reply_topic_patterns=(self.results_topic,))
        group_id = f"{settings.kafka.topic_prefix}.batch-workers"
        self.service = ConsumerService(options, Consumer(
            kind=BATCH_WORKER_KIND, topic=catalog.batch_lines, input_model=GenerateRequest, handle=self._start,
            outputs=[Output(catalog.batch_results, Completion | ErrorEvent), Output(catalog.completions, CompletionRecord)],
            group_id=group_id, check=self._check, grants=worker_grants,
            prepare=self._prepare, close=self.book.stop, models=models,
        ), telemetry=telemetry.beside(BATCH_WORKER_KIND, group_id) if telemetry is not None else None)

    def is_batch_line(self, request: GenerateRequest) -> bool:
        return request.reply_to.topic == self.results_topic

    async def _prepare(self) -> None:
        await self.book.start()
        # Lines of a batch cancelled before this worker started must be known before the first line is read.
        await self.book.caught_up.wait()

    def _check(self, request: GenerateRequest) -> Rejection | None:
        batch_id = self._stopped_batch(request)
        if batch_id is not None:
            return Rejection("cancelled", f"batch {batch_id} was cancelled before this line started",
                             request.request_id, request.reply_to)
        return self._precheck(request)

    async def _start(self, request: GenerateRequest, delivery: Delivery) -> None:
        # Checked again: the cancel may have come while the line waited for one of the lane's slots.
        batch_id = self._stopped_batch(request)
        if batch_id is not None:
            delivery.fail("cancelled", f"batch {batch_id} was cancelled before this line started")
            return
        await self._handle(request, delivery)

    def _stopped_batch(self, request: GenerateRequest) -> str | None:
        ids = parse_line_request_id(request.request_id)
        return ids[0] if ids is not None and self.book.is_stopped(ids[0]) else None

    def _changed(self, state: BatchState) -> None:
        if state.id not in self._stopped and self.book.is_stopped(state.id):
            self._stopped.add(state.id)
            self._stop_lines(state.id)

    async def start(self) -> None:
        await self.service.start()

    async def stop(self) -> None:
        await self.service.stop()
