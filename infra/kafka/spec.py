"""What a local Kafka deployment looks like: nodes, ports, folders, broker defaults.

Every node runs in KRaft *combined* mode (broker and controller in one JVM): it is
the lightest layout that still gives a real controller quorum, which matters on a
2-core machine that also runs the models.

Topic auto-creation is OFF in both layouts. Producing to a topic that does not
exist then fails loudly (UnknownTopicOrPartition / metadata timeout) instead of
silently creating a 1-partition topic with broker defaults, which would hide typos
and break partition-based parallelism. Create topics explicitly (admin client or
the pipeline's topic setup), or pass ``auto_create_topics=True`` to the spec
builders when prototyping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from infra.kafka.paths import kafka_version, state_root

LOCALHOST = "127.0.0.1"
# Kafka's own start script gives a broker 1 GiB. Each partition holds 40-60 KiB of heap (metrics, segments, producer
# state: 12.5k partitions kept 502 MiB live under a 512 MiB cap and 718 MiB under 1 GiB), and the JVM exits when the
# heap is gone (process.py): a dev broker that keeps every topic a user or a test session made must not sit near it.
SINGLE_HEAP_MB = 1024
CLUSTER_NODE_HEAP_MB = 384
DEFAULT_CLUSTER_BASE_PORT = 29192


@dataclass(frozen=True)
class KafkaNodeSpec:
    """One KRaft combined-mode node (broker + controller in one JVM)."""

    node_id: int
    broker_port: int
    controller_port: int
    state_dir: Path
    heap_mb: int
    host: str = LOCALHOST
    # The client listener's security protocol: PLAINTEXT, or SASL_SSL on a secured deployment.
    protocol: str = "PLAINTEXT"

    @property
    def bootstrap_server(self) -> str:
        return f"{self.host}:{self.broker_port}"

    @property
    def controller_endpoint(self) -> str:
        return f"{self.host}:{self.controller_port}"

    @property
    def data_dir(self) -> Path:
        return self.state_dir / "data"

    @property
    def logs_dir(self) -> Path:
        return self.state_dir / "logs"

    @property
    def server_log(self) -> Path:
        return self.logs_dir / "server.log"

    @property
    def console_log(self) -> Path:
        # JVM stdout/stderr: crashes before log4j is up (bad flags, OOM) land here.
        return self.logs_dir / "console.log"

    @property
    def config_file(self) -> Path:
        return self.state_dir / "server.properties"

    @property
    def pid_file(self) -> Path:
        return self.state_dir / "kafka.pid"


@dataclass(frozen=True)
class BrokerSecurity:
    """A secured deployment: a SASL_SSL client listener, SCRAM users, optionally an authorizer.

    Certificates, passwords and client files live in ``folder`` (see :mod:`infra.kafka.secure`).
    """

    folder: Path
    authorizer: bool = True
    admin_user: str = "admin"
    # SCRAM users created at format time besides the admin: one per specstream service.
    users: tuple[str, ...] = ("specstream-edge", "specstream-worker")

    @property
    def all_users(self) -> tuple[str, ...]:
        return (self.admin_user, *self.users)


@dataclass(frozen=True)
class ClusterSpec:
    """A set of nodes forming one KRaft cluster, plus the topic defaults they enforce."""

    name: str
    nodes: tuple[KafkaNodeSpec, ...]
    state_dir: Path
    replication_factor: int
    min_insync_replicas: int
    kafka_version: str
    auto_create_topics: bool = False
    security: BrokerSecurity | None = None
    # Escape hatch for experiments; these win over everything we generate.
    extra_properties: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(node.bootstrap_server for node in self.nodes)

    @property
    def is_single(self) -> bool:
        return len(self.nodes) == 1

    @property
    def identity_file(self) -> Path:
        return self.state_dir / "cluster.json"

    def node(self, node_id: int) -> KafkaNodeSpec:
        for candidate in self.nodes:
            if candidate.node_id == node_id:
                return candidate
        known = ", ".join(str(candidate.node_id) for candidate in self.nodes)
        raise KeyError(f"{self.name} has no node {node_id} (nodes: {known})")


def _folder_name(base: str, port: int, default_port: int) -> str:
    # One state folder per port: two deployments on different ports must never
    # share a data folder (the second broker would fail to lock it, or worse).
    return base if port == default_port else f"{base}-{port}"


def _check_port(port: int, what: str) -> None:
    if not 1 <= port <= 65535:
        raise ValueError(f"{what} {port} is outside 1..65535")


def single_node(
    port: int = 9092,
    controller_port: int | None = None,
    state_dir: Path | None = None,
    *,
    heap_mb: int = SINGLE_HEAP_MB,
    auto_create_topics: bool = False,
    extra_properties: Mapping[str, str] | None = None,
    version: str | None = None,
    security: BrokerSecurity | None = None,
) -> ClusterSpec:
    """A one-node cluster for development: replication factor 1 everywhere.

    ``controller_port`` defaults to ``port + 1`` (9093 for the default 9092).
    State defaults to ``<state root>/kafka-single`` (``kafka-single-<port>`` when
    ``port`` is not 9092).
    """
    resolved_controller = port + 1 if controller_port is None else controller_port
    _check_port(port, "broker port")
    _check_port(resolved_controller, "controller port")
    if port == resolved_controller:
        raise ValueError(f"broker and controller ports must differ (both {port})")
    root = state_dir if state_dir is not None else state_root() / _folder_name("kafka-single", port, 9092)
    node = KafkaNodeSpec(
        node_id=1, broker_port=port, controller_port=resolved_controller, state_dir=root, heap_mb=heap_mb,
        protocol="SASL_SSL" if security is not None else "PLAINTEXT",
    )
    return ClusterSpec(
        name="single",
        nodes=(node,),
        state_dir=root,
        replication_factor=1,
        min_insync_replicas=1,
        kafka_version=version or kafka_version(),
        auto_create_topics=auto_create_topics,
        security=security,
        extra_properties=MappingProxyType(dict(extra_properties or {})),
    )


def three_nodes(
    base_port: int = DEFAULT_CLUSTER_BASE_PORT,
    state_dir: Path | None = None,
    *,
    heap_mb: int = CLUSTER_NODE_HEAP_MB,
    auto_create_topics: bool = False,
    extra_properties: Mapping[str, str] | None = None,
    version: str | None = None,
) -> ClusterSpec:
    """Three combined nodes: RF 3, min ISR 2, so one node can die without data loss.

    Node N (1..3) listens on ``base_port + 2(N-1)`` (broker) and the port after it
    (controller): 29192/29193, 29194/29195, 29196/29197 by default. That leaves the
    single node's 9092/9093 free so both layouts can run side by side, stays clear
    of 19092/29092, which docker-compose setups commonly take, and below Linux's
    ephemeral ports (32768-60999), which any client's connection may hold when the
    cluster starts (39092 once did, mid-suite: "Address already in use"). State defaults
    to ``<state root>/kafka-cluster-<base_port>/node-N``: a cluster's metadata records
    its controllers' ports, so each port layout keeps its own (the folder
    ``kafka-cluster`` held the cluster on 39092, the default until 2026-12).
    """
    _check_port(base_port, "base port")
    _check_port(base_port + 5, "highest cluster port")
    default_root = state_root() / f"kafka-cluster-{base_port}"
    root = state_dir if state_dir is not None else default_root
    nodes = tuple(
        KafkaNodeSpec(
            node_id=node_id,
            broker_port=base_port + 2 * (node_id - 1),
            controller_port=base_port + 2 * (node_id - 1) + 1,
            state_dir=root / f"node-{node_id}",
            heap_mb=heap_mb,
        )
        for node_id in (1, 2, 3)
    )
    return ClusterSpec(
        name="cluster",
        nodes=nodes,
        state_dir=root,
        replication_factor=3,
        min_insync_replicas=2,
        kafka_version=version or kafka_version(),
        auto_create_topics=auto_create_topics,
        extra_properties=MappingProxyType(dict(extra_properties or {})),
    )
