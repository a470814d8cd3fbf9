"""The local single-node broker: lifecycle API, CLI and a real produce/consume."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from infra.kafka.broker import ClusterSpec, kill_node, single_node, start, status, stop
from infra.kafka.errors import BrokerStartError
from infra.kafka.process import port_open
from infra.kafka.storage import is_formatted
from streams.kafka import clients
from tests import kafka_fixtures
from tests.kafka_fixtures import BrokerDied, TopicLedger, revive_single_broker
from tests.kafka_fixtures import kafka_bootstrap, kafka_single, unique_topic  # noqa: F401

pytestmark = pytest.mark.kafka

REPO_ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.kafka", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )


def test_second_start_is_a_no_op(kafka_single: ClusterSpec) -> None:  # noqa: F811
    before = status(kafka_single)
    result = start(kafka_single)
    assert result.started == ()
    assert result.formatted == ()
    assert result.status.pids == before.pids
    assert result.ready is not None and result.ready.broker_ids == (1,)


def test_status_reports_the_running_broker_with_its_pid_and_open_ports(kafka_single: ClusterSpec) -> None:  # noqa: F811
    current = status(kafka_single)
    assert current.running
    (node,) = current.nodes
    assert node.pid is not None and node.broker_port_open and node.controller_port_open
    port = str(kafka_single.nodes[0].broker_port)
    cli = _run_cli("status", "--port", port)
    assert cli.returncode == 0, cli.stderr
    assert f"running on 127.0.0.1:{port} (pid {node.pid})" in cli.stdout


async def test_a_produced_record_is_consumed_with_its_key_value_and_headers(kafka_bootstrap: str) -> None:  # noqa: F811
    topic = unique_topic("single-roundtrip")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        response = await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
        assert [error_code for _name, error_code, *_ in response.topic_errors] == [0]
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            sent = await producer.send_and_wait(topic, b"hello kafka", key=b"k1", headers=[("trace", b"t-1")])
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest", group_id=unique_topic("g")
        )
        await consumer.start()
        try:
            record = await consumer.getone()
        finally:
            await consumer.stop()
        assert (record.offset, record.key, record.value) == (sent.offset, b"k1", b"hello kafka")
        assert list(record.headers) == [("trace", b"t-1")]
    finally:
        await admin.delete_topics([topic])
        await admin.close()


def test_a_broker_starts_once_refuses_other_ports_stops_and_ignores_stale_pid_files(tmp_path: Path) -> None:
    spec = single_node(port=_free_port(), controller_port=_free_port(), state_dir=tmp_path / "kafka")
    node = spec.nodes[0]
    try:
        first = start(spec)
        assert first.started == (1,) and first.formatted == (1,)
        assert is_formatted(node)
        pid = first.status.pids[1]
        assert node.pid_file.read_text().strip() == str(pid)

        again = start(spec)
        assert again.started == () and again.status.pids == {1: pid}

        # Same state folder, other ports: refuse rather than wait on the wrong port.
        moved = single_node(port=_free_port(), controller_port=_free_port(), state_dir=spec.state_dir)
        with pytest.raises(BrokerStartError, match="is running with listeners"):
            start(moved)
        assert status(spec).pids == {1: pid}

        stopped = stop(spec)
        assert stopped.stopped == {1: pid} and stopped.forced == ()
        assert not status(spec).running and not node.pid_file.exists()
        assert stop(spec).stopped == {}

        # A stale pid file pointing at a live, unrelated process must not count.
        node.pid_file.write_text(f"{os.getpid()}\n")
        assert status(spec).pids == {}
        assert not node.pid_file.exists()

        restarted = start(spec)
        assert restarted.started == (1,) and restarted.formatted == ()
        killed_pid = kill_node(spec, 1)
        assert killed_pid == restarted.status.pids[1]
        assert status(spec).pids == {}
    finally:
        stop(spec)


async def _create(bootstrap: str, *names: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1) for name in names])
        await clients.wait_visible(admin, list(names), 30.0)
    finally:
        await admin.close()


def test_tests_delete_the_topics_they_made_even_after_a_session_died_and_revive_a_broker_that_exited(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = single_node(port=_free_port(), controller_port=_free_port(), state_dir=tmp_path / "kafka")
    try:
        start(spec)
        asyncio.run(_create(spec.bootstrap_servers, "users-own"))
        TopicLedger(spec).open()
        asyncio.run(_create(spec.bootstrap_servers, "made-by-a-session-that-died"))
        # The next session keeps the dead one's record, so what that one made is deleted with its own.
        TopicLedger(spec).open()
        asyncio.run(_create(spec.bootstrap_servers, "made-by-this-session", "__internal_made_on_first_use"))
        TopicLedger(spec).close()
        # A deletion the controller committed reaches the broker's metadata later (seconds on a loaded machine).
        deadline = time.monotonic() + 30
        while True:
            left = asyncio.run(clients.list_topics(spec.bootstrap_servers))
            if not [name for name in left if name.startswith("made-by-")] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert {"users-own", "__internal_made_on_first_use"} <= set(left), left
        assert not [name for name in left if name.startswith("made-by-")], left
        assert not TopicLedger(spec).path.exists()

        monkeypatch.setattr(kafka_fixtures, "_session_single", spec)
        kill_node(spec, 1)
        node = spec.nodes[0]
        deadline = time.monotonic() + 30
        while port_open(node.host, node.broker_port):  # the kernel closes a killed JVM's sockets a moment later
            assert time.monotonic() < deadline
            time.sleep(0.1)
        with pytest.warns(BrokerDied, match="exited during the session, started again; its log: "):
            revive_single_broker()
        assert status(spec).running
    finally:
        stop(spec)


async def test_read_partition_returns_the_records_up_to_the_end_it_saw(kafka_bootstrap: str) -> None:  # noqa: F811
    topic = unique_topic("read-partition")
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
        await clients.wait_visible(admin, [topic], 30.0)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            for value in (b"a", b"b", b"c"):
                await producer.send_and_wait(topic, value)
        finally:
            await producer.stop()
        records = await clients.read_partition(kafka_bootstrap, topic, timeout_s=30.0)
        assert [r.value for r in records] == [b"a", b"b", b"c"]
        assert [r.offset for r in records] == [0, 1, 2]
    finally:
        await admin.delete_topics([topic])
        await admin.close()
