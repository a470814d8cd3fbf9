"""ConsumerService: one :class:`~streams.service.consumer.Consumer` run on Kafka with FastStream.

Path of one message::

    input topic ──► consume (middleware: source, offsets) ──► decoder (intake: size, JSON, version, schema)
        │ Rejected: ErrorEvent to its route (if allowed) + dead letter, commit past it
        ▼
    admit: reply route allowed and existing ──► check ──► dedupe ──► slot ──► consumer.handle(payload, delivery)
        ▼
    delivery.reply / publish ──► Publisher lanes ──► Kafka ack ──► _settle: commit below the oldest open one

How this is laid out on FastStream (public API only) is :mod:`streams.service.wiring`.
The middleware hands each message its :class:`Delivery` through a context
variable, which the handler reads on the event loop (FastStream's own
``msg: KafkaMessage`` context parameter would cost a thread-pool hop per
message). Pause/resume and commits go to the subscriber's aiokafka consumer
(:mod:`streams.service.flow`, :mod:`streams.service.commits`).
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Awaitable, Mapping
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AIOKafkaTopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from faststream.message import StreamMessage
from pydantic import BaseModel

from schemas.events import ErrorEvent
from streams.kafka import clients
from streams.kafka.reply_routes import ReplyRoutes, RouteCheck
from streams.service.announcer import Announcer
from streams.service.commits import OffsetCommitter
from streams.kafka.permissions import prepare_service
from streams.service.consumer import Consumer, ServiceOptions, grants_of
from streams.service.dead_letters import DeadLetters
from streams.service.delivery import Delivery
from streams.service.flow import Flow
from streams.service.intake import Rejected, Rejection
from streams.service.offsets import OffsetTracker, Source
from streams.service.publisher import JSON_HEADERS, Publisher, describe_error
from streams.service.telemetry import Telemetry
from streams.service.wiring import CallNext, wire
from streams.service.consumer_telemetry import ConsumerTelemetry

log = logging.getLogger("specstream.service")

# The delivery of the message being consumed, set by the middleware around FastStream's call of the handler.
_current: contextvars.ContextVar[Delivery] = contextvars.ContextVar("specstream_delivery")


class ConsumerService:
    def __init__(self, options: ServiceOptions, consumer: Consumer[Any], *, telemetry: Telemetry | None = None) -> None:
        self.options = options
        self.consumer = consumer
        self.kind = consumer.kind
        self.service_id = options.service_id
        self.group_id = consumer.group(options.catalog)
        # Traces and metrics for every consumer; the engine worker passes its own (sharing its tracer and registry).
        self.telemetry: Telemetry = telemetry or ConsumerTelemetry.from_settings(options.telemetry, kind=self.kind,
                                                                               group_id=self.group_id)
        catalog = options.catalog
        self.broker, self.subscriber = wire(options, consumer, self.group_id, self)

        self.offsets = OffsetTracker()
        # Long-lived admin client (started in prepare): reply routes are checked against topic metadata (cached).
        self._admin: AIOKafkaAdminClient | None = None
        self.routes = ReplyRoutes(options.reply_topic_patterns or (), self._list_topics,
                                  ttl_s=options.topic_cache_ttl_s, lookup_timeout_s=options.metadata_timeout_s)
        self.publisher = Publisher(self._send, self.routes, timeout_s=options.publish_timeout_s)
        self.dead_letters = DeadLetters(self.publisher, catalog.dead_letters.name, self.service_id,
                                        counted=self.telemetry.dead_lettered)
        self.flow = Flow(options.max_inflight, self.input_consumer)
        self.announcer = Announcer(
            self._send_announcement, catalog.services.name, kind=self.kind, service_id=self.service_id,
            heartbeat_s=options.heartbeat_s, models=consumer.models, in_flight=lambda: len(self._held),
        )
        self.committer = OffsetCommitter(self.offsets, self.input_consumer, active=lambda: self.announcer.state != "stopped")
        # Deliveries being handled, by request id: a redelivered copy joins the one held instead of running twice.
        self._held: dict[str, Delivery] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        # The topics prepare() created or found: the ones its start owns (streams.kafka.topic_watch).
        self.created_topics: list[str] = []

    # --- lifecycle (FastStream's hooks, or start/stop without an app) ------------------------------------------------

    async def prepare(self) -> None:
        """Before any message is read: create the catalog's topics and the consumer's inputs, start the route
        checks' admin client, and run the consumer's own preparation (the engine worker loads its model)."""
        o = self.options
        client_id = f"specstream-{self.kind}-{self.service_id}"
        # Its permissions, then its topics: a missing ACL stops the service here, in one line, before serving.
        grants = grants_of(self.consumer, o.catalog, self.group_id)
        granted = {g.name for g in grants}
        inputs = [self.consumer.topic, *(listener.topic for listener in self.consumer.listeners)]
        self.created_topics = await prepare_service(
            o.kafka, grants, [t for t in inputs if t.name not in granted], client_id=f"{client_id}-admin",
            replication_factor=o.replication_factor, min_insync_replicas=o.min_insync_replicas,
        )
        self._admin = clients.make_admin(o.kafka, client_id=f"{client_id}-routes")
        await self._admin.start()
        if self.consumer.prepare is not None:
            await self.consumer.prepare()

    async def started(self) -> None:
        """Serve metrics, announce readiness (once the subscribers run) and keep announcing it."""
        self.telemetry.start(self)
        self.announcer.metrics_url = self.telemetry.metrics_url
        await self.announcer.announce("ready")
        self.announcer.start_heartbeat()
        if self.consumer.started is not None:
            await self.consumer.started()

    async def drain(self) -> None:
        """Stop reading, let held messages finish (up to drain_timeout_s), hand back the rest, announce stopped."""
        if self.announcer.state in ("draining", "stopped"):
            return
        await self.announcer.announce("draining")
        self.flow.stop_intake()
        deadline = time.monotonic() + self.options.drain_timeout_s
        while self._held and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self._held:
            # Not answered and not committed: Kafka redelivers them to another instance.
            log.warning("handing back %d unfinished message(s) at shutdown; they will be redelivered", len(self._held))
            for delivery in list(self._held.values()):
                delivery.hand_back()
        try:
            # Bounded: with the broker gone these would wait out the producer's request timeout; what is not
            # acknowledged by then is not committed either, so Kafka redelivers it.
            await asyncio.wait_for(self._settle_pending(), timeout=max(1.0, deadline - time.monotonic()))
        except TimeoutError:
            log.warning("outcomes still unacknowledged at the end of the drain; their messages will be redelivered")
        self.announcer.stop_heartbeat()
        await self.announcer.announce("stopped")
        self.committer.stop()

    async def close(self) -> None:
        if self.consumer.close is not None:
            await self.consumer.close()
        self.telemetry.stop()
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.close()
            self._admin = None

    async def start(self) -> None:
        """Everything the FastStream app does at startup, for use without one (tests, embedding)."""
        await self.prepare()
        await self.broker.start()
        await self.started()

    async def stop(self) -> None:
        try:
            await self.drain()
        finally:
            await self.broker.stop()
            await self.close()

    @property
    def in_flight(self) -> int:
        return len(self._held)

    def held(self) -> list[Delivery]:
        return list(self._held.values())

    # --- one message ------------------------------------------------------------------------------------------------

    async def consume(self, call_next: CallNext, msg: StreamMessage[Any]) -> Any:
        """The middleware around FastStream's call of a handler: one message's delivery, and its rejection."""
        record = msg.raw_message
        if record.topic != self.consumer.topic.name:  # a listener: best effort, nothing to commit
            try:
                return await call_next(msg)
            except Rejected as rejected:
                log.warning("ignoring malformed message on %s: %s", record.topic, rejected)
                return None
        source = Source(record.topic, record.partition, record.offset)
        self.offsets.started(source.topic, source.partition, source.offset)
        delivery = Delivery([source], record.value, record.key, received_at=time.time(),
                            published_at=record.timestamp / 1000, outlet=self, headers=record.headers or ())
        token = _current.set(delivery)
        try:
            return await call_next(msg)
        except Rejected as rejected:
            route = rejected.rejection.route
            self._reject(rejected.rejection, delivery, await self.routes.check(route.topic) if route else None)
        except Exception:  # noqa: BLE001 - a bug here must not stop consumption; the message is dead-lettered
            log.exception("internal error handling %s", source)
            self._reject(Rejection("internal_error", f"the {self.kind} failed to handle this message",
                                   dead_letter=True), delivery)
        finally:
            _current.reset(token)
        return None

    async def admit(self, payload: BaseModel) -> None:
        """The handler FastStream calls with the validated input."""
        delivery = _current.get()
        consumer = self.consumer
        delivery.payload = payload
        delivery.request_id, delivery.route = consumer.key_of(payload), consumer.route_of(payload)
        # Before any work or reply: a message may only be answered on one of this deployment's existing reply topics.
        problem = await self.routes.check(delivery.route.topic) if delivery.route is not None else None
        if problem is not None:
            log.warning("dead-lettered %s (request %s): %s: %s", delivery.source, delivery.request_id, problem.code,
                        problem.message)
            reason = f"{problem.code}: {problem.message}"
            self.telemetry.rejected(delivery, Rejection(problem.code, problem.message, dead_letter=True))
            self._spawn(self._settle_rejection([self.dead_letters.keep(reason, delivery.value, delivery.key,
                                                                       delivery.source)], delivery.source))
            return
        rejection = consumer.check(payload)
        if rejection is not None:
            self._reject(rejection, delivery)
            return
        key = _hold_key(delivery)
        held = self._held.get(key)
        if held is not None:
            # Redelivered while still held here (e.g. after a rebalance): answered once, both offsets committed then.
            held.sources.append(delivery.source)
            return
        if not await self.flow.acquire(delivery.source):
            return
        self._held[key] = delivery
        self.telemetry.admitted(delivery)
        try:
            result = await consumer.handle(payload, delivery)
        except Exception as error:  # noqa: BLE001 - answered as an internal error, the consumer keeps serving
            log.exception("%s failed on %s", self.kind, delivery.source)
            delivery.fail("internal_error", f"could not handle the message: {type(error).__name__}: {error}")
            return
        if result is not None and not delivery.done:
            for event in (result,) if isinstance(result, BaseModel) else result:
                delivery.reply(event)
        if not delivery.deferred:
            delivery.finish()

    def _reject(self, rejection: Rejection, delivery: Delivery, route_problem: RouteCheck | None = None) -> None:
        """Answer a message that never reaches the handler, dead-letter it if malformed, then commit past it.

        Not awaited by the consume path: the publishes are bounded, but the partition must not wait even that long.
        The offset stays in flight (uncommitted) until they are settled.
        """
        source = delivery.source
        log.info("rejected %s (%s): %s", source, rejection.code, rejection.message)
        self.telemetry.rejected(delivery, rejection)
        reason = f"{rejection.code}: {rejection.message}"
        pending: list[Awaitable[Any]] = []
        if route_problem is not None:
            # The sender hears nothing (its route is refused); the dead letter says why.
            reason += f" (no error reply sent: {route_problem.code}: {route_problem.message})"
        elif rejection.route is not None:
            error = ErrorEvent(request_id=rejection.request_id, code=rejection.code, message=rejection.message)
            key = clients.request_key(rejection.request_id) if rejection.request_id else delivery.key or b""
            pending.append(self.publisher.publish(rejection.route.topic, rejection.route.partition, key, error))
        if rejection.dead_letter or route_problem is not None:
            pending.append(self.dead_letters.keep(reason, delivery.value, delivery.key, source))
        self._spawn(self._settle_rejection(pending, source))

    async def _settle_rejection(self, pending: list[Awaitable[Any]], source: Source) -> None:
        for result in await asyncio.gather(*pending, return_exceptions=True):
            if isinstance(result, BaseException):
                log.error("could not publish the rejection of %s: %s", source, describe_error(result))
        # Committed past whatever happened to its reply: a message is never read again once it was dealt with.
        self.offsets.finished(source.topic, source.partition, source.offset)
        await self.committer.commit()

    # --- the delivery's outlet --------------------------------------------------------------------------------------

    def publish(self, topic: str, partition: int | None, key: bytes, event: BaseModel, *,
                origin: Delivery | None = None) -> asyncio.Future[Any]:
        """Publish an event; one of a delivery's (``origin``) carries its trace context in the record's headers."""
        headers = JSON_HEADERS if origin is None else {**JSON_HEADERS, **self.telemetry.publishing(origin, topic)}
        return self.publisher.publish(topic, partition, key, event, headers)

    def settle(self, delivery: Delivery) -> None:
        self._spawn(self._settle(delivery))

    def forget(self, delivery: Delivery) -> None:
        """A delivery handed back: free its slot; its offsets stay uncommitted."""
        self._release(delivery)
        self.telemetry.handed_back(delivery)

    async def _settle(self, delivery: Delivery) -> None:
        results = await asyncio.gather(*delivery.published, return_exceptions=True)
        failures = [r for r in results if isinstance(r, BaseException)]
        if failures:
            await self._dead_letter_undelivered(delivery, failures, len(results))
        self._release(delivery)
        for source in delivery.sources:
            self.offsets.finished(source.topic, source.partition, source.offset)
        self.telemetry.settled(delivery, len(failures))
        await self.committer.commit()

    async def _dead_letter_undelivered(self, delivery: Delivery, failures: list[BaseException], total: int) -> None:
        """Every publish is bounded, so this is known within seconds. The message is finished and committed anyway
        (a redelivery would meet the same topic); the dead letter keeps the input and the final answer."""
        topic = delivery.route.topic if delivery.route is not None else "its topics"
        log.error("could not deliver %d event(s) of %s to %s: %s", len(failures),
                  delivery.request_id or delivery.source, topic, describe_error(failures[0]))
        reason = (f"reply_undeliverable: {len(failures)} of {total} event(s) to '{topic}' not delivered: "
                  f"{describe_error(failures[0])}")
        # The input as validated (a redrive does the work again), and the final event that did not arrive.
        original = clients.encode(delivery.payload) if delivery.payload is not None else delivery.value
        undelivered = clients.encode(delivery.final_event).decode() if delivery.final_event is not None else None
        key = clients.request_key(delivery.request_id) if delivery.request_id else delivery.key
        await asyncio.gather(self.dead_letters.keep(reason, original, key, delivery.source, undelivered=undelivered),
                             return_exceptions=True)

    def _release(self, delivery: Delivery) -> None:
        key = _hold_key(delivery)
        if self._held.get(key) is delivery:
            del self._held[key]
            self.flow.release()

    async def _settle_pending(self) -> None:
        await self.publisher.flush()
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # --- rebalance --------------------------------------------------------------------------------------------------

    async def partitions_revoked(self, revoked: set[AIOKafkaTopicPartition]) -> None:
        """Commit what is finished before the partitions move, then forget them."""
        await self.committer.commit()
        for tp in revoked:
            self.offsets.forget(tp.topic, tp.partition)

    def partitions_assigned(self, assigned: set[AIOKafkaTopicPartition]) -> None:
        """Hand back what was read from partitions another instance owns now: it redoes them from their
        uncommitted offsets. Work of partitions kept here goes on (the consumer reads those messages again from the
        last commit, and ``admit`` joins the copies to the deliveries held)."""
        log.info("assigned %s", ", ".join(f"{tp.topic}/{tp.partition}" for tp in sorted(assigned)) or "no partitions")
        self.flow.assigned(assigned)
        lost = [d for d in self._held.values() if not d.done and not self.flow.owns(d.sources)]
        if lost:
            log.info("rebalance: handing back %d message(s) of partitions now owned elsewhere", len(lost))
            for delivery in lost:
                delivery.hand_back()

    # --- plumbing ---------------------------------------------------------------------------------------------------

    async def _list_topics(self) -> list[str]:
        if self._admin is None:
            raise RuntimeError(f"the {self.kind} is not started")
        topics: list[str] = await self._admin.list_topics()
        return topics

    def input_consumer(self) -> AIOKafkaConsumer | None:
        # The subscriber's aiokafka consumer (None until it started): FastStream has no per-partition pause or
        # per-offset commit of its own.
        consumer: AIOKafkaConsumer | None = self.subscriber.consumer
        return consumer

    async def _send(self, value: bytes, topic: str, key: bytes, partition: int | None,
                    headers: Mapping[str, str]) -> asyncio.Future[Any]:
        # no_confirm: returns once the record is in the producer's buffer; the broker's ack arrives on the future.
        ack: asyncio.Future[Any] = await self.broker.publish(value, topic, key=key, partition=partition,
                                                             headers=dict(headers), no_confirm=True)
        return ack

    async def _send_announcement(self, topic: str, key: bytes, value: bytes) -> None:
        await self.broker.publish(value, topic, key=key, headers=JSON_HEADERS)

    def _spawn(self, coro: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _hold_key(delivery: Delivery) -> str:
    return delivery.request_id or str(delivery.source)
