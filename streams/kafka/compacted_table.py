"""A compacted topic followed from its beginning as a table: key -> the record kept for it; a tombstone removes the key.

One follower for every such topic (documents, vector stores, files, batches, rollouts), so they agree on what
"caught up" means and on what a broker outage does: the table keeps serving its last known rows and retries,
warning at most once a minute. What a newly read record does to the row held is its topic's :class:`Policy`:
replace it (files), keep the newest by a stamp (documents and stores by ``updated_at``, rollouts by ``at``), or
merge the two (batches, whose writers must never undo each other). A record that does not decode is skipped.

``loaded`` is set once the table holds everything the topic had when the follower assigned it; ``caught_up()``
waits until it holds everything published before the call (read-your-writes: what a reader needs before
deciding on a key). ``find()`` is the lookup by key that holds across processes: a key missing from the table may
have been written a moment ago by another process (another edge behind the same load balancer), so a miss first
catches up, once and bounded, and only then says "no such key". Concurrent callers share one end-offsets request.

The end offsets ``caught_up()`` compares against are asked through a second, never-assigned consumer: the broker
answers one connection's requests in order, so asked through the follower's own connection the question would
queue behind its pending fetch, which an idle topic holds open for the whole ``fetch_max_wait_ms`` (500 ms a call,
every vector-store request at the edge paying it twice).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import BaseModel, ValidationError

from schemas.topics import Topic
from streams.kafka import clients
from streams.kafka.connection import Connectable

log = logging.getLogger(__name__)

RowT = TypeVar("RowT", bound=BaseModel)
T = TypeVar("T")
POLL_MS = 200
RETRY_S = 1.0
WARN_EVERY_S = 60.0
TOPIC_LOOK_S = 2.0
# How long ``find()`` may catch up on a miss before giving up (TimeoutError: the caller's "unavailable", not a 404).
# A healthy broker answers in milliseconds; the bound is what a truly unknown key costs when it is slow, kept
# well under a client's timeout. No settings section owns the tables' timings, so it is a constant.
FIND_CATCH_UP_S = 2.5


@dataclass(frozen=True)
class Policy(Generic[RowT]):
    """What a record read for a key does to the row held for it."""

    # The row to hold after reading ``new`` on top of ``held``; None: ignore ``new``.
    combine: Callable[[RowT | None, RowT], RowT | None]
    # When set, a record stamped at or before its key's tombstone (Kafka's clock) does not bring the key back:
    # one writer finishing late on something another writer deleted meanwhile.
    stamp: Callable[[RowT], float] | None = None


def replace() -> Policy[Any]:
    """The record read last wins: the topic has one writer per key, or its writers never race."""
    return Policy(lambda held, new: new)


def newest_by(stamp: Callable[[RowT], float]) -> Policy[RowT]:
    """Keep the record with the newest stamp (ties: the one read last), whatever order writers' records land in."""
    return Policy(lambda held, new: new if held is None or stamp(new) >= stamp(held) else None, stamp)


def merged(merge: Callable[[RowT | None, RowT], RowT]) -> Policy[RowT]:
    """Hold ``merge(held, new)``: every writer's record adds to what is known, none undoes another's."""
    return Policy(merge)


def _updated_at(row: BaseModel) -> float:
    return float(getattr(row, "updated_at", 0.0))


class _Warner:
    """A failing broker would warn every poll: say it once per minute."""

    def __init__(self) -> None:
        self._last = -WARN_EVERY_S

    def __call__(self, message: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last >= WARN_EVERY_S:
            self._last = now
            log.warning(message, *args)


class CompactedTable(Generic[RowT]):
    def __init__(self, kafka: Connectable, topic: Topic, model: type[RowT], *,
                 policy: Policy[RowT] | None = None,
                 key_of: Callable[[RowT], str] | None = None,
                 on_change: Callable[[str, RowT | None], None] | None = None,
                 create_topic: bool = True, wait_for_topic: bool = False) -> None:
        """``key_of``: a row's key, when its own field rather than the record's key names it. ``create_topic``:
        create it at start (a process that may not create topics passes False); ``wait_for_topic``: a topic
        that does not exist yet is looked for every 2 s (the rows stay empty, ``loaded`` unset, meanwhile)."""
        self.kafka = kafka
        self.topic = topic
        self.model = model
        self.policy: Policy[RowT] = policy or newest_by(_updated_at)
        self.key_of = key_of
        self.on_change = on_change
        self.create_topic = create_topic
        self.wait_for_topic = wait_for_topic
        self.rows: dict[str, RowT] = {}
        self.deleted_at: dict[str, float] = {}  # key -> time of its tombstone (Kafka's clock)
        self.loaded = asyncio.Event()
        self._consumer: AIOKafkaConsumer | None = None
        self._ends: AIOKafkaConsumer | None = None  # asks for end offsets only (see the module's docstring)
        self._task: asyncio.Task[None] | None = None
        self._partitions: list[TopicPartition] = []
        self._warn = _Warner()
        self._asking = asyncio.Lock()  # one end-offsets request in flight at a time
        self._next_ends: asyncio.Future[dict[TopicPartition, int]] | None = None  # the one callers now share
        self._asks: set[asyncio.Task[None]] = set()

    # --- lifecycle ---------------------------------------------------------------------------------------------

    async def start(self, *, wait: bool = True) -> None:
        """Start following; with ``wait``, return once the table is ``loaded`` (else it loads in the background)."""
        if self.create_topic:
            await clients.ensure_topics(self.kafka, [self.topic])
        self._consumer = clients.make_consumer(self.kafka, enable_auto_commit=False, auto_offset_reset="earliest")
        self._ends = clients.make_consumer(self.kafka, enable_auto_commit=False)
        await self._consumer.start()
        await self._ends.start()
        self._task = asyncio.create_task(self._run(), name=f"table-{self.topic.name}")
        if wait:
            await self.caught_up()

    async def stop(self) -> None:
        asks = list(self._asks)
        for ask in asks:
            ask.cancel()
        await asyncio.gather(*asks, return_exceptions=True)
        if self._next_ends is not None:  # its request was cancelled before it began: its waiters stop waiting
            self._next_ends.cancel()
            self._next_ends = None
        await clients.stop_polling(self._task, self._consumer)
        if self._ends is not None:
            await self._ends.stop()
        self._task, self._consumer, self._ends, self._partitions = None, None, None, []
        self.loaded.clear()

    async def caught_up(self, timeout_s: float = 30.0) -> None:
        """Wait until everything published before this call is in the table (TimeoutError past ``timeout_s``)."""
        assert self._ends is not None, "start() first"
        deadline = time.monotonic() + timeout_s

        async def loaded() -> bool:
            return self.loaded.is_set()

        await self._until(loaded, deadline)
        try:
            ends = await asyncio.wait_for(asyncio.shield(self._ends_from_now()), max(deadline - time.monotonic(), 0))
        except TimeoutError:
            raise TimeoutError(f"{self.topic.name}: no end offsets in time") from None
        await self._until(lambda: self._reached(ends), deadline)

    def _ends_from_now(self) -> asyncio.Future[dict[TopicPartition, int]]:
        """End offsets asked after this call. Concurrent callers share one request (a burst of lookups is one
        question to the broker, not a herd); a caller arriving once a request is sent waits for the next one,
        since the one in flight may have been answered before the write that caller is looking for."""
        if self._next_ends is None:
            answer: asyncio.Future[dict[TopicPartition, int]] = asyncio.get_running_loop().create_future()
            answer.add_done_callback(lambda f: f.cancelled() or f.exception())  # every waiter may have timed out
            self._next_ends = answer
            ask = asyncio.create_task(self._ask_ends(answer), name=f"table-{self.topic.name}-ends")
            self._asks.add(ask)
            ask.add_done_callback(self._asks.discard)
        return self._next_ends

    async def _ask_ends(self, answer: asyncio.Future[dict[TopicPartition, int]]) -> None:
        try:
            async with self._asking:
                self._next_ends = None  # sent from here on: later callers share the next request
                assert self._ends is not None, "start() first"
                answer.set_result(await self._ends.end_offsets(self._partitions))
        except Exception as error:  # the broker's error is every waiter's
            answer.set_exception(error)
        finally:
            if self._next_ends is answer:  # stopped before it was sent: the next caller asks afresh
                self._next_ends = None
            if not answer.done():
                answer.cancel()

    async def _until(self, done: Callable[[], Awaitable[bool]], deadline: float) -> None:
        while not await done():
            if self._task is not None and self._task.done():
                self._task.result()  # the follower died: raise its error here
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.topic.name}: not caught up in time")
            await asyncio.sleep(0.02)

    # --- reading -----------------------------------------------------------------------------------------------

    def get(self, key: str) -> RowT | None:
        """The row held now: what this process has read so far (see ``find`` for a lookup by an id a client gave)."""
        return self.rows.get(key)

    async def find(self, key: str, timeout_s: float = FIND_CATCH_UP_S) -> RowT | None:
        """The row of ``key``, read-your-writes across processes: on a miss, catch up with the topic once and look
        again, so None means the topic had no such key when this was called. TimeoutError when the catch-up does
        not finish within ``timeout_s`` (the broker is slow or gone: unknown, not absent)."""
        row = self.rows.get(key)
        if row is None:
            await self.caught_up(timeout_s)
            row = self.rows.get(key)
        return row

    def values(self) -> list[RowT]:
        return list(self.rows.values())

    # --- following ---------------------------------------------------------------------------------------------

    async def _run(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        ends = await self._retrying(self._assign)
        while True:
            batches = await self._retrying(lambda: consumer.getmany(timeout_ms=POLL_MS))
            for records in batches.values():
                for record in records:
                    if record.key is not None:
                        self.apply(record.key.decode(errors="replace"), record.value, record.timestamp / 1000)
            if not self.loaded.is_set() and await self._retrying(lambda: self._reached(ends)):
                self.loaded.set()

    async def _retrying(self, step: Callable[[], Awaitable[T]]) -> T:
        """Run ``step`` until the broker answers: meanwhile the table serves its last known rows."""
        while True:
            try:
                return await step()
            except KafkaError as error:
                self._warn("%s: cannot read (%s); serving the last known rows, retrying", self.topic.name, error)
                await asyncio.sleep(RETRY_S)

    async def _assign(self) -> dict[TopicPartition, int]:
        """Assign every partition from its beginning; the end offsets then are what ``loaded`` waits for."""
        consumer = self._consumer
        assert consumer is not None
        name = self.topic.name
        while self.wait_for_topic and name not in await consumer.topics():
            await asyncio.sleep(TOPIC_LOOK_S)
            await consumer._client.force_metadata_update()  # aiokafka has no public metadata refresh
        numbers = consumer.partitions_for_topic(name) or set(range(self.topic.partitions))
        self._partitions = [TopicPartition(name, p) for p in sorted(numbers)]
        consumer.assign(self._partitions)
        await consumer.seek_to_beginning(*self._partitions)
        return await consumer.end_offsets(self._partitions)

    async def _reached(self, ends: dict[TopicPartition, int]) -> bool:
        """By position, not by the last record's offset: compaction may have removed the records before the end."""
        assert self._consumer is not None
        return all([await self._consumer.position(tp) >= end for tp, end in ends.items()])

    # --- applying ----------------------------------------------------------------------------------------------

    def apply(self, key: str, value: bytes | None, at: float) -> None:
        """A record read from the topic: its key, its value (None: a tombstone), its time (Kafka's clock, s)."""
        if value is None:
            self.deleted_at[key] = at
            if self.rows.pop(key, None) is not None:
                self._changed(key, None)
            return
        try:
            row = clients.decode(value, self.model)
        except (ValidationError, ValueError) as error:  # a newer writer's record, or a broken one: skip it
            log.warning("%s: record of %s skipped: %s", self.topic.name, key, error)
            return
        key = self.key_of(row) if self.key_of is not None else key
        if self._revives(key, row):
            return
        kept = self.put(key, row)
        if kept is not None:
            self._changed(key, kept)

    def put(self, key: str, row: RowT) -> RowT | None:
        """Combine ``row`` into the table by the policy (read from the topic, or just written by this process, for
        read-your-writes); returns the row now held, or None when ``row`` was ignored."""
        kept = self.policy.combine(self.rows.get(key), row)
        if kept is not None:
            self.rows[key] = kept
        return kept

    def delete(self, key: str) -> None:
        """Forget a key this process just deleted (its tombstone reaches the other readers through the topic)."""
        self.rows.pop(key, None)

    def _revives(self, key: str, row: RowT) -> bool:
        stamp = self.policy.stamp
        return stamp is not None and key in self.deleted_at and stamp(row) <= self.deleted_at[key]

    def _changed(self, key: str, row: RowT | None) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change(key, row)
        except Exception:  # a reader's bug must not stop the table for every other reader
            log.exception("%s: on_change of %s failed", self.topic.name, key)


class BackgroundView(Generic[RowT]):
    """A process's view of a compacted topic that loads in the background, so the process starts at once and
    answers "not yet" (503, or waiting) until ``caught_up`` is set; its subclasses name the rows for their callers."""

    def __init__(self, table: CompactedTable[RowT]) -> None:
        self.table = table
        self.kafka = table.kafka
        self.topic = table.topic

    @property
    def caught_up(self) -> asyncio.Event:
        """Set once the view holds what the topic had when it started following."""
        return self.table.loaded

    async def find(self, key: str) -> RowT | None:
        """The row of ``key``, caught up with the topic on a miss (:meth:`CompactedTable.find`)."""
        return await self.table.find(key)

    async def start(self) -> None:
        await self.table.start(wait=False)

    async def stop(self) -> None:
        await self.table.stop()
