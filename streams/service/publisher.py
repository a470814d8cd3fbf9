"""Publishing a consumer's outcomes: one ordered lane per topic.

Events of one request must reach its reply topic in the order they were
produced, and a slow or missing topic (a metadata wait) must hold up only its
own events. So each topic gets a lane: a queue drained by one task, which hands
each event to the producer (FastStream's ``publish`` with ``no_confirm``: it
returns once the record is in the producer's buffer, which fixes its order) and
chains the broker's acknowledgement to the future the caller holds. Offsets are
committed only once those futures resolve (:mod:`streams.service.delivery`).
"""
from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from streams import kafka_io

JSON_HEADERS = {"content-type": "application/json"}

# (value, topic, key, partition) -> a future resolved by the broker's acknowledgement.
Send = Callable[[bytes, str, bytes, int | None], Awaitable[asyncio.Future[Any]]]


@dataclass
class _Job:
    topic: str
    partition: int | None
    key: bytes
    value: bytes
    delivered: asyncio.Future[Any]


@dataclass
class _Lane:
    queue: collections.deque[_Job] = field(default_factory=collections.deque)
    task: asyncio.Task[None] | None = None


class Publisher:
    def __init__(self, send: Send) -> None:
        self._send = send
        self._lanes: dict[str, _Lane] = {}

    def publish(self, topic: str, partition: int | None, key: bytes, event: BaseModel) -> asyncio.Future[Any]:
        """Queue one event; the returned future resolves when Kafka acknowledged it (or fails with the error)."""
        delivered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        lane = self._lanes.get(topic)
        if lane is None:
            lane = self._lanes[topic] = _Lane()
            lane.task = asyncio.create_task(self._run(topic, lane), name=f"lane-{topic}")
        lane.queue.append(_Job(topic, partition, key, kafka_io.encode(event), delivered))
        return delivered

    async def _run(self, topic: str, lane: _Lane) -> None:
        while lane.queue:
            job = lane.queue.popleft()
            try:
                ack = await self._send(job.value, job.topic, job.key, job.partition)
            except Exception as error:  # noqa: BLE001 - reported through the job's future
                if not job.delivered.done():
                    job.delivered.set_exception(error)
                continue
            ack.add_done_callback(lambda fut, done=job.delivered: _chain(fut, done))
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
