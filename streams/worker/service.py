"""The engine worker: a FastStream Kafka app that serves GenerateRequests with the engine.

Flow of one request::

    request topic ──► on_request ──► intake (validate) ──► EngineDriver.add ──► engine thread
                                                                                   │ step()
    reply topic  ◄── ReplyLane (ordered publish) ◄── TokenChunk / Completion ◄─────┘

* The request subscriber belongs to one consumer group, so workers share the
  request partitions; a second ``specstream worker`` simply joins the group.
* The handler only validates and hands the request to the engine thread; it
  does not wait for generation, so the next message is read at once and new
  requests join the running batch at the next step (continuous batching).
  ``worker.max_inflight`` bounds how many requests one worker holds: beyond
  it the handler waits, which stops consumption (back-pressure through Kafka).
* Offsets are committed by hand, only once a request's Completion or
  ErrorEvent is acknowledged by Kafka (see :mod:`streams.worker.offsets`).
* Every worker reads the whole cancellations topic (no consumer group) and
  aborts the requests it holds.
"""
from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from aiokafka import ConsumerRebalanceListener
from aiokafka import TopicPartition as AIOKafkaTopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError, MessageSizeTooLargeError
from faststream import FastStream
from faststream.kafka import KafkaBroker
from faststream._internal.context import Context as FastStreamContext
from faststream.kafka.message import KafkaMessage as FastStreamKafkaMessage
from faststream.kafka.schemas import Topic as FastStreamTopic
from faststream.middlewares import AckPolicy
from pydantic import BaseModel, ValidationError

from engine.outputs import RequestOutput
from engine.request import EngineRequest, RequestRejected
from schemas.events import (
    CancelRequest,
    Completion,
    DeadLetter,
    ErrorEvent,
    GenerateRequest,
    ReplyRoute,
    SpecStats,
    SpecStepStats,
    Timings,
    TokenChunk,
    Usage,
    WorkerAnnouncement,
)
from schemas.topics import DEAD_LETTER_MAX_BYTES
from streams import kafka_io
from streams.config import Settings
from streams.kafka_acls import worker_grants
from streams.kafka_connection import faststream_options
from streams.kafka_permissions import prepare_service
from streams.reply_routes import ReplyRoutes, RouteCheck, compile_patterns
from streams.worker.engine_driver import Engine, EngineDriver
from streams.worker.intake import Rejection, parse_request, to_engine_request
from streams.worker.offsets import OffsetTracker

log = logging.getLogger("specstream.worker")
# FastStream's own lines (per-message, lifecycle) go to a child logger that the CLI keeps at WARNING.
faststream_log = logging.getLogger("specstream.worker.faststream")


class _DropDeclaredTopicWarning(logging.Filter):
    """Our topics are created from the catalog on purpose, so FastStream's reminder that it will not create them is noise."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Auto create topics is disabled" not in record.getMessage()


faststream_log.addFilter(_DropDeclaredTopicWarning())


class _ThrottleMissingTopicErrors(logging.Filter):
    """Reply topics come and go (an edge shuts down, `specstream send` deletes its own), but the producer keeps
    asking for every topic it ever wrote to and logs an ERROR per metadata refresh (several a second) for each one
    that is gone. Keep one line per topic and interval: enough to see it, not enough to bury everything else."""

    interval_s = 60.0

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != "Topic %s not found in cluster metadata" or not record.args:
            return True
        topic = str(record.args[0] if isinstance(record.args, tuple) else record.args)
        now = time.monotonic()
        if now - self._last.get(topic, -self.interval_s) < self.interval_s:
            return False
        if len(self._last) > 10_000:
            self._last.clear()
        self._last[topic] = now
        return True


logging.getLogger("aiokafka.cluster").addFilter(_ThrottleMissingTopicErrors())


class _InlineContext(FastStreamContext):
    """``Context("message")`` resolved on the event loop.

    FastStream resolves a handler's context parameter (``msg: KafkaMessage``) by calling the field's synchronous
    ``use`` through ``anyio.to_thread.run_sync``: one thread-pool hop before every request and cancellation reaches its
    handler, which on a busy machine waits for a CPU like any wakeup. ``use`` only looks the message up, so an async
    ``use`` (run inline) gives the same value without the hop.
    """

    async def use(self, /, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        return super().use(**kwargs)


# The consumed message, as ``faststream.kafka.annotations.KafkaMessage`` gives it, without the thread hop.
KafkaMessage = Annotated[FastStreamKafkaMessage, _InlineContext("message")]

Progress = Callable[[str], None]
EngineFactory = Callable[[Any, Progress | None], Engine]

_JSON_HEADERS = {"content-type": "application/json"}
# Seconds before a failed offset commit is tried again.
_COMMIT_RETRY_S = 1.0
_ANNOUNCE_TIMEOUT_S = 3.0
# After the drain, how long the Kafka clients may take to stop before the process exits anyway.
_CLIENT_STOP_GRACE_S = 10.0
# Cancellations remembered for requests not (yet) seen here: a cancel may overtake its request.
_REMEMBERED_CANCELS = 10_000
_ERROR_CODES = {"invalid_request", "unknown_model", "context_length_exceeded", "deadline_exceeded", "cancelled",
                "overloaded", "internal_error", "unsupported_schema_version", "message_too_large"}


def load_engine(config: Any, progress: Progress | None) -> Engine:
    """The real engine (imported lazily: torch takes seconds to import)."""
    from engine.llm_engine import LLMEngine

    engine: Engine = LLMEngine.from_config(config, progress=progress)
    return engine


@dataclass(frozen=True)
class Source:
    """Where a request message came from: what is committed once it is answered."""

    topic: str
    partition: int
    offset: int


@dataclass
class InFlight:
    request: GenerateRequest
    sources: list[Source]
    received_at: float  # worker clock, when consumed
    transit_s: float  # publication -> consumption, added to the engine's timings
    engine_request: EngineRequest | None = None
    next_index: int = 0
    text: list[str] = field(default_factory=list)
    text_chars: int = 0  # characters published so far: the next chunk's text_offset
    tokens: int = 0  # tokens published so far: the next chunk's token_offset
    deliveries: list[asyncio.Future[Any]] = field(default_factory=list)
    done: bool = False
    final_event: BaseModel | None = None  # the Completion or ErrorEvent, kept for a dead letter if undeliverable


@dataclass
class _Publish:
    topic: str
    partition: int | None
    key: bytes
    value: bytes
    delivered: asyncio.Future[Any]


class _ReplyLane:
    """Publishes to one topic strictly in submission order.

    One lane per reply topic: events of one request stay in order, and a slow
    or missing topic (metadata wait) holds up only its own replies.
    """

    def __init__(self) -> None:
        self.queue: collections.deque[_Publish] = collections.deque()
        self.task: asyncio.Task[None] | None = None


class EngineWorker:
    """One engine worker process. ``create_app`` wraps it in a FastStream app; tests drive it with ``async with``."""

    def __init__(
        self,
        settings: Settings,
        *,
        engine_factory: EngineFactory = load_engine,
        progress: Progress | None = None,
    ) -> None:
        self.settings = settings
        self.catalog = settings.catalog
        self.worker_id = settings.worker.resolved_id()
        self.group_id = settings.worker.resolved_group_id(settings.kafka.topic_prefix)
        self._engine_factory = engine_factory
        self._progress = progress
        self.engine: Engine | None = None
        self.served_models: list[str] = []
        self._driver: EngineDriver | None = None
        self._offsets = OffsetTracker()
        self._in_flight: dict[str, InFlight] = {}
        self._slots = asyncio.Semaphore(settings.worker.max_inflight)
        self._lanes: dict[str, _ReplyLane] = {}
        self._cancelled: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._commit_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._heartbeat: asyncio.Task[None] | None = None
        self._state: str = "starting"
        # Request partitions this worker owns (updated on every rebalance; None before the first assignment).
        self._owned: set[tuple[str, int]] | None = None
        # True while the request partitions are paused because every slot is taken (back-pressure).
        self._intake_paused = False
        self._commit_retry_pending = False
        self._admin: AIOKafkaAdminClient | None = None
        self.routes = ReplyRoutes(
            compile_patterns(settings.delivery.reply_topic_patterns, settings.kafka.topic_prefix),
            self._list_topics,
            ttl_s=settings.delivery.topic_cache_ttl_s,
            lookup_timeout_s=settings.delivery.metadata_timeout_s,
        )

        self.broker = KafkaBroker(
            # Addresses, TLS and SASL: built in one place for every client (streams.kafka_connection).
            **faststream_options(settings.kafka),
            # Large enough for a dead letter of a request at the broker's size limit.
            **kafka_io.producer_options(client_id=f"specstream-worker-{self.worker_id}",
                                        max_request_size=DEAD_LETTER_MAX_BYTES + 64 * 1024),
            logger=faststream_log,
            # Per-message "Received"/"Processed" lines are debug noise at request rates.
            log_level=logging.DEBUG,
            # Topics come from the catalog (kafka_io.ensure_topics), with their retention and ISR settings.
            allow_auto_create_topics=False,
        )
        self.requests = self.broker.subscriber(
            FastStreamTopic(self.catalog.requests.name, declare=False),
            group_id=self.group_id,
            # Offsets are committed by hand once replies are stored, not when a message is read.
            ack_policy=AckPolicy.MANUAL,
            auto_offset_reset="earliest",
            listener=_Rebalance(self),
            # A worker that crashed gives up its partitions after the session timeout (a clean stop leaves at
            # once); the survivors learn of the rebalance at their next heartbeat. Heartbeats run on the event
            # loop, which the engine thread leaves free, so a few seconds tolerate a busy machine
            # (worker.session_timeout_ms; raise it where stalls are longer).
            session_timeout_ms=settings.worker.session_timeout_ms,
            heartbeat_interval_ms=settings.worker.heartbeat_interval_ms,
            title="requests",
            description="GenerateRequest events; engine workers share them as one consumer group.",
        )
        self.requests(self._on_request)
        self.cancellations = self.broker.subscriber(
            FastStreamTopic(self.catalog.cancellations.name, declare=False),
            # No group: every worker sees every cancellation, and only new ones.
            auto_offset_reset="latest",
            title="cancellations",
        )
        self.cancellations(self._on_cancel)

    # --- lifecycle --------------------------------------------------------------------------------------------------

    async def prepare(self) -> None:
        """Create its topics, check its permissions, load the engine (before any message is read)."""
        kafka = self.settings.kafka
        # Its topics, then its permissions: a missing ACL stops the worker here, in one line, before serving.
        await prepare_service(
            kafka, worker_grants(self.catalog, self.group_id), client_id=f"specstream-worker-{self.worker_id}-admin",
            replication_factor=kafka.replication_factor, min_insync_replicas=kafka.min_insync_replicas,
        )
        # Long-lived: reply routes are checked against topic metadata (cached) before any work or reply.
        self._admin = kafka_io.make_admin(kafka, client_id=f"specstream-worker-{self.worker_id}-routes")
        await self._admin.start()
        config = self.settings.engine.to_engine_config()
        # Loading takes seconds to minutes (conversion on first use); keep the loop free meanwhile.
        self.engine = await asyncio.to_thread(self._engine_factory, config, self._progress)
        self.served_models = sorted({self.engine.model_name, self.settings.engine.model})
        self._driver = EngineDriver(
            self.engine, asyncio.get_running_loop(), self._on_outputs, self._on_engine_failure,
            name=f"engine-{self.worker_id}",
        )
        self._driver.start()

    async def started(self) -> None:
        """Announce readiness (after the subscribers run) and keep announcing it."""
        self._state = "ready"
        await self._announce("ready")
        self._heartbeat = asyncio.create_task(self._heartbeat_loop(), name="worker-heartbeat")
        log.info(
            "worker %s ready: model %s, group %s, requests from %s",
            self.worker_id, self.engine.model_name if self.engine else "?", self.group_id, self.catalog.requests.name,
        )

    async def drain(self) -> None:
        """Stop reading requests, let running ones finish (up to worker.drain_timeout_s), abort the rest."""
        if self._state in ("draining", "stopped"):
            return
        self._state = "draining"
        await self._announce("draining")
        # Pause rather than stop the request consumer: it must stay in the group to commit what finishes now.
        consumer = self.requests.consumer
        if consumer is not None:
            consumer.pause(*consumer.assignment())
        deadline = time.monotonic() + self.settings.worker.drain_timeout_s
        while self._in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._in_flight and self._driver is not None:
            # Not answered and not committed: Kafka redelivers them to another worker.
            log.warning("aborting %d unfinished request(s) at shutdown; they will be redelivered", len(self._in_flight))
            for request_id in list(self._in_flight):
                self._in_flight.pop(request_id).done = True
                self._driver.abort(request_id)
        try:
            # Bounded: with the broker gone these would wait out the producer's request timeout; what is not
            # acknowledged by then is not committed either, so Kafka redelivers it.
            await asyncio.wait_for(self._settle_pending(), timeout=max(1.0, deadline - time.monotonic()))
        except TimeoutError:
            log.warning("replies still unacknowledged at the end of the drain; their requests will be redelivered")
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        self._state = "stopped"
        await self._announce("stopped")

    async def close(self) -> None:
        if self._driver is not None:
            await asyncio.to_thread(self._driver.stop)
            self._driver = None
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.close()
            self._admin = None

    async def _list_topics(self) -> list[str]:
        if self._admin is None:
            raise RuntimeError("the worker is not started")
        topics: list[str] = await self._admin.list_topics()
        return topics

    async def start(self) -> None:
        """Everything ``create_app`` does at startup, for use without a FastStream app (tests, embedding)."""
        await self.prepare()
        await self.broker.start()
        await self.started()

    async def stop(self) -> None:
        try:
            await self.drain()
        finally:
            await self.broker.stop()
            await self.close()

    async def __aenter__(self) -> EngineWorker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- requests ---------------------------------------------------------------------------------------------------

    async def _on_request(self, msg: KafkaMessage) -> None:
        record = msg.raw_message
        source = Source(record.topic, record.partition, record.offset)
        self._offsets.started(source.topic, source.partition, source.offset)
        try:
            await self._intake(record.value, record.key, record.timestamp, source)
        except Exception:  # noqa: BLE001 - a bug here must not stop consumption; the message is dead-lettered
            log.exception("internal error handling %s/%d@%d", source.topic, source.partition, source.offset)
            self._reject(
                Rejection("internal_error", "the worker failed to handle this message", dead_letter=True),
                record.value, record.key, source,
            )

    async def _intake(self, value: bytes | None, key: bytes | None, timestamp_ms: int, source: Source) -> None:
        received_at = time.time()
        parsed = parse_request(value, max_bytes=self.settings.worker.max_message_bytes)
        if isinstance(parsed, Rejection):
            route_problem = await self.routes.check(parsed.route.topic) if parsed.route is not None else None
            self._reject(parsed, value, key, source, route_problem)
            return
        request = parsed
        # Before any work or reply: a request may only be answered on one of this deployment's existing reply topics.
        route_problem = await self.routes.check(request.reply_to.topic)
        if route_problem is not None:
            self._dead_letter_route(route_problem, request.request_id, value, key, source)
            return
        rejection = self._precheck(request, received_at)
        if rejection is not None:
            self._reject(rejection, value, key, source)
            return
        held = self._in_flight.get(request.request_id)
        if held is not None:
            # Redelivered while still running here (e.g. after a rebalance): answer once, commit both offsets then.
            held.sources.append(source)
            return
        # Back-pressure: waiting here stops this subscriber from reading further messages, and pausing the
        # partitions stops the consumer from fetching more of them meanwhile: a burst waits in Kafka.
        if self._slots.locked():
            self._pause_intake()
        await self._slots.acquire()
        if self._state not in ("starting", "ready"):  # draining: leave it uncommitted for another worker
            self._release_slot()
            return
        if self._owned is not None and (source.topic, source.partition) not in self._owned:
            # Its partition moved to another worker while we waited for a slot; the new owner serves it.
            self._release_slot()
            return
        if request.request_id in self._cancelled:  # the cancel arrived while we waited for a slot
            self._release_slot()
            self._reject(Rejection("cancelled", "cancelled before it started", request.request_id, request.reply_to),
                         value, key, source)
            return
        published_at = request.created_at if request.created_at is not None else timestamp_ms / 1000
        flight = InFlight(request, [source], received_at, transit_s=max(0.0, received_at - published_at))
        self._in_flight[request.request_id] = flight
        assert self._driver is not None
        try:
            added = self._driver.add(
                lambda engine: to_engine_request(request, engine.tokenizer, arrival_time=received_at)
            )
        except RuntimeError:  # driver stopped: shutting down, leave it uncommitted for redelivery
            self._in_flight.pop(request.request_id, None)
            self._release_slot()
            return
        # Not awaited here: the engine thread applies adds between steps, and reading the next request
        # meanwhile is what lets requests arriving together share a batch.
        self._spawn(self._await_admission(flight, added))

    def _precheck(self, request: GenerateRequest, now: float) -> Rejection | None:
        route = request.reply_to
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

    async def _await_admission(self, flight: InFlight, added: Any) -> None:
        try:
            flight.engine_request = await added
        except RequestRejected as rejected:
            code = rejected.code if rejected.code in _ERROR_CODES else "invalid_request"
            message = rejected.message if code == rejected.code else f"{rejected.code}: {rejected.message}"
            await self._fail(flight, code, message)
        except RuntimeError as error:  # driver stopped while queued
            log.info("request %s not started: %s", flight.request.request_id, error)
        except Exception as error:  # noqa: BLE001 - e.g. the tokenizer choked on the input
            log.exception("could not start request %s", flight.request.request_id)
            await self._fail(flight, "internal_error", f"could not start the request: {type(error).__name__}: {error}")

    # --- engine outputs ---------------------------------------------------------------------------------------------

    def _on_outputs(self, outputs: list[RequestOutput]) -> None:
        """Called on the loop once per engine step: one TokenChunk per output, then a Completion when finished."""
        for output in outputs:
            flight = self._in_flight.get(output.request_id)
            if flight is None or flight.done:
                continue  # aborted at shutdown, or failed
            self._emit(flight, output)

    def _emit(self, flight: InFlight, output: RequestOutput) -> None:
        request = flight.request
        finish_reason = (output.finish_reason or "stop") if output.finished else None
        chunk = TokenChunk(
            request_id=request.request_id,
            index=flight.next_index,
            text=output.text,
            token_ids=list(output.token_ids),
            finish_reason=finish_reason,
            spec=SpecStepStats(drafted=output.spec.drafted, accepted=output.spec.accepted),
            text_offset=flight.text_chars,
            token_offset=flight.tokens,
        )
        flight.next_index += 1
        flight.text.append(output.text)
        flight.text_chars += len(output.text)
        flight.tokens += len(output.token_ids)
        self._publish_reply(flight, chunk)
        if output.finished:
            completion = self._completion(flight, output, finish_reason or "stop")
            self._publish_reply(flight, completion)
            self._finish(flight, completion)

    def _completion(self, flight: InFlight, output: RequestOutput, finish_reason: Any) -> Completion:
        stats = output.stats
        prompt_tokens = len(flight.engine_request.prompt_token_ids) if flight.engine_request else 0
        elapsed = time.time() - flight.received_at
        if stats is not None:
            usage = Usage(
                prompt_tokens=stats.prompt_tokens,
                completion_tokens=stats.completion_tokens,
                total_tokens=stats.prompt_tokens + stats.completion_tokens,
            )
            timings = Timings(
                queued_s=max(0.0, stats.queued_s) + flight.transit_s,
                ttft_s=max(0.0, stats.ttft_s) + flight.transit_s,
                total_s=max(0.0, stats.total_s) + flight.transit_s,
            )
            spec = SpecStats(
                drafted=stats.spec.drafted,
                accepted=stats.spec.accepted,
                acceptance_rate=min(1.0, stats.spec.acceptance_rate),
                tokens_per_forward=stats.tokens_per_forward,
            )
        else:  # the engine gave no stats (e.g. an abort before the first step): our own clock
            usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=0, total_tokens=prompt_tokens)
            total = elapsed + flight.transit_s
            timings = Timings(queued_s=total, ttft_s=total, total_s=total)
            spec = SpecStats()
        return Completion(
            request_id=flight.request.request_id,
            text="".join(flight.text),
            finish_reason=finish_reason,
            num_chunks=flight.next_index,
            usage=usage,
            timings=timings,
            spec=spec,
            model=self.engine.model_name if self.engine else None,
        )

    def _on_engine_failure(self, error: BaseException) -> None:
        """A step raised: the engine's view of its requests is unknown, so fail and abort all of them."""
        for flight in list(self._in_flight.values()):
            if flight.engine_request is None or flight.done:
                continue
            if self._driver is not None:
                self._driver.abort(flight.request.request_id)
            self._spawn(self._fail(flight, "internal_error", f"engine step failed: {type(error).__name__}: {error}"))

    # --- cancellations ----------------------------------------------------------------------------------------------

    async def _on_cancel(self, msg: KafkaMessage) -> None:
        try:
            cancel = kafka_io.decode(msg.raw_message.value or b"", CancelRequest)
        except ValidationError as error:
            log.warning("ignoring malformed cancellation: %s", kafka_io.validation_summary(error))
            return
        flight = self._in_flight.get(cancel.request_id)
        if flight is None or flight.done:
            self._remember_cancel(cancel.request_id)
            return
        log.info("cancelling %s: %s", cancel.request_id, cancel.reason)
        if self._driver is None:
            return
        # The inbox is FIFO, so this abort reaches the engine after the request's add. None back means the
        # engine no longer held it (finished in the meantime, or rejected): its own reply is on its way.
        final = await self._driver.abort(cancel.request_id)
        log.info("cancelled %s after %d token(s); KV cache in use: %s", cancel.request_id, flight.tokens,
                 self._cache_in_use())
        if final is not None and not flight.done:
            if not final.finished:
                final.finished, final.finish_reason = True, "abort"
            self._emit(flight, final)

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

    # --- replies, errors, dead letters ------------------------------------------------------------------------------

    def _publish_reply(self, flight: InFlight, event: BaseModel) -> None:
        route = flight.request.reply_to
        flight.deliveries.append(
            self._enqueue(route.topic, route.partition, kafka_io.request_key(flight.request.request_id), event)
        )

    def _enqueue(self, topic: str, partition: int | None, key: bytes, event: BaseModel) -> asyncio.Future[Any]:
        delivered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        lane = self._lanes.get(topic)
        if lane is None:
            lane = self._lanes[topic] = _ReplyLane()
            lane.task = asyncio.create_task(self._run_lane(topic, lane), name=f"lane-{topic}")
        lane.queue.append(_Publish(topic, partition, key, kafka_io.encode(event), delivered))
        return delivered

    async def _run_lane(self, topic: str, lane: _ReplyLane) -> None:
        """Publish the lane's jobs in order, each bounded by delivery.publish_timeout_s.

        The bound is what keeps a topic that vanished (or a broker that stopped answering) from holding anything
        but its own lane: the job fails with a timeout, its request is finished anyway (and dead-lettered), and
        later jobs for a topic known to be missing fail at once instead of each waiting out the bound.
        """
        timeout_s = self.settings.delivery.publish_timeout_s
        loop = asyncio.get_running_loop()
        while lane.queue:
            job = lane.queue.popleft()
            if not await self.routes.exists(topic):
                _fail_job(job, ReplyTopicGone(f"topic '{topic}' does not exist"))
                continue
            try:
                # no_confirm: returns once the message is in the producer's buffer, which fixes its order;
                # the broker's ack arrives on the returned future. The producer waits for the topic's metadata
                # first, for up to its request timeout (40 s), hence the bound.
                ack = await asyncio.wait_for(
                    self.broker.publish(job.value, job.topic, key=job.key, partition=job.partition,
                                        headers=_JSON_HEADERS, no_confirm=True),
                    timeout=timeout_s,
                )
            except Exception as error:  # noqa: BLE001 - reported through the job's future
                self.routes.forget(topic)  # look it up again before the next publish
                _fail_job(job, error if not isinstance(error, TimeoutError) else
                          TimeoutError(f"not accepted by the producer within {timeout_s:g} s"))
                continue
            ack.add_done_callback(lambda fut, done=job.delivered: _chain(fut, done))
            expiry = loop.call_later(timeout_s, _fail_job, job,
                                     TimeoutError(f"not acknowledged by Kafka within {timeout_s:g} s"))
            job.delivered.add_done_callback(lambda _, timer=expiry: timer.cancel())
        # No await between the emptiness check and this: a job enqueued later starts a new lane.
        del self._lanes[topic]

    async def _settle_pending(self) -> None:
        await self._drain_lanes()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _drain_lanes(self) -> None:
        while self._lanes:
            await asyncio.gather(*[lane.task for lane in self._lanes.values() if lane.task], return_exceptions=True)

    def _finish(self, flight: InFlight, final_event: BaseModel) -> None:
        """The request is answered: once Kafka has acked its events, release its slot and commit its offsets."""
        flight.done = True
        flight.final_event = final_event
        self._spawn(self._settle(flight))

    async def _settle(self, flight: InFlight) -> None:
        results = await asyncio.gather(*flight.deliveries, return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            # Every publish is bounded, so this is known within seconds. The request is finished and committed
            # anyway (a redelivery would meet the same topic); the dead letter keeps the answer and the request.
            request = flight.request
            log.error("could not deliver %d reply event(s) of %s to %s: %s",
                      len(failures), request.request_id, request.reply_to.topic, failures[0])
            reason = (f"reply_undeliverable: {len(failures)} of {len(results)} reply event(s) to "
                      f"'{request.reply_to.topic}' not delivered: {_describe_error(failures[0])}")
            undelivered = kafka_io.encode(flight.final_event).decode() if flight.final_event is not None else None
            await asyncio.gather(self._dead_letter(reason, kafka_io.encode(request),
                                                   kafka_io.request_key(request.request_id), flight.sources[0],
                                                   undelivered=undelivered), return_exceptions=True)
        if self._in_flight.get(flight.request.request_id) is flight:
            del self._in_flight[flight.request.request_id]
            self._release_slot()
        for source in flight.sources:
            self._offsets.finished(source.topic, source.partition, source.offset)
        await self._commit()

    async def _fail(self, flight: InFlight, code: Any, message: str) -> None:
        if flight.done:
            return
        error = ErrorEvent(request_id=flight.request.request_id, code=code, message=message)
        self._publish_reply(flight, error)
        self._finish(flight, error)

    def _reject(self, rejection: Rejection, value: bytes | None, key: bytes | None, source: Source,
                route_problem: RouteCheck | None = None) -> None:
        """Answer a message that never reaches the engine, then let its offset be committed.

        Not awaited by the handler: the publishes are bounded, but the partition must not wait even that long.
        The offset stays in flight (uncommitted) until they are settled.
        """
        log.info(
            "rejected %s/%d@%d (%s): %s", source.topic, source.partition, source.offset, rejection.code, rejection.message
        )
        reason = f"{rejection.code}: {rejection.message}"
        pending: list[asyncio.Future[Any]] = []
        if route_problem is not None:
            # The sender hears nothing (its route is refused); the dead letter says why.
            reason += f" (no error reply sent: {route_problem.code}: {route_problem.message})"
        elif rejection.route is not None:
            error = ErrorEvent(request_id=rejection.request_id, code=rejection.code, message=rejection.message)
            key_bytes = kafka_io.request_key(rejection.request_id) if rejection.request_id else key or b""
            pending.append(self._enqueue(rejection.route.topic, rejection.route.partition, key_bytes, error))
        if rejection.dead_letter or route_problem is not None:
            pending.append(self._dead_letter(reason, value, key, source))
        self._spawn(self._settle_rejection(pending, reason, value, key, source))

    def _dead_letter_route(self, problem: RouteCheck, request_id: str, value: bytes | None, key: bytes | None,
                           source: Source) -> None:
        """A request whose reply route is refused: dead-lettered, never answered, never generated."""
        log.warning("dead-lettered %s/%d@%d (request %s): %s: %s", source.topic, source.partition, source.offset,
                    request_id, problem.code, problem.message)
        reason = f"{problem.code}: {problem.message}"
        self._spawn(self._settle_rejection([self._dead_letter(reason, value, key, source)], reason, value, key, source))

    async def _settle_rejection(self, pending: list[asyncio.Future[Any]], reason: str, value: bytes | None,
                                key: bytes | None, source: Source) -> None:
        results = await asyncio.gather(*pending, return_exceptions=True)
        for result in results:
            if isinstance(result, MessageSizeTooLargeError):
                # Too big even for the dead-letters topic: keep the reason and the source offset.
                await asyncio.gather(self._dead_letter(reason, None, key, source, dropped=len(value or b"")),
                                     return_exceptions=True)
            elif isinstance(result, BaseException):
                log.error("could not publish the rejection of %s/%d@%d: %s",
                          source.topic, source.partition, source.offset, _describe_error(result))
        # Committed past whatever happened to its reply: a message is never read again once it was dealt with.
        self._offsets.finished(source.topic, source.partition, source.offset)
        await self._commit()

    def _dead_letter(self, reason: str, value: bytes | None, key: bytes | None, source: Source, *,
                     dropped: int = 0, undelivered: str | None = None) -> asyncio.Future[Any]:
        if dropped:
            reason += f" (original of {dropped} bytes too large to keep)"
        letter = DeadLetter(
            reason=reason,
            source_topic=source.topic,
            source_partition=source.partition,
            source_offset=source.offset,
            original_b64=base64.b64encode(value or b"").decode("ascii"),
            original_key_b64=base64.b64encode(key).decode("ascii") if key is not None else None,
            consumer=self.worker_id,
            at=time.time(),
            undelivered=undelivered,
        )
        letter_key = f"{source.topic}/{source.partition}/{source.offset}".encode()
        return self._enqueue(self.catalog.dead_letters.name, None, letter_key, letter)

    # --- offsets ----------------------------------------------------------------------------------------------------

    async def _commit(self) -> None:
        # One commit at a time, each with the latest positions: a slow commit can never overwrite a newer one.
        async with self._commit_lock:
            positions = self._offsets.committable()
            consumer = self.requests.consumer
            if not positions or consumer is None:
                return
            try:
                await consumer.commit({AIOKafkaTopicPartition(t, p): offset for (t, p), offset in positions.items()})
            except (KafkaError, AssertionError) as error:
                # Typically a rebalance took the partition away (its new owner resumes from the last commit), or the
                # group coordinator moved (a broker died). Retry soon: the last requests before a quiet spell must
                # not stay uncommitted (they would be generated again after the next rebalance).
                log.warning("offset commit failed (%s); retrying in %.0f s", error, _COMMIT_RETRY_S)
                if not self._commit_retry_pending:
                    self._commit_retry_pending = True
                    self._spawn(self._retry_commit())
                return
            self._offsets.mark_committed(positions)

    async def _retry_commit(self) -> None:
        await asyncio.sleep(_COMMIT_RETRY_S)
        self._commit_retry_pending = False
        if self._state != "stopped":
            await self._commit()

    def _partitions_revoked(self, revoked: set[AIOKafkaTopicPartition]) -> None:
        for tp in revoked:
            self._offsets.forget(tp.topic, tp.partition)

    def _partitions_assigned(self, assigned: set[AIOKafkaTopicPartition]) -> None:
        """Hand back the requests of partitions another worker owns now: it regenerates them from their
        uncommitted offsets, and the edge forwards only text its client has not seen yet. Requests of partitions
        kept here go on (the consumer reads them again from the last commit; ``_intake`` attaches those copies to
        the running requests)."""
        self._owned = {(tp.topic, tp.partition) for tp in assigned}
        if self._intake_paused:
            # A new assignment starts unpaused; keep it paused while every slot is taken.
            self._intake_paused = False
            if self._slots.locked():
                self._pause_intake()
        owned = self._owned
        lost = [f for f in self._in_flight.values()
                if not f.done and not any((s.topic, s.partition) in owned for s in f.sources)]
        if not lost:
            return
        log.info("rebalance: handing back %d request(s) of partitions now owned elsewhere", len(lost))
        for flight in lost:
            flight.done = True
            del self._in_flight[flight.request.request_id]
            self._release_slot()
            if self._driver is not None:
                # The inbox is FIFO: a request still being added is aborted right after its add.
                with contextlib.suppress(RuntimeError):
                    self._driver.abort(flight.request.request_id)

    # --- back-pressure ----------------------------------------------------------------------------------------------

    def _pause_intake(self) -> None:
        consumer = self.requests.consumer
        if consumer is None or self._intake_paused:
            return
        partitions = consumer.assignment()
        if partitions:
            consumer.pause(*partitions)
            self._intake_paused = True
            log.debug("every slot taken: paused %d request partition(s)", len(partitions))

    def _release_slot(self) -> None:
        self._slots.release()
        if self._intake_paused and self._state in ("starting", "ready"):
            self._intake_paused = False
            consumer = self.requests.consumer
            if consumer is not None:
                consumer.resume(*consumer.assignment())

    # --- announcements ----------------------------------------------------------------------------------------------

    async def _announce(self, state: str) -> None:
        announcement = WorkerAnnouncement(
            worker_id=self.worker_id, models=self.served_models, state=state, at=time.time()  # type: ignore[arg-type]
        )
        try:
            # Best effort and bounded, so that a missing broker cannot hold up a shutdown.
            await asyncio.wait_for(
                self.broker.publish(
                    kafka_io.encode(announcement), self.catalog.workers.name,
                    key=self.worker_id.encode(), headers=_JSON_HEADERS,
                ),
                timeout=_ANNOUNCE_TIMEOUT_S,
            )
        except Exception as error:  # noqa: BLE001 - an announcement is best effort; the next heartbeat retries
            log.warning("could not announce %s: %s", state, repr(error))

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.worker.heartbeat_s)
            await self._announce(self._state)

    # --- helpers ----------------------------------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)


class ReplyTopicGone(KafkaError):
    """A publish to a topic that a metadata look-up found missing (deleted since its request was checked)."""


def _fail_job(job: _Publish, error: BaseException) -> None:
    if not job.delivered.done():
        job.delivered.set_exception(error)


def _describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


def _chain(source: asyncio.Future[Any], target: asyncio.Future[Any]) -> None:
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif source.exception() is not None:
        target.set_exception(source.exception())  # type: ignore[arg-type]
    else:
        target.set_result(source.result())


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """Commit what is finished before partitions move, then forget them."""

    def __init__(self, worker: EngineWorker) -> None:
        self._worker = worker

    async def on_partitions_revoked(self, revoked: set[AIOKafkaTopicPartition]) -> None:
        await self._worker._commit()
        self._worker._partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[AIOKafkaTopicPartition]) -> None:
        log.info("assigned %s", ", ".join(f"{tp.topic}/{tp.partition}" for tp in sorted(assigned)) or "no partitions")
        self._worker._partitions_assigned(assigned)


def create_app(settings: Settings, *, engine_factory: EngineFactory = load_engine,
               progress: Progress | None = None) -> tuple[FastStream, EngineWorker]:
    """The worker as a FastStream application: hooks load the engine before consuming and drain on shutdown."""
    worker = EngineWorker(settings, engine_factory=engine_factory, progress=progress)
    app = FastStream(
        worker.broker,
        logger=faststream_log,
        on_startup=[worker.prepare],
        after_startup=[worker.started],
        on_shutdown=[worker.drain],
        after_shutdown=[worker.close],
    )
    return app, worker


async def run_worker(settings: Settings, *, progress: Progress | None = None) -> None:
    """Serve until SIGINT/SIGTERM (FastStream installs the handlers), then drain and stop."""
    app, _ = create_app(settings, progress=progress)
    watchdog = threading.Timer(_CLIENT_STOP_GRACE_S, _exit_stuck_clients)
    watchdog.daemon = True

    @app.on_shutdown
    async def _arm_watchdog() -> None:
        # Runs after the drain. FastStream then stops the Kafka clients, which with the broker gone wait out
        # their own retries; the drain already settled what could be, so that wait has nothing left to save.
        watchdog.start()

    try:
        await app.run()
    finally:
        watchdog.cancel()


def _exit_stuck_clients() -> None:
    log.warning("Kafka clients did not stop within %.0f s (broker unreachable?); exiting", _CLIENT_STOP_GRACE_S)
    logging.shutdown()
    os._exit(0)
