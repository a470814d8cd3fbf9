"""What a rollout watches on the bus: which pool each request went to, how each was answered, the candidate's dead
letters and whether its workers are alive.

* attribution: the stable and the candidate request topics, read from their ends at the start (so exactly the
  requests published since), request id -> pool;
* answers: every edge's reply topic (``<prefix>.replies.*``, by pattern; new edges included), their final events
  (Completion, ErrorEvent) filed under the pool of their request;
* dead letters: the candidate's ``<candidate>.dead-letters`` grown since the start;
* liveness: the candidate's announcements (``engine-worker`` on its services topic, or its workers topic).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import BaseModel, ValidationError

from schemas.events import Completion, ErrorEvent, GenerateRequest, ServiceAnnouncement
from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.kafka.connection import Connectable
from streams.ops.lag import ENGINE_WORKER
from streams.ops.rollout_gates import PoolStats


@dataclass
class Window:
    candidate: PoolStats = field(default_factory=PoolStats)
    stable: PoolStats = field(default_factory=PoolStats)
    dead_letters_at_start: int = 0


class RolloutWatch:
    def __init__(self, kafka: Connectable, stable: TopicCatalog, candidate: TopicCatalog) -> None:
        self.kafka = kafka
        self.stable, self.candidate = stable, candidate
        self.pool_of: dict[str, str] = {}
        self.window = Window()
        self.baseline = PoolStats()  # stable over the whole rollout: a baseline for the 100 % step
        # Answers read before their request, kept 30 s (a request from before the start is never attributed).
        self._unattributed: list[tuple[float, Completion | ErrorEvent]] = []
        self._requests: AIOKafkaConsumer | None = None
        self._replies: AIOKafkaConsumer | None = None
        self._probe: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        """Start, or stop what was started and raise: a start that failed on a broker going down may be tried again."""
        try:
            await self._start()
        except BaseException:
            await self.stop()
            raise

    async def _start(self) -> None:
        self._probe = clients.make_consumer(self.kafka, enable_auto_commit=False)
        await self._probe.start()
        self._requests = clients.make_consumer(self.kafka, enable_auto_commit=False)
        await self._requests.start()
        tps = []
        for catalog in (self.stable, self.candidate):
            topic = catalog.requests.name
            partitions = self._requests.partitions_for_topic(topic)
            if not partitions:
                await self._requests._client.force_metadata_update()  # noqa: SLF001 - no public refresh
                partitions = self._requests.partitions_for_topic(topic)
            if not partitions:
                raise KafkaError(f"topic {topic} does not exist")
            tps += [TopicPartition(topic, p) for p in sorted(partitions)]
        self._requests.assign(tps)
        await self._requests.seek_to_end(*tps)
        self._replies = clients.make_consumer(self.kafka, enable_auto_commit=False, auto_offset_reset="latest",
                                               metadata_max_age_ms=5000)
        await self._replies.start()
        self._replies.subscribe(pattern=f"^{re.escape(self.stable.replies('').name)}.*")

    async def stop(self) -> None:
        consumers = (self._requests, self._replies, self._probe)
        self._requests = self._replies = self._probe = None
        for consumer in consumers:
            if consumer is not None:
                await consumer.stop()

    async def new_window(self) -> None:
        self.window = Window(dead_letters_at_start=await self._dead_letter_end())

    async def poll(self, timeout_s: float = 0.2) -> None:
        """File what arrived; waits up to ``timeout_s`` for replies."""
        assert self._requests is not None and self._replies is not None
        for tp, records in (await self._requests.getmany(timeout_ms=0)).items():
            pool = "candidate" if tp.topic == self.candidate.requests.name else "stable"
            for record in records:
                request_id = _request_id(record.value)
                if request_id is not None:
                    self.pool_of[request_id] = pool
        now = time.monotonic()
        waiting, self._unattributed = self._unattributed, []
        for until, event in waiting:
            if now < until:
                self._file(event, until)
        for records in (await self._replies.getmany(timeout_ms=int(timeout_s * 1000))).values():
            for record in records:
                self._file_reply(record.value)

    def _file_reply(self, value: bytes | None) -> None:
        if not value:
            return
        try:
            event: BaseModel = clients.decode_reply(value)
        except (ValidationError, ValueError):
            return
        if isinstance(event, (Completion, ErrorEvent)) and event.request_id is not None:
            self._file(event)

    def _file(self, event: Completion | ErrorEvent, until: float | None = None) -> None:
        pool = self.pool_of.get(event.request_id or "")
        if pool is None:
            self._unattributed.append((until or time.monotonic() + 30.0, event))
        elif pool == "candidate":
            self.window.candidate.add(event)
        elif pool == "stable":
            self.window.stable.add(event)
            self.baseline.add(event)

    async def dead_letters(self) -> int:
        return await self._dead_letter_end() - self.window.dead_letters_at_start

    async def _dead_letter_end(self) -> int:
        assert self._probe is not None
        tp = TopicPartition(self.candidate.dead_letters.name, 0)
        if tp.topic not in await self._probe.topics():
            return 0
        return (await self._probe.end_offsets([tp]))[tp]

    async def candidate_ready(self, stale_after_s: float) -> bool:
        """A candidate worker announced itself ready within the last ``stale_after_s`` seconds."""
        now = time.time()
        existing = await clients.list_topics(self.kafka)
        topic = self.candidate.services.name
        if topic not in existing:
            return False
        newest: dict[str, bytes] = {}
        for record in await clients.read_partition(self.kafka, topic, timeout_s=5.0):
            if record.value and record.key:
                newest[record.key.decode(errors="replace")] = record.value
        for raw in newest.values():
            try:
                a = clients.decode(raw, ServiceAnnouncement)
            except (ValidationError, ValueError):
                continue
            if a.kind == ENGINE_WORKER and a.state == "ready" and now - a.at <= stale_after_s:
                return True
        return False


def _request_id(value: bytes | None) -> str | None:
    if not value:
        return None
    try:
        return clients.decode(value, GenerateRequest).request_id
    except (ValidationError, ValueError):
        return None
