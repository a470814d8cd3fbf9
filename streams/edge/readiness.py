"""Readiness: is there anyone to serve a request this edge would publish?

The edge is ready when (1) it is connected to Kafka, with its reply router
running, and (2) at least one worker announced ``state="ready"`` recently, i.e.
its last announcement on the compacted workers topic is no older than
``ready_heartbeats`` heartbeat intervals (3 x 5 s by default). Workers announce
on start, every heartbeat, and on shutdown (``draining``/``stopped``), so a
worker that stops cleanly is dropped at once and one that dies is dropped after
a few missed heartbeats.

A background consumer is *assigned* the workers topic's partitions from the
beginning (compaction keeps the newest announcement of every worker) and keeps
the newest announcement per ``worker_id``; a tombstone (empty value) removes
the worker. Kafka reachability is checked with a metadata request, cached for
a second so /readyz can be polled freely.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from schemas.events import WorkerAnnouncement
from streams.kafka_io import decode, make_consumer, stop_polling
from streams.edge.settings import EdgeOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReadyState:
    ready: bool
    reason: str
    workers: tuple[str, ...] = ()
    models: tuple[str, ...] = ()

    def body(self) -> dict:
        return {"ready": self.ready, "reason": self.reason, "workers": list(self.workers), "models": list(self.models)}


class Readiness:
    def __init__(self, settings: EdgeOptions) -> None:
        self.settings = settings
        self.topic = settings.catalog.workers.name
        self.workers: dict[str, WorkerAnnouncement] = {}
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task | None = None
        self._kafka_ok: tuple[float, bool, str] = (0.0, False, "not connected yet")
        self._probe_lock = asyncio.Lock()

    @property
    def max_age_s(self) -> float:
        return self.settings.heartbeat_s * self.settings.edge.ready_heartbeats

    async def start(self) -> None:
        s = self.settings
        consumer = make_consumer(
            s.kafka,
            client_id=f"{s.client_id}-{s.edge_id}-readiness",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        try:
            await consumer.start()
            partitions = await _wait_partitions(consumer, self.topic)
            tps = [TopicPartition(self.topic, p) for p in sorted(partitions)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
        except BaseException:
            await consumer.stop()
            raise
        self._consumer = consumer
        self._kafka_ok = (time.monotonic(), True, "")
        self._task = asyncio.create_task(self._run(), name=f"readiness-{s.edge_id}")

    async def stop(self) -> None:
        task, consumer, self._task, self._consumer = self._task, self._consumer, None, None
        await stop_polling(task, consumer)

    async def _run(self) -> None:
        assert self._consumer is not None
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=1000)
            except asyncio.CancelledError:
                raise
            except KafkaError as exc:
                log.warning("readiness: fetch from %s failed: %s", self.topic, exc)
                await asyncio.sleep(1.0)
                continue
            for messages in batches.values():
                for message in messages:
                    self.observe(message.key, message.value)

    def observe(self, key: bytes | None, value: bytes | None) -> None:
        if value is None:
            if key is not None:
                self.workers.pop(key.decode(errors="replace"), None)
            return
        try:
            announcement = decode(value, WorkerAnnouncement)
        except ValidationError as exc:
            log.warning("readiness: undecodable worker announcement dropped: %s", exc.errors()[:1])
            return
        previous = self.workers.get(announcement.worker_id)
        if previous is None or announcement.at >= previous.at:
            self.workers[announcement.worker_id] = announcement

    def live_workers(self, now: float | None = None) -> list[WorkerAnnouncement]:
        now = time.time() if now is None else now
        return [
            w for w in self.workers.values()
            if w.state == "ready" and now - w.at <= self.max_age_s
        ]

    async def kafka_reachable(self) -> tuple[bool, str]:
        """A metadata round trip to the cluster, at most once a second."""
        async with self._probe_lock:
            checked, ok, reason = self._kafka_ok
            if time.monotonic() - checked < 1.0:
                return ok, reason
            if self._consumer is None:
                ok, reason = False, "not connected to Kafka yet"
            else:
                try:
                    await asyncio.wait_for(self._consumer._client.fetch_all_metadata(), timeout=3.0)
                    ok, reason = True, ""
                except (KafkaError, TimeoutError, OSError) as exc:
                    ok, reason = False, f"Kafka at {self.settings.kafka.bootstrap_servers} unreachable: {exc or type(exc).__name__}"
            self._kafka_ok = (time.monotonic(), ok, reason)
            return ok, reason

    async def state(self, *, router_running: bool = True) -> ReadyState:
        ok, reason = await self.kafka_reachable()
        if not ok:
            return ReadyState(False, reason)
        if not router_running:
            return ReadyState(False, "reply router not running")
        live = self.live_workers()
        if not live:
            known = ", ".join(f"{w.worker_id}={w.state}" for w in self.workers.values()) or "none announced"
            return ReadyState(
                False, f"no worker announced ready in the last {self.max_age_s:g} s (workers: {known})",
            )
        models = sorted({m for w in live for m in w.models})
        return ReadyState(True, "ok", tuple(w.worker_id for w in live), tuple(models))


async def _wait_partitions(consumer: AIOKafkaConsumer, topic: str, timeout_s: float = 10.0) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        cluster = await consumer._client.fetch_all_metadata()
        partitions = cluster.partitions_for_topic(topic)
        if partitions:
            return set(partitions)
        if time.monotonic() > deadline:
            raise RuntimeError(f"topic {topic!r} has no partitions (does it exist?)")
        await asyncio.sleep(0.2)
