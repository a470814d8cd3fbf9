"""`specstream up` keeps what it started running: a worker killed with SIGKILL is replaced by a new one.

The real command as a subprocess, with a configuration file of its own (this
test's topic prefix and edge port, a small engine), on the real broker. The
proof goes through the edge, as a client would see it: ``/readyz`` lists a
worker that was not there before the kill, and a chat completion then
completes. SIGTERM afterwards stops the edge, then the worker, and restarts
nothing.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.testing.stack import DEFAULT_MODEL, REPO, free_port
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.timeout(900)]

READY_TIMEOUT_S = 600.0  # two model loads on a shared, busy machine


@dataclass
class Up:
    process: subprocess.Popen[bytes]
    log: Path
    base_url: str
    api_key_file: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def pids(self, name: str) -> list[int]:
        """Every pid `up` said it started or restarted `name` with, in order."""
        return [int(p) for p in re.findall(rf"^{name}: (?:started|restarted) \(pid (\d+)", self.text(), re.M)]

    def readyz(self) -> dict[str, Any]:
        with contextlib.suppress(httpx.HTTPError):
            response = httpx.get(self.base_url + "/readyz", timeout=2.0)
            return {**response.json(), "status": response.status_code}
        return {"status": None}

    def wait(self, what: str, done: Callable[[], bool], timeout_s: float = READY_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            assert self.process.poll() is None, f"up exited with {self.process.returncode}\n{self.text()[-4000:]}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}\n{self.text()[-4000:]}"
            time.sleep(0.3)


def _config(tmp_path: Path, bootstrap: str, prefix: str, port: int, engine: dict[str, Any],
            ops: dict[str, Any]) -> Path:
    config = {
        "kafka": {"bootstrap_servers": bootstrap, "topic_prefix": prefix, "request_partitions": 2,
                  "manage_local": False},
        "engine": {"max_model_len": 512, "kv_cache_bytes": "96MiB", "max_running_requests": 8, **engine},
        "worker": {"heartbeat_s": 1.0, "drain_timeout_s": 5.0},
        "edge": {"host": "127.0.0.1", "port": port, "edge_id": f"edge-{prefix}",
                 "auth": {"keys_file": str(tmp_path / "keys.json")}},
        "ops": ops,
    }
    path = tmp_path / "specstream.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@contextlib.contextmanager
def running_up(tmp_path: Path, bootstrap: str, *args: str, engine: dict[str, Any] | None = None,
               ops: dict[str, Any] | None = None) -> Iterator[Up]:
    """`specstream --config <this test's> up ARGS` as a subprocess; stopped, with what it started, afterwards."""
    prefix = f"t-up-{uuid.uuid4().hex[:8]}"
    port = free_port()
    config = _config(tmp_path, bootstrap, prefix, port, engine or {}, ops or {})
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECSTREAM_") or k == "SPECSTREAM_CACHE_DIR"}
    env.update({"PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)})
    log = tmp_path / "up.log"
    with log.open("wb") as handle:
        process = subprocess.Popen([sys.executable, "-m", "streams.cli", "--config", str(config), "up", *args],
                                   cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    running = Up(process, log, f"http://127.0.0.1:{port}", (tmp_path / "keys.json").with_name("local.key"))
    try:
        yield running
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(60)
        # The services run in sessions of their own: whatever `up` left behind goes too.
        started = [pid for kind in ("worker", "parser", "rag", "edge", "batch-assembler") for pid in running.pids(kind)]
        for pid in [process.pid, *started]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        catalog = TopicCatalog(prefix)
        topics = [t.name for t in catalog.shared_topics()] + [catalog.replies(f"edge-{prefix}").name]
        asyncio.run(clients.delete_topics(bootstrap, topics))


@pytest.fixture
def up(tmp_path: Path, kafka_bootstrap: str) -> Iterator[Up]:  # noqa: F811
    with running_up(tmp_path, kafka_bootstrap) as running:
        yield running


def test_a_worker_killed_under_up_is_restarted_announces_ready_and_serves_a_request(up: Up) -> None:
    up.wait("the stack to come up", lambda: "specstream is up" in up.text())
    (first_worker,) = up.pids("worker")
    workers_before = set(up.readyz()["workers"])
    assert workers_before, up.readyz()

    os.kill(first_worker, signal.SIGKILL)
    up.wait("the supervisor to restart the worker", lambda: len(up.pids("worker")) == 2, timeout_s=60)
    assert f"worker (pid {first_worker}): killed by SIGKILL" in up.text()
    new_worker = up.pids("worker")[1]
    assert new_worker != first_worker

    # A worker that announced itself after the kill: /readyz names one the first never was.
    up.wait("the new worker to announce ready", lambda: bool(set(up.readyz().get("workers") or []) - workers_before))
    assert up.readyz()["status"] == 200
    key = up.api_key_file.read_text().strip()
    response = httpx.post(up.base_url + "/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                          timeout=120, json={"model": DEFAULT_MODEL, "max_tokens": 4,
                                             "messages": [{"role": "user", "content": "Say hello."}]})
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")

    up.process.send_signal(signal.SIGTERM)
    assert up.process.wait(90) == 0, up.text()[-4000:]
    shutdown = up.text().split("stopping ...", 1)[1]
    assert shutdown.index("edge: stopped") < shutdown.index("worker: stopped")
    assert "restarted" not in shutdown
    with pytest.raises(ProcessLookupError):
        os.kill(new_worker, 0)


def test_a_worker_that_keeps_dying_at_start_is_reported_as_crash_looping_and_up_stops(
        tmp_path: Path, kafka_bootstrap: str) -> None:  # noqa: F811
    # A model that does not exist: the worker exits with status 1 about a second after every start (it checks the
    # reference before importing the engine).
    # The restart policy from ops.restart (shortened here: the shipped one waits 1, 2, 4, 8 and 15 s over 6 deaths).
    restart = {"first_backoff_s": 0.5, "max_backoff_s": 1.0, "crash_loop_after": 4}
    # The tool runner (no model) is "the rest" that up must stop; the parser and the rag service (which loads the
    # embedder) would only compete with the worker's starts for the CPU: the test above starts all of them.
    with running_up(tmp_path, kafka_bootstrap, "--no-edge", "--no-parser", "--no-rag",
                    engine={"model": str(tmp_path / "missing.gguf")}, ops={"restart": restart}) as up:
        assert up.process.wait(300) == 1, up.text()[-4000:]
        text = up.text()
    assert "up: worker is crash-looping: it died 4 times in a row, each within 60s of starting" in text
    assert "(last: exited with status 1" in text and "not restarting it; stopping the rest" in text
    assert "tool-runner: stopped" in text.split("stopping the rest", 1)[1]
    waits = re.findall(r"^worker \(pid \d+\): exited with status 1 after [\d.]+s; restarting in (\S+)$", text, re.M)
    assert waits == ["0.5s", "1s", "1s"]
    assert len(up.pids("worker")) == 4
