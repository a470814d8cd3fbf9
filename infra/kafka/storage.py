"""KRaft storage formatting: done once per node, before its first start.

The cluster id and each controller's metadata directory id are generated here (no
JVM needed) and kept in ``<state>/cluster.json`` so that every node of a cluster
is formatted with the same identity even when formatted at different times.
"""

from __future__ import annotations

import base64
import json
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from infra.kafka.errors import BrokerStartError
from infra.kafka.java import JavaRuntime
from infra.kafka.paths import LOG4J2_CONFIG
from infra.kafka.properties import write_server_properties
from infra.kafka.secure import scram_format_flags
from infra.kafka.spec import ClusterSpec, KafkaNodeSpec

_FORMAT_TIMEOUT_S = 120
# The formatter is a short-lived JVM: skip the optimising JIT and the G1 setup.
_TOOL_JVM_FLAGS = ("-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")


@dataclass(frozen=True)
class ClusterIdentity:
    cluster_id: str
    directory_ids: dict[int, str]


def random_kafka_uuid() -> str:
    """A Kafka-style Uuid string: 16 random bytes, base64url without padding."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        # Kafka refuses ids starting with "-": they read as options on its CLIs.
        if not text.startswith("-"):
            return text


def load_or_create_identity(cluster: ClusterSpec) -> ClusterIdentity:
    path = cluster.identity_file
    if path.is_file():
        try:
            raw = json.loads(path.read_text())
            identity = ClusterIdentity(
                cluster_id=str(raw["cluster_id"]),
                directory_ids={int(key): str(value) for key, value in raw["directory_ids"].items()},
            )
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise BrokerStartError(f"{path} is corrupt ({error}); run `python -m infra.kafka reset`") from error
        if all(node.node_id in identity.directory_ids for node in cluster.nodes):
            return identity
    identity = ClusterIdentity(
        cluster_id=random_kafka_uuid(),
        directory_ids={node.node_id: random_kafka_uuid() for node in cluster.nodes},
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    serialisable = {"cluster_id": identity.cluster_id, "directory_ids": identity.directory_ids}
    path.write_text(json.dumps(serialisable, indent=1))
    return identity


def is_formatted(node: KafkaNodeSpec) -> bool:
    return (node.data_dir / "meta.properties").is_file()


def _quorum_flags(cluster: ClusterSpec, identity: ClusterIdentity) -> list[str]:
    if cluster.is_single:
        return ["--standalone"]
    voters = ",".join(
        f"{node.node_id}@{node.controller_endpoint}:{identity.directory_ids[node.node_id]}" for node in cluster.nodes
    )
    return ["--initial-controllers", voters]


def _format_command(
    cluster: ClusterSpec, node: KafkaNodeSpec, identity: ClusterIdentity, java: JavaRuntime, libs: Path
) -> list[str]:
    return [
        str(java.executable),
        *_TOOL_JVM_FLAGS,
        f"-Dkafka.logs.dir={node.logs_dir}",
        f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
        "-cp",
        f"{libs}/*",
        "kafka.tools.StorageTool",
        "format",
        "--config",
        str(node.config_file),
        "--cluster-id",
        identity.cluster_id,
        *_quorum_flags(cluster, identity),
        *(scram_format_flags(cluster.security) if cluster.security is not None else []),
    ]


def _refuse_partial_format(cluster: ClusterSpec, missing: list[KafkaNodeSpec]) -> None:
    # Re-formatting one voter of a quorum that already ran would give it an empty
    # metadata log under an identity the others remember; KRaft does not allow that.
    if len(missing) != len(cluster.nodes):
        ids = ", ".join(str(node.node_id) for node in missing)
        raise BrokerStartError(
            f"kafka {cluster.name}: node(s) {ids} have no storage but the others do; "
            f"run `python -m infra.kafka reset{'' if cluster.is_single else ' --cluster'}` to start over"
        )


def format_missing(cluster: ClusterSpec, java: JavaRuntime, libs: Path) -> list[int]:
    """Format every node that has no storage yet (in parallel); return their ids."""
    missing = [node for node in cluster.nodes if not is_formatted(node)]
    if not missing:
        return []
    _refuse_partial_format(cluster, missing)
    identity = load_or_create_identity(cluster)
    running: list[tuple[KafkaNodeSpec, subprocess.Popen[str]]] = []
    for node in missing:
        write_server_properties(cluster, node)
        node.logs_dir.mkdir(parents=True, exist_ok=True)
        command = _format_command(cluster, node, identity, java, libs)
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True
        )
        running.append((node, process))
    for node, process in running:
        _finish_format(node, process)
    return [node.node_id for node in missing]


def _finish_format(node: KafkaNodeSpec, process: subprocess.Popen[str]) -> None:
    try:
        output, _ = process.communicate(timeout=_FORMAT_TIMEOUT_S)
    except subprocess.TimeoutExpired as error:
        process.kill()
        process.communicate()
        raise BrokerStartError(f"formatting node {node.node_id} took over {_FORMAT_TIMEOUT_S}s") from error
    if process.returncode != 0 or not is_formatted(node):
        # Drop stack frames: the exception line says what is wrong with the config.
        messages = [line for line in output.strip().splitlines() if not line.lstrip().startswith("at ")]
        last_lines = " | ".join(messages[-3:])
        raise BrokerStartError(
            f"formatting node {node.node_id} storage failed (exit {process.returncode}): {last_lines}"
        )
