"""Send many GenerateRequests to one deployment's request topic and collect each final answer.

Answers come back on a reply topic of this run's own, ``<reply prefix>.replies.eval-<tag>``, created first and
deleted afterwards; the workers must accept it as a reply route (their ``delivery.reply_topic_patterns``). At most ``concurrency`` requests are outstanding, so
latencies measure the candidate, not a queue this tool built up. A request without an answer by ``timeout_s``
counts as failed (``deadline_exceeded``); an unreadable reply is skipped.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from pydantic import ValidationError

from schemas.events import Completion, ErrorEvent, GenerateRequest, ReplyRoute
from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.config import KafkaSettings

Final = Completion | ErrorEvent
_PROGRESS_EVERY_S = 10.0


async def send_all(kafka: KafkaSettings, request_topic: str, reply_prefix: str, requests: Sequence[GenerateRequest],
                   *, concurrency: int, timeout_s: float, progress: Callable[[str], None]) -> dict[str, Final]:
    """The final event of each request, by request_id (re-addressed to this run's reply topic)."""
    reply = TopicCatalog(prefix=reply_prefix).replies(f"eval-{uuid.uuid4().hex[:10]}")
    async with clients.reply_session(kafka, reply, client_id="specstream-eval") as (consumer, producer):
        return await _exchange(consumer, producer, request_topic, reply.name, requests,
                               concurrency=concurrency, timeout_s=timeout_s, progress=progress)


async def _exchange(consumer: AIOKafkaConsumer, producer: AIOKafkaProducer, request_topic: str, reply_topic: str,
                    requests: Sequence[GenerateRequest], *, concurrency: int, timeout_s: float,
                    progress: Callable[[str], None]) -> dict[str, Final]:
    waiting = list(reversed(requests))
    answers: dict[str, Final] = {}
    outstanding: dict[str, float] = {}  # request_id -> when sent (monotonic)
    last_note = time.monotonic()
    while waiting or outstanding:
        while waiting and len(outstanding) < concurrency:
            request = waiting.pop().model_copy(update={"reply_to": ReplyRoute(topic=reply_topic, partition=0),
                                                       "created_at": time.time(), "deadline": None})
            await producer.send_and_wait(request_topic, clients.encode(request),
                                         key=clients.request_key(request.request_id))
            outstanding[request.request_id] = time.monotonic()
        batch = await consumer.getmany(timeout_ms=200)
        for record in (r for records in batch.values() for r in records):
            try:
                event = clients.decode_reply(record.value or b"")
            except ValidationError:
                continue
            request_id = getattr(event, "request_id", None)
            if isinstance(event, (Completion, ErrorEvent)) and request_id in outstanding:
                del outstanding[request_id]
                answers[request_id] = event
        now = time.monotonic()
        for request_id in [r for r, sent in outstanding.items() if now - sent > timeout_s]:
            del outstanding[request_id]
            answers[request_id] = ErrorEvent(request_id=request_id, code="deadline_exceeded",
                                             message=f"timeout: no answer within {timeout_s:g} s")
        if now - last_note > _PROGRESS_EVERY_S:
            last_note = now
            progress(f"{len(answers)} of {len(requests)} answered")
    progress(f"{len(answers)} of {len(requests)} answered")
    return answers
