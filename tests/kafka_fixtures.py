"""Pytest fixtures for tests that need a real Kafka.

Import the fixtures you use into a test module (or list this module in the root
conftest's ``pytest_plugins``)::

    from tests.kafka_fixtures import kafka_bootstrap  # noqa: F401

    @pytest.mark.kafka
    async def test_something(kafka_bootstrap: str) -> None: ...

Environment:
  SPECSTREAM_BOOTSTRAP_SERVERS   use this external Kafka; nothing is started or stopped
  SPECSTREAM_KAFKA_PORT          port of the local single node (default 9092)
  SPECSTREAM_KAFKA_CLUSTER_PORT  base port of the local three-node cluster (default 39092)
  SPECSTREAM_STATE_DIR / SPECSTREAM_CACHE_DIR   see infra.kafka.paths

A broker that was already running before the session is left running; one a
test session started is stopped by the last session using it. Setup failures (no Java, no Maven, port
taken, broker crash) surface as fixture errors, never as skips.
"""

from __future__ import annotations

import fcntl
import os
import uuid
from collections.abc import Iterator

import pytest

from infra.kafka.broker import ClusterSpec, single_node, start, stop, three_nodes
from infra.kafka.paths import env_port
from infra.kafka.spec import DEFAULT_CLUSTER_BASE_PORT

BOOTSTRAP_ENV = "SPECSTREAM_BOOTSTRAP_SERVERS"
SINGLE_PORT_ENV = "SPECSTREAM_KAFKA_PORT"
CLUSTER_PORT_ENV = "SPECSTREAM_KAFKA_CLUSTER_PORT"


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
    exclusively: stopping it when the session that started it ends would pull it from under the others.
    """
    spec.state_dir.mkdir(parents=True, exist_ok=True)
    marker = spec.state_dir / "started-by-tests"
    with (spec.state_dir / "sessions.lock").open("w") as sessions:
        fcntl.flock(sessions, fcntl.LOCK_SH)
        if start(spec).started:
            marker.touch()
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
                    stop(spec)
                    marker.unlink(missing_ok=True)


@pytest.fixture(scope="session")
def kafka_single() -> Iterator[ClusterSpec]:
    """The local single-node broker, running; skipped when an external Kafka is configured."""
    if external_bootstrap() is not None:
        pytest.skip(f"{BOOTSTRAP_ENV} is set: the local broker is not managed in this session")
    yield from run_for_session(local_single_spec())


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
