"""What the autoscaler reads from the real broker: the request topic's lag per partition (an uncommitted partition
counted from its start) and the in-flight requests of live engine workers, from their announcements on a services
topic of the test's own."""
from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from schemas.events import ServiceAnnouncement
from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.ops.lag import ENGINE_WORKER, LoadProbe
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401


@pytest_asyncio.fixture
async def catalog(kafka_bootstrap: str) -> AsyncIterator[TopicCatalog]:  # noqa: F811
    catalog = TopicCatalog(prefix=f"lag-{uuid.uuid4().hex[:8]}", request_partitions=2)
    await clients.ensure_topics(kafka_bootstrap, [catalog.requests, catalog.services])
    yield catalog
    await clients.delete_topics(kafka_bootstrap, [catalog.requests.name, catalog.services.name])


@pytest.mark.kafka
async def test_lag_is_end_minus_committed_and_counts_an_uncommitted_partition_from_its_start(
        kafka_bootstrap: str, catalog: TopicCatalog) -> None:  # noqa: F811
    topic, group = catalog.requests.name, f"{catalog.prefix}.engine-workers"
    producer = clients.make_producer(kafka_bootstrap, client_id="lag-test")
    await producer.start()
    try:
        for i in range(7):
            await producer.send_and_wait(topic, b"{}", partition=i % 2)  # 4 on partition 0, 3 on partition 1
    finally:
        await producer.stop()
    probe = LoadProbe(kafka_bootstrap, group, topic, catalog.services.name)
    try:
        first = await probe.observe()
        assert first.lag_by_partition == {0: 4, 1: 3} and first.load.partitions == 2
        assert not first.announced and first.load.in_flight == 0

        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=group, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            await consumer.commit({TopicPartition(topic, 0): OffsetAndMetadata(3, "")})
        finally:
            await consumer.stop()
        after = await probe.observe()
        assert after.lag_by_partition == {0: 1, 1: 3} and after.load.lag == 4
    finally:
        await probe.close()


@pytest.mark.kafka
async def test_in_flight_is_summed_over_live_engine_workers_only(kafka_bootstrap: str,  # noqa: F811
                                                                   catalog: TopicCatalog) -> None:
    now = time.time()

    def announcement(service_id: str, state: str, in_flight: int, *, kind: str = ENGINE_WORKER,
                     age_s: float = 0.0) -> ServiceAnnouncement:
        return ServiceAnnouncement(kind=kind, service_id=service_id, state=state, started_at=now - 100,
                                   in_flight=in_flight, at=now - age_s)

    producer = clients.make_producer(kafka_bootstrap, client_id="lag-test")
    await producer.start()
    try:
        for a in (announcement("w1", "ready", 5), announcement("w2", "draining", 2),
                  announcement("w3", "stopped", 9), announcement("w4", "ready", 11, age_s=60),  # stale: died
                  announcement("e1", "ready", 30, kind="edge"), announcement("w1", "ready", 7)):  # w1's newest
            await producer.send_and_wait(catalog.services.name, clients.encode(a),
                                         key=f"{a.kind}/{a.service_id}".encode())
    finally:
        await producer.stop()
    probe = LoadProbe(kafka_bootstrap, "g", catalog.requests.name, catalog.services.name, stale_after_s=15)
    try:
        seen = await probe.observe()
    finally:
        await probe.close()
    assert seen.announced and sorted(seen.workers) == ["w1", "w2"]
    assert seen.load.in_flight == 7 + 2
