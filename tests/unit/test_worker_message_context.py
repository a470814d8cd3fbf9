"""FastStream hands each message the worker consumes to its handler on the event loop, without a thread-pool hop."""
from __future__ import annotations

from typing import Any

import anyio.to_thread
import pytest
from faststream.kafka import KafkaBroker, TestKafkaBroker

from streams.worker.service import KafkaMessage


async def test_the_consumed_message_reaches_the_handler_without_a_worker_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    hops: list[Any] = []
    real = anyio.to_thread.run_sync

    async def counting(func: Any, *args: Any, **kwargs: Any) -> Any:
        hops.append(func)
        return await real(func, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counting)
    broker = KafkaBroker()
    got: list[tuple[bytes, str]] = []

    @broker.subscriber("requests")
    async def handler(msg: KafkaMessage) -> None:
        got.append((msg.body, msg.raw_message.topic))

    async with TestKafkaBroker(broker) as test_broker:
        await test_broker.publish(b"payload", "requests")

    assert got == [(b"payload", "requests")]
    assert hops == []  # FastStream's own KafkaMessage annotation resolves through anyio.to_thread.run_sync
