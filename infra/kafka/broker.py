"""Public API: bring a local KRaft Kafka (one node or three) up and down.

Typical use::

    from infra.kafka.broker import single_node, start, stop

    spec = single_node()
    start(spec)            # formats storage on first use, waits until produce works
    ...                    # bootstrap servers: spec.bootstrap_servers
    stop(spec)

Everything here is idempotent: ``start`` on a running deployment only waits for
readiness, ``stop`` on a stopped one does nothing. State (data, logs, pid files)
lives under ``spec.state_dir``; see :mod:`infra.kafka.spec` for the layout.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from infra.kafka import process
from infra.kafka.errors import BrokerStartError, KafkaInfraError
from infra.kafka.jars import Progress, ensure_kafka_jars
from infra.kafka.java import find_java
from infra.kafka.locking import exclusive
from infra.kafka.properties import configured_listeners, listeners, write_server_properties
from infra.kafka.readiness import ReadyReport, await_ready
from infra.kafka.secure import prepare as prepare_security
from infra.kafka.secure import secured_single_node
from infra.kafka.spec import ClusterSpec, KafkaNodeSpec, single_node, three_nodes
from infra.kafka.storage import format_missing

__all__ = [
    "ClusterSpec",
    "ClusterStatus",
    "KafkaInfraError",
    "KafkaNodeSpec",
    "NodeStatus",
    "ReadyReport",
    "StartResult",
    "StopResult",
    "await_ready",
    "ensure_kafka_jars",
    "kill_node",
    "reset",
    "secured_single_node",
    "single_node",
    "start",
    "start_node",
    "status",
    "stop",
    "three_nodes",
    "wait_ready",
]

_T = TypeVar("_T")
SINGLE_READY_TIMEOUT_S = 120.0
CLUSTER_READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
_KILL_WAIT_S = 10.0


@dataclass(frozen=True)
class NodeStatus:
    node_id: int
    pid: int | None
    broker_port: int
    broker_port_open: bool
    controller_port: int
    controller_port_open: bool

    @property
    def running(self) -> bool:
        """Process alive and both listeners accepting connections."""
        return self.pid is not None and self.broker_port_open and self.controller_port_open


@dataclass(frozen=True)
class ClusterStatus:
    name: str
    bootstrap_servers: str
    nodes: tuple[NodeStatus, ...]

    @property
    def running(self) -> bool:
        return all(node.running for node in self.nodes)

    @property
    def any_process(self) -> bool:
        return any(node.pid is not None for node in self.nodes)

    @property
    def pids(self) -> dict[int, int]:
        return {node.node_id: node.pid for node in self.nodes if node.pid is not None}

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "bootstrap_servers": self.bootstrap_servers,
            "running": self.running,
            "nodes": [
                {
                    "node_id": node.node_id,
                    "pid": node.pid,
                    "running": node.running,
                    "broker_port": node.broker_port,
                    "broker_port_open": node.broker_port_open,
                    "controller_port": node.controller_port,
                    "controller_port_open": node.controller_port_open,
                }
                for node in self.nodes
            ],
        }


@dataclass(frozen=True)
class StartResult:
    status: ClusterStatus
    started: tuple[int, ...]  # node ids launched by this call; empty = was already running
    formatted: tuple[int, ...]  # node ids whose storage was formatted by this call
    ready: ReadyReport | None  # None when called with wait=False


@dataclass(frozen=True)
class StopResult:
    stopped: dict[int, int]  # node id -> pid that was stopped
    forced: tuple[int, ...]  # node ids that ignored SIGTERM and got SIGKILL


def _live_pid(node: KafkaNodeSpec) -> int | None:
    pid = process.running_pid(node)
    if pid is not None:
        return pid
    # A broker whose pid file was deleted must not get a twin on the same ports.
    orphan = process.find_untracked_pid(node)
    if orphan is not None:
        node.pid_file.parent.mkdir(parents=True, exist_ok=True)
        node.pid_file.write_text(f"{orphan}\n")
    return orphan


def _node_status(node: KafkaNodeSpec) -> NodeStatus:
    return NodeStatus(
        node_id=node.node_id,
        pid=_live_pid(node),
        broker_port=node.broker_port,
        broker_port_open=process.port_open(node.host, node.broker_port),
        controller_port=node.controller_port,
        controller_port_open=process.port_open(node.host, node.controller_port),
    )


def status(spec: ClusterSpec) -> ClusterStatus:
    """Process and port state of every node (no Kafka requests, returns in ~ms)."""
    return ClusterStatus(
        name=spec.name,
        bootstrap_servers=spec.bootstrap_servers,
        nodes=tuple(_node_status(node) for node in spec.nodes),
    )


def _run_sync(make_coroutine: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make_coroutine())
    # Called from async code (e.g. an async test): a nested asyncio.run is not
    # allowed on this thread, so give the check its own thread and loop.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make_coroutine())).result()


def _require_alive(spec: ClusterSpec, nodes: Sequence[KafkaNodeSpec], just_launched: bool) -> Callable[[], None]:
    def check() -> None:
        for node in nodes:
            if process.running_pid(node) is not None:
                continue
            if just_launched:
                raise BrokerStartError(
                    f"kafka {spec.name} node {node.node_id} exited while starting: {process.log_tail(node)}"
                )
            raise BrokerStartError(f"kafka {spec.name} node {node.node_id} is not running (start it first)")

    return check


def _default_timeout(spec: ClusterSpec) -> float:
    return SINGLE_READY_TIMEOUT_S if spec.is_single else CLUSTER_READY_TIMEOUT_S


def _wait(
    spec: ClusterSpec, nodes: Sequence[KafkaNodeSpec], timeout_s: float | None, just_launched: bool
) -> ReadyReport:
    limit = timeout_s if timeout_s is not None else _default_timeout(spec)
    liveness = _require_alive(spec, nodes, just_launched)
    node_ids = [node.node_id for node in nodes]
    return _run_sync(lambda: await_ready(spec, limit, node_ids=node_ids, liveness=liveness))


def wait_ready(spec: ClusterSpec, timeout_s: float | None = None, node_ids: Sequence[int] | None = None) -> ReadyReport:
    """Block until the nodes serve metadata and accept an acks=all produce.

    Fails fast (BrokerStartError) if a node's process is not running, and with
    NotReadyError after ``timeout_s`` (default 120 s single, 180 s cluster: a cold JVM on a busy CI machine is slow). Safe
    to call from inside a running event loop; async code may use :func:`await_ready`.
    """
    selected = [spec.node(node_id) for node_id in node_ids] if node_ids else list(spec.nodes)
    return _wait(spec, selected, timeout_s, just_launched=False)


def _check_ports_free(node: KafkaNodeSpec) -> None:
    for port in (node.broker_port, node.controller_port):
        if process.port_open(node.host, port):
            raise BrokerStartError(
                f"port {port} on {node.host} is in use by another process, not kafka node {node.node_id} "
                f"of {node.state_dir}; stop it or choose other ports"
            )


def _launch(spec: ClusterSpec, nodes: Sequence[KafkaNodeSpec], progress: Progress | None) -> tuple[int, ...]:
    java = find_java()
    libs = ensure_kafka_jars(spec.kafka_version, progress)
    for node in nodes:
        _check_ports_free(node)
    prepare_security(spec)
    formatted = format_missing(spec, java, libs)
    for node in nodes:
        write_server_properties(spec, node)
        process.launch(node, java, libs)
    return tuple(formatted)


def _check_running_matches(spec: ClusterSpec, nodes: Sequence[KafkaNodeSpec]) -> None:
    # Same state folder, other ports: the JVM there was started from a different
    # spec. Waiting on our ports would time out; launching a twin would fight over
    # the data folder. Say so instead.
    for node in nodes:
        actual = configured_listeners(node)
        if actual is not None and actual != listeners(node):
            raise BrokerStartError(
                f"kafka {spec.name} node {node.node_id} in {node.state_dir} is running with listeners {actual}, "
                f"not {listeners(node)}; stop it first or use another state dir"
            )


def _start_nodes(
    spec: ClusterSpec,
    nodes: Sequence[KafkaNodeSpec],
    wait: bool,
    timeout_s: float | None,
    progress: Progress | None,
) -> StartResult:
    to_launch = [node for node in nodes if _live_pid(node) is None]
    _check_running_matches(spec, [node for node in nodes if node not in to_launch])
    ready: ReadyReport | None = None
    try:
        formatted = _launch(spec, to_launch, progress) if to_launch else ()
        if wait:
            ready = _wait(spec, nodes, timeout_s, just_launched=bool(to_launch))
    except KafkaInfraError:
        # Leave nothing half-started behind: the caller sees the error, and the
        # next start begins from a clean slate instead of a wedged JVM.
        _stop_nodes(to_launch, STOP_TIMEOUT_S)
        raise
    return StartResult(
        status=status(spec),
        started=tuple(node.node_id for node in to_launch),
        formatted=formatted,
        ready=ready,
    )


def _lifecycle_lock(spec: ClusterSpec) -> contextlib.AbstractContextManager[None]:
    # Two processes starting the same deployment at once (parallel test sessions,
    # a CLI call during a test run) would both see "not running" and launch twins.
    return exclusive(spec.state_dir / ".lifecycle.lock")


def start(
    spec: ClusterSpec, *, wait: bool = True, timeout_s: float | None = None, progress: Progress | None = None
) -> StartResult:
    """Start every node that is not running (formatting storage on first use).

    A no-op for nodes already running (same pid). With ``wait`` (default) it
    returns only once produce requests succeed; on a readiness failure the nodes
    it launched are stopped again and the error is raised.
    """
    with _lifecycle_lock(spec):
        return _start_nodes(spec, spec.nodes, wait, timeout_s, progress)


def start_node(spec: ClusterSpec, node_id: int, *, wait: bool = True, timeout_s: float | None = None) -> StartResult:
    """Start one node (e.g. after :func:`kill_node`); waits until it rejoined the cluster."""
    node = spec.node(node_id)
    with _lifecycle_lock(spec):
        return _start_nodes(spec, [node], wait, timeout_s, None)


def _stop_nodes(nodes: Sequence[KafkaNodeSpec], timeout_s: float) -> StopResult:
    pids = {node.node_id: pid for node in nodes if (pid := _live_pid(node)) is not None}
    by_id = {node.node_id: node for node in nodes}
    # Signal all at once: stopping cluster nodes one by one makes each later one
    # wait for a controller quorum that is already shrinking.
    for pid in pids.values():
        process.send_signal(pid, signal.SIGTERM)
        # A node frozen with kill_node(..., SIGSTOP) would hold SIGTERM pending.
        process.send_signal(pid, signal.SIGCONT)
    deadline = time.monotonic() + timeout_s
    forced: list[int] = []
    for node_id, pid in pids.items():
        node = by_id[node_id]
        if not process.wait_exit(pid, node, max(0.0, deadline - time.monotonic())):
            process.send_signal(pid, signal.SIGKILL)
            process.wait_exit(pid, node, _KILL_WAIT_S)
            forced.append(node_id)
        node.pid_file.unlink(missing_ok=True)
    return StopResult(stopped=pids, forced=tuple(forced))


def stop(spec: ClusterSpec, timeout_s: float = STOP_TIMEOUT_S) -> StopResult:
    """SIGTERM every node, wait up to ``timeout_s``, then SIGKILL what is left."""
    with _lifecycle_lock(spec):
        return _stop_nodes(spec.nodes, timeout_s)


def kill_node(spec: ClusterSpec, node_id: int, sig: signal.Signals = signal.SIGKILL) -> int:
    """Send ``sig`` to one node's JVM (fault injection); return its pid.

    For SIGKILL/SIGTERM this waits until the process is gone. Other signals
    (SIGSTOP to freeze a broker, SIGCONT to resume) return immediately.
    """
    node = spec.node(node_id)
    pid = _live_pid(node)
    if pid is None:
        raise KafkaInfraError(f"kafka {spec.name} node {node_id} is not running")
    process.send_signal(pid, sig)
    if sig in (signal.SIGKILL, signal.SIGTERM):
        timeout = STOP_TIMEOUT_S if sig == signal.SIGTERM else _KILL_WAIT_S
        if not process.wait_exit(pid, node, timeout):
            raise KafkaInfraError(
                f"kafka {spec.name} node {node_id} (pid {pid}) still alive {timeout:.0f}s after {sig.name}"
            )
        node.pid_file.unlink(missing_ok=True)
    return pid


def reset(spec: ClusterSpec) -> StopResult:
    """Stop the deployment and delete its state folder (data, logs, identity)."""
    with _lifecycle_lock(spec):
        stopped = _stop_nodes(spec.nodes, STOP_TIMEOUT_S)
        if spec.state_dir.exists():
            shutil.rmtree(spec.state_dir)
    return stopped
