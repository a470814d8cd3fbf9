"""FastStream hands each consumed message to the foundation's handler on the event loop, typed, without a
thread-pool hop, and through FastStream's public API only (no subclass of its internals)."""
from __future__ import annotations

from typing import Any

import anyio.to_thread
import pytest
from faststream.kafka import TestKafkaBroker

from schemas.events import Event, ReplyRoute
from schemas.topics import HOUR_MS, Topic, TopicCatalog
from streams.service import Consumer, Delivery, ServiceOptions
from streams.service.runner import ConsumerService


class Note(Event):
    request_id: str
    reply_to: ReplyRoute
    text: str


async def test_the_consumed_message_reaches_the_handler_validated_and_without_a_worker_thread(
        monkeypatch: pytest.MonkeyPatch) -> None:
    hops: list[Any] = []
    real = anyio.to_thread.run_sync

    async def counting(func: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(func)
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counting)
    got: list[tuple[Note, str]] = []

    async def handle(note: Note, delivery: Delivery) -> None:
        got.append((note, str(delivery.source)))

    catalog = TopicCatalog(prefix="unit")
    notes = Topic(name="unit.notes", partitions=1, key="request_id", retention_ms=HOUR_MS, carries="Note",
                  purpose="Notes.")
    service = ConsumerService(ServiceOptions(kafka="127.0.0.1:9", catalog=catalog, service_id="u1"),
                              Consumer(kind="note-taker", topic=notes, input_model=Note, handle=handle))
    body = Note(request_id="n1", reply_to=ReplyRoute(topic="unit.replies.x"), text="hello")

    async with TestKafkaBroker(service.broker) as broker:
        await broker.publish(body.model_dump_json().encode(), "unit.notes")

    assert [(note.text, source.split("@")[0]) for note, source in got] == [("hello", "unit.notes/0")]
    assert hops == []  # FastStream's own `msg: KafkaMessage` context parameter resolves through anyio.to_thread
