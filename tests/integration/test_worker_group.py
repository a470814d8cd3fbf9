"""`specstream worker` as a process: a second worker joins the same consumer group, `specstream send` is served,
and SIGTERM drains and announces the stop."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient

from schemas.events import ServiceAnnouncement
from tests.conftest import TEST_MAX_MODEL_LEN, WorkerHarness

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.kafka, pytest.mark.model]

REPO = Path(__file__).resolve().parents[2]


def _env(harness: WorkerHarness, worker_id: str) -> dict[str, str]:
    """The same deployment as the in-process worker, configured the way an operator would: environment variables."""
    kafka = harness.settings.kafka
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECSTREAM_") or k in (
        "SPECSTREAM_CACHE_DIR", "SPECSTREAM_STATE_DIR")}
    env.update({
        "SPECSTREAM_KAFKA__BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "SPECSTREAM_KAFKA__TOPIC_PREFIX": kafka.topic_prefix,
        "SPECSTREAM_KAFKA__REQUEST_PARTITIONS": str(kafka.request_partitions),
        "SPECSTREAM_KAFKA__MANAGE_LOCAL": "false",
        "SPECSTREAM_ENGINE__MAX_MODEL_LEN": str(TEST_MAX_MODEL_LEN),
        "SPECSTREAM_ENGINE__KV_CACHE_BYTES": "64MiB",
        "SPECSTREAM_WORKER__ID": worker_id,
        "SPECSTREAM_WORKER__HEARTBEAT_S": "1",
        "SPECSTREAM_WORKER__DRAIN_TIMEOUT_S": "5",
        "PYTHONPATH": str(REPO),
    })
    return env


async def _announcements(harness: WorkerHarness, worker_id: str, state: str, timeout_s: float) -> ServiceAnnouncement:
    announcement = await harness.first_event(
        harness.settings.catalog.services.name, ServiceAnnouncement,
        lambda a: (a.kind, a.service_id, a.state) == ("engine-worker", worker_id, state), timeout_s,
    )
    if announcement is None:
        raise AssertionError(f"worker {worker_id} did not announce {state!r} within {timeout_s}s")
    return announcement


async def _group_members(harness: WorkerHarness) -> int:
    admin = AIOKafkaAdminClient(bootstrap_servers=harness.bootstrap_servers)
    await admin.start()
    try:
        (response,) = await admin.describe_consumer_groups([harness.worker.group_id])
        groups = response.to_object()["groups"]
        return len(groups[0]["members"])
    finally:
        await admin.close()


async def test_second_worker_process_joins_the_group_and_serves(worker_harness: WorkerHarness, tmp_path: Path):
    worker_id = f"cli-{uuid.uuid4().hex[:6]}"
    env = _env(worker_harness, worker_id)
    log = (tmp_path / "worker.log").open("wb")
    process = subprocess.Popen([sys.executable, "-m", "streams.cli", "worker"], env=env, cwd=tmp_path,
                               stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ready = await _announcements(worker_harness, worker_id, "ready", timeout_s=180)
        assert worker_harness.model in ready.models

        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while (members := await _group_members(worker_harness)) < 2:
            assert loop.time() < deadline, f"group has {members} member(s)"
            await asyncio.sleep(0.5)

        send = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "streams.cli", "send", "Say hello.", "--max-tokens", "6", env=env, cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        stdout, stderr = await asyncio.wait_for(send.communicate(), timeout=120)
        assert send.returncode == 0, stderr.decode()
        assert stdout.decode().strip()
        assert "completion tokens" in stderr.decode()

        os.killpg(process.pid, signal.SIGTERM)
        assert await asyncio.to_thread(process.wait, 60) == 0
        await _announcements(worker_harness, worker_id, "stopped", timeout_s=10)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()
        if process.returncode not in (0, None):
            print((tmp_path / "worker.log").read_text(errors="replace")[-4000:])
