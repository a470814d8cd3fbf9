"""Readiness: the brokers answer metadata *and* accept an acks=all produce.

An open port only means the socket server is up; a KRaft broker is still fenced
until the controller has caught it up, and produce requests fail until then. So
the check is: TCP connect to every expected node, a Metadata request listing
every expected broker, then one acks=all record to a small internal topic (for
the 3-node cluster this also proves that min.insync.replicas=2 is satisfiable).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from infra.kafka.errors import NotReadyError
from infra.kafka.secure import admin_client_options
from infra.kafka.spec import ClusterSpec, KafkaNodeSpec

READINESS_TOPIC = "__specstream_readiness"
_ATTEMPT_TIMEOUT_MS = 5000
_RETRY_PAUSE_S = 0.25
# Each readiness check leaves one tiny record behind; expire them quickly.
_READINESS_TOPIC_CONFIG = {"retention.ms": str(60 * 60 * 1000), "segment.ms": str(60 * 60 * 1000)}


@dataclass(frozen=True)
class ReadyReport:
    broker_ids: tuple[int, ...]
    elapsed_s: float


class _NotYet(Exception):
    """One readiness attempt saw a cluster that is up but not complete yet."""


async def _tcp_reachable(node: KafkaNodeSpec) -> None:
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(node.host, node.broker_port), timeout=1.0)
    except (OSError, TimeoutError) as error:
        raise _NotYet(f"node {node.node_id} port {node.broker_port} not accepting connections") from error
    writer.close()
    await writer.wait_closed()


async def _broker_ids(admin: AIOKafkaAdminClient) -> tuple[int, ...]:
    described = await admin.describe_cluster()
    return tuple(sorted(int(broker["node_id"]) for broker in described["brokers"]))


async def _ensure_readiness_topic(admin: AIOKafkaAdminClient, cluster: ClusterSpec) -> None:
    topic = NewTopic(
        name=READINESS_TOPIC,
        num_partitions=1,
        replication_factor=cluster.replication_factor,
        topic_configs=_READINESS_TOPIC_CONFIG,
    )
    response = await admin.create_topics([topic], timeout_ms=_ATTEMPT_TIMEOUT_MS)
    for _name, code, *details in response.topic_errors:
        error_type = for_code(code)
        if code != 0 and error_type is not TopicAlreadyExistsError:
            raise _NotYet(f"creating {READINESS_TOPIC}: {error_type.__name__} {details[0] if details else ''}")


def _client_options(cluster: ClusterSpec) -> dict[str, Any]:
    return admin_client_options(cluster.security) if cluster.security is not None else {}


async def _produce_probe(cluster: ClusterSpec, bootstrap: str) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        request_timeout_ms=_ATTEMPT_TIMEOUT_MS,
        client_id="specstream-readiness",
        **_client_options(cluster),
    )
    await producer.start()
    try:
        await producer.send_and_wait(READINESS_TOPIC, b"ready")
    finally:
        await producer.stop()


async def _attempt(cluster: ClusterSpec, nodes: Sequence[KafkaNodeSpec]) -> tuple[int, ...]:
    for node in nodes:
        await _tcp_reachable(node)
    bootstrap = ",".join(node.bootstrap_server for node in nodes)
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=_ATTEMPT_TIMEOUT_MS,
                                **_client_options(cluster))
    await admin.start()
    try:
        broker_ids = await _broker_ids(admin)
        missing = sorted({node.node_id for node in nodes} - set(broker_ids))
        if missing:
            raise _NotYet(f"broker(s) {missing} not registered yet (metadata lists {list(broker_ids)})")
        await _ensure_readiness_topic(admin, cluster)
    finally:
        await admin.close()
    await _produce_probe(cluster, bootstrap)
    return broker_ids


async def await_ready(
    cluster: ClusterSpec,
    timeout_s: float,
    node_ids: Sequence[int] | None = None,
    liveness: Callable[[], None] | None = None,
) -> ReadyReport:
    """Retry the readiness check until it passes or ``timeout_s`` runs out.

    ``node_ids`` limits which nodes must answer (default: all). ``liveness`` is
    called between attempts and should raise if a broker process has died, so a
    crash fails fast instead of waiting out the timeout.
    """
    nodes = [cluster.node(node_id) for node_id in node_ids] if node_ids else list(cluster.nodes)
    started = time.monotonic()
    deadline = started + timeout_s
    last_problem = "no attempt made"
    while True:
        if liveness is not None:
            liveness()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise NotReadyError(f"kafka {cluster.name} not ready after {timeout_s:.0f}s: {last_problem}")
        try:
            broker_ids = await asyncio.wait_for(_attempt(cluster, nodes), timeout=remaining)
        except (_NotYet, KafkaError, OSError, TimeoutError) as problem:
            last_problem = str(problem) or type(problem).__name__
        else:
            return ReadyReport(broker_ids=broker_ids, elapsed_s=time.monotonic() - started)
        await asyncio.sleep(_RETRY_PAUSE_S)
