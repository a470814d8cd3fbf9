"""Command line: ``python -m infra.kafka start|stop|status|wait|reset|jars``.

Each command prints one line and exits 0 on success, 1 otherwise. The project
CLI (``specstream kafka start``) delegates to :func:`main` with the remaining argv.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from infra.kafka import broker
from infra.kafka.errors import KafkaInfraError
from infra.kafka.paths import env_port
from infra.kafka.secure import DEFAULT_SECURE_PORT, client_config_file, secured_single_node, user_env_file
from infra.kafka.spec import DEFAULT_CLUSTER_BASE_PORT, ClusterSpec

SINGLE_PORT_ENV = "SPECSTREAM_KAFKA_PORT"
CLUSTER_PORT_ENV = "SPECSTREAM_KAFKA_CLUSTER_PORT"
SECURE_PORT_ENV = "SPECSTREAM_KAFKA_SECURE_PORT"


def spec_from_args(args: argparse.Namespace) -> ClusterSpec:
    state_dir: Path | None = args.state_dir
    if args.secure:
        if args.cluster:
            raise ValueError("--secure runs a single node; it cannot be combined with --cluster")
        port = args.port if args.port is not None else env_port(SECURE_PORT_ENV, DEFAULT_SECURE_PORT)
        return broker.secured_single_node(port=port, state_dir=state_dir, authorizer=not args.no_authorizer)
    if args.cluster:
        base_port = args.port if args.port is not None else env_port(CLUSTER_PORT_ENV, DEFAULT_CLUSTER_BASE_PORT)
        return broker.three_nodes(base_port=base_port, state_dir=state_dir)
    port = args.port if args.port is not None else env_port(SINGLE_PORT_ENV, 9092)
    return broker.single_node(port=port, state_dir=state_dir)


def _pids(status: broker.ClusterStatus) -> str:
    pids = status.pids
    if len(pids) == 1:
        return f"pid {next(iter(pids.values()))}"
    return "pids " + ", ".join(f"{node_id}:{pid}" for node_id, pid in sorted(pids.items()))


def _cmd_start(spec: ClusterSpec, args: argparse.Namespace) -> int:
    result = broker.start(spec, timeout_s=args.timeout)
    prefix = f"kafka {spec.name}:"
    where = f"on {spec.bootstrap_servers} ({_pids(result.status)})"
    if not result.started:
        print(f"{prefix} already running {where}{_client_hint(spec)}")
        return 0
    ready = f", ready in {result.ready.elapsed_s:.1f}s" if result.ready else ""
    partial = "" if len(result.started) == len(spec.nodes) else f" node(s) {list(result.started)}"
    print(f"{prefix} started{partial} {where}{ready}{_client_hint(spec)}")
    return 0


def _client_hint(spec: ClusterSpec) -> str:
    security = spec.security
    if security is None:
        return ""
    admin_env = user_env_file(security, security.admin_user)
    return f"; clients: --config {client_config_file(security)} with the user of {admin_env}"


def _cmd_stop(spec: ClusterSpec, args: argparse.Namespace) -> int:
    result = broker.stop(spec, timeout_s=args.timeout or broker.STOP_TIMEOUT_S)
    if not result.stopped:
        print(f"kafka {spec.name}: not running")
        return 0
    pids = ", ".join(str(pid) for pid in result.stopped.values())
    forced = f"; node(s) {list(result.forced)} needed SIGKILL" if result.forced else ""
    print(f"kafka {spec.name}: stopped (pid {pids}){forced}")
    return 0


def _describe_nodes(status: broker.ClusterStatus) -> str:
    parts = []
    for node in status.nodes:
        if node.running:
            parts.append(f"node {node.node_id} up (pid {node.pid})")
        elif node.pid is not None:
            parts.append(f"node {node.node_id} starting (pid {node.pid}, ports not open)")
        else:
            parts.append(f"node {node.node_id} down")
    return ", ".join(parts)


def _cmd_status(spec: ClusterSpec, args: argparse.Namespace) -> int:
    current = broker.status(spec)
    if args.json:
        print(json.dumps(current.as_dict()))
    elif current.running:
        print(f"kafka {spec.name}: running on {spec.bootstrap_servers} ({_pids(current)})")
    elif not current.any_process:
        print(f"kafka {spec.name}: not running")
    else:
        print(f"kafka {spec.name}: degraded: {_describe_nodes(current)}")
    return 0 if current.running else 1


def _cmd_wait(spec: ClusterSpec, args: argparse.Namespace) -> int:
    report = broker.wait_ready(spec, timeout_s=args.timeout)
    brokers = ", ".join(str(broker_id) for broker_id in report.broker_ids)
    print(f"kafka {spec.name}: ready on {spec.bootstrap_servers} (brokers {brokers}, {report.elapsed_s:.1f}s)")
    return 0


def _cmd_reset(spec: ClusterSpec, args: argparse.Namespace) -> int:
    result = broker.reset(spec)
    stopped = f"stopped pid {', '.join(map(str, result.stopped.values()))}, " if result.stopped else ""
    print(f"kafka {spec.name}: reset ({stopped}removed {spec.state_dir})")
    return 0


def _cmd_jars(spec: ClusterSpec, args: argparse.Namespace) -> int:
    libs = broker.ensure_kafka_jars(spec.kafka_version)
    print(f"kafka {spec.kafka_version}: jars in {libs}")
    return 0


_COMMANDS: dict[str, tuple[Callable[[ClusterSpec, argparse.Namespace], int], str]] = {
    "start": (_cmd_start, "start the broker(s) unless running, wait until they accept produce requests"),
    "stop": (_cmd_stop, "stop the broker(s): SIGTERM, then SIGKILL after --timeout"),
    "status": (_cmd_status, "report pids and open ports; exit 1 unless fully running"),
    "wait": (_cmd_wait, "wait until the running broker(s) accept produce requests"),
    "reset": (_cmd_reset, "stop and delete all data, logs and cluster identity"),
    "jars": (_cmd_jars, "resolve the Kafka jars with Maven (normally done by start)"),
}


def _common_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cluster", action="store_true", help="the three-node cluster instead of the single node")
    common.add_argument(
        "--port",
        type=int,
        default=None,
        help=f"broker port (single, default ${SINGLE_PORT_ENV} or 9092; controller = port+1) "
        f"or base port (cluster, default ${CLUSTER_PORT_ENV} or {DEFAULT_CLUSTER_BASE_PORT})",
    )
    common.add_argument("--secure", action="store_true",
                        help=f"the secured single node: SASL_SSL + SCRAM with an authorizer (default port "
                        f"${SECURE_PORT_ENV} or {DEFAULT_SECURE_PORT}; see infra.kafka.secure)")
    common.add_argument("--no-authorizer", action="store_true", help="--secure without the StandardAuthorizer")
    common.add_argument("--state-dir", type=Path, default=None, help="override the state folder of this deployment")
    common.add_argument("--timeout", type=float, default=None, help="seconds to wait (start/wait/stop)")
    common.add_argument("--json", action="store_true", help="status: print the full status as JSON")
    return common


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Add the kafka sub-commands to ``parser`` (used standalone and by the project CLI)."""
    common = _common_options()
    actions = parser.add_subparsers(dest="kafka_command", required=True, metavar="COMMAND")
    for name, (_handler, help_text) in _COMMANDS.items():
        actions.add_parser(name, parents=[common], help=help_text, description=help_text)


def run(args: argparse.Namespace) -> int:
    """Execute parsed kafka arguments; print one line; return the exit code."""
    # Brokers that are still starting make aiokafka log every refused connection.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    handler, _help = _COMMANDS[args.kafka_command]
    try:
        return handler(spec_from_args(args), args)
    except (KafkaInfraError, ValueError) as error:
        print(f"kafka: error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kafka: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m infra.kafka", description="Local Apache Kafka (KRaft) without Docker"
    )
    configure_parser(parser)
    return run(parser.parse_args(argv))
