"""Dead letters: what a consumer could not process, kept with its reason, original bytes and source offset.

Keyed by ``<topic>/<partition>/<offset>`` so ``specstream dlq`` can find a
letter by its source. A message too large even for the dead-letters topic still
leaves a letter with its reason and source offset (and the size it had), so
nothing disappears without a trace.
"""
from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from typing import Any

from aiokafka.errors import MessageSizeTooLargeError

from schemas.events import DeadLetter
from streams.service.offsets import Source
from streams.service.publisher import Publisher


class DeadLetters:
    def __init__(self, publisher: Publisher, topic: str, consumer_id: str, *,
                 counted: Callable[[str], None] = lambda reason: None) -> None:
        self._publisher = publisher
        self.topic = topic
        self._consumer_id = consumer_id
        self._counted = counted  # told of every letter kept (the dead-letters metric)

    async def keep(self, reason: str, value: bytes | None, key: bytes | None, source: Source, *,
                   undelivered: str | None = None) -> None:
        """Publish the letter and wait for Kafka's acknowledgement; raises what the publish raised."""
        self._counted(reason)
        try:
            await self._send(reason, value, key, source, undelivered)
        except MessageSizeTooLargeError:
            await self._send(f"{reason} (original of {len(value or b'')} bytes too large to keep)", None, key, source,
                             undelivered)

    def _send(self, reason: str, value: bytes | None, key: bytes | None, source: Source,
              undelivered: str | None) -> asyncio.Future[Any]:
        letter = DeadLetter(
            reason=reason,
            source_topic=source.topic,
            source_partition=source.partition,
            source_offset=source.offset,
            original_b64=base64.b64encode(value or b"").decode("ascii"),
            original_key_b64=base64.b64encode(key).decode("ascii") if key is not None else None,
            consumer=self._consumer_id,
            at=time.time(),
            undelivered=undelivered,
        )
        return self._publisher.publish(self.topic, None, f"{source.topic}/{source.partition}/{source.offset}".encode(),
                                       letter)
