"""Publishing a consumer's outcomes: one ordered lane per topic, every publish bounded.

Events of one request must reach its reply topic in the order they were
produced, and a slow or missing topic (a metadata wait) must hold up only its
own events. So each topic gets a lane: a queue drained by one task, which hands
each event to the producer (FastStream's ``publish`` with ``no_confirm``: it
returns once the record is in the producer's buffer, which fixes its order) and
chains the broker's acknowledgement to the future the caller holds. Offsets are
committed only once those futures resolve (:mod:`streams.service.delivery`).

Every publish is bounded by ``publish_timeout_s``: the producer would wait for
a missing topic's metadata for its whole request timeout (40 s). A topic that
vanished (or a broker that stopped answering) thus costs its own lane a few
seconds, and later events for a topic known to be missing fail at once
(:class:`~streams.kafka.reply_routes.ReplyRoutes` caches what exists).
"""
from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiokafka.errors import KafkaError
from pydantic import BaseModel

from streams.kafka import clients
from streams.kafka.reply_routes import ReplyRoutes

JSON_HEADERS = {"content-type": "application/json"}

# (value, topic, key, partition, headers) -> a future resolved by the broker's acknowledgement.
Send = Callable[[bytes, str, bytes, int | None, Mapping[str, str]], Awaitable[asyncio.Future[Any]]]


class ReplyTopicGone(KafkaError):
    """A publish to a topic that a metadata look-up found missing (deleted since its request was checked)."""


def describe_error(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


@dataclass
class _Job:
    topic: str
    partition: int | None
    key: bytes
    value: bytes
    headers: Mapping[str, str]
    delivered: asyncio.Future[Any]

    def fail(self, error: BaseException) -> None:
        if not self.delivered.done():
            self.delivered.set_exception(error)


@dataclass
class _Lane:
    queue: collections.deque[_Job] = field(default_factory=collections.deque)
    task: asyncio.Task[None] | None = None


class Publisher:
    def __init__(self, send: Send, routes: ReplyRoutes, *, timeout_s: float) -> None:
        self._send = send
        self.routes = routes
        self.timeout_s = timeout_s
        self._lanes: dict[str, _Lane] = {}

    def publish(self, topic: str, partition: int | None, key: bytes, event: BaseModel,
                headers: Mapping[str, str] = JSON_HEADERS) -> asyncio.Future[Any]:
        """Queue one event; the returned future resolves when Kafka acknowledged it, or fails with why it was not
        (within ``timeout_s`` of its turn in the lane). ``headers``: the record's (content type, trace context)."""
        delivered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        lane = self._lanes.get(topic)
        if lane is None:
            lane = self._lanes[topic] = _Lane()
            lane.task = asyncio.create_task(self._run(topic, lane), name=f"lane-{topic}")
        lane.queue.append(_Job(topic, partition, key, clients.encode(event), headers, delivered))
        return delivered

    async def _run(self, topic: str, lane: _Lane) -> None:
        timeout_s = self.timeout_s
        loop = asyncio.get_running_loop()
        while lane.queue:
            job = lane.queue.popleft()
            if not await self.routes.exists(topic):
                job.fail(ReplyTopicGone(f"topic '{topic}' does not exist"))
                continue
            try:
                ack = await asyncio.wait_for(self._send(job.value, job.topic, job.key, job.partition, job.headers),
                                             timeout=timeout_s)
            except Exception as error:  # noqa: BLE001 - reported through the job's future
                self.routes.forget(topic)  # look it up again before the next publish
                job.fail(error if not isinstance(error, TimeoutError) else
                         TimeoutError(f"not accepted by the producer within {timeout_s:g} s"))
                continue
            ack.add_done_callback(lambda fut, done=job.delivered: _chain(fut, done))
            expiry = loop.call_later(timeout_s, job.fail,
                                     TimeoutError(f"not acknowledged by Kafka within {timeout_s:g} s"))
            job.delivered.add_done_callback(lambda _, timer=expiry: timer.cancel())
        # No await between the emptiness check and this: a job queued later starts a new lane.
        del self._lanes[topic]

    async def flush(self) -> None:
        """Until every queued event was handed to the producer."""
        while self._lanes:
            await asyncio.gather(*[lane.task for lane in self._lanes.values() if lane.task], return_exceptions=True)


def _chain(source: asyncio.Future[Any], target: asyncio.Future[Any]) -> None:
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif source.exception() is not None:
        target.set_exception(source.exception())  # type: ignore[arg-type]
    else:
        target.set_result(source.result())
