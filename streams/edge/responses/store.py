"""Stored responses: the compacted responses topic, and this edge's view of it.

Storage is the topic, never this process: every edge follows the topic from its beginning
(:class:`~streams.kafka.compacted_table.CompactedTable`), so a response created on one replica is found on another
(a reader catches up to the topic's end before it answers, so what another replica just wrote or deleted is
seen). A record's key is ``<tenant>/<id>`` (:func:`schemas.responses.response_key`): a tenant asking for another's
id finds nothing, exactly as for an id that never existed. A response older than the topic's retention (``edge.responses_retention_h``) is
gone even before the broker deletes its segment.
"""
from __future__ import annotations

import asyncio
import time

from aiokafka import AIOKafkaProducer

from schemas.responses import StoredResponse, response_key
from schemas.topics import Topic
from streams.kafka import clients
from streams.kafka.compacted_table import BackgroundView, CompactedTable, replace
from streams.kafka.connection import Connectable

CATCH_UP_S = 10.0
WRITE_TIMEOUT_S = 10.0


class ResponsesUnavailable(Exception):
    """The responses topic cannot be read or written now."""


class ResponseStore(BackgroundView[StoredResponse]):
    def __init__(self, kafka: Connectable, topic: Topic, *, client_id: str = "specstream-responses") -> None:
        """The topic must exist when it starts (the edge creates it at start, from its grants)."""
        super().__init__(CompactedTable(kafka, topic, StoredResponse, policy=replace(), create_topic=False))
        self.client_id = client_id
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        producer = clients.make_producer(self.kafka, client_id=self.client_id)
        await producer.start()
        self._producer = producer
        await super().start()

    async def stop(self) -> None:
        await super().stop()
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def put(self, stored: StoredResponse) -> None:
        key = response_key(stored.tenant, stored.id)
        await self._send(key, clients.encode(stored))
        self.table.put(key, stored)  # read-your-writes on this edge; the others read it from the topic

    async def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        """The tenant's stored response, or None (another tenant's, deleted, expired, or never stored)."""
        # Written or deleted by another edge a moment ago? Catch up with the topic first (one end-offsets request).
        await self._caught_up()
        stored = self.table.get(response_key(tenant, response_id))
        if stored is None or self._expired(stored):
            return None
        return stored

    async def delete(self, tenant: str, response_id: str) -> bool:
        """Delete the tenant's response; False when it has none by that id."""
        if await self.get(tenant, response_id) is None:
            return False
        key = response_key(tenant, response_id)
        await self._send(key, None)
        self.table.delete(key)
        return True

    def _expired(self, stored: StoredResponse) -> bool:
        return stored.created_at + self.topic.retention_ms / 1000 <= time.time()

    async def _send(self, key: str, value: bytes | None) -> None:
        if self._producer is None:
            raise ResponsesUnavailable("not connected to Kafka")
        try:
            await asyncio.wait_for(self._producer.send_and_wait(self.topic.name, value, key=key.encode()),
                                   WRITE_TIMEOUT_S)
        except Exception as error:  # every failure to store means the same to a client
            raise ResponsesUnavailable(f"could not write {self.topic.name}: {error!r}") from error

    async def _caught_up(self) -> None:
        try:
            await self.table.caught_up(CATCH_UP_S)
        except (TimeoutError, AssertionError) as error:
            raise ResponsesUnavailable(f"still reading {self.topic.name}") from error
