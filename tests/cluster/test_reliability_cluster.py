"""Broker failure: on the three-node cluster (replication 3, min.insync.replicas 2), kill -9 the broker leading
the request partitions during a run of requests; every client gets its whole answer exactly once, and the edge
and the worker reconnect by themselves."""
from __future__ import annotations

import asyncio
import collections
import tempfile
import threading
import time
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from infra.kafka.broker import ClusterSpec, kill_node, start_node
from streams.testing.reliability import PROMPTS, WORKER_ENV, Fleet, chat_body, run_ws
from streams.testing.stack import DEFAULT_MODEL, running_stack
from tests.kafka_fixtures import kafka_cluster  # noqa: F401  (its cluster: tests/cluster/conftest.py)

pytestmark = [pytest.mark.kafka, pytest.mark.cluster, pytest.mark.model]

N = 16
SPACING_S = 0.5  # requests keep arriving while the broker is down and its partitions move
KILL_AFTER_S = 3.0


async def _leaders(bootstrap: str, topic: str) -> dict[int, int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        return {p["partition"]: p["leader"] for p in described["partitions"]}
    finally:
        await admin.close()


def test_leader_broker_kill_during_a_run_loses_and_doubles_nothing(kafka_cluster: ClusterSpec) -> None:  # noqa: F811
    env = {**WORKER_ENV, "SPECSTREAM_KAFKA__REPLICATION_FACTOR": "3", "SPECSTREAM_KAFKA__MIN_INSYNC_REPLICAS": "2",
           "SPECSTREAM_EDGE__STARTUP_TIMEOUT_S": "60"}
    with tempfile.TemporaryDirectory(prefix="specstream-cluster-") as logs, \
            running_stack(kafka_cluster.bootstrap_servers, env=env, log_dir=logs) as stack:
        fleet = Fleet(stack, Path(logs))
        leaders = asyncio.run(_leaders(stack.bootstrap_servers, f"{stack.topic_prefix}.requests"))
        victim, led = collections.Counter(leaders.values()).most_common(1)[0]
        killed: dict[str, float] = {}

        def kill() -> None:
            killed["at"] = time.time()
            kill_node(kafka_cluster, victim)
            killed["done"] = time.time()

        timer = threading.Timer(KILL_AFTER_S, kill)
        bodies = [chat_body(f"c-{i}", PROMPTS[i % len(PROMPTS)], model=DEFAULT_MODEL, max_tokens=24) for i in range(N)]
        timer.start()
        try:
            answers = asyncio.run(run_ws(stack.ws_url, stack.api_key, bodies, spacing_s=SPACING_S, timeout_s=300))
        finally:
            timer.join()
        try:
            assert killed, "the broker was not killed"
            before = [a for a in answers.values() if a.sent_at < killed["at"]]
            during = [a for a in answers.values() if a.sent_at >= killed["at"]]
            problems = {a.tag: a.problems() for a in answers.values() if a.problems()}
            assert not problems, (problems, stack.logs())
            stack.check_alive()  # neither the edge nor the worker died with the broker
            latencies = sorted(a.latency_s for a in answers.values())  # type: ignore[type-var]
            print(f"\nkilled broker {victim} (leader of {led} of {len(leaders)} request partitions) with "
                  f"{len(before)} requests sent and {len(during)} still to come: {N} of {N} complete, 0 lost, "
                  f"0 doubled; latency max {latencies[-1]:.1f}s")
            assert during, "every request was sent before the kill"
            assert not fleet.log_text().count("Traceback"), fleet.log_text()[-3000:]
        finally:
            start_node(kafka_cluster, victim)
