"""Readiness: is there anyone to serve a request this edge would publish?

The edge is ready when (1) it is connected to Kafka, with its reply router
running, and (2) at least one engine worker serving one of the edge's models
announced ``state="ready"`` recently, i.e. its last announcement on the
compacted services topic is no older than ``ready_heartbeats`` heartbeat
intervals (3 x 5 s by default). Every service announces there on start, every
heartbeat, and on shutdown (``draining``/``stopped``), so a worker that stops
cleanly is dropped at once and one that dies is dropped after a few missed
heartbeats; announcements of other kinds (edges, other consumers) are kept but
do not make the edge ready.

A background consumer is *assigned* the services topic's partitions from the
beginning (compaction keeps the newest announcement of every service) and keeps
the newest announcement per ``<kind>/<service_id>``; a tombstone (empty value)
removes the service. Kafka reachability is checked with a metadata request, cached for
a second so /readyz can be polled freely.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Literal

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import BaseModel, ConfigDict, ValidationError

from schemas.events import ENGINE_WORKER_KIND, ServiceAnnouncement
from streams.edge.settings import EdgeOptions
from streams.kafka.clients import decode, make_consumer, stop_polling

log = logging.getLogger(__name__)


class Health(BaseModel):
    """``GET /healthz``: the edge process is up."""

    status: Literal["ok"]
    edge_id: str


class Readiness(BaseModel):
    """``GET /readyz``: whether the edge can serve (503 with ``reason`` when not)."""

    model_config = ConfigDict(extra="allow")

    ready: bool
    reason: str | None = None
    edge_id: str


@dataclass(frozen=True)
class ReadyState:
    ready: bool
    reason: str
    workers: tuple[str, ...] = ()
    models: tuple[str, ...] = ()

    def body(self) -> dict:
        return {"ready": self.ready, "reason": self.reason, "workers": list(self.workers), "models": list(self.models)}


class ReadinessWatch:
    def __init__(self, settings: EdgeOptions) -> None:
        self.settings = settings
        self.topic = settings.catalog.services.name
        self.services: dict[str, ServiceAnnouncement] = {}  # by <kind>/<service_id>, the key on the topic
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
                self.services.pop(key.decode(errors="replace"), None)
            return
        try:
            announcement = decode(value, ServiceAnnouncement)
        except ValidationError as exc:
            log.warning("readiness: undecodable service announcement dropped: %s", exc.errors()[:1])
            return
        name = f"{announcement.kind}/{announcement.service_id}"
        previous = self.services.get(name)
        if previous is None or announcement.at >= previous.at:
            self.services[name] = announcement

    def workers(self) -> list[ServiceAnnouncement]:
        return [s for s in self.services.values() if s.kind == ENGINE_WORKER_KIND]

    def live_workers(self, now: float | None = None) -> list[ServiceAnnouncement]:
        """Engine workers that announced ready recently and serve one of this edge's models."""
        now = time.time() if now is None else now
        models = set(self.settings.models)
        return [
            w for w in self.workers()
            if w.state == "ready" and now - w.at <= self.max_age_s and models.intersection(w.models)
        ]

    def adapters(self) -> dict[str, str]:
        """LoRA adapters live workers serve on this edge's models: name -> base model."""
        models = set(self.settings.models)
        return {name: parent for w in self.live_workers() for name, parent in w.adapters.items() if parent in models}

    def adapter_error(self, command_id: str) -> str | None:
        """Why a worker failed the adapter load command `command_id` (None: no worker reported a failure)."""
        for w in self.workers():
            if command_id in w.adapter_errors:
                return f"{w.service_id}: {w.adapter_errors[command_id]}"
        return None

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
            known = ", ".join(f"{w.service_id}={w.state} serving {'/'.join(w.models) or 'nothing'}"
                              for w in self.workers()) or "none announced"
            return ReadyState(
                False, f"no worker announced ready for {', '.join(self.settings.models)} in the last "
                f"{self.max_age_s:g} s (workers: {known})",
            )
        models = sorted({m for w in live for m in w.models})
        return ReadyState(True, "ok", tuple(w.service_id for w in live), tuple(models))


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
