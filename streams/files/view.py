"""Every file's metadata, as the compacted files topic says: what each edge serves `/v1/files` from.

The view reads the topic from its start and then follows it, so a restarted or second edge knows the same
files (within one poll, 0.2 s, of a change). Until it has read up to the end the topic had when it started,
it is not ``caught_up`` and the API answers 503 rather than "no such file". A tombstone (null value) deletes.
"""
from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from schemas.documents import FileObject
from schemas.topics import Topic
from streams import kafka_io
from streams.kafka_connection import Connectable

log = logging.getLogger(__name__)
POLL_MS = 200


class FilesView:
    def __init__(self, kafka: Connectable, topic: Topic) -> None:
        self.kafka = kafka
        self.topic = topic
        self.files: dict[str, FileObject] = {}
        self.caught_up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        """Start following; the topic must exist (the edge creates it at start)."""
        consumer = kafka_io.make_consumer(self.kafka, enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        self._consumer = consumer
        tp = TopicPartition(self.topic.name, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        self._task = asyncio.create_task(self._follow(tp, end), name=f"files-view-{self.topic.name}")

    async def stop(self) -> None:
        await kafka_io.stop_polling(self._task, self._consumer)
        self._task = self._consumer = None
        self.caught_up.clear()

    def apply(self, file_id: str, file: FileObject | None) -> None:
        """Record a file (or its deletion, None): what was read from the topic, or what this edge just wrote."""
        if file is None:
            self.files.pop(file_id, None)
        else:
            self.files[file_id] = file

    async def _follow(self, tp: TopicPartition, end: int) -> None:
        consumer = self._consumer
        assert consumer is not None
        while True:
            try:
                batch = await consumer.getmany(tp, timeout_ms=POLL_MS)
            except KafkaError as error:  # the broker moving or gone: keep serving the last known files
                log.warning("files: cannot read %s (%s); serving the last known files", tp.topic, error)
                await asyncio.sleep(1.0)
                continue
            for record in batch.get(tp, []):
                self._record(record.key, record.value)
            # By position, not by the last record's offset: compaction may have removed the records before the end.
            if not self.caught_up.is_set() and await consumer.position(tp) >= end:
                self.caught_up.set()

    def _record(self, key: bytes | None, value: bytes | None) -> None:
        if key is None:
            return
        file_id = key.decode("utf-8", errors="replace")
        if value is None:
            self.apply(file_id, None)
            return
        try:
            self.apply(file_id, kafka_io.decode(value, FileObject))
        except (ValidationError, ValueError) as error:  # a newer writer's record: skip it, keep the rest
            log.warning("files: skipping record %s on %s: %s", file_id, self.topic.name, error)
