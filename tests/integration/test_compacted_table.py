"""The shared follower of compacted topics (streams/kafka/compacted_table.py), on the real broker."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaConnectionError
from pydantic import BaseModel

from schemas.topics import Topic
from streams.kafka import clients, compacted_table
from streams.kafka.compacted_table import CompactedTable, merged, newest_by, replace
from tests.kafka_fixtures import kafka_bootstrap, kafka_single, unique_topic  # noqa: F401

pytestmark = pytest.mark.kafka


class Row(BaseModel):
    name: str
    value: int
    updated_at: float


def row(name: str, value: int, updated_at: float | None = None) -> Row:
    return Row(name=name, value=value, updated_at=time.time() if updated_at is None else updated_at)


@pytest_asyncio.fixture
async def topic(kafka_bootstrap: str) -> AsyncIterator[Topic]:  # noqa: F811
    topic = Topic(name=unique_topic("compacted"), partitions=2, key="name", retention_ms=-1, carries="Row",
                  purpose="test", compacted=True)
    yield topic
    await clients.delete_topics(kafka_bootstrap, [topic.name])


@pytest_asyncio.fixture(loop_scope="function")  # the producer must live on the test's loop
async def producer(kafka_bootstrap: str) -> AsyncIterator[AIOKafkaProducer]:  # noqa: F811
    producer = clients.make_producer(kafka_bootstrap, client_id="test-compacted")
    await producer.start()
    yield producer
    await producer.stop()


async def send(producer: AIOKafkaProducer, topic: Topic, key: str, value: Row | bytes | None) -> None:
    data = clients.encode(value) if isinstance(value, Row) else value
    await producer.send_and_wait(topic.name, data, key=key.encode())


async def until(predicate: Callable[[], bool], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def test_a_table_started_late_holds_the_newest_row_of_every_key_and_no_deleted_one(
        kafka_bootstrap: str, topic: Topic, producer: AIOKafkaProducer) -> None:  # noqa: F811
    await clients.ensure_topics(kafka_bootstrap, [topic])
    await send(producer, topic, "a", row("a", 1))
    await send(producer, topic, "b", row("b", 1))
    await send(producer, topic, "a", row("a", 2))
    await send(producer, topic, "b", None)
    table = CompactedTable(kafka_bootstrap, topic, Row)
    await table.start()  # returns once loaded: no waiting for a poll here
    try:
        assert table.loaded.is_set()
        assert {key: r.value for key, r in table.rows.items()} == {"a": 2}
        assert "b" in table.deleted_at
    finally:
        await table.stop()


async def test_caught_up_sees_a_write_made_just_before_it(kafka_bootstrap: str, topic: Topic,  # noqa: F811
                                                         producer: AIOKafkaProducer) -> None:
    changes: list[tuple[str, int | None]] = []
    table = CompactedTable(kafka_bootstrap, topic, Row,
                           on_change=lambda key, r: changes.append((key, None if r is None else r.value)))
    await table.start()
    try:
        for n in range(5):
            await send(producer, topic, f"k{n}", row(f"k{n}", n))
            await table.caught_up()
            assert table.get(f"k{n}") is not None and table.get(f"k{n}").value == n  # type: ignore[union-attr]
        await send(producer, topic, "k0", None)
        await table.caught_up()
        assert table.get("k0") is None
        assert changes[-1] == ("k0", None)
    finally:
        await table.stop()


async def test_caught_up_on_an_idle_table_does_not_wait_out_the_followers_pending_fetch(
        kafka_bootstrap: str, topic: Topic, producer: AIOKafkaProducer) -> None:  # noqa: F811
    # The follower's fetch is held open by the broker for fetch_max_wait_ms (500 ms) when nothing is new; asked on
    # its connection, the end offsets queued behind it and every caught_up on an idle table took ~0.5 s.
    await clients.ensure_topics(kafka_bootstrap, [topic])
    await send(producer, topic, "a", row("a", 1))
    table = CompactedTable(kafka_bootstrap, topic, Row)
    await table.start()
    try:
        await asyncio.sleep(0.3)  # the follower is now in a long-polling fetch on an idle topic
        took = []
        for _ in range(5):
            started = time.monotonic()
            await table.caught_up()
            took.append(time.monotonic() - started)
        assert sorted(took)[2] < 0.25, f"caught_up on an idle table took {took}"
        await send(producer, topic, "a", row("a", 2))  # and read-your-writes still holds
        await table.caught_up()
        assert table.get("a") is not None and table.get("a").value == 2  # type: ignore[union-attr]
    finally:
        await table.stop()


async def test_newest_by_keeps_the_newer_stamp_whatever_order_records_land_in(
        kafka_bootstrap: str, topic: Topic, producer: AIOKafkaProducer) -> None:  # noqa: F811
    table = CompactedTable(kafka_bootstrap, topic, Row, policy=newest_by(lambda r: r.updated_at))
    await table.start()
    try:
        now = time.time()
        await send(producer, topic, "a", row("a", 2, now))
        await send(producer, topic, "a", row("a", 1, now - 10))  # a slow writer's older state, landing last
        await table.caught_up()
        assert table.get("a").value == 2  # type: ignore[union-attr]
    finally:
        await table.stop()


async def test_a_record_stamped_before_its_keys_tombstone_does_not_bring_it_back(
        kafka_bootstrap: str, topic: Topic, producer: AIOKafkaProducer) -> None:  # noqa: F811
    table = CompactedTable(kafka_bootstrap, topic, Row)  # by default newest by updated_at
    await table.start()
    try:
        before = time.time() - 5
        await send(producer, topic, "a", row("a", 1, before))
        await send(producer, topic, "a", None)
        await send(producer, topic, "a", row("a", 2, before + 1))  # written before the delete, read after it
        await table.caught_up()
        assert table.get("a") is None
        await send(producer, topic, "a", row("a", 3))  # a new record after the delete does
        await table.caught_up()
        assert table.get("a").value == 3  # type: ignore[union-attr]
    finally:
        await table.stop()


async def test_a_merge_policy_combines_every_record_of_a_key_and_replace_keeps_the_last(
        kafka_bootstrap: str, topic: Topic, producer: AIOKafkaProducer) -> None:  # noqa: F811
    def add(held: Row | None, new: Row) -> Row:
        return new if held is None else held.model_copy(update={"value": held.value + new.value})

    summed = CompactedTable(kafka_bootstrap, topic, Row, policy=merged(add))
    last = CompactedTable(kafka_bootstrap, topic, Row, policy=replace(), create_topic=False)
    await summed.start()
    await last.start()
    try:
        now = time.time()
        for n, stamp in [(1, now), (2, now - 10), (4, now - 20)]:
            await send(producer, topic, "a", row("a", n, stamp))
        await summed.caught_up()
        await last.caught_up()
        assert summed.get("a").value == 7  # type: ignore[union-attr]
        assert last.get("a").value == 4  # type: ignore[union-attr]
        assert summed.put("a", row("a", 10)).value == 17  # type: ignore[union-attr]  # a local write merges too
    finally:
        await summed.stop()
        await last.stop()


async def test_a_malformed_record_is_skipped_and_the_rest_still_read(
        kafka_bootstrap: str, topic: Topic, producer: AIOKafkaProducer, caplog: pytest.LogCaptureFixture,  # noqa: F811
) -> None:
    await clients.ensure_topics(kafka_bootstrap, [topic])
    await send(producer, topic, "bad", b"{not json")
    await send(producer, topic, "worse", b'{"name": "worse"}')  # valid JSON, missing fields
    await send(producer, topic, "good", row("good", 1))
    table = CompactedTable(kafka_bootstrap, topic, Row)
    with caplog.at_level(logging.WARNING, logger="streams.kafka.compacted_table"):
        await table.start()
    try:
        assert set(table.rows) == {"good"}
        assert "record of bad skipped" in caplog.text and "record of worse skipped" in caplog.text
    finally:
        await table.stop()


async def test_a_table_waiting_for_its_topic_loads_once_the_topic_is_created(
        kafka_bootstrap: str, topic: Topic, producer: AIOKafkaProducer, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
) -> None:
    monkeypatch.setattr(compacted_table, "TOPIC_LOOK_S", 0.2)
    table = CompactedTable(kafka_bootstrap, topic, Row, create_topic=False, wait_for_topic=True)
    await table.start(wait=False)
    try:
        await asyncio.sleep(0.5)
        assert not table.loaded.is_set() and table.rows == {}
        await clients.ensure_topics(kafka_bootstrap, [topic])
        await send(producer, topic, "a", row("a", 1))
        await until(lambda: "a" in table.rows)
        await table.caught_up()  # and read-your-writes works from then on
        await send(producer, topic, "b", row("b", 2))
        await table.caught_up()
        assert set(table.rows) == {"a", "b"} and table.loaded.is_set()
    finally:
        await table.stop()


async def test_a_broker_error_is_retried_with_one_warning_a_minute(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(compacted_table, "RETRY_S", 0.0)
    table = CompactedTable("127.0.0.1:9", Topic(name="t", partitions=1, key="k", retention_ms=-1, carries="Row",
                                                purpose="test"), Row)
    failures = iter(range(3))

    async def flaky() -> str:
        if next(failures, None) is not None:
            raise KafkaConnectionError("broker gone")
        return "read"

    with caplog.at_level(logging.WARNING, logger="streams.kafka.compacted_table"):
        assert await table._retrying(flaky) == "read"
    assert caplog.text.count("cannot read") == 1


async def test_find_sees_a_key_another_process_just_wrote_without_waiting_for_a_poll(
        kafka_bootstrap: str, topic: Topic, producer: AIOKafkaProducer) -> None:  # noqa: F811
    # Two edges on one topic: a client gets an id from one and at once asks the other, whose follower has not
    # polled the record yet (up to POLL_MS later). find() catches up on the miss instead of answering "no such key".
    writer = CompactedTable(kafka_bootstrap, topic, Row)
    reader = CompactedTable(kafka_bootstrap, topic, Row, create_topic=False)
    await writer.start()
    await reader.start()
    try:
        for n in range(10):
            await send(producer, topic, f"k{n}", row(f"k{n}", n))
            writer.put(f"k{n}", row(f"k{n}", n))  # the writer's own read-your-writes
            found = await reader.find(f"k{n}")
            assert found is not None and found.value == n, f"k{n} not found by the other table"
    finally:
        await writer.stop()
        await reader.stop()


async def test_find_of_a_key_nobody_wrote_answers_none_within_the_bound(
        kafka_bootstrap: str, topic: Topic) -> None:  # noqa: F811
    table = CompactedTable(kafka_bootstrap, topic, Row)
    await table.start()
    try:
        started = time.monotonic()
        assert await table.find("never-written") is None
        assert time.monotonic() - started < compacted_table.FIND_CATCH_UP_S
    finally:
        await table.stop()


async def test_concurrent_misses_share_one_end_offsets_request_and_a_later_one_asks_again(
        kafka_bootstrap: str, topic: Topic, producer: AIOKafkaProducer) -> None:  # noqa: F811
    table = CompactedTable(kafka_bootstrap, topic, Row)
    await table.start()
    assert table._ends is not None
    real = table._ends.end_offsets
    asked: list[float] = []

    async def slow_end_offsets(partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        asked.append(time.monotonic())
        ends = await real(partitions)
        await asyncio.sleep(0.3)  # answered, but not yet back: a write now is past these ends
        return ends

    table._ends.end_offsets = slow_end_offsets  # type: ignore[method-assign]
    try:
        herd = [asyncio.create_task(table.find(f"missing-{n}")) for n in range(50)]
        await asyncio.sleep(0.1)  # the herd's request is in flight
        await send(producer, topic, "late", row("late", 1))
        await table.caught_up()  # must not share the herd's request, answered before this write
        assert table.get("late") is not None
        assert await asyncio.gather(*herd) == [None] * 50
        assert len(asked) == 2, f"{len(asked)} end-offsets requests for 50 concurrent misses and one later"
    finally:
        await table.stop()


async def test_a_table_stopped_while_a_miss_waits_for_end_offsets_starts_again_and_finds_keys(
        kafka_bootstrap: str, topic: Topic, producer: AIOKafkaProducer) -> None:  # noqa: F811
    table = CompactedTable(kafka_bootstrap, topic, Row)
    await table.start()
    pending = asyncio.create_task(table.find("missing"))
    await asyncio.sleep(0)  # the miss waits for an end-offsets request that has not begun
    await table.stop()
    await asyncio.gather(pending, return_exceptions=True)  # however it ended, the restarted table must not wait on it
    try:
        await asyncio.wait_for(table.start(), 10)
        await send(producer, topic, "a", row("a", 1))
        assert await asyncio.wait_for(table.find("a"), 10) is not None
    finally:
        await table.stop()
