"""How a consumer is laid out on FastStream, through its public API only.

* The input subscriber's custom **decoder** runs the foundation's intake
  (:func:`~streams.service.intake.parse_message`) and raises
  :class:`~streams.service.intake.Rejected` for what does not parse, so the
  handler only ever sees a validated event.
* The handler's one parameter is annotated with the input model, which is how
  FastStream's AsyncAPI document learns each payload; listeners and the topics
  the service publishes to are declared the same way.
* A broker **middleware** wraps each call of a handler: that is where the
  foundation gives a message its delivery, and catches a rejection to
  dead-letter it (``Hooks.consume``).
* ``AckPolicy.MANUAL`` leaves commits to the foundation; a rebalance listener
  reports assignments.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
from aiokafka import TopicPartition as AIOKafkaTopicPartition
from faststream.kafka import KafkaBroker
from faststream.kafka import Topic as FastStreamTopic
from faststream.message import StreamMessage
from faststream.middlewares import AckPolicy, BaseMiddleware
from pydantic import BaseModel

from schemas.events import DeadLetter, ServiceAnnouncement
from schemas.topics import DEAD_LETTER_MAX_BYTES, Topic
from streams.kafka import clients
from streams.kafka.connection import faststream_options
from streams.service.consumer import Consumer, Output, ServiceOptions
from streams.service.intake import Rejected, Rejection, parse_message
from streams.service.logs import faststream_log

CallNext = Callable[[StreamMessage[Any]], Awaitable[Any]]


class Hooks(Protocol):
    """What FastStream calls back into (:class:`~streams.service.runner.ConsumerService`)."""

    async def consume(self, call_next: CallNext, msg: StreamMessage[Any]) -> Any: ...

    async def admit(self, payload: BaseModel) -> None: ...

    async def partitions_revoked(self, revoked: set[AIOKafkaTopicPartition]) -> None: ...

    def partitions_assigned(self, assigned: set[AIOKafkaTopicPartition]) -> None: ...


class InputSubscriber(Protocol):
    """The input subscriber as the foundation uses it: its aiokafka consumer (None until started), for
    per-partition pause/resume and per-offset commits, which FastStream does not offer."""

    consumer: AIOKafkaConsumer | None


def wire(options: ServiceOptions, consumer: Consumer[Any], group_id: str,
         hooks: Hooks) -> tuple[KafkaBroker, InputSubscriber]:
    """The broker with the consumer's input subscriber, its listeners and its declared outputs."""
    broker = KafkaBroker(
        # Addresses, TLS and SASL: built in one place for every client (streams.kafka.connection).
        **faststream_options(options.kafka),
        # Large enough for a dead letter of a message at the broker's size limit.
        **clients.producer_options(client_id=f"specstream-{consumer.kind}-{options.service_id}",
                                    max_request_size=DEAD_LETTER_MAX_BYTES + 64 * 1024),
        logger=faststream_log,
        # Per-message "Received"/"Processed" lines are debug noise at request rates.
        log_level=logging.DEBUG,
        # Topics come from the catalog (clients.ensure_topics), with their retention and ISR settings.
        allow_auto_create_topics=False,
        middlewares=[functools.partial(_IntakeMiddleware, hooks=hooks)],
        # No wait of FastStream's own at stop (15 s by default): ConsumerService.drain has already let held messages
        # finish or handed them back, bounded by drain_timeout_s; a handed-back handler is cancelled at once.
        graceful_timeout=None,
    )
    max_bytes = options.max_message_bytes
    subscriber = broker.subscriber(
        FastStreamTopic(consumer.topic.name, declare=False),
        group_id=group_id,
        # Offsets are committed by hand once outcomes are stored, not when a message is read.
        ack_policy=AckPolicy.MANUAL,
        auto_offset_reset="earliest",
        listener=_Rebalance(hooks),
        # A consumer that crashed gives up its partitions after the session timeout (a clean stop leaves at
        # once); the others learn of the rebalance at their next heartbeat, which runs on the event loop.
        session_timeout_ms=options.session_timeout_ms,
        heartbeat_interval_ms=options.heartbeat_interval_ms,
        decoder=_decoder(consumer.input_model, max_bytes),
        no_reply=True,
        title=consumer.topic.name,
        description=channel_description(consumer.topic),
    )
    subscriber(typed_handler(consumer.input_model, hooks.admit, f"{consumer.kind}-{consumer.topic.name}"))
    for listener in consumer.listeners:
        # No group: every instance sees every message, and only new ones (or all: a compacted registry).
        broker.subscriber(
            FastStreamTopic(listener.topic.name, declare=False),
            auto_offset_reset="earliest" if listener.from_beginning else "latest", no_reply=True,
            decoder=_decoder(listener.input_model, max_bytes), title=listener.topic.name,
            description=channel_description(listener.topic),
        )(typed_handler(listener.input_model, listener.handle, f"{consumer.kind}-{listener.topic.name}"))
    catalog = options.catalog
    for output in (*consumer.outputs, Output(catalog.dead_letters, DeadLetter),
                   Output(catalog.services, ServiceAnnouncement)):
        declare_output(broker, output)
    return broker, subscriber


def typed_handler(model: type[BaseModel], call: Callable[[Any], Awaitable[None]], name: str) -> Callable[..., Any]:
    """A FastStream handler whose one parameter is annotated with ``model``: FastStream documents the payload
    (AsyncAPI) from this annotation, and validates the decoder's output against it."""

    async def handler(payload: Any) -> None:
        await call(payload)

    handler.__annotations__ = {"payload": model, "return": None}
    handler.__name__ = handler.__qualname__ = name
    handler.__doc__ = model.__doc__
    return handler


def channel_description(topic: Topic) -> str:
    return f"{topic.purpose} Key: {topic.key}. Carries {topic.carries}."


def declare_output(broker: KafkaBroker, output: Output) -> None:
    """Declare a topic this service publishes to, for the AsyncAPI document (publishing goes through the lanes)."""
    broker.publisher(output.topic.name, schema=output.events, title=f"{output.topic.name}:publish",
                     description=channel_description(output.topic))


def _decoder(model: type[BaseModel], max_bytes: int) -> Callable[..., Awaitable[BaseModel]]:
    async def decode(msg: StreamMessage[Any], _default: Any) -> BaseModel:
        parsed = parse_message(msg.raw_message.value, model, max_bytes=max_bytes)
        if isinstance(parsed, Rejection):
            raise Rejected(parsed)
        return parsed

    return decode


class _IntakeMiddleware(BaseMiddleware):  # type: ignore[type-arg]
    """Wraps FastStream's call of a handler with the foundation's per-message path."""

    def __init__(self, msg: Any, /, *, context: Any, hooks: Hooks) -> None:
        super().__init__(msg, context=context)
        self._hooks = hooks

    async def consume_scope(self, call_next: Any, msg: StreamMessage[Any]) -> Any:
        return await self._hooks.consume(call_next, msg)


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, hooks: Hooks) -> None:
        self._hooks = hooks

    async def on_partitions_revoked(self, revoked: set[AIOKafkaTopicPartition]) -> None:
        await self._hooks.partitions_revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[AIOKafkaTopicPartition]) -> None:
        self._hooks.partitions_assigned(assigned)
