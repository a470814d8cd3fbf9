"""The dead-letter topic: list what consumers rejected, and re-drive it.

A worker sends a request message it cannot process (malformed JSON, not
UTF-8, over ``worker.max_message_bytes``, an unknown ``schema_version``, a
schema violation) to ``<prefix>.dead-letters`` as a :class:`DeadLetter`: the
reason, the original bytes and key (base64), and where it came from (topic,
partition, offset). The consumer then commits past it and keeps going.

    specstream dlq list [--limit N] [--json]        the newest N dead letters (default 20)
    specstream dlq redrive --offset N [--offset M]  publish those letters' original bytes to their source topic again
    specstream dlq redrive --all                    every dead letter still in the topic

Re-driving publishes the original key and bytes unchanged (with a header
naming the dead letter), so it is for messages that a fixed or upgraded worker
can now read; one that is still bad is dead-lettered again, with a new offset.
"""
from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiokafka import TopicPartition
from pydantic import ValidationError

from schemas.events import DeadLetter
from schemas.topics import DEAD_LETTER_MAX_BYTES
from streams.kafka import clients
from streams.kafka.connection import Connectable

REDRIVEN_HEADER = "specstream-redriven-from"


@dataclass(frozen=True)
class Letter:
    offset: int  # in the dead-letter topic
    letter: DeadLetter | None  # None: the record itself is not a readable DeadLetter
    problem: str = ""

    @property
    def original(self) -> bytes:
        return base64.b64decode(self.letter.original_b64) if self.letter else b""

    @property
    def original_key(self) -> bytes | None:
        if self.letter is None or self.letter.original_key_b64 is None:
            return None
        return base64.b64decode(self.letter.original_key_b64)

    def as_dict(self) -> dict[str, Any]:
        if self.letter is None:
            return {"offset": self.offset, "unreadable": self.problem}
        return {"offset": self.offset, **self.letter.model_dump(exclude={"original_b64", "original_key_b64"}),
                "original_bytes": len(self.original), "original_preview": _preview(self.original)}


async def read_letters(kafka: Connectable, topic: str, *, limit: int | None = None,
                       offsets: Iterable[int] | None = None, timeout_s: float = 30.0) -> list[Letter]:
    """Dead letters in offset order: the newest ``limit`` of them, or exactly those at ``offsets``."""
    wanted = sorted(set(offsets)) if offsets is not None else None
    tp = TopicPartition(topic, 0)
    consumer = clients.make_consumer(kafka, enable_auto_commit=False,
                                      auto_offset_reset="earliest", max_partition_fetch_bytes=2 * DEAD_LETTER_MAX_BYTES,
                                      fetch_max_bytes=4 * DEAD_LETTER_MAX_BYTES)
    await asyncio.wait_for(consumer.start(), timeout_s)
    try:
        consumer.assign([tp])
        begin = (await consumer.beginning_offsets([tp]))[tp]
        end = (await consumer.end_offsets([tp]))[tp]
        start = begin
        if wanted is not None:
            if not wanted:
                return []
            start = max(begin, wanted[0])
        elif limit is not None:
            start = max(begin, end - limit)
        if start >= end:
            return []
        consumer.seek(tp, start)
        letters: list[Letter] = []
        deadline = time.monotonic() + timeout_s
        position = start
        while position < end and time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=500)
            for record in batch.get(tp, []):
                position = record.offset + 1
                if record.offset >= end:
                    break
                if wanted is not None and record.offset not in wanted:
                    continue
                letters.append(_parse(record.offset, record.value))
            if wanted is not None and position > wanted[-1]:
                break
        return letters
    finally:
        await consumer.stop()


def _parse(offset: int, value: bytes | None) -> Letter:
    try:
        return Letter(offset, clients.decode(value or b"", DeadLetter))
    except ValidationError as error:
        return Letter(offset, None, clients.validation_summary(error))


async def redrive(kafka: Connectable, letters: list[Letter], *, to_topic: str | None = None,
                  dead_letter_topic: str = "") -> list[tuple[Letter, str, int, int]]:
    """Publish each letter's original bytes (and key) to its source topic, or ``to_topic``.

    Returns (letter, topic, partition, offset) per message written. Letters that are not readable DeadLetters are
    skipped (nothing to re-drive)."""
    producer = clients.make_producer(kafka, client_id="specstream-dlq",
                                      max_request_size=DEAD_LETTER_MAX_BYTES)
    await producer.start()
    written: list[tuple[Letter, str, int, int]] = []
    try:
        for item in letters:
            if item.letter is None:
                continue
            topic = to_topic or item.letter.source_topic
            headers = [(REDRIVEN_HEADER, f"{dead_letter_topic}@{item.offset}".encode())]
            meta = await producer.send_and_wait(topic, item.original, key=item.original_key, headers=headers)
            written.append((item, meta.topic, meta.partition, meta.offset))
    finally:
        await producer.stop()
    return written


def _preview(data: bytes, limit: int = 80) -> str:
    text = data[:limit].decode("utf-8", errors="replace")
    return text + ("..." if len(data) > limit else "")
