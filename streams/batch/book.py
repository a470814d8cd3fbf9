"""Every batch's state, as the compacted batches topic says, merged so that its writers never undo each other.

The edge writes a batch when it is created and when it is cancelled; the assembler writes its progress and its
end. Both may write at once, so every reader (edges, the assembler, engine workers) merges what it reads into
what it knows (:func:`merge`): the status only moves forward, counts only grow, a timestamp or file id once set
stays. The book reads the topic from its start and follows it, so a restarted process knows every batch.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from schemas.batch import BatchRequestCounts, BatchState, BatchStatus
from schemas.topics import Topic
from streams import kafka_io
from streams.kafka_connection import Connectable

log = logging.getLogger(__name__)
POLL_MS = 200

# Forward only. finalizing and cancelling tie: the first one written wins (a cancel after every line was
# answered changes nothing; a batch being cancelled ends cancelled, not completed).
_RANK: dict[str, int] = {"validating": 0, "in_progress": 1, "finalizing": 2, "cancelling": 2, "completed": 3,
                         "failed": 3, "expired": 3, "cancelled": 3}
TERMINAL: frozenset[BatchStatus] = frozenset({"completed", "failed", "expired", "cancelled"})
_ONCE = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
         "cancelled_at", "output_file_id", "error_file_id")


def merge(old: BatchState | None, new: BatchState) -> BatchState:
    """What is known of a batch after reading ``new`` on top of ``old``."""
    if old is None:
        return new
    status = new.status if _RANK[new.status] > _RANK[old.status] else old.status
    counts = BatchRequestCounts(
        total=max(old.request_counts.total, new.request_counts.total),
        completed=max(old.request_counts.completed, new.request_counts.completed),
        failed=max(old.request_counts.failed, new.request_counts.failed),
    )
    update: dict[str, object] = {
        "status": status, "request_counts": counts, "answered": max(old.answered, new.answered),
        "estimated_tokens": max(old.estimated_tokens, new.estimated_tokens),
        "errors": old.errors or new.errors, "at": max(old.at, new.at),
    }
    for name in _ONCE:
        update[name] = getattr(old, name) if getattr(old, name) is not None else getattr(new, name)
    return old.model_copy(update=update)


class BatchBook:
    def __init__(self, kafka: Connectable, topic: Topic,
                 on_change: Callable[[BatchState], None] | None = None) -> None:
        self.kafka = kafka
        self.topic = topic
        self.on_change = on_change  # called with each merged state read from the topic
        self.batches: dict[str, BatchState] = {}
        self.caught_up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        """Start following; the topic must exist."""
        consumer = kafka_io.make_consumer(self.kafka, enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        self._consumer = consumer
        tp = TopicPartition(self.topic.name, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        self._task = asyncio.create_task(self._follow(tp, end), name=f"batch-book-{self.topic.name}")

    async def stop(self) -> None:
        await kafka_io.stop_polling(self._task, self._consumer)
        self._task = self._consumer = None
        self.caught_up.clear()

    def get(self, batch_id: str) -> BatchState | None:
        return self.batches.get(batch_id)

    def apply(self, state: BatchState) -> BatchState:
        """Record a state (read from the topic, or just written here); returns the merged one."""
        merged = merge(self.batches.get(state.id), state)
        self.batches[state.id] = merged
        return merged

    def is_stopped(self, batch_id: str) -> bool:
        """A line of this batch must not start: the batch is being cancelled, or is over."""
        state = self.batches.get(batch_id)
        return state is not None and (state.status == "cancelling" or state.status in TERMINAL)

    async def _follow(self, tp: TopicPartition, end: int) -> None:
        consumer = self._consumer
        assert consumer is not None
        while True:
            try:
                records = await consumer.getmany(tp, timeout_ms=POLL_MS)
            except KafkaError as error:  # the broker moving or gone: keep the last known states
                log.warning("batches: cannot read %s (%s); keeping the last known states", tp.topic, error)
                await asyncio.sleep(1.0)
                continue
            for record in records.get(tp, []):
                self._record(record.value)
            # By position: compaction may have removed the records before the end.
            if not self.caught_up.is_set() and await consumer.position(tp) >= end:
                self.caught_up.set()

    def _record(self, value: bytes | None) -> None:
        if value is None:
            return
        try:
            state = self.apply(kafka_io.decode(value, BatchState))
        except (ValidationError, ValueError) as error:
            log.warning("batches: skipping a record on %s: %s", self.topic.name, error)
            return
        if self.on_change is not None:
            self.on_change(state)
