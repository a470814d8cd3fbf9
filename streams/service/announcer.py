"""Announcements: every service says who it is and what state it is in, on one compacted services topic.

``starting`` before it reads anything, ``ready`` once it serves (and again every
heartbeat, so readers can tell a live service from one that died), ``draining``
at shutdown, ``stopped`` at the end. Keyed by ``<kind>/<service_id>``, so
compaction keeps each service's newest state. The edge's ``/readyz``,
``specstream status`` and the autoscaler read them, whatever the kind.
Announcing is best effort and bounded: a broker that is gone must not hold up a
shutdown, and the next heartbeat retries.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from schemas.events import ServiceAnnouncement
from streams.kafka import clients

log = logging.getLogger(__name__)

ANNOUNCE_TIMEOUT_S = 3.0

State = Literal["starting", "ready", "draining", "stopped"]
# (topic, key, value) -> once Kafka has it.
Send = Callable[[str, bytes, bytes], Awaitable[Any]]


def announcement_key(kind: str, service_id: str) -> bytes:
    return f"{kind}/{service_id}".encode()


class Announcer:
    def __init__(self, send: Send, topic: str, *, kind: str, service_id: str, heartbeat_s: float,
                 models: Callable[[], list[str]] = list, in_flight: Callable[[], int] = lambda: 0,
                 metrics_url: str | None = None) -> None:
        self._send = send
        self.topic = topic
        self.kind = kind
        self.service_id = service_id
        self.heartbeat_s = heartbeat_s
        self._models = models
        self._in_flight = in_flight
        self.metrics_url = metrics_url  # set once the service's metrics server is up
        # More fields of the announcement, set by the service (an engine worker's LoRA adapters).
        self.extra: Callable[[], dict[str, Any]] = dict
        self.started_at = time.time()
        self.state: State = "starting"
        self._heartbeat: asyncio.Task[None] | None = None
        self.muted: str | None = None  # why announcing stopped (its topic is gone); None: announcing

    def current(self) -> ServiceAnnouncement:
        return ServiceAnnouncement(
            kind=self.kind, service_id=self.service_id, state=self.state, host=socket.gethostname(), pid=os.getpid(),
            started_at=self.started_at, in_flight=self._in_flight(), models=self._models(),
            metrics_url=self.metrics_url, at=time.time(), **self.extra(),
        )

    def mute(self, reason: str) -> None:
        """Announce nothing more: a send to a topic that is gone could only wait out ANNOUNCE_TIMEOUT_S."""
        self.muted = reason
        log.info("%s %s: no more announcements: %s", self.kind, self.service_id, reason)

    async def announce(self, state: State | None = None) -> None:
        if state is not None:
            self.state = state
        if self.muted is not None:
            return
        value = clients.encode(self.current())
        try:
            await asyncio.wait_for(self._send(self.topic, announcement_key(self.kind, self.service_id), value),
                                   timeout=ANNOUNCE_TIMEOUT_S)
        except Exception as error:  # noqa: BLE001 - best effort; the next heartbeat retries
            log.warning("%s %s: could not announce %s: %r", self.kind, self.service_id, self.state, error)

    def start_heartbeat(self) -> None:
        if self._heartbeat is None:
            self._heartbeat = asyncio.create_task(self._beat(), name=f"announce-{self.kind}-{self.service_id}")

    def stop_heartbeat(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            self._heartbeat = None

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_s)
            await self.announce()
