"""Pytest fixtures for tests that need a real Kafka.

Import the fixtures you use into a test module (or list this module in the root
conftest's ``pytest_plugins``)::

    from tests.kafka_fixtures import kafka_bootstrap  # noqa: F401

    @pytest.mark.kafka
    async def test_something(kafka_bootstrap: str) -> None: ...

Environment:
  SPECSTREAM_BOOTSTRAP_SERVERS   use this external Kafka; nothing is started or stopped
  SPECSTREAM_KAFKA_PORT          port of the local single node (default 9092)
  SPECSTREAM_KAFKA_CLUSTER_PORT  base port of the local three-node cluster (default 29192)
  SPECSTREAM_STATE_DIR / SPECSTREAM_CACHE_DIR   see infra.kafka.paths

A broker that was already running before the session is left running; one a
test session started is stopped by the last session using it, after it deleted the
topics the tests made. A broker that dies mid-session is started again before the
next test, with a warning that quotes its log. Setup failures (no Java, no Maven, port
taken, broker crash) surface as fixture errors, never as skips.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import uuid
import warnings
from collections.abc import Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pytest

from infra.kafka import process
from infra.kafka.broker import ClusterSpec, single_node, start, status, stop, three_nodes
from infra.kafka.paths import env_port
from infra.kafka.spec import DEFAULT_CLUSTER_BASE_PORT
from streams.kafka import clients

BOOTSTRAP_ENV = "SPECSTREAM_BOOTSTRAP_SERVERS"
SINGLE_PORT_ENV = "SPECSTREAM_KAFKA_PORT"
CLUSTER_PORT_ENV = "SPECSTREAM_KAFKA_CLUSTER_PORT"
T = TypeVar("T")


def external_bootstrap() -> str | None:
    return os.environ.get(BOOTSTRAP_ENV) or None


def local_single_spec() -> ClusterSpec:
    return single_node(port=env_port(SINGLE_PORT_ENV, 9092))


def local_cluster_spec() -> ClusterSpec:
    return three_nodes(base_port=env_port(CLUSTER_PORT_ENV, DEFAULT_CLUSTER_BASE_PORT))


def unique_topic(prefix: str) -> str:
    """A topic name no earlier run used: the local broker keeps data across sessions."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def run_for_session(spec: ClusterSpec) -> Iterator[ClusterSpec]:
    """Share the broker with every other pytest session on this machine (two checkouts testing at once).

    Each session holds a shared lock on the state folder's ``sessions.lock`` while it runs. A broker some session
    started (``started-by-tests`` marks it) is stopped by the last session out, the one that can then take the lock
    exclusively: stopping it when the session that started it ends would pull it from under the others. Before
    stopping it, that session deletes every topic the tests made (see ``TopicLedger``).
    """
    spec.state_dir.mkdir(parents=True, exist_ok=True)
    marker = spec.state_dir / "started-by-tests"
    ledger = TopicLedger(spec)
    with (spec.state_dir / "sessions.lock").open("w") as sessions:
        fcntl.flock(sessions, fcntl.LOCK_SH)
        if start(spec).started:
            marker.touch()
        if marker.exists():
            ledger.open()
        try:
            yield spec
        finally:
            fcntl.flock(sessions, fcntl.LOCK_UN)
            try:
                fcntl.flock(sessions, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pass  # another session still tests against it
            else:
                if marker.exists():
                    ledger.close()
                    stop(spec)
                    marker.unlink(missing_ok=True)


class TopicLedger:
    """The topics a broker held before tests ran on it, so that the last session out deletes the rest.

    The broker keeps every topic a session makes (each test uses a prefix of its own), and each partition holds
    heap (infra/kafka/spec.py): sessions piling up on one machine filled it, and the broker exited mid-suite. The
    record outlives a session that died, so the next one still deletes what that one left.
    """

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.path = spec.state_dir / "topics-before-tests"

    def open(self) -> None:
        if not self.path.exists():
            self.path.write_text("\n".join(self._run(clients.list_topics(self.spec.bootstrap_servers))))

    def close(self) -> None:
        if not self.path.exists():
            return
        kept = set(self.path.read_text().split())
        try:
            # Internal topics (__consumer_offsets: every group's offsets) appear on first use, never by a test.
            made = [n for n in self._run(clients.list_topics(self.spec.bootstrap_servers))
                    if n not in kept and not n.startswith("__")]
            for start_at in range(0, len(made), 500):
                self._run(clients.delete_topics(self.spec.bootstrap_servers, made[start_at:start_at + 500],
                                                timeout_s=120.0))
        except Exception as error:  # a node the last test killed: the next session deletes them
            warnings.warn(f"kafka {self.spec.name}: could not delete the topics tests made: {error!r}")
            return
        self.path.unlink()

    @staticmethod
    def _run(call: Coroutine[Any, Any, T]) -> T:
        # A thread of its own: a fixture may be set up or torn down while pytest-asyncio's loop runs.
        with ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, call).result()


class BrokerDied(UserWarning):
    """The session's broker exited between tests; the warning carries the reason from its own log."""


_session_single: ClusterSpec | None = None


@pytest.fixture(scope="session")
def kafka_single() -> Iterator[ClusterSpec]:
    """The local single-node broker, running; skipped when an external Kafka is configured."""
    global _session_single
    if external_bootstrap() is not None:
        pytest.skip(f"{BOOTSTRAP_ENV} is set: the local broker is not managed in this session")
    _session_single = local_single_spec()
    try:
        yield from run_for_session(_session_single)
    finally:
        _session_single = None


def revive_single_broker() -> None:
    """Start the session's broker again if it died since the last test, warning with the reason.

    One crash (a full heap, the OOM killer) otherwise fails every later test with "cannot reach Kafka", and
    the reason, in the broker's own log, is gone with the machine. Called before each test that uses Kafka.
    """
    spec = _session_single
    if spec is None or status(spec).any_process:
        return
    reason = process.log_tail(spec.nodes[0], lines=5)
    warnings.warn(BrokerDied(f"kafka {spec.name} exited during the session, started again; its log: {reason}"))
    start(spec)


@pytest.fixture(scope="session")
def kafka_bootstrap(request: pytest.FixtureRequest) -> str:
    """Bootstrap servers of a ready Kafka: the external one if configured, else the local node."""
    external = external_bootstrap()
    if external is not None:
        return external
    spec: ClusterSpec = request.getfixturevalue("kafka_single")
    return spec.bootstrap_servers


@pytest.fixture(scope="session")
def kafka_cluster_session() -> Iterator[ClusterSpec]:
    """The three-node cluster for the whole session (prefer ``kafka_cluster`` in tests)."""
    yield from run_for_session(local_cluster_spec())


@pytest.fixture
def kafka_cluster(kafka_cluster_session: ClusterSpec) -> ClusterSpec:
    """The three-node cluster with every node up and ready.

    Restarts any node an earlier test killed, so fault-injection tests may leave
    the cluster degraded without breaking the next test.
    """
    start(kafka_cluster_session)
    return kafka_cluster_session
