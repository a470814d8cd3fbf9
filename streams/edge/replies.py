"""The reply router: how an edge gets back the events of the requests it published.

Design
------
Every edge has an ``edge_id`` and owns one reply topic,
``TopicCatalog.replies(edge_id)`` (``<prefix>.replies.<edge_id>``: one
partition, short retention), which it creates when it starts. Each
``GenerateRequest`` it publishes names that topic in ``reply_to``; workers
produce the request's ``TokenChunk``/``Completion``/``ErrorEvent`` events there,
keyed by ``request_id``. So with several edges each one reads only its own
replies: no edge filters out other edges' traffic, and adding edges adds no
read load to the others.

The edge reads its topic with one background aiokafka consumer that is
*assigned* the single partition (no consumer group, no rebalances) and starts
at the end of the log: the position is resolved before the edge serves
traffic, so no reply to a request published afterwards can be missed, and
replies left over from an earlier run of the same edge (whose clients are gone)
are skipped. Each in-flight request registers an ``asyncio.Queue`` under its
``request_id`` *before* its request is published; the consumer loop decodes
every message and puts it on the queue of its ``request_id``. Events for ids
that are not in flight (late events of a cancelled or timed-out request, a
worker's duplicate after a redelivery, or requests this edge published before
it restarted) are dropped with a debug log; while such a request is still
generating, the edge publishes one ``CancelRequest`` for it so no worker keeps
spending steps on an answer nobody reads.

One partition keeps each request's events in order. :class:`ReplyStream` also
drops what the client already has when a redelivered request is regenerated
(see :mod:`streams.edge.dedupe`: by text offset, with an explicit
``regeneration_diverged`` error if the new text differs), and enforces the
request's deadline on the edge's side.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from schemas.events import Completion, ErrorEvent, TokenChunk
from schemas.retrieval import IndexState, Retrieved, SearchResults
from streams.edge.dedupe import Diverged, Forwarded
from streams.kafka.clients import decode_reply, ensure_topics, make_consumer, stop_polling
from streams.edge.settings import EdgeOptions

log = logging.getLogger(__name__)

# The rag service's answers arrive here too: SearchResults and IndexState end a stream, Retrieved precedes a grounded
# request's engine events.
ReplyEventT = TokenChunk | Completion | ErrorEvent | SearchResults | IndexState | Retrieved
# Request ids already cancelled as orphans (see ReplyRouter._orphaned), newest last.
_REMEMBERED_ORPHANS = 10_000


class ReplyTimeout(Exception):
    """No final event arrived before the request's deadline (plus grace)."""


@dataclass
class RouterStats:
    delivered: int = 0
    unknown: int = 0
    undecodable: int = 0
    duplicates: int = 0
    diverged: int = 0


class ReplyRouter:
    """Consumes this edge's reply topic and dispatches events to in-flight requests by request_id."""

    def __init__(self, settings: EdgeOptions, *, seen_capacity: int = 10_000) -> None:
        self.settings = settings
        self.topic = settings.catalog.replies(settings.edge_id)
        self._inflight: dict[str, asyncio.Queue[ReplyEventT]] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task | None = None
        self.stats = RouterStats()
        # request_ids of every event this router read, newest last (diagnostics; tests check routing with it).
        self.seen: collections.deque[str] = collections.deque(maxlen=seen_capacity)
        self.started = asyncio.Event()
        self.last_poll_ok: float = 0.0
        # Called with (request_id, reason) when the edge gives up on a request whose worker still runs it
        # (a diverged regeneration); the Edge sets it to publish a CancelRequest.
        self.on_abandon: Callable[[str, str], None] | None = None
        self._orphans: collections.OrderedDict[str, None] = collections.OrderedDict()

    @property
    def reply_topic(self) -> str:
        return self.topic.name

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    async def start(self) -> None:
        s = self.settings
        await ensure_topics(
            s.kafka, [self.topic],
            replication_factor=s.kafka.replication_factor, min_insync_replicas=s.kafka.min_insync_replicas,
            client_id=f"{s.client_id}-{s.edge_id}-admin",
        )
        consumer = make_consumer(
            s.kafka,
            client_id=f"{s.client_id}-{s.edge_id}-replies",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="latest",
            isolation_level="read_committed",
        )
        try:
            await consumer.start()
            tp = TopicPartition(self.topic.name, 0)
            consumer.assign([tp])
            await consumer.seek_to_end(tp)
            # Resolve the position now: replies to requests published after this point cannot be skipped.
            position = await consumer.position(tp)
        except BaseException:
            await consumer.stop()
            raise
        log.info("reply router for edge %s reading %s from offset %d", s.edge_id, self.topic.name, position)
        self._consumer = consumer
        self.last_poll_ok = time.monotonic()
        self._task = asyncio.create_task(self._run(), name=f"reply-router-{s.edge_id}")
        self.started.set()

    async def stop(self) -> None:
        task, consumer, self._task, self._consumer = self._task, self._consumer, None, None
        await stop_polling(task, consumer)
        self.started.clear()

    def open(self, request_id: str, *, deadline: float | None = None, grace_s: float | None = None) -> "ReplyStream":
        """Register a request; call before publishing it. Close the stream (or use it as a context manager) when done."""
        if request_id in self._inflight:
            raise ValueError(f"request {request_id!r} is already in flight on this edge")
        queue: asyncio.Queue[ReplyEventT] = asyncio.Queue()
        self._inflight[request_id] = queue
        grace = self.settings.edge.deadline_grace_s if grace_s is None else grace_s
        return ReplyStream(self, request_id, queue, deadline=deadline, grace_s=grace)

    def _close(self, request_id: str) -> None:
        self._inflight.pop(request_id, None)

    async def _run(self) -> None:
        assert self._consumer is not None
        consumer = self._consumer
        while True:
            try:
                batches = await consumer.getmany(timeout_ms=1000)
            except asyncio.CancelledError:
                raise
            except KafkaError as exc:
                log.warning("reply router: fetch failed (%s); retrying", exc)
                await asyncio.sleep(0.5)
                continue
            self.last_poll_ok = time.monotonic()
            for messages in batches.values():
                for message in messages:
                    self.dispatch(message.value, offset=message.offset)

    def _orphaned(self, request_id: str) -> None:
        """A worker is still generating a request nobody here waits for: one whose client went away, a redelivered
        copy of one already answered, or one sent by this edge before it restarted. Cancel it once."""
        if request_id in self._orphans or self.on_abandon is None:
            return
        self._orphans[request_id] = None
        while len(self._orphans) > _REMEMBERED_ORPHANS:
            self._orphans.popitem(last=False)
        self.on_abandon(request_id, "no client waits for it at this edge")

    def dispatch(self, value: bytes | None, *, offset: int = -1) -> None:
        """Route one raw reply message to its request's queue."""
        if value is None:
            return
        try:
            event = decode_reply(value)
        except ValidationError as exc:
            self.stats.undecodable += 1
            log.warning("reply router: undecodable event at %s@%d dropped: %s", self.topic.name, offset, exc.errors()[:1])
            return
        request_id = event.request_id
        if request_id is None:
            self.stats.undecodable += 1
            log.warning("reply router: error event without request_id at offset %d: %s %s", offset, event.code, event.message)
            return
        self.seen.append(request_id)
        queue = self._inflight.get(request_id)
        if queue is None:
            self.stats.unknown += 1
            log.debug("reply router: dropping %s for unknown request %s (offset %d)", event.type, request_id, offset)
            if isinstance(event, TokenChunk) and event.finish_reason is None:
                self._orphaned(request_id)
            return
        self.stats.delivered += 1
        queue.put_nowait(event)


class ReplyStream:
    """The events of one request, in order, ending with its Completion or ErrorEvent."""

    def __init__(
        self, router: ReplyRouter, request_id: str, queue: asyncio.Queue[ReplyEventT],
        *, deadline: float | None, grace_s: float,
    ) -> None:
        self.router = router
        self.request_id = request_id
        self._queue = queue
        self.deadline = deadline
        self.grace_s = grace_s
        self.forwarded = Forwarded(request_id)
        self.final: Completion | ErrorEvent | SearchResults | IndexState | None = None
        self.retrieved: Retrieved | None = None  # the passages a grounded chat request was given
        self.closed = False
        # Called once, when the final event arrives or the stream closes without one (the edge's relay span ends).
        self.on_end: Callable[[], None] | None = None

    @property
    def finished(self) -> bool:
        return self.final is not None

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.router._close(self.request_id)
            self._ended()

    def _ended(self) -> None:
        if self.on_end is not None:
            on_end, self.on_end = self.on_end, None
            on_end()

    def __enter__(self) -> "ReplyStream":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def _get(self) -> ReplyEventT:
        if self.deadline is None:
            return await self._queue.get()
        remaining = self.deadline + self.grace_s - time.time()
        if remaining <= 0 and self._queue.empty():
            raise ReplyTimeout(f"no reply for request {self.request_id} before its deadline")
        try:
            return await asyncio.wait_for(self._queue.get(), timeout=max(remaining, 0.001))
        except TimeoutError:
            raise ReplyTimeout(f"no reply for request {self.request_id} before its deadline") from None

    @property
    def next_index(self) -> int:
        """Index of the next chunk the client will receive (chunks forwarded so far)."""
        return self.forwarded.chunks

    async def events(self) -> AsyncIterator[ReplyEventT]:
        """Yield the chunks the client has not seen yet (indexes 0, 1, 2, ...), then the final event; then stop."""
        while self.final is None:
            event = await self._get()
            duplicates = self.forwarded.duplicates
            if isinstance(event, Retrieved):
                self.retrieved = event
                continue
            try:
                if isinstance(event, TokenChunk):
                    fresh = self.forwarded.chunk(event)
                    self.router.stats.duplicates += self.forwarded.duplicates - duplicates
                    if fresh is not None:
                        yield fresh
                    continue
                if isinstance(event, Completion):
                    tail, event = self.forwarded.completion(event)
                    if tail is not None:
                        yield tail
            except Diverged as diverged:
                self.router.stats.diverged += 1
                log.error("request %s: %s", self.request_id, diverged)
                if self.router.on_abandon is not None:
                    self.router.on_abandon(self.request_id, "regeneration diverged")
                event = diverged.event()
            self.final = event
            self._ended()
            yield event
        self.close()

    def __aiter__(self) -> AsyncIterator[ReplyEventT]:
        return self.events()
