"""What the autoscaler reads from Kafka, and what it does when Kafka does not answer.

The probe tests use the real broker: a request topic of their own, a consumer group that commits, and engine-worker
announcements on a services topic of their own.
"""
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
from streams.ops.control import Controller
from streams.ops.lag import ENGINE_WORKER, LoadProbe, Observation, ProbeError
from streams.ops.scaling import Autoscaler, Load, ScalePolicy
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401

POLICY = ScalePolicy(min_replicas=1, max_replicas=4, lag_threshold=10, scale_down_window_s=60)


def observed(lag: int, in_flight: int = 0) -> Observation:
    return Observation(Load(lag, in_flight, 6), {0: lag}, {}, announced=False)


def test_in_flight_inside_the_lag_is_not_counted_twice() -> None:
    # specstream's workers commit a request only once answered: 12 held are 12 of the lag already.
    assert Load(lag=12, in_flight=12, partitions=6).total == 12
    assert Load(lag=3, in_flight=12, partitions=6).total == 12  # announcements newer than the last commit
    # A consumer that commits on read: what it holds comes on top of the lag.
    assert Load(lag=3, in_flight=12, partitions=6, in_flight_in_lag=False).total == 15


def test_losing_kafka_holds_the_last_decision_and_says_so() -> None:
    controller = Controller(Autoscaler(POLICY))
    assert controller.decide(0.0, observed(35), current=1).replicas == 4
    held = controller.hold(5.0, ProbeError("cannot read the lag: no answer within 10 s"), current=4)
    assert held.replicas == 4 and "holding 4 (the last decision)" in held.why and "no answer" in held.why
    # A worker died while Kafka was gone: the held decision still asks for 4, so it is replaced.
    assert controller.hold(65.0, ProbeError("still nothing"), current=3).replicas == 4
    assert "for 60 s" in controller.hold(65.0, ProbeError("x"), current=4).why


def test_without_any_decision_yet_losing_kafka_keeps_what_runs() -> None:
    assert Controller(Autoscaler(POLICY)).hold(0.0, ProbeError("x"), current=2).replicas == 2


async def test_a_probe_of_an_unreachable_kafka_fails_within_its_bound_naming_the_servers() -> None:
    probe = LoadProbe("127.0.0.1:1", "g", "t.requests", "t.services", timeout_s=3.0)
    started = time.monotonic()
    with pytest.raises(ProbeError, match=r"127\.0\.0\.1:1"):
        await probe.observe()
    assert time.monotonic() - started < 10


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


class _ColdCoordinator:
    """An admin client whose group coordinator answers only after `failures` calls, as on a cluster that is still
    creating its offsets topic (seen on a fresh broker: GroupCoordinatorNotAvailableError at the first request)."""

    def __init__(self, failures: int, error: Exception) -> None:
        self.failures, self.error, self.calls = failures, error, 0

    async def list_consumer_group_offsets(self, group_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return {TopicPartition("t", 0): OffsetAndMetadata(5, "")}


async def test_a_coordinator_not_available_yet_is_asked_again_and_other_errors_are_not() -> None:
    from aiokafka.errors import GroupAuthorizationFailedError, GroupCoordinatorNotAvailableError

    probe = LoadProbe("127.0.0.1:1", "g", "t", "s", timeout_s=10.0)
    cold = _ColdCoordinator(2, GroupCoordinatorNotAvailableError())
    assert await probe._group_offsets(cold) == {TopicPartition("t", 0): OffsetAndMetadata(5, "")}  # type: ignore[arg-type]
    assert cold.calls == 3
    refused = _ColdCoordinator(1, GroupAuthorizationFailedError())
    with pytest.raises(GroupAuthorizationFailedError):
        await probe._group_offsets(refused)  # type: ignore[arg-type]
    assert refused.calls == 1
    # Retried for half the observation's time at most, then the error itself (which observe names).
    never = _ColdCoordinator(10**6, GroupCoordinatorNotAvailableError())
    started = time.monotonic()
    with pytest.raises(GroupCoordinatorNotAvailableError):
        await LoadProbe("127.0.0.1:1", "g", "t", "s", timeout_s=0.8)._group_offsets(never)  # type: ignore[arg-type]
    assert 0.4 <= time.monotonic() - started < 0.8
