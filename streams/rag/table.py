"""A compacted topic followed from its beginning as a table: key -> newest record; a tombstone removes the key.

Several writers may publish a key's records (the documents topic: the API, the parser, the indexer), so a record
replaces the one held only if its ``updated_at`` is newer, and a record written before the key's tombstone (a
parser finishing a file that was deleted meanwhile) does not bring it back. ``caught_up()`` waits until the table
holds everything published before the call: what a reader needs before deciding on a key (read-your-writes).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import BaseModel, ValidationError

from schemas.topics import Topic
from streams import kafka_io
from streams.kafka_connection import Connectable

log = logging.getLogger("specstream.rag")

RecordT = TypeVar("RecordT", bound=BaseModel)
OnChange = Callable[[str, "BaseModel | None"], None]


class CompactedTable(Generic[RecordT]):
    def __init__(self, kafka: Connectable, topic: Topic, model: type[RecordT], *,
                 on_change: Callable[[str, RecordT | None], None] | None = None) -> None:
        self.kafka = kafka
        self.topic = topic
        self.model = model
        self.on_change = on_change
        self.rows: dict[str, RecordT] = {}
        self.deleted_at: dict[str, float] = {}  # key -> time of its tombstone (Kafka's clock)
        self._consumer: AIOKafkaConsumer | None = None
        self._task: asyncio.Task[None] | None = None
        self._partitions: list[TopicPartition] = []

    async def start(self) -> None:
        """Assign every partition from the beginning and read up to the current end."""
        await kafka_io.ensure_topics(self.kafka, [self.topic])
        self._consumer = kafka_io.make_consumer(self.kafka, enable_auto_commit=False, auto_offset_reset="earliest")
        await self._consumer.start()
        self._partitions = [TopicPartition(self.topic.name, p) for p in range(self.topic.partitions)]
        self._consumer.assign(self._partitions)
        await self._consumer.seek_to_beginning(*self._partitions)
        self._task = asyncio.create_task(self._run(), name=f"table-{self.topic.name}")
        await self.caught_up()

    async def stop(self) -> None:
        await kafka_io.stop_polling(self._task, self._consumer)
        self._task, self._consumer = None, None

    async def caught_up(self, timeout_s: float = 30.0) -> None:
        """Wait until everything published before this call is in the table."""
        assert self._consumer is not None, "start() first"
        ends = await self._consumer.end_offsets(self._partitions)
        deadline = time.monotonic() + timeout_s
        while await self._behind(ends):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.topic.name}: not caught up within {timeout_s:.0f} s")
            if self._task is not None and self._task.done():
                self._task.result()  # the reader died: raise its error here
            await asyncio.sleep(0.02)

    async def _behind(self, ends: dict[TopicPartition, int]) -> bool:
        assert self._consumer is not None
        for tp, end in ends.items():
            if await self._consumer.position(tp) < end:
                return True
        return False

    def get(self, key: str) -> RecordT | None:
        return self.rows.get(key)

    def values(self) -> list[RecordT]:
        return list(self.rows.values())

    async def _run(self) -> None:
        assert self._consumer is not None
        while True:
            batches = await self._consumer.getmany(timeout_ms=200)
            for records in batches.values():
                for record in records:
                    if record.key is not None:
                        self.apply(record.key.decode(errors="replace"), record.value, record.timestamp / 1000)

    def apply(self, key: str, value: bytes | None, at: float) -> None:
        if value is None:
            self.deleted_at[key] = at
            if self.rows.pop(key, None) is not None and self.on_change is not None:
                self.on_change(key, None)
            return
        try:
            row = kafka_io.decode(value, self.model)
        except (ValidationError, ValueError) as error:
            log.warning("%s: record of %s skipped: %s", self.topic.name, key, error)
            return
        updated = float(getattr(row, "updated_at", at))
        held = self.rows.get(key)
        if held is not None and float(getattr(held, "updated_at", 0.0)) > updated:
            return
        if key in self.deleted_at and updated <= self.deleted_at[key]:
            return
        self.rows[key] = row
        if self.on_change is not None:
            with contextlib.suppress(Exception):
                self.on_change(key, row)
