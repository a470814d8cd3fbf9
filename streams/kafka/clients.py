"""Kafka plumbing shared by the engine worker, the edge and the CLI.

One place decides how specstream talks to Kafka, so the worker and the edge
cannot drift apart on durability settings, topic layout or wire format:

* :func:`producer_options` / :func:`make_producer`: an idempotent ``acks=all``
  producer (a reply event is either stored on all in-sync replicas or the send
  fails; retries never duplicate it). :func:`make_consumer` / :func:`make_admin`:
  the other clients. All connect with :func:`streams.kafka.connection.client_options`
  (TLS, SASL), and take the ``kafka.*`` settings or a plain address.
* :func:`ensure_topics`: create catalog topics idempotently with the configured
  replication factor and ``min.insync.replicas``.
* :func:`encode` / :func:`decode` / :func:`decode_reply`: the JSON wire format
  of the pydantic events in :mod:`schemas.events`.
* :func:`validation_summary`: a one-line, field-naming description of a
  pydantic validation error, used for ``ErrorEvent.message`` and dead letters.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.codec import has_lz4
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    TopicAlreadyExistsError,
    TopicAuthorizationFailedError,
    for_code,
)
from aiokafka.protocol.metadata import MetadataRequest
from pydantic import BaseModel, TypeAdapter, ValidationError

from schemas.retrieval import AnyReply
from schemas.topics import Topic
from streams.kafka.connection import (
    Connectable,
    KafkaAccessError,
    check_connection,
    client_options,
    not_authorized,
    settings_of,
)

log = logging.getLogger(__name__)

EventT = TypeVar("EventT", bound=BaseModel)
ResultT = TypeVar("ResultT")

# No linger: a chunk goes out at once. Batching still happens where it pays:
# while one produce request to a broker is in flight, the chunks of other
# requests accumulate and leave together in the next one. A 5 ms linger was
# measured to add 5-7 ms per leg at p50 and bought nothing at these rates.
LINGER_MS = 0
PRODUCE_REQUEST_TIMEOUT_MS = 10_000

# aiokafka's AIOKafkaClient.fetch_all_metadata (a consumer's topics()) when no known broker answered.
_NO_METADATA = "Unable to get cluster metadata"
# The rag service's answers (search results, retrieved passages) share the reply topics with the engine's events.
_REPLY_ADAPTER: TypeAdapter[Any] = TypeAdapter(AnyReply)


def compression_type() -> Literal["lz4"] | None:
    """lz4 when its codec is installed, else none.

    Events are small JSON documents; compression only pays off for big batches,
    and a codec the consumer lacks would make messages unreadable, so we never
    require one.
    """
    return "lz4" if has_lz4() else None


def producer_options(*, client_id: str, max_request_size: int = 1024 * 1024) -> dict[str, Any]:
    """Keyword arguments for ``AIOKafkaProducer`` (and FastStream's ``KafkaBroker``, which takes the same names)."""
    return {
        "client_id": client_id,
        # Idempotence makes the producer's internal retries safe: a chunk retried
        # after a lost ack is stored once, and per-partition order is kept.
        "enable_idempotence": True,
        "acks": "all",
        # A request to a broker that stopped answering (frozen, partitioned) is retried after this, with fresh
        # metadata, at the partition's new leader; aiokafka's 40 s default outlasts every publish bound we set.
        # aiokafka also fails a batch whose partition has had no leader for this long: 4 s did so during a broker
        # kill's election (a reply dead-lettered, KafkaTimeoutError), 10 s outlasts the 6-9 s fencing.
        "request_timeout_ms": PRODUCE_REQUEST_TIMEOUT_MS,
        "linger_ms": LINGER_MS,
        "compression_type": compression_type(),
        "max_request_size": max_request_size,
    }


def make_producer(kafka: Connectable, *, client_id: str, max_request_size: int = 1024 * 1024) -> AIOKafkaProducer:
    """An unstarted producer with specstream's durability settings; ``await producer.start()`` before use."""
    return AIOKafkaProducer(
        **client_options(kafka),
        **producer_options(client_id=client_id, max_request_size=max_request_size),
    )


def make_consumer(kafka: Connectable, **options: Any) -> AIOKafkaConsumer:
    """An unstarted consumer of ``kafka`` (settings or a plain address) with the given consumer options."""
    return AIOKafkaConsumer(**client_options(kafka), **options)


def make_admin(kafka: Connectable, *, client_id: str = "specstream-admin", **options: Any) -> AIOKafkaAdminClient:
    return AIOKafkaAdminClient(**client_options(kafka), client_id=client_id, **options)


def request_key(request_id: str) -> bytes:
    """Message key of every event about one request: same key, same partition, so their order is kept."""
    return request_id.encode("utf-8")


# --- wire format ---------------------------------------------------------------------------------------------------


def encode(event: BaseModel) -> bytes:
    """JSON bytes of an event, defaults included so consumers never depend on the producer's defaults."""
    return event.model_dump_json().encode("utf-8")


def decode(data: bytes | str, model: type[EventT]) -> EventT:
    """Parse and validate one event; raises ``pydantic.ValidationError`` naming the offending field."""
    return model.model_validate_json(data)


def decode_reply(data: bytes | str) -> BaseModel:
    """Parse one reply-topic event (``TokenChunk``, ``Completion``, ``ErrorEvent`` or a rag answer) by its ``type``."""
    event: BaseModel = _REPLY_ADAPTER.validate_json(data)
    return event


def validation_summary(error: ValidationError, *, limit: int = 3) -> str:
    """One line naming each offending field, e.g. ``sampling.max_tokens: Input should be greater than or equal to 1``.

    Unknown fields read ``unknown field 'tempreature'`` rather than pydantic's
    "Extra inputs are not permitted", because that is what a client needs to fix.
    """
    parts: list[str] = []
    errors = error.errors(include_url=False)
    for item in errors[:limit]:
        location = ".".join(str(part) for part in item["loc"])
        if item["type"] == "extra_forbidden":
            parts.append(f"unknown field '{location}'")
        elif item["type"] == "json_invalid":
            parts.append(f"malformed JSON: {item['ctx'].get('error', item['msg']) if item.get('ctx') else item['msg']}")
        else:
            # Model validators raise ValueError, which pydantic prefixes with "Value error, ".
            message = str(item["msg"]).removeprefix("Value error, ")
            parts.append(f"{location}: {message}" if location else message)
    if len(errors) > limit:
        parts.append(f"and {len(errors) - limit} more")
    return "; ".join(parts)


# --- topics --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TopicResult:
    name: str
    created: bool  # False: it already existed


def _new_topic(topic: Topic, replication_factor: int, min_insync_replicas: int) -> NewTopic:
    return NewTopic(
        name=topic.name,
        num_partitions=topic.partitions,
        replication_factor=replication_factor,
        topic_configs=topic.config(min_insync_replicas=min_insync_replicas),
    )


async def ensure_topics(
    kafka: Connectable,
    topics: Iterable[Topic],
    *,
    replication_factor: int = 1,
    min_insync_replicas: int = 1,
    timeout_s: float = 30.0,
    client_id: str = "specstream-admin",
) -> list[TopicResult]:
    """Create the topics that do not exist yet; existing topics are left as they are.

    Idempotent, so every process (CLI, worker, edge, tests) may call it at start
    without coordinating. Only missing topics are created, so a service that may
    not create topics (least-privilege ACLs) passes once they exist. Raises
    ``KafkaError`` with a one-line message when the cluster refuses a topic for
    another reason (e.g. fewer brokers than ``replication_factor``).
    """
    wanted = list(topics)
    if not wanted:
        return []
    admin = make_admin(kafka, client_id=client_id, request_timeout_ms=int(timeout_s * 1000))
    await start_admin(admin, kafka, timeout_s)
    try:
        existing = set(await admin.list_topics())
        missing = [t for t in wanted if t.name not in existing]
        created = await _create(admin, missing, replication_factor, min_insync_replicas, timeout_s) if missing else set()
        results = [TopicResult(t.name, created=t.name in created) for t in wanted]
        # Creation is acknowledged by the controller before every broker knows the
        # topic; wait until metadata shows it so the first produce does not fail.
        await wait_visible(admin, [t.name for t in wanted], timeout_s)
        if any(r.created for r in results):
            # Leaders are elected a moment before they accept writes; without
            # this pause the first send logs a (harmless) NotLeaderForPartition retry.
            await asyncio.sleep(0.5)
        return results
    finally:
        await admin.close()


async def _create(admin: AIOKafkaAdminClient, topics: list[Topic], replication_factor: int, min_insync_replicas: int,
                  timeout_s: float) -> set[str]:
    """Create the topics; return the names created here (another process may have been first with some)."""
    response = await admin.create_topics(
        [_new_topic(t, replication_factor, min_insync_replicas) for t in topics], timeout_ms=int(timeout_s * 1000))
    created: set[str] = set()
    for topic_error in response.to_object()["topic_errors"]:
        name, code = topic_error["topic"], topic_error["error_code"]
        error = for_code(code)(topic_error.get("error_message") or f"error code {code}") if code else None
        if error is None:
            created.add(name)
        elif isinstance(error, TopicAuthorizationFailedError):
            raise KafkaAccessError(f"{not_authorized(f'CREATE topic {name}')} "
                                   "(or create the topics first: `specstream topics create` with an admin user)")
        elif not isinstance(error, TopicAlreadyExistsError):
            raise KafkaError(f"cannot create topic {name}: {type(error).__name__}: {error}")
    return created


async def list_topics(kafka: Connectable, *, timeout_s: float = 30.0) -> list[str]:
    admin = make_admin(kafka)
    await start_admin(admin, kafka, timeout_s)
    try:
        return sorted(await admin.list_topics())
    finally:
        await admin.close()


async def delete_topics(kafka: Connectable, names: Sequence[str], *, timeout_s: float = 30.0) -> None:
    """Delete topics, ignoring those that do not exist (used for temporary reply topics)."""
    if not names:
        return
    admin = make_admin(kafka)
    await start_admin(admin, kafka, timeout_s)
    try:
        existing = set(await admin.list_topics())
        doomed = [n for n in names if n in existing]
        if doomed:
            await admin.delete_topics(doomed, timeout_ms=int(timeout_s * 1000))
    finally:
        await admin.close()


async def start_admin(admin: AIOKafkaAdminClient, kafka: Connectable, timeout_s: float) -> None:
    """Start an admin client, or raise one line: KafkaAccessError (refused) or KafkaConnectionError (unreachable).

    One direct connection goes first: it names what is wrong (credentials, certificate, protocol), where
    aiokafka would log an error of its own and then only say that it could not bootstrap.
    """
    try:
        await asyncio.wait_for(check_connection(kafka), timeout=timeout_s)
        await asyncio.wait_for(admin.start(), timeout=timeout_s)
    except (KafkaError, asyncio.TimeoutError) as error:
        await admin.close()
        if isinstance(error, (KafkaAccessError, KafkaConnectionError)):
            raise
        reason = "timed out" if isinstance(error, asyncio.TimeoutError) else (error.args[0] if error.args else error)
        raise KafkaConnectionError(f"cannot reach Kafka at {settings_of(kafka).bootstrap_servers}: {reason}") from error


def transient(error: BaseException) -> bool:
    """Whether asking Kafka again may succeed: what aiokafka calls retriable (a broker not ready or restarting, a
    leader moving, a coordinator loading), and two errors it does not call so: its own client-side timeout, what a
    request to a broker that just died ends in (a produce batch or an offsets look-up expiring), and the plain
    KafkaError it raises when no known broker answered a metadata request (every broker restarting at once)."""
    if not isinstance(error, KafkaError):
        return False
    no_broker = type(error) is KafkaError and str(error.args[0] if error.args else "").startswith(_NO_METADATA)
    return error.retriable or isinstance(error, KafkaTimeoutError) or no_broker


async def retrying(call: Callable[[], Awaitable[ResultT]], *, timeout_s: float, pause_s: float = 0.2,
                   max_pause_s: float | None = None,
                   on_retry: Callable[[KafkaError], None] | None = None) -> ResultT:
    """``call()``, asked again while its error is :func:`transient`, for at most ``timeout_s``; then that error.

    The pause between tries starts at ``pause_s`` and doubles up to ``max_pause_s`` (None: it stays). ``on_retry``
    hears each error that will be retried, before its pause, and may raise to give up at once.

    A new cluster creates its offsets topic at the first group request, and until it has (a second or two) every
    group's coordinator is "not available": a group lookup on a fresh cluster needs this.
    """
    deadline = time.monotonic() + timeout_s
    pause = pause_s
    while True:
        try:
            return await call()
        except KafkaError as error:
            if not transient(error) or time.monotonic() >= deadline:
                raise
            if on_retry is not None:
                on_retry(error)
        # The last try falls on the deadline, not a whole pause after it.
        await asyncio.sleep(max(0.0, min(pause, deadline - time.monotonic())))
        pause = min(2 * pause, max_pause_s or pause_s)


async def wait_visible(admin: AIOKafkaAdminClient, names: list[str], timeout_s: float) -> None:
    """Until every broker knows every topic with a leader for each partition.

    The controller acknowledges a creation before every broker has the topic from the
    metadata log, and a describe goes to a random broker, so one broker knowing the
    topic says nothing about the next: a describe or produce right after may still hear
    UNKNOWN_TOPIC_OR_PARTITION. Each broker is asked in turn.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        by_broker = await metadata_by_broker(admin, names)
        pending = {d["topic"] for described in by_broker.values() for d in described if not _has_leaders(d)}
        if by_broker and not pending:
            return
        if loop.time() > deadline:
            raise KafkaError(f"topics not visible after {timeout_s:.0f}s: {', '.join(sorted(pending))}")
        await asyncio.sleep(0.1)


async def metadata_by_broker(admin: AIOKafkaAdminClient, names: list[str]) -> dict[int, list[dict[str, Any]]]:
    """Each reachable broker's own metadata of the topics, by node id (a describe asks a random broker).

    A broker that cannot be reached is left out: it cannot give a client a stale answer either.
    """
    request = MetadataRequest(names)
    answers: dict[int, list[dict[str, Any]]] = {}
    # The admin's client holds the cluster's broker list from its bootstrap; there is no public
    # call that sends a metadata request to one chosen broker.
    for broker in admin._client.cluster.brokers():  # noqa: SLF001
        try:
            response = await admin._client.send(broker.nodeId, request)  # noqa: SLF001
        except KafkaError:
            continue
        answers[broker.nodeId] = response.to_object()["topics"]
    return answers


def _has_leaders(described: dict[str, Any]) -> bool:
    """A described topic is usable once known with a leader for each partition (-1: none elected yet)."""
    partitions = described.get("partitions")
    return not described.get("error_code") and bool(partitions) and all(p.get("leader", -1) >= 0 for p in partitions)


async def read_partition(kafka: Connectable, topic: str, *, timeout_s: float = 30.0) -> list[ConsumerRecord]:
    """Every record of the topic's partition 0, from the beginning up to the end it had when called.

    For small bookkeeping topics (announcements, one reply topic) read whole; stops at
    timeout_s with what it has.
    """
    tp = TopicPartition(topic, 0)
    consumer = make_consumer(kafka, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    records: list[ConsumerRecord] = []
    try:
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        deadline = time.monotonic() + timeout_s
        while await consumer.position(tp) < end and time.monotonic() < deadline:
            batch = await consumer.getmany(tp, timeout_ms=500)
            records.extend(r for r in batch.get(tp, []) if r.offset < end)
    finally:
        await consumer.stop()
    return records


@contextlib.asynccontextmanager
async def reply_session(kafka: Connectable, reply: Topic, *,
                        client_id: str) -> AsyncIterator[tuple[AIOKafkaConsumer, AIOKafkaProducer]]:
    """A reply topic of the caller's own (as an edge has one), read from its start, and a producer to send requests
    with; the topic is deleted afterwards (`specstream send`, `specstream eval`)."""
    settings = settings_of(kafka)
    await ensure_topics(kafka, [reply], replication_factor=settings.replication_factor,
                        min_insync_replicas=settings.min_insync_replicas)
    consumer = make_consumer(kafka, enable_auto_commit=False, auto_offset_reset="earliest")
    producer = make_producer(kafka, client_id=client_id)
    await consumer.start()
    await producer.start()
    try:
        consumer.assign([TopicPartition(reply.name, 0)])
        yield consumer, producer
    finally:
        await stop_polling(None, consumer)  # a fetch being retried when it stops must not fail the session
        await producer.stop()
        with contextlib.suppress(Exception):
            await delete_topics(kafka, [reply.name])


async def stop_polling(task: asyncio.Task[None] | None, consumer: AIOKafkaConsumer | None) -> None:
    """Stop a background poll loop, then its consumer: the loop first, so it never polls a closed consumer."""
    if task is not None:
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass  # the loop's own end, or the error it died of, was already logged by it
    if consumer is not None:
        try:
            await consumer.stop()
        except asyncio.CancelledError:
            # aiokafka's fetcher cancels a fetch it is retrying (a partition not there yet, a broker moving) and
            # awaits it, which raises that cancellation here; only a cancellation of this task itself goes on.
            task_now = asyncio.current_task()
            if task_now is not None and task_now.cancelling():
                raise
