"""A toy consumer built on the foundation in a few lines gets, on the real broker and for free: replies,
commit-after-publish, dead letters for bad input, back-pressure, drain, hand-back and announcements."""
from __future__ import annotations

import asyncio
import base64
import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Literal

import pytest
import pytest_asyncio
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from pydantic import BaseModel, ValidationError

from schemas.events import DeadLetter, ErrorEvent, Event, ReplyRoute, ServiceAnnouncement
from schemas.topics import HOUR_MS, Topic, TopicCatalog
from streams.kafka import clients
from streams.service import Consumer, Delivery, Output, ServiceOptions
from streams.service.runner import ConsumerService
from tests.kafka_fixtures import kafka_bootstrap  # noqa: F401

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.kafka]


# --- the toy consumer: its input model, its output event, its handler -----------------------------------------------


class Ping(Event):
    request_id: str
    reply_to: ReplyRoute
    text: str


class Pong(Event):
    type: Literal["pong"] = "pong"
    request_id: str
    text: str


class Gate:
    """Holds pings whose text is 'wait' until released; counts how many the handler held at once."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.holding = 0
        self.most = 0
        self.handed_back: list[str] = []

    async def echo(self, ping: Ping, delivery: Delivery) -> Pong:
        delivery.on_handback(lambda: self.handed_back.append(ping.request_id))
        if ping.text == "wait":
            self.holding += 1
            self.most = max(self.most, self.holding)
            try:
                await self.open.wait()
            finally:
                self.holding -= 1
        return Pong(request_id=ping.request_id, text=ping.text.upper())


def toy(catalog: TopicCatalog, gate: Gate) -> Consumer[Ping]:
    pings = Topic(name=f"{catalog.prefix}.pings", partitions=1, key="request_id", retention_ms=HOUR_MS,
                  carries="Ping", purpose="Pings for the toy consumer.")
    replies = catalog.replies("toy")
    return Consumer(kind="toy", topic=pings, input_model=Ping, handle=gate.echo, outputs=[Output(replies, Pong)])


# --- harness --------------------------------------------------------------------------------------------------------


class Toy:
    def __init__(self, bootstrap: str, prefix: str) -> None:
        self.bootstrap = bootstrap
        self.catalog = TopicCatalog(prefix=prefix)
        self.gate = Gate()
        self.reply_topic = self.catalog.replies("toy").name
        self.producer = clients.make_producer(bootstrap, client_id="pytest-toy")

    def service(self, *, drain_timeout_s: float = 5.0, max_inflight: int = 1) -> ConsumerService:
        options = ServiceOptions(kafka=self.bootstrap, catalog=self.catalog,
                                 service_id=f"toy-{uuid.uuid4().hex[:6]}", max_message_bytes=2048, heartbeat_s=1.0,
                                 max_inflight=max_inflight, drain_timeout_s=drain_timeout_s)
        return ConsumerService(options, toy(self.catalog, self.gate))

    @property
    def input_topic(self) -> str:
        return f"{self.catalog.prefix}.pings"

    async def send_raw(self, value: bytes) -> int:
        sent = await self.producer.send_and_wait(self.input_topic, value)
        return sent.offset

    async def ping(self, text: str) -> tuple[str, int]:
        request_id = f"p-{uuid.uuid4().hex[:8]}"
        body = {"request_id": request_id, "reply_to": {"topic": self.reply_topic}, "text": text}
        return request_id, await self.send_raw(json.dumps(body).encode())

    async def first(self, topic: str, model: type[BaseModel], matches: Callable[[BaseModel], bool],
                    timeout_s: float = 30.0) -> BaseModel:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            for record in await clients.read_partition(self.bootstrap, topic, timeout_s=5):
                try:
                    event = clients.decode(record.value, model)
                except ValidationError:
                    continue  # another kind of event on the same topic
                if matches(event):
                    return event
            await asyncio.sleep(0.3)
        raise AssertionError(f"nothing matching on {topic} within {timeout_s}s")

    async def pong(self, request_id: str) -> Pong:
        pong = await self.first(self.reply_topic, Pong, lambda p: p.request_id == request_id)
        assert isinstance(pong, Pong)
        return pong

    async def dead_letter(self, offset: int) -> DeadLetter:
        letter = await self.first(self.catalog.dead_letters.name, DeadLetter,
                                  lambda d: (d.source_topic, d.source_offset) == (self.input_topic, offset))
        assert isinstance(letter, DeadLetter)
        return letter

    async def announcement(self, service: ConsumerService, state: str) -> ServiceAnnouncement:
        announcement = await self.first(self.catalog.services.name, ServiceAnnouncement,
                                        lambda a: (a.service_id, a.state) == (service.service_id, state))
        assert isinstance(announcement, ServiceAnnouncement)
        return announcement

    async def served_by_a_successor(self, request_id: str) -> ConsumerService:
        """A new instance of the group answers the request (redelivered from its uncommitted offset)."""
        successor = self.service()
        await successor.start()
        try:
            assert (await self.pong(request_id)).text == "WAIT"
        finally:
            await successor.stop()
        return successor

    async def committed(self, group_id: str) -> int:
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            tp = TopicPartition(self.input_topic, 0)
            offsets = await admin.list_consumer_group_offsets(group_id, partitions=[tp])
            return offsets[tp].offset if tp in offsets else -1
        finally:
            await admin.close()

    async def committed_past(self, group_id: str, offset: int, timeout_s: float = 15.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (position := await self.committed(group_id)) <= offset:
            assert loop.time() < deadline, f"offset {offset} not committed (committed position {position})"
            await asyncio.sleep(0.2)


@pytest_asyncio.fixture(loop_scope="session")
async def harness(kafka_bootstrap: str) -> AsyncIterator[Toy]:  # noqa: F811
    toy_harness = Toy(kafka_bootstrap, f"test-toy-{uuid.uuid4().hex[:8]}")
    await toy_harness.producer.start()
    await clients.ensure_topics(kafka_bootstrap, [toy_harness.catalog.replies("toy")])  # an edge creates its own
    try:
        yield toy_harness
    finally:
        await toy_harness.producer.stop()
        catalog = toy_harness.catalog
        await clients.delete_topics(kafka_bootstrap, [t.name for t in catalog.shared_topics()]
                                     + [toy_harness.input_topic, toy_harness.reply_topic])


async def test_a_toy_consumer_replies_commits_after_publishing_and_dead_letters_bad_input(harness: Toy) -> None:
    service = harness.service()
    await service.start()
    try:
        request_id, offset = await harness.ping("wait")
        await asyncio.sleep(2.0)  # held by the handler: nothing published, so nothing committed
        assert await harness.committed(service.group_id) <= offset
        harness.gate.open.set()
        assert (await harness.pong(request_id)).text == "WAIT"
        await harness.committed_past(service.group_id, offset)

        bad = {
            b"{nope": "invalid_request: malformed JSON",
            json.dumps({"request_id": "x", "reply_to": {"topic": harness.reply_topic}, "text": "hi",
                        "schema_version": 7}).encode(): "unsupported_schema_version",
            json.dumps({"request_id": "x", "reply_to": {"topic": harness.reply_topic}}).encode(): "text: Field required",
            b"x" * 4096: "message_too_large",
        }
        for value, reason in bad.items():
            offset = await harness.send_raw(value)
            letter = await harness.dead_letter(offset)
            assert reason in letter.reason
            assert base64.b64decode(letter.original_b64) == value  # the original bytes are kept
        await harness.committed_past(service.group_id, offset)
        # Where a reply route can be read from the bad message, the sender hears why too.
        error = await harness.first(harness.reply_topic, ErrorEvent, lambda e: e.request_id == "x")
        assert isinstance(error, ErrorEvent) and error.code == "unsupported_schema_version"

        request_id, _ = await harness.ping("still serving")
        assert (await harness.pong(request_id)).text == "STILL SERVING"
    finally:
        await service.stop()


async def test_back_pressure_drain_and_announcements(harness: Toy) -> None:
    harness.gate.open.clear()
    service = harness.service(max_inflight=1)
    await service.start()
    ready = await harness.announcement(service, "ready")
    assert ready.kind == "toy" and ready.host and ready.pid

    first, _ = await harness.ping("wait")
    second, _ = await harness.ping("wait")
    await asyncio.sleep(2.0)
    assert harness.gate.most == 1 and service.in_flight == 1  # one slot: the second waits in Kafka
    stopping = asyncio.create_task(service.stop())
    await asyncio.sleep(0.5)
    harness.gate.open.set()  # the drain lets the held ping finish, then stops
    await stopping
    assert (await harness.pong(first)).text == "WAIT"
    draining, stopped = [await harness.announcement(service, state) for state in ("draining", "stopped")]
    assert draining.at <= stopped.at

    # The second ping was never started: a new instance of the group serves it.
    await harness.served_by_a_successor(second)


async def test_work_unfinished_at_the_end_of_the_drain_is_handed_back_and_redelivered(harness: Toy) -> None:
    harness.gate.open.clear()
    service = harness.service(drain_timeout_s=1.0)
    await service.start()
    request_id, offset = await harness.ping("wait")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while service.in_flight == 0:
        assert loop.time() < deadline, "the ping never reached the handler"
        await asyncio.sleep(0.1)
    await service.stop()
    assert request_id in harness.gate.handed_back
    assert await harness.committed(service.group_id) <= offset  # not answered, not committed

    harness.gate.open.set()
    successor = await harness.served_by_a_successor(request_id)
    await harness.committed_past(successor.group_id, offset)
