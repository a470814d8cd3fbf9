"""What a consumer is: its input, its handler, its outputs. Everything else the foundation does.

A new consumer is a small file that builds a :class:`Consumer` and hands it to
:class:`~streams.service.runner.ConsumerService`; it gets intake validation and
dead letters, at-least-once commits, back-pressure, rebalance hand-back, drain
and announcements without writing any of them (see docs/architecture.md).
"""
from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from schemas.events import ReplyRoute
from schemas.topics import Topic, TopicCatalog
from streams.config import TelemetrySettings
from streams.config.kafka import FAILOVER_BOUND_S
from streams.kafka.acls import Grant, announcement_topics
from streams.kafka.connection import Connectable
from streams.kafka.reply_routes import compile_patterns
from streams.service.delivery import Delivery
from streams.service.intake import Rejection

InputT = TypeVar("InputT", bound=BaseModel)

# Returns the events to reply with (published to the message's route, then the delivery is finished), or None
# when it answered through the delivery itself.
Handler = Callable[[InputT, Delivery], Awaitable[BaseModel | Sequence[BaseModel] | None]]


def _request_id(payload: BaseModel) -> str:
    return str(getattr(payload, "request_id", ""))


def _reply_to(payload: BaseModel) -> ReplyRoute | None:
    route = getattr(payload, "reply_to", None)
    return route if isinstance(route, ReplyRoute) else None


def _accept(payload: BaseModel) -> Rejection | None:
    return None


@dataclass(frozen=True)
class Output:
    """A topic the consumer publishes to, declared for the AsyncAPI document."""

    topic: Topic
    events: Any  # a model or a union of models


@dataclass(frozen=True)
class Listener(Generic[InputT]):
    """A side input every instance reads whole (no consumer group, from the newest message): e.g. cancellations.

    Best effort: a message that does not parse is logged and skipped; nothing is committed.
    """

    topic: Topic
    input_model: type[InputT]
    handle: Callable[[InputT], Awaitable[None]]
    # True: read the topic from its beginning at every start (a compacted registry, e.g. LoRA adapters).
    from_beginning: bool = False


@dataclass(frozen=True)
class Consumer(Generic[InputT]):
    kind: str  # e.g. "engine-worker": in announcements, the default group and client ids
    topic: Topic
    input_model: type[InputT]
    handle: Handler[InputT]
    outputs: Sequence[Output] = ()
    group_id: str | None = None  # None: <topic_prefix>.<kind>s
    # Cheap checks before the message waits for a slot (an unknown model need not queue behind the busy ones).
    check: Callable[[InputT], Rejection | None] = _accept
    # The id that deduplicates redeliveries held at once, and keys replies; the reply route, if any.
    key_of: Callable[[InputT], str] = _request_id
    route_of: Callable[[InputT], ReplyRoute | None] = _reply_to
    listeners: Sequence[Listener[Any]] = ()
    # The ACLs it needs, checked at start ((catalog, group id) -> grants); None: derived from this description.
    grants: Callable[[TopicCatalog, str], list[Grant]] | None = None
    # Before any message is read (e.g. load a model), once serving, and after the last message.
    prepare: Callable[[], Awaitable[None]] | None = None
    started: Callable[[], Awaitable[None]] | None = None
    close: Callable[[], Awaitable[None]] | None = None
    models: Callable[[], list[str]] = list  # announced (engine workers)

    def group(self, catalog: TopicCatalog) -> str:
        return self.group_id or f"{catalog.prefix}.{self.kind}s"


@dataclass(frozen=True)
class ServiceOptions:
    """The settings every consumer service takes, from its section of the configuration."""

    kafka: Connectable  # the kafka settings (addresses, TLS, SASL), or just the bootstrap addresses
    catalog: TopicCatalog
    service_id: str
    replication_factor: int = 1
    min_insync_replicas: int = 1
    max_message_bytes: int = 1024 * 1024
    heartbeat_s: float = 5.0
    max_inflight: int = 128
    drain_timeout_s: float = 30.0
    session_timeout_ms: int = 6000
    heartbeat_interval_ms: int = 1000
    # Reply routes and bounded publishes (the `delivery` section): the topics a message may name as its reply route
    # ({prefix} already replaced; None: the catalog's reply topics), and the bounds of a publish and of a look-up.
    reply_topic_patterns: tuple[str, ...] | None = None
    publish_timeout_s: float = FAILOVER_BOUND_S
    topic_cache_ttl_s: float = 30.0
    metadata_timeout_s: float = 2.0
    # Seconds the topics its start created may be missing before the process exits to recreate them (0: never).
    missing_topic_restart_s: float = 30.0
    # Traces (OTEL_* variables and telemetry.tracing) and metrics (telemetry.metrics) of every message; None: off.
    telemetry: TelemetrySettings | None = None

    def __post_init__(self) -> None:
        if self.reply_topic_patterns is None:
            object.__setattr__(self, "reply_topic_patterns", (f"{self.catalog.prefix}.replies.*",))

    @classmethod
    def from_settings(cls, settings: Any, section: Any) -> ServiceOptions:
        """From ``streams.config.Settings`` and a consumer's section (``settings.worker`` for engine workers)."""
        kafka, delivery = settings.kafka, settings.delivery
        return cls(
            kafka=kafka, catalog=settings.catalog, service_id=section.resolved_id(),
            replication_factor=kafka.replication_factor, min_insync_replicas=kafka.min_insync_replicas,
            max_message_bytes=int(section.max_message_bytes), heartbeat_s=section.heartbeat_s,
            max_inflight=section.max_inflight, drain_timeout_s=section.drain_timeout_s,
            session_timeout_ms=section.session_timeout_ms, heartbeat_interval_ms=section.heartbeat_interval_ms,
            reply_topic_patterns=compile_patterns(delivery.reply_topic_patterns, kafka.topic_prefix),
            publish_timeout_s=delivery.publish_timeout_s, topic_cache_ttl_s=delivery.topic_cache_ttl_s,
            metadata_timeout_s=delivery.metadata_timeout_s, missing_topic_restart_s=delivery.missing_topic_restart_s,
            telemetry=settings.telemetry,
        )


def grants_of(consumer: Consumer[Any], catalog: TopicCatalog, group_id: str) -> list[Grant]:
    """What a consumer does on Kafka: read its input as its group and its listeners' topics; write its outputs,
    dead letters and announcements. Reply topics are granted by prefix (any edge's)."""
    if consumer.grants is not None:
        return consumer.grants(catalog, group_id)
    replies = catalog.replies("").name
    outputs = [o.topic for o in consumer.outputs if not o.topic.name.startswith(replies)]
    return [
        Grant("READ", "TOPIC", consumer.topic.name, topic=consumer.topic),
        Grant("READ", "GROUP", group_id),
        *[Grant("READ", "TOPIC", listener.topic.name, topic=listener.topic) for listener in consumer.listeners],
        Grant("WRITE", "TOPIC", replies, prefixed=True),
        *[Grant("WRITE", "TOPIC", topic.name, topic=topic) for topic in (*outputs, catalog.dead_letters,
                                                                         *announcement_topics(catalog))],
    ]
