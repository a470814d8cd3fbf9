"""The real specstream stack for integration tests: an engine worker and an edge as subprocesses.

    from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401
    from streams.testing.stack import running_stack

    @pytest.fixture(scope="module")
    def stack(kafka_bootstrap: str) -> Iterator[Stack]:
        with running_stack(kafka_bootstrap) as s:
            yield s

    def test_x(stack: Stack) -> None:
        httpx.post(stack.base_url + "/v1/chat/completions", json={...})

Each stack gets its own topic prefix (so runs never see each other's requests,
replies or worker announcements on a shared broker), an edge on a free port,
and the default model. Both processes are started with ``python -m streams.cli``
(what the ``specstream`` script runs), configured through ``SPECSTREAM_*``
environment variables; their output goes to log files whose tails are shown
when something fails. ``running_stack`` returns once the edge's ``/readyz``
answers 200, i.e. the worker has loaded the model and announced itself.

The edge requires API keys, as in production: each stack has a keys file of
its own with one key (tenant ``test``, no limits), ``stack.api_key``; send it
as ``Authorization: Bearer`` (``stack.headers``) or ``OpenAI(api_key=...)``.
Stopping sends SIGTERM to the edge, then the worker (which drains), then kills
what is left.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]  # the checkout: children import its code, not an older install
DEFAULT_MODEL = "smollm2-135m-instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Stack:
    bootstrap_servers: str
    topic_prefix: str
    edge_id: str
    port: int
    model: str = DEFAULT_MODEL
    processes: list[Process] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    api_key: str = ""
    keys_file: Path | None = None

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} ({p.log}) ---\n{p.tail()}" for p in self.processes)

    def check_alive(self) -> None:
        for p in self.processes:
            code = p.popen.poll()
            if code is not None:
                raise RuntimeError(f"{p.name} exited with status {code}\n{self.logs()}")


def stack_env(bootstrap_servers: str, topic_prefix: str, edge_id: str, port: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECSTREAM_") or k in ("SPECSTREAM_CACHE_DIR", "SPECSTREAM_STATE_DIR")}
    env.update({
        "SPECSTREAM_CONFIG": os.devnull,  # the defaults, whatever specstream.yaml lies around
        "SPECSTREAM_KAFKA__BOOTSTRAP_SERVERS": bootstrap_servers,
        "SPECSTREAM_KAFKA__TOPIC_PREFIX": topic_prefix,
        "SPECSTREAM_KAFKA__MANAGE_LOCAL": "false",
        "SPECSTREAM_EDGE__HOST": "127.0.0.1",
        "SPECSTREAM_EDGE__PORT": str(port),
        "SPECSTREAM_EDGE__EDGE_ID": edge_id,
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra or {})
    return env


def spawn_process(name: str, args: list[str], env: dict[str, str], log_dir: Path) -> Process:
    log = log_dir / f"{name}.log"
    handle = open(log, "wb")  # noqa: SIM115 - owned by the child's lifetime
    popen = subprocess.Popen(
        [sys.executable, "-m", "streams.cli", *args], cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, start_new_session=True,
    )
    handle.close()
    return Process(name, popen, log)


def _stop(process: Process, timeout_s: float) -> None:
    if process.popen.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.popen.send_signal(signal.SIGTERM)
    try:
        process.popen.wait(timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.popen.pid, signal.SIGKILL)
        process.popen.wait(10)


def wait_ready(stack: Stack, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        stack.check_alive()
        try:
            response = httpx.get(stack.base_url + "/readyz", timeout=2.0)
            if response.status_code == 200:
                return
            last = f"{response.status_code} {response.text[:200]}"
        except httpx.HTTPError as error:
            last = f"{type(error).__name__}"
        time.sleep(0.5)
    raise TimeoutError(f"{stack.base_url}/readyz not ready after {timeout_s:.0f}s ({last})\n{stack.logs()}")


@contextlib.contextmanager
def running_stack(
    bootstrap_servers: str,
    *,
    worker: bool = True,
    edge: bool = True,
    env: dict[str, str] | None = None,
    worker_env: dict[str, str] | None = None,
    edge_env: dict[str, str] | None = None,
    prepare: Callable[[Stack], None] | None = None,
    ready_timeout_s: float = 300.0,
    log_dir: str | os.PathLike[str] | None = None,
) -> Iterator[Stack]:
    """Start a worker and an edge on their own topic prefix; yield when the edge is ready (see the module docstring).

    ``env`` adds or overrides ``SPECSTREAM_*`` settings of both processes (e.g.
    ``{"SPECSTREAM_ENGINE__SPECULATION__ENABLED": "false"}``). With ``edge=False`` nothing
    waits for readiness; with ``worker=False`` the edge's /readyz never turns ready, so
    only the edge's start is awaited (its /healthz). ``worker_env`` / ``edge_env`` add settings of one
    process only (e.g. its own Kafka user); ``prepare(stack)`` runs before either starts (e.g. to grant ACLs
    for ``stack.topic_prefix``).
    """
    tag = uuid.uuid4().hex[:8]
    stack = Stack(bootstrap_servers=bootstrap_servers, topic_prefix=f"st-{tag}", edge_id=f"edge-{tag}", port=free_port())
    with contextlib.ExitStack() as cleanup:
        logs = Path(log_dir) if log_dir is not None else Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="specstream-stack-")))
        from streams.edge.keys import create_key

        stack.keys_file = logs / "keys.json"
        stack.api_key, _ = create_key(stack.keys_file, "test", rpm=0, tpm=0, concurrency=0)
        auth_env = {"SPECSTREAM_EDGE__AUTH__KEYS_FILE": str(stack.keys_file)}
        stack.env = stack_env(bootstrap_servers, stack.topic_prefix, stack.edge_id, stack.port, {**auth_env, **(env or {})})
        try:
            if prepare is not None:
                prepare(stack)
            if worker:
                stack.processes.append(spawn_process("worker", ["worker"], {**stack.env, **(worker_env or {})}, logs))
            if edge:
                stack.processes.append(spawn_process("edge", ["edge"], {**stack.env, **(edge_env or {})}, logs))
            if edge and worker:
                wait_ready(stack, ready_timeout_s)
            elif edge:
                _wait_healthy(stack, ready_timeout_s)
            yield stack
        finally:
            # Edge first (no new requests), then the worker (drains what it holds).
            for process in reversed(stack.processes):
                _stop(process, timeout_s=30.0)


def _wait_healthy(stack: Stack, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stack.check_alive()
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(stack.base_url + "/healthz", timeout=2.0).status_code == 200:
                return
        time.sleep(0.3)
    raise TimeoutError(f"{stack.base_url}/healthz not up after {timeout_s:.0f}s\n{stack.logs()}")
