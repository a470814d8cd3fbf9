"""The local three-node KRaft cluster: replication, acks=all, and surviving a leader kill."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from infra.kafka.broker import ClusterSpec, kill_node, start_node, status
from streams.kafka import clients
from tests.kafka_fixtures import kafka_cluster, unique_topic  # noqa: F401  (its cluster: tests/cluster/conftest.py)

pytestmark = [pytest.mark.kafka, pytest.mark.cluster]

ALL_NODES = [1, 2, 3]
ISR_RECOVERY_TIMEOUT_S = 60.0
TOPIC_PROPAGATION_TIMEOUT_S = 15.0


@contextlib.asynccontextmanager
async def _admin(bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    # A context manager rather than an async fixture: the fixture would live on the
    # session event loop while each test runs on its own loop.
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def _create_replicated_topic(admin: AIOKafkaAdminClient, partitions: int) -> str:
    topic = unique_topic("cluster")
    new_topic = NewTopic(
        topic, num_partitions=partitions, replication_factor=3, topic_configs={"min.insync.replicas": "2"}
    )
    response = await admin.create_topics([new_topic])
    assert [error_code for _name, error_code, *_ in response.topic_errors] == [0]
    await clients.wait_visible(admin, [topic], TOPIC_PROPAGATION_TIMEOUT_S)
    return topic


async def _partitions(admin: AIOKafkaAdminClient, topic: str) -> list[dict[str, Any]]:
    (described,) = await admin.describe_topics([topic])
    assert described["error_code"] == 0
    return sorted(described["partitions"], key=lambda partition: partition["partition"])


async def _error_codes_by_broker(admin: AIOKafkaAdminClient, topic: str) -> dict[int, int]:
    """The topic's metadata error code as each broker answers it (a describe asks a random one), once every
    broker answers or after 30 s: a loaded machine can let one broker's answer time out, and an unanswered
    broker is left out of metadata_by_broker."""
    deadline = time.monotonic() + 30
    while True:
        by_broker = await clients.metadata_by_broker(admin, [topic])
        codes = {node_id: described["error_code"] for node_id, (described,) in by_broker.items()}
        if sorted(codes) == ALL_NODES or time.monotonic() > deadline:
            return codes
        await asyncio.sleep(0.5)


async def _topic_config(admin: AIOKafkaAdminClient, topic: str, name: str) -> str:
    (response,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {name: None})])
    (resource,) = response.resources
    # resource: (error_code, error_message, resource_type, resource_name, config_entries)
    values = {entry[0]: entry[1] for entry in resource[4]}
    return str(values[name])


async def _produce_all(bootstrap: str, topic: str, values: list[bytes], partition: int | None = None) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, partition=partition)
    finally:
        await producer.stop()


async def _consume(bootstrap: str, topic: str, count: int) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=unique_topic("g")
    )
    await consumer.start()
    received: list[bytes] = []
    try:
        while len(received) < count:
            batches = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), timeout=30)
            received.extend(record.value for records in batches.values() for record in records)
    finally:
        await consumer.stop()
    return received


async def _wait_for_isr(admin: AIOKafkaAdminClient, topic: str, expected: list[int]) -> dict[str, Any]:
    deadline = time.monotonic() + ISR_RECOVERY_TIMEOUT_S
    while True:
        (partition,) = await _partitions(admin, topic)
        if sorted(partition["isr"]) == expected or time.monotonic() > deadline:
            return partition
        await asyncio.sleep(0.5)


def test_the_cluster_runs_three_distinct_broker_processes(kafka_cluster: ClusterSpec) -> None:  # noqa: F811
    current = status(kafka_cluster)
    assert current.running
    assert sorted(current.pids) == ALL_NODES
    assert len(set(current.pids.values())) == 3


async def test_a_topic_replicated_on_all_three_nodes_delivers_every_record(
        kafka_cluster: ClusterSpec) -> None:  # noqa: F811
    bootstrap = kafka_cluster.bootstrap_servers
    async with _admin(bootstrap) as admin:
        topic = await _create_replicated_topic(admin, partitions=3)
        try:
            # Visible means visible on every broker, whichever a client happens to ask next.
            assert await _error_codes_by_broker(admin, topic) == dict.fromkeys(ALL_NODES, 0)
            partitions = await _partitions(admin, topic)
            assert [partition["partition"] for partition in partitions] == [0, 1, 2]
            for partition in partitions:
                assert sorted(partition["replicas"]) == ALL_NODES
                assert sorted(partition["isr"]) == ALL_NODES
                assert partition["leader"] in ALL_NODES
            assert await _topic_config(admin, topic, "min.insync.replicas") == "2"

            values = [f"message-{index}".encode() for index in range(6)]
            await _produce_all(bootstrap, topic, values)
            assert sorted(await _consume(bootstrap, topic, len(values))) == sorted(values)
        finally:
            await admin.delete_topics([topic])


async def test_acks_all_survives_leader_kill(kafka_cluster: ClusterSpec) -> None:  # noqa: F811
    bootstrap = kafka_cluster.bootstrap_servers
    async with _admin(bootstrap) as admin:
        topic = await _create_replicated_topic(admin, partitions=1)
        try:
            await _produce_all(bootstrap, topic, [b"before"], partition=0)
            (partition,) = await _partitions(admin, topic)
            leader = int(partition["leader"])

            kill_node(kafka_cluster, leader)
            assert leader not in status(kafka_cluster).pids
            survivors = ",".join(node.bootstrap_server for node in kafka_cluster.nodes if node.node_id != leader)
            # Two of three replicas left: min.insync.replicas=2 still admits acks=all writes.
            await _produce_all(survivors, topic, [b"during"], partition=0)
            assert await _consume(survivors, topic, 2) == [b"before", b"during"]

            start_node(kafka_cluster, leader)
            recovered = await _wait_for_isr(admin, topic, ALL_NODES)
            assert sorted(recovered["isr"]) == ALL_NODES, f"ISR did not recover: {recovered}"
            await _produce_all(bootstrap, topic, [b"after"], partition=0)
            assert await _consume(bootstrap, topic, 3) == [b"before", b"during", b"after"]
        finally:
            await admin.delete_topics([topic])
