"""Straight onto the bus: GenerateRequest to the request topic, replies from a reply topic of our own.

This measures worker + Kafka without the edge. The benchmark creates a reply
topic ``<prefix>.replies.bench-<random>`` (one partition, like an edge's),
consumes it from its end before sending anything, routes each reply event to
its request by ``request_id``, and deletes the topic when done.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any

from pydantic import ValidationError

from schemas.events import Completion, ErrorEvent, TokenChunk
from schemas.topics import TopicCatalog
from streams.bench.backends.base import Backend, BackendOptions, generate_request
from streams.bench.record import RequestRecord, StreamChecker

log = logging.getLogger(__name__)

# Reply latency is what we measure: fetch as soon as one byte is there, and
# do not sit on an empty fetch for long.
CONSUMER_OPTIONS = {"fetch_min_bytes": 1, "fetch_max_wait_ms": 10}


class KafkaBackend(Backend):
    name = "kafka"

    def __init__(self, options: BackendOptions, timeout_s: float | None = None) -> None:
        super().__init__(options)
        self.catalog = TopicCatalog(prefix=options.topic_prefix)
        self.client_tag = f"bench-{uuid.uuid4().hex[:10]}"
        self.reply_topic = self.catalog.replies(self.client_tag).name
        self.timeout_s = timeout_s
        self._producer: Any = None
        self._consumer: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._routes: dict[str, asyncio.Queue[Any]] = {}
        self.stray_events = 0

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(), "bootstrap_servers": self.options.bootstrap_servers,
            "request_topic": self.catalog.requests.name, "reply_topic": self.reply_topic,
            "consumer": CONSUMER_OPTIONS, "producer": _producer_settings(),
        }

    def _connection(self) -> Any:
        """The project's Kafka settings at the address asked for, else just the address (an open broker)."""
        kafka, servers = self.options.kafka, self.options.bootstrap_servers
        return kafka.model_copy(update={"bootstrap_servers": servers}) if kafka is not None else servers

    async def start(self) -> None:
        from aiokafka import TopicPartition

        from streams.kafka.clients import ensure_topics, make_consumer, make_producer

        servers = self._connection()
        await ensure_topics(servers, [self.catalog.requests, self.catalog.replies(self.client_tag)],
                            client_id=f"{self.client_tag}-admin", timeout_s=30)
        self._producer = make_producer(servers, client_id=self.client_tag)
        await self._producer.start()
        self._consumer = make_consumer(
            servers, client_id=f"{self.client_tag}-replies", group_id=None,
            enable_auto_commit=False, auto_offset_reset="latest", **CONSUMER_OPTIONS,
        )
        await self._consumer.start()
        tp = TopicPartition(self.reply_topic, 0)
        self._consumer.assign([tp])
        await self._consumer.seek_to_end(tp)
        await self._consumer.position(tp)  # resolve the offset now, before any request is sent
        self._reader = asyncio.create_task(self._read())

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        if self._consumer is not None:
            await self._consumer.stop()
        if self._producer is not None:
            await self._producer.stop()
        try:
            from streams.kafka.clients import delete_topics

            await delete_topics(self._connection(), [self.reply_topic], timeout_s=10)
        except Exception as error:  # noqa: BLE001 - cleanup only; the topic's retention removes it anyway
            log.warning("could not delete reply topic %s: %s", self.reply_topic, error)

    async def _read(self) -> None:
        from streams.kafka.clients import decode_reply

        while True:
            batches = await self._consumer.getmany(timeout_ms=100)
            now = time.perf_counter()
            for messages in batches.values():
                for message in messages:
                    try:
                        event = decode_reply(message.value)
                    except ValidationError as error:
                        rid = _request_id_of(message.value, message.key)
                        queue = self._routes.get(rid or "")
                        if queue is not None:
                            queue.put_nowait((now, ("bad_event", str(error).splitlines()[0])))
                        else:
                            self.stray_events += 1
                        continue
                    queue = self._routes.get(event.request_id or "")
                    if queue is None:
                        self.stray_events += 1  # a late event of a request we gave up on, or not ours
                        continue
                    queue.put_nowait((now, event))

    async def run(self, record: RequestRecord, checker: StreamChecker) -> None:
        from aiokafka.errors import KafkaError

        from streams.kafka.clients import encode, request_key

        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._routes[record.request_id] = queue
        try:
            event = generate_request(record, self.options.model, self.reply_topic, timeout_s=self.timeout_s)
            record.start = time.perf_counter()
            try:
                await self._producer.send_and_wait(
                    self.catalog.requests.name, encode(event), key=request_key(record.request_id)
                )
            except KafkaError as error:
                checker.error(time.perf_counter(), "kafka_send", f"{type(error).__name__}: {error}")
                return
            while True:
                now, item = await queue.get()
                if isinstance(item, tuple):
                    checker.error(now, "protocol:bad_event", item[1])
                    return
                if isinstance(item, TokenChunk):
                    checker.chunk(now, text=item.text, token_ids=list(item.token_ids), index=item.index,
                                  drafted=item.spec.drafted, accepted=item.spec.accepted)
                elif isinstance(item, Completion):
                    checker.final(
                        now, finish_reason=item.finish_reason, num_chunks=item.num_chunks, text=item.text,
                        prompt_tokens=item.usage.prompt_tokens, completion_tokens=item.usage.completion_tokens,
                        server={"timings": item.timings.model_dump(), "spec": item.spec.model_dump()},
                    )
                    return
                elif isinstance(item, ErrorEvent):
                    checker.error(now, f"error:{item.code}", item.message)
                    return
        finally:
            self._routes.pop(record.request_id, None)


def _request_id_of(value: bytes | None, key: bytes | None) -> str | None:
    try:
        data = json.loads(value or b"")
        if isinstance(data, dict) and isinstance(data.get("request_id"), str):
            return data["request_id"]
    except ValueError:
        pass
    return key.decode("utf-8", "replace") if key else None


def _producer_settings() -> dict[str, Any]:
    from streams.kafka.clients import producer_options

    options = producer_options(client_id="bench")
    return {k: options[k] for k in ("linger_ms", "acks", "enable_idempotence", "compression_type") if k in options}
