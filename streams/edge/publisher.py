"""Publishing the edge's two kinds of events: requests and cancellations.

``GenerateRequest`` goes to the request topic keyed by ``request_id`` (so a
request's redeliveries land on the same partition and workers share the
partitions as one consumer group); its ``reply_to`` names this edge's reply
topic. ``CancelRequest`` goes to the cancellations topic when a client goes
away before its request finished. Cancellation is fire-and-forget: it is
scheduled as a task the publisher keeps a reference to, so it still goes out
when the code that noticed the disconnect is itself being cancelled.

While a model is rolled out, the :class:`~streams.ops.rollout_router.RolloutRouter` picks each request's topic
(stable's, or the candidate pool's), and cancellations go to both pools.
"""
from __future__ import annotations

import asyncio
import logging

from aiokafka import AIOKafkaProducer
from opentelemetry import trace
from opentelemetry.trace import SpanKind

from schemas.events import CancelRequest, GenerateRequest
from streams.kafka.clients import encode, make_producer, request_key
from streams.edge.settings import EdgeOptions
from streams.ops.rollout_router import RolloutRouter
from streams.telemetry import tracing

log = logging.getLogger(__name__)


class RequestPublisher:
    def __init__(self, settings: EdgeOptions, tracer: trace.Tracer | None = None) -> None:
        self.settings = settings
        self.tracer = tracer
        catalog = settings.catalog
        self.request_topic = catalog.requests.name
        self.cancel_topic = catalog.cancellations.name
        self.rollouts = RolloutRouter(settings.kafka, catalog)
        self._producer: AIOKafkaProducer | None = None
        self._pending: set[asyncio.Task] = set()
        self.cancels_sent = 0

    @property
    def producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            raise RuntimeError("publisher is not started")
        return self._producer

    async def start(self) -> None:
        producer = make_producer(self.settings.kafka,
                                 client_id=f"{self.settings.client_id}-{self.settings.edge_id}")
        try:
            await producer.start()
        except BaseException:
            await producer.stop()
            raise
        self._producer = producer
        await self.rollouts.start()

    async def stop(self) -> None:
        await self.rollouts.stop()
        if self._pending:
            await asyncio.wait(self._pending, timeout=2.0)
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def publish_request(self, request: GenerateRequest) -> None:
        """Publish and wait until the broker acknowledged it.

        Traced, the publish is a producer span whose context travels in the record's headers and in
        ``request.trace``: the worker's consumer span continues this trace.
        """
        topic = self.rollouts.request_topic(request.model, request.request_id, request.conversation_id)
        # A conversation's turns share a partition, so the worker that holds its prefix in its KV cache gets them.
        key = request_key(request.conversation_id or request.request_id)
        if self.tracer is None:
            await self.producer.send_and_wait(topic, encode(request), key=key)
            return
        with self.tracer.start_as_current_span(
            f"publish {topic}", kind=SpanKind.PRODUCER,
            attributes={"messaging.system": "kafka", "messaging.operation.type": "publish",
                        "messaging.destination.name": topic, "messaging.message.id": request.request_id},
        ):
            carrier = tracing.carrier_of()
            request = request.model_copy(update={"trace": tracing.trace_context(carrier)})
            await self.producer.send_and_wait(topic, encode(request), key=key, headers=tracing.kafka_headers(carrier))

    async def publish_cancel(self, request_id: str, reason: str = "client disconnected") -> None:
        for topic in self.rollouts.cancel_topics():
            await self.producer.send_and_wait(
                topic, encode(CancelRequest(request_id=request_id, reason=reason)), key=request_key(request_id),
            )
        self.cancels_sent += 1
        log.info("cancelled request %s (%s)", request_id, reason)

    def cancel_soon(self, request_id: str, reason: str = "client disconnected") -> None:
        """Schedule a CancelRequest without awaiting it; safe to call from code being cancelled."""
        if self._producer is None:
            return
        task = asyncio.get_running_loop().create_task(self._cancel_logged(request_id, reason))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _cancel_logged(self, request_id: str, reason: str) -> None:
        try:
            await self.publish_cancel(request_id, reason)
        except Exception:  # the client is gone; nobody to tell but the log
            log.exception("could not publish cancellation of %s", request_id)

