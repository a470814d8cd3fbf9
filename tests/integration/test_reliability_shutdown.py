"""SIGTERM ends a worker promptly even when its broker is already gone.

Its replies and announcements cannot be delivered then; the drain must not wait
out the Kafka client's request timeout for them, and what was not acknowledged
stays uncommitted, so it is redelivered once a broker is back.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from infra.kafka import broker
from streams.testing.stack import free_port
from tests.conftest import TEST_MAX_MODEL_LEN

pytestmark = [pytest.mark.kafka, pytest.mark.model]

REPO = Path(__file__).resolve().parents[2]
DRAIN_S = 3


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def test_sigterm_exits_within_the_drain_time_when_the_broker_is_gone(tmp_path: Path) -> None:
    spec = broker.single_node(port=free_port(), controller_port=free_port(), state_dir=tmp_path / "kafka")
    broker.start(spec)
    log_path = tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECSTREAM_") or k == "SPECSTREAM_CACHE_DIR"}
    env.update({
        "SPECSTREAM_KAFKA__BOOTSTRAP_SERVERS": f"127.0.0.1:{spec.nodes[0].broker_port}",
        "SPECSTREAM_KAFKA__TOPIC_PREFIX": f"shutdown-{uuid.uuid4().hex[:6]}",
        "SPECSTREAM_KAFKA__MANAGE_LOCAL": "false",
        "SPECSTREAM_ENGINE__MAX_MODEL_LEN": str(TEST_MAX_MODEL_LEN),
        "SPECSTREAM_ENGINE__KV_CACHE_BYTES": "64MiB",
        "SPECSTREAM_WORKER__HEARTBEAT_S": "1",
        "SPECSTREAM_WORKER__DRAIN_TIMEOUT_S": str(DRAIN_S),
        "PYTHONPATH": str(REPO),
    })
    with log_path.open("wb") as log:
        worker = subprocess.Popen([sys.executable, "-m", "streams.cli", "worker"], env=env, cwd=tmp_path,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # The freeze is start-up's last act (streams.service.gc_pauses): after it the worker is fully up.
        _wait_for(lambda: " objects frozen out of garbage collection" in log_path.read_text(errors="replace")
                  or worker.poll() is not None, 180, "the worker to finish starting")
        assert worker.poll() is None, log_path.read_text(errors="replace")[-3000:]
        broker.stop(spec)

        started = time.monotonic()
        os.killpg(worker.pid, signal.SIGTERM)
        code = worker.wait(60)
        took = time.monotonic() - started
        assert code == 0, log_path.read_text(errors="replace")[-3000:]
        # Drain time plus bounded announcements and client shutdown; the Kafka request timeout is 40 s.
        assert took < DRAIN_S + 20, f"SIGTERM took {took:.1f} s"
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        broker.stop(spec)
