"""Shared fixtures.

Kafka: ``kafka_bootstrap`` (the local single node, started for the session
unless already running, or $SPECSTREAM_BOOTSTRAP_SERVERS) and ``kafka_cluster``
come from :mod:`tests.kafka_fixtures`.

Engine worker: ``worker_harness`` runs one real :class:`EngineWorker` on the
real default model in this process (session-scoped: the model loads once), on
topics with a prefix of its own, plus a producer to publish raw bytes onto its
request topic and readers for reply and dead-letter topics. ``reply_inbox``
gives each test a reply topic of its own.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import RecordMetadata
from pydantic import BaseModel

from engine.config import EngineConfig
from schemas.events import Completion, DeadLetter, ErrorEvent, TokenChunk
from streams.kafka import clients
from streams.config import EdgeSettings, KafkaSettings, Settings, WorkerSettings
from tests import parallel
from tests.kafka_fixtures import kafka_bootstrap, kafka_cluster, kafka_cluster_session, kafka_single  # noqa: F401
from tests.kafka_fixtures import revive_single_broker

# Small enough to be quick on 2 cores, large enough to hold a few short requests at once.
TEST_MAX_MODEL_LEN = 512
TEST_MAX_MESSAGE_BYTES = 64 * 1024
EventT = TypeVar("EventT", bound=BaseModel)


@pytest.fixture(autouse=True)
def _no_leftover_log_handlers() -> Any:
    """A test that runs a CLI command in this process configures logging onto pytest's captured stderr of that
    test; left installed, every later record (the websocket client's DEBUG frames, which carry an API key) fails
    on the closed stream and Python's logging prints the record, arguments and all, as a "Logging error". Each
    test gets the root logger back as it found it."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in [h for h in root.handlers if h not in handlers]:
        root.removeHandler(handler)
    root.setLevel(level)


CLUSTER_TIER = Path(__file__).parent / "cluster"


def pytest_configure(config: pytest.Config) -> None:
    parallel.threads_sleep_at_barriers(config)
    if parallel.in_a_test_process():
        parallel.one_thread_each()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` groups tests by what their process builds once (tests/parallel.py)."""
    return parallel.SharedWorkScheduling(config, log) if config.getvalue("dist") == "loadgroup" else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The three-node cluster lives for tests/cluster only (tests/cluster/conftest.py): a test elsewhere that marks
    itself `cluster` or asks for the cluster is an error that names it, not a cluster left running to the end."""
    del config
    wrong = [item.nodeid for item in items if CLUSTER_TIER not in item.path.parents
             and (item.get_closest_marker("cluster") is not None
                  or {"kafka_cluster", "kafka_cluster_session"} & set(getattr(item, "fixturenames", ())))]
    if wrong:
        raise pytest.UsageError("tests that start the three-node cluster belong in tests/cluster:\n  "
                                + "\n  ".join(wrong))


def pytest_runtest_setup(item: pytest.Item) -> None:
    if {"kafka_bootstrap", "kafka_single"} & set(getattr(item, "fixturenames", ())):
        revive_single_broker()


def worker_test_settings(bootstrap_servers: str, prefix: str, worker_id: str) -> Settings:
    return Settings(
        kafka=KafkaSettings(bootstrap_servers=bootstrap_servers, topic_prefix=prefix, request_partitions=2,
                            manage_local=False),
        engine=EngineConfig(max_model_len=TEST_MAX_MODEL_LEN, kv_cache_bytes=96 * 1024 * 1024,
                              max_running_requests=8),
        worker=WorkerSettings(id=worker_id, max_message_bytes=TEST_MAX_MESSAGE_BYTES, heartbeat_s=1.0,
                              drain_timeout_s=5.0),
        edge=EdgeSettings(),
    )


class ReplyInbox:
    """Reads one reply topic from its start and sorts events by request id."""

    def __init__(self, bootstrap_servers: str, topic: str) -> None:
        self.topic = topic
        self._consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False,
                                          auto_offset_reset="earliest")
        self._events: dict[str | None, list[BaseModel]] = defaultdict(list)

    async def start(self) -> None:
        await self._consumer.start()
        self._consumer.assign([TopicPartition(self.topic, 0)])

    async def stop(self) -> None:
        await self._consumer.stop()

    async def _pump(self, timeout_s: float) -> None:
        batch = await self._consumer.getmany(timeout_ms=int(timeout_s * 1000))
        for records in batch.values():
            for record in records:
                event = clients.decode_reply(record.value)
                self._events[getattr(event, "request_id", None)].append(event)

    async def events_for(self, request_id: str | None, timeout_s: float = 120.0) -> list[BaseModel]:
        """Every event of one request, up to and including its Completion or ErrorEvent."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            events = self._events[request_id]
            if events and isinstance(events[-1], (Completion, ErrorEvent)):
                return list(events)
            if loop.time() > deadline:
                raise AssertionError(f"no final event for {request_id!r} within {timeout_s}s; got {events}")
            await self._pump(0.2)

    async def error_for(self, request_id: str | None, timeout_s: float = 60.0) -> ErrorEvent:
        events = await self.events_for(request_id, timeout_s)
        assert len(events) == 1 and isinstance(events[0], ErrorEvent), events
        return events[0]


@dataclass
class WorkerHarness:
    settings: Settings
    worker: Any  # streams.worker.EngineWorker
    producer: AIOKafkaProducer
    model: str

    @property
    def bootstrap_servers(self) -> str:
        return self.settings.kafka.bootstrap_servers

    @property
    def request_topic(self) -> str:
        return self.settings.catalog.requests.name

    def request(self, reply_topic: str, **fields: Any) -> dict[str, Any]:
        """A valid GenerateRequest body (as a dict, so tests can break it on purpose)."""
        body: dict[str, Any] = {
            "request_id": f"t-{uuid.uuid4().hex[:12]}",
            "messages": [{"role": "user", "content": "What is Apache Kafka? Answer in one sentence."}],
            "model": self.model,
            "sampling": {"max_tokens": 8},
            "reply_to": {"topic": reply_topic, "partition": 0},
        }
        body.update(fields)
        return body

    async def publish_raw(self, value: bytes, key: bytes | None = None) -> RecordMetadata:
        return await self.producer.send_and_wait(self.request_topic, value, key=key)

    async def publish(self, body: dict[str, Any]) -> RecordMetadata:
        import json

        return await self.publish_raw(json.dumps(body).encode(), key=str(body.get("request_id", "")).encode())

    async def first_event(self, topic: str, model: type[EventT], matches: Callable[[EventT], bool],
                          timeout_s: float = 30.0) -> EventT | None:
        """The first event of partition 0 of `topic`, read from the start, that `matches`; None after timeout_s."""
        # A consumer per call, read from the start: an idle consumer kept for the whole session
        # only adds fetch traffic and a shutdown that can fail under load.
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap_servers, enable_auto_commit=False,
                                    auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while loop.time() < deadline:
                batch = await consumer.getmany(timeout_ms=200)
                for records in batch.values():
                    for record in records:
                        event = clients.decode(record.value, model)
                        if matches(event):
                            return event
        finally:
            await consumer.stop()
        return None

    async def dead_letter_for(self, sent: RecordMetadata, timeout_s: float = 30.0) -> DeadLetter:
        """The dead letter whose source is the given published record."""
        letter = await self.first_event(
            self.settings.catalog.dead_letters.name, DeadLetter,
            lambda d: (d.source_topic, d.source_partition, d.source_offset) == (sent.topic, sent.partition, sent.offset),
            timeout_s,
        )
        if letter is None:
            raise AssertionError(f"no dead letter for {sent.topic}/{sent.partition}@{sent.offset}")
        return letter

    async def serves_a_request(self, inbox: ReplyInbox) -> Completion:
        """Proof that the worker still works: a short request completes."""
        body = self.request(inbox.topic, sampling={"max_tokens": 2})
        await self.publish(body)
        events = await inbox.events_for(body["request_id"])
        assert isinstance(events[-1], Completion), events
        return events[-1]


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def worker_harness(kafka_bootstrap: str) -> AsyncIterator[WorkerHarness]:  # noqa: F811
    from streams.worker import EngineWorker

    prefix = f"test-{uuid.uuid4().hex[:8]}"
    settings = worker_test_settings(kafka_bootstrap, prefix, worker_id=f"pytest-{uuid.uuid4().hex[:6]}")
    producer = clients.make_producer(kafka_bootstrap, client_id="pytest")
    await producer.start()
    worker = EngineWorker(settings)
    await worker.start()
    assert worker.engine is not None
    harness = WorkerHarness(settings, worker, producer, model=worker.engine.model_name)
    try:
        yield harness
    finally:
        # Each step on its own: one failing close must not leave the others running.
        await worker.stop()
        with contextlib.suppress(Exception):
            await producer.stop()
        with contextlib.suppress(Exception):
            await clients.delete_topics(kafka_bootstrap, [t.name for t in settings.catalog.shared_topics()])


@pytest_asyncio.fixture(loop_scope="session")
async def reply_inbox(worker_harness: WorkerHarness) -> AsyncIterator[ReplyInbox]:
    """A reply topic of this test's own, as an edge would own one."""
    topic = worker_harness.settings.catalog.replies(f"t-{uuid.uuid4().hex[:10]}")
    await clients.ensure_topics(worker_harness.bootstrap_servers, [topic])
    inbox = ReplyInbox(worker_harness.bootstrap_servers, topic.name)
    await inbox.start()
    try:
        yield inbox
    finally:
        await inbox.stop()
        await clients.delete_topics(worker_harness.bootstrap_servers, [topic.name])


def chunks_and_completion(events: list[BaseModel]) -> tuple[list[TokenChunk], Completion]:
    """Split a finished stream, checking its shape: chunks 0..n-1 without gaps, then one Completion."""
    *chunks, last = events
    assert isinstance(last, Completion), f"stream did not end with a Completion: {last}"
    assert all(isinstance(c, TokenChunk) for c in chunks), events
    assert [c.index for c in chunks] == list(range(len(chunks)))  # type: ignore[attr-defined]
    assert last.num_chunks == len(chunks)
    return chunks, last  # type: ignore[return-value]
