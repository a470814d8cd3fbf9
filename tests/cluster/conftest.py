"""tests/cluster is the three-node tier: tests that start the local three-node Kafka cluster (marked `cluster`).

A package (``__init__.py``) so that the cluster lives for this folder only: it is started by the first test here and
stopped after the last one (when this session started it), instead of three idle brokers taking CPU and memory from
every test that runs after them.
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from infra.kafka.broker import ClusterSpec
from tests.kafka_fixtures import local_cluster_spec, run_for_session


@pytest.fixture(scope="package")
def kafka_cluster_session() -> Iterator[ClusterSpec]:
    """The three-node cluster for this folder's tests (prefer ``kafka_cluster`` in tests)."""
    yield from run_for_session(local_cluster_spec())
