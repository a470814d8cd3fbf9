"""A partition leader frozen (SIGSTOP: a stalled disk, a long GC pause, a VM paused) past the broker session timeout:
publishes with specstream's producer settings ride through the failover within the delivery bound, so no reply is
given up as undeliverable while two of three replicas serve."""
from __future__ import annotations

import asyncio
import signal
import time

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from infra.kafka.broker import ClusterSpec, kill_node
from streams.config.kafka import DeliverySettings
from streams.kafka import clients
from tests.kafka_fixtures import kafka_cluster, unique_topic  # noqa: F401  (its cluster: tests/cluster/conftest.py)

pytestmark = [pytest.mark.kafka, pytest.mark.cluster]

FROZEN_S = 15.0


async def _replicated_topic(bootstrap: str) -> tuple[str, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        topic = unique_topic("frozen")
        await admin.create_topics([NewTopic(topic, 1, 3, topic_configs={"min.insync.replicas": "2"})])
        await clients.wait_visible(admin, [topic], 15.0)
        (described,) = await admin.describe_topics([topic])
        return topic, described["partitions"][0]["leader"]
    finally:
        await admin.close()


async def test_publishes_ride_through_a_frozen_partition_leader(kafka_cluster: ClusterSpec) -> None:  # noqa: F811
    bound = DeliverySettings().publish_timeout_s
    topic, leader = await _replicated_topic(kafka_cluster.bootstrap_servers)
    producer = clients.make_producer(kafka_cluster.bootstrap_servers, client_id="frozen-leader")
    await producer.start()
    outcomes: list[tuple[float, str]] = []
    try:
        await producer.send_and_wait(topic, b"before", partition=0)
        kill_node(kafka_cluster, leader, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            while time.monotonic() - frozen_at < FROZEN_S:
                sent = time.monotonic()
                try:
                    ack = await producer.send(topic, f"m{len(outcomes)}".encode(), partition=0)
                    await asyncio.wait_for(ack, timeout=bound)
                    outcomes.append((time.monotonic() - sent, "acked"))
                except Exception as error:  # noqa: BLE001 - what the publisher would dead-letter
                    outcomes.append((time.monotonic() - sent, f"{type(error).__name__}: {error}"))
                await asyncio.sleep(0.5)
        finally:
            kill_node(kafka_cluster, leader, signal.SIGCONT)
    finally:
        await producer.stop()
    # Every publish acknowledged within the delivery bound: the failover (fencing after the 6 s session, an election,
    # the producer's next request at the new leader) fits inside it. How long it takes is a benchmark's figure
    # (bench.soak), not this test's: on a loaded machine one publish took 20 s, two 10 s requests to the frozen node.
    failed = [o for o in outcomes if o[1] != "acked"]
    late = f"{len(failed)} of {len(outcomes)} publishes not acknowledged within {bound:g} s: {failed[:3]}"
    assert outcomes and not failed, late
