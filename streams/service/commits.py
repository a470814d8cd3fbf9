"""Committing offsets by hand: one commit at a time, retried after a failure.

FastStream's ``msg.ack()`` commits the consumer's current position, i.e. also
every message read after this one and still in flight; at-least-once needs the
position below the oldest unanswered message of each partition
(:class:`~streams.service.offsets.OffsetTracker`), so commits go to the
subscriber's aiokafka consumer directly.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AIOKafkaTopicPartition
from aiokafka.errors import KafkaError

from streams.service.offsets import OffsetTracker

log = logging.getLogger(__name__)

# Seconds before a failed offset commit is tried again.
COMMIT_RETRY_S = 1.0


class OffsetCommitter:
    """Commits each partition's offset below its oldest unanswered message, retrying a failed commit."""

    def __init__(self, offsets: OffsetTracker, consumer: Callable[[], AIOKafkaConsumer | None],
                 active: Callable[[], bool]) -> None:
        self._offsets = offsets
        self._consumer = consumer
        self._active = active
        self._lock = asyncio.Lock()
        self._retry: asyncio.Task[None] | None = None

    async def commit(self) -> None:
        # One commit at a time, each with the latest positions: a slow commit can never overwrite a newer one.
        async with self._lock:
            positions = self._offsets.committable()
            consumer = self._consumer()
            if not positions or consumer is None:
                return
            try:
                await consumer.commit({AIOKafkaTopicPartition(t, p): offset for (t, p), offset in positions.items()})
            except (KafkaError, AssertionError) as error:
                # Typically a rebalance took the partition away (its new owner resumes from the last commit), or the
                # group coordinator moved (a broker died). Retry soon: the last messages before a quiet spell must
                # not stay uncommitted (they would be processed again after the next rebalance).
                log.warning("offset commit failed (%s); retrying in %.0f s", error, COMMIT_RETRY_S)
                if self._retry is None or self._retry.done():
                    self._retry = asyncio.create_task(self._commit_later(), name="commit-retry")
                return
            self._offsets.mark_committed(positions)

    async def _commit_later(self) -> None:
        await asyncio.sleep(COMMIT_RETRY_S)
        self._retry = None  # a commit failing again below schedules the next retry
        if self._active():
            await self.commit()

    def stop(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
