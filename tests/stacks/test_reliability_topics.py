"""Topics deleted under a running stack (an operator's mistake, or the broker's storage reset): the processes
recreate them and serving resumes, without a flood of log lines in between.

Real broker, real edge and engine worker as subprocesses (streams.testing.stack).
"""
from __future__ import annotations

import asyncio
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from aiokafka.admin import AIOKafkaAdminClient

from streams.testing.reliability import WORKER_ENV
from streams.testing.stack import Stack, running_stack, spawn_process, wait_ready
from tests.kafka_fixtures import kafka_bootstrap, kafka_single, unique_topic  # noqa: F401
from tests.rag_stack import start_rag, wait_rag_ready

pytestmark = [pytest.mark.kafka]

GONE_AFTER_S = 3.0
WORKER_EXIT_TIMEOUT_S = 60.0
# aiokafka's readers of a deleted topic logged ~2,400 "not found" lines a second here before the throttle; with it,
# one per topic a minute (19 topics at most in the few seconds this takes).
MAX_NOT_FOUND_LINES = 40


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str) -> Iterator[tuple[Stack, Path]]:  # noqa: F811
    with tempfile.TemporaryDirectory(prefix="specstream-topics-") as logs:
        env = {**WORKER_ENV, "SPECSTREAM_DELIVERY__MISSING_TOPIC_RESTART_S": str(GONE_AFTER_S)}
        with running_stack(kafka_bootstrap, env=env, log_dir=logs) as running:
            yield running, Path(logs)


async def _topics(bootstrap: str, prefix: str, *, delete: bool = False) -> list[str]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = sorted(t for t in await admin.list_topics() if t.startswith(prefix + "."))
        if delete:
            await admin.delete_topics(names)
        return names
    finally:
        await admin.close()


def _answer(stack: Stack) -> str:
    response = httpx.post(stack.base_url + "/v1/chat/completions", headers=stack.headers, timeout=120.0, json={
        "model": stack.model, "messages": [{"role": "user", "content": "Name three primary colors."}],
        "max_tokens": 8, "temperature": 0})
    assert response.status_code == 200, (response.text, stack.logs())
    return str(response.json()["choices"][0]["message"]["content"])


@pytest.mark.model
def test_deleted_topics_are_recreated_by_the_edge_and_by_a_restarted_worker(stack: tuple[Stack, Path]) -> None:
    running, logs = stack
    edge, worker = (next(p for p in running.processes if p.name == name) for name in ("edge", "worker"))
    assert _answer(running)
    reply_topic = f"{running.topic_prefix}.replies.{running.edge_id}"
    deleted = asyncio.run(_topics(running.bootstrap_servers, running.topic_prefix, delete=True))
    assert reply_topic in deleted

    # The worker drains and exits with status 1, naming what is gone, for its supervisor to restart it.
    assert worker.popen.wait(WORKER_EXIT_TIMEOUT_S) == 1, worker.tail()
    assert "topics gone from the cluster:" in worker.tail()
    # Its services topic is gone too: the drain announces nothing (each try would wait out 3 s, unacknowledged).
    assert not re.search(r"could not announce (draining|stopped)", worker.log.read_text(errors="replace")), worker.tail()

    # The edge stays up and connects again, which recreates its topics (its reply topic among them).
    deadline = time.monotonic() + 30.0
    while reply_topic not in asyncio.run(_topics(running.bootstrap_servers, running.topic_prefix)):
        assert time.monotonic() < deadline, edge.tail()
        time.sleep(0.5)
    assert edge.popen.poll() is None
    edge_log = edge.log.read_text(errors="replace")
    assert "topics gone from the cluster:" in edge_log and "connecting again, which recreates them" in edge_log
    assert edge_log.count("not found in cluster metadata") <= MAX_NOT_FOUND_LINES

    # A restarted worker (what `specstream up` or Kubernetes does) and the same edge serve again.
    running.processes.remove(worker)
    running.processes.append(spawn_process("worker-restarted", ["worker"], running.env, logs))
    wait_ready(running, timeout_s=120.0)
    assert _answer(running)


def test_the_rag_service_whose_topics_are_deleted_drains_and_exits_1_naming_them(
        kafka_bootstrap: str, tmp_path: Path) -> None:  # noqa: F811
    prefix = unique_topic("rag-gone")
    rag = start_rag(kafka_bootstrap, prefix, tmp_path / "state", tmp_path,
                    env={"SPECSTREAM_DELIVERY__MISSING_TOPIC_RESTART_S": str(GONE_AFTER_S)})
    try:
        wait_rag_ready(rag, kafka_bootstrap, prefix)
        deleted = asyncio.run(_topics(kafka_bootstrap, prefix, delete=True))
        assert f"{prefix}.retrieval" in deleted
        assert rag.popen.wait(WORKER_EXIT_TIMEOUT_S) == 1, rag.tail()
        assert "topics gone from the cluster:" in rag.tail()
    finally:
        if rag.popen.poll() is None:
            rag.popen.kill()
