"""Publish a ToolIntent and wait for its ToolResult: ``specstream tools call``, the benchmark and the tests.

The results topic is read from its end as it was at start (so only results of calls made after it), and each
result resolves the call waiting for its call id; later copies of a result are ignored, as the worker ignores
them.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from schemas.tools import ToolIntent, ToolResult
from streams.kafka import clients
from streams.config import Settings


class ToolClient:
    def __init__(self, settings: Settings, *, client_id: str = "specstream-tools-client") -> None:
        self.settings = settings
        self.client_id = client_id
        catalog = settings.catalog
        self.intents, self.results = catalog.tool_intents, catalog.tool_results
        self._waiting: dict[str, asyncio.Future[ToolResult]] = {}
        self._consumer = clients.make_consumer(settings.kafka, enable_auto_commit=False, auto_offset_reset="latest")
        self._producer = clients.make_producer(settings.kafka, client_id=client_id)
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        kafka = self.settings.kafka
        await clients.ensure_topics(kafka, [self.intents, self.results], replication_factor=kafka.replication_factor,
                                     min_insync_replicas=kafka.min_insync_replicas)
        await self._consumer.start()
        await self._producer.start()
        partitions = [TopicPartition(self.results.name, p) for p in range(self.results.partitions)]
        self._consumer.assign(partitions)
        for tp in partitions:
            await self._consumer.seek_to_end(tp)
            await self._consumer.position(tp)  # resolved now: no result of a later call can be skipped
        self._task = asyncio.create_task(self._read(), name="tool-results-reader")

    async def stop(self) -> None:
        await clients.stop_polling(self._task, None)
        await self._producer.stop()
        await self._consumer.stop()

    async def __aenter__(self) -> ToolClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def intent(self, tool: str, arguments: dict[str, Any], *, tenant: str = "default",
               timeout_s: float = 60.0) -> ToolIntent:
        request_id = f"cli-{uuid.uuid4().hex[:16]}"
        return ToolIntent(request_id=request_id, call_id=f"call_{uuid.uuid4().hex[:24]}", tool=tool,
                          arguments=arguments, tenant=tenant, deadline=time.time() + timeout_s,
                          created_at=time.time())

    async def publish(self, intent: ToolIntent) -> asyncio.Future[ToolResult]:
        """Publish the intent (acknowledged by Kafka); the future resolves with its first result."""
        waiting = self._waiting[intent.call_id] = asyncio.get_running_loop().create_future()
        await self._producer.send_and_wait(self.intents.name, clients.encode(intent), key=intent.call_id.encode())
        return waiting

    async def call(self, intent: ToolIntent, *, timeout_s: float) -> ToolResult:
        waiting = await self.publish(intent)
        try:
            return await asyncio.wait_for(waiting, timeout=timeout_s)
        finally:
            self._waiting.pop(intent.call_id, None)

    async def _read(self) -> None:
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=500)
            except KafkaError:
                await asyncio.sleep(0.5)
                continue
            for records in batches.values():
                for record in records:
                    self._resolve(record.value)

    def _resolve(self, value: bytes | None) -> None:
        if value is None:
            return
        with contextlib.suppress(ValidationError):
            result = clients.decode(value, ToolResult)
            waiting = self._waiting.get(result.call_id)
            if waiting is not None and not waiting.done():
                waiting.set_result(result)
