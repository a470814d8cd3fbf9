"""Back-pressure and partition ownership of a consumer's input.

A service holds at most ``max_inflight`` messages; when every slot is taken it
pauses its input partitions, so a burst waits in Kafka, not in the process, and
resumes as soon as a slot is free. Rebalances change which partitions it owns:
work read from a partition now owned elsewhere is handed back (the new owner
redoes it from the last commit). Pause and resume act on the subscriber's
aiokafka consumer: FastStream has no per-partition pause.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AIOKafkaTopicPartition

from streams.service.offsets import Source

log = logging.getLogger(__name__)


class Flow:
    def __init__(self, max_inflight: int, consumer: Callable[[], AIOKafkaConsumer | None]) -> None:
        self._slots = asyncio.Semaphore(max_inflight)
        self._consumer = consumer
        # True while the input partitions are paused because every slot is taken.
        self._paused = False
        # False once draining: nothing new is started, and paused partitions stay paused.
        self.accepting = True
        # Input partitions owned now (updated on every rebalance; None before the first assignment).
        self._owned: set[tuple[str, int]] | None = None

    async def acquire(self, source: Source) -> bool:
        """Wait for a slot; False (and no slot held) when the message must be left for redelivery."""
        # Waiting here stops the subscriber from reading further messages, and pausing the partitions stops the
        # consumer from fetching more of them meanwhile.
        if self._slots.locked():
            self._pause()
        await self._slots.acquire()
        if not self.accepting or not self.owns([source]):
            # Draining, or its partition moved to another consumer while it waited: leave it uncommitted.
            self.release()
            return False
        return True

    def release(self) -> None:
        self._slots.release()
        if self._paused and self.accepting:
            self._paused = False
            consumer = self._consumer()
            if consumer is not None:
                consumer.resume(*consumer.assignment())

    def owns(self, sources: Iterable[Source]) -> bool:
        return self._owned is None or any((s.topic, s.partition) in self._owned for s in sources)

    def assigned(self, assigned: set[AIOKafkaTopicPartition]) -> None:
        self._owned = {(tp.topic, tp.partition) for tp in assigned}
        if self._paused:
            # A new assignment starts unpaused; keep it paused while every slot is taken.
            self._paused = False
            if self._slots.locked():
                self._pause()

    def stop_intake(self) -> None:
        """Read nothing more (drain), while staying in the group to commit what finishes now."""
        self.accepting = False
        consumer = self._consumer()
        if consumer is not None:
            consumer.pause(*consumer.assignment())

    def _pause(self) -> None:
        consumer = self._consumer()
        if consumer is None or self._paused:
            return
        partitions = consumer.assignment()
        if partitions:
            consumer.pause(*partitions)
            self._paused = True
            log.debug("every slot taken: paused %d partition(s)", len(partitions))
