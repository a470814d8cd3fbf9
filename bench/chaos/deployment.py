"""Every service kind of a deployment as subprocesses on the three-node cluster, each restartable on its own: two
edges sharing keys, files and Redis limits, two engine workers, a parser, the rag service, a tool runner and the
batch assembler; plus the Redis they share, restartable on its port. RSS is sampled per incarnation."""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.chaos.ledger import FlowContext, say
from bench.chaos.schedule import SERVICE_KINDS, instances
from streams.testing.redis import RedisServer
from streams.testing.reliability import WORKER_ENV, vm_kib
from streams.testing.stack import DEFAULT_MODEL, Process, free_port, spawn_process, stack_env

# Consumers refuse messages past this (the injected oversized ones are larger), below the broker's 1 MiB.
MAX_MESSAGE_BYTES = 256 * 1024
# Which CLI command runs each kind.
ARGV = {"edge": ["edge"], "worker": ["worker"], "parser": ["parser"], "rag": ["rag"], "tool-runner": ["tool-runner"],
        "batch-assembler": ["batch", "assembler"]}
# The settings naming each kind's id, so a restart announces under the same id (as a pod restart would).
ID_SETTING = {"worker": "SPECSTREAM_WORKER__ID", "parser": "SPECSTREAM_PARSER__ID",
              "tool-runner": "SPECSTREAM_TOOLS__RUNNER__ID", "batch-assembler": "SPECSTREAM_BATCH__ASSEMBLER__ID"}


@dataclass
class Incarnation:
    pid: int
    started: float  # time.monotonic()
    ended: float | None = None
    rss_mib: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, MiB)


@dataclass
class Service:
    name: str
    kind: str
    env: dict[str, str]
    log_dir: Path
    process: Process | None = None
    incarnations: list[Incarnation] = field(default_factory=list)

    def start(self) -> None:
        n = len(self.incarnations) + 1
        self.process = spawn_process(f"{self.name}.{n}", ARGV[self.kind], self.env, self.log_dir)
        self.incarnations.append(Incarnation(self.process.popen.pid, time.monotonic()))

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.popen.poll() is None

    def signal(self, sig: signal.Signals) -> None:
        """kill -9 takes the whole process group (a container dying: sandboxed tool children too)."""
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            if sig == signal.SIGKILL:
                os.killpg(self.process.popen.pid, sig)
            else:
                os.kill(self.process.popen.pid, sig)

    def wait_exit(self, timeout_s: float) -> None:
        assert self.process is not None
        try:
            self.process.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.process.popen.wait(10)
        self.incarnations[-1].ended = time.monotonic()

    def sample(self) -> None:
        if not self.alive:
            return
        current = self.incarnations[-1]
        with contextlib.suppress(OSError, KeyError):
            current.rss_mib.append((time.monotonic() - current.started, vm_kib(current.pid, "VmRSS") / 1024))

    def exited_unexpectedly(self) -> str | None:
        if self.process is None or self.process.popen.poll() is None:
            return None
        return f"{self.name} exited with status {self.process.popen.returncode}\n{self.process.tail(30)}"


class Deployment:
    """The services of one chaos run on a topic prefix of their own (`start`, then `services[name]`)."""

    def __init__(self, bootstrap: str, log_dir: Path) -> None:
        tag = uuid.uuid4().hex[:6]
        self.bootstrap = bootstrap
        self.log_dir = log_dir
        self.prefix = f"chaos-{tag}"
        self.redis = RedisServer()
        self.services: dict[str, Service] = {}
        self.ports: dict[str, int] = {}
        self.api_key = ""

    def env(self, name: str) -> dict[str, str]:
        from streams.edge.keys import create_key

        keys = self.log_dir / "keys.json"
        if not self.api_key:
            self.api_key, _ = create_key(keys, "chaos", rpm=0, tpm=0, concurrency=0)
        port = self.ports.setdefault(name, free_port()) if name.startswith("edge") else 1
        limit = str(MAX_MESSAGE_BYTES)
        extra = {
            **WORKER_ENV,
            "SPECSTREAM_KAFKA__REPLICATION_FACTOR": "3", "SPECSTREAM_KAFKA__MIN_INSYNC_REPLICAS": "2",
            "SPECSTREAM_EDGE__AUTH__KEYS_FILE": str(keys), "SPECSTREAM_EDGE__REDIS_URL": self.redis.url,
            "SPECSTREAM_FILES__DIR": str(self.log_dir / "files"),
            "SPECSTREAM_RAG__STATE_DIR": str(self.log_dir / "rag"), "SPECSTREAM_RAG__HEARTBEAT_S": "1",
            "SPECSTREAM_ENGINE__LORA__RUNTIME_UPDATES": "true", "SPECSTREAM_TOOLS__MAX_ROUNDS": "1",
            "SPECSTREAM_WORKER__MAX_MESSAGE_BYTES": limit, "SPECSTREAM_RAG__MAX_MESSAGE_BYTES": limit,
            "SPECSTREAM_TOOLS__RUNNER__MAX_MESSAGE_BYTES": limit,
            "SPECSTREAM_BATCH__ASSEMBLER__MAX_MESSAGE_BYTES": limit,
            "SPECSTREAM_BATCH__ASSEMBLER__PROGRESS_INTERVAL_S": "1",
        }
        kind = name.rsplit("-", 1)[0] if name not in SERVICE_KINDS else name
        if kind in ID_SETTING:
            extra[ID_SETTING[kind]] = f"{self.prefix}-{name}"
        return stack_env(self.bootstrap, self.prefix, f"{self.prefix}-{name}", port, extra)

    def start(self) -> None:
        from schemas.topics import TopicCatalog
        from streams.kafka import clients

        self.redis.start()
        asyncio.run(clients.ensure_topics(self.bootstrap, TopicCatalog(prefix=self.prefix).shared_topics(),
                                          replication_factor=3, min_insync_replicas=2))
        for kind in SERVICE_KINDS:
            for name in instances(kind):
                service = Service(name, kind, self.env(name), self.log_dir)
                self.services[name] = service
                service.start()
        self.wait_ready(600.0)

    def edges(self) -> list[Service]:
        return [s for s in self.services.values() if s.kind == "edge"]

    def base_url(self, edge: str) -> str:
        return f"http://127.0.0.1:{self.ports[edge]}"

    def wait_ready(self, timeout_s: float) -> None:
        """Every edge answers /readyz (a worker announced itself) and every consumer kind announced `ready`."""
        deadline = time.monotonic() + timeout_s
        pending = set(self.services)
        while pending and time.monotonic() < deadline:
            for name in sorted(pending):
                if (problem := self.services[name].exited_unexpectedly()) is not None:
                    raise RuntimeError(problem)
            pending -= self._ready()
            time.sleep(1.0)
        if pending:
            raise TimeoutError(f"not ready after {timeout_s:.0f}s: {sorted(pending)}")
        say(f"deployment {self.prefix}: {len(self.services)} services ready")

    def _ready(self) -> set[str]:
        from tests.rag_stack import ready_kinds

        ready = set()
        for name, service in self.services.items():
            if service.kind == "edge":
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(self.base_url(name) + "/readyz", timeout=2).status_code == 200:
                        ready.add(name)
            elif service.alive and asyncio.run(ready_kinds(self.bootstrap, self.prefix, service.process.popen.pid)):
                ready.add(name)
        return ready

    def context(self) -> FlowContext:
        any_env = self.services["parser"].env
        return FlowContext([self.base_url(e.name) for e in self.edges()], self.api_key, self.bootstrap,
                           self.prefix, DEFAULT_MODEL, any_env, self.log_dir)

    def sample(self) -> None:
        for service in self.services.values():
            service.sample()

    def stop(self) -> None:
        # Edges first (no new requests), then the consumers (they drain), then Redis.
        ordered = sorted(self.services.values(), key=lambda s: s.kind != "edge")
        for service in ordered:
            if service.alive:
                service.signal(signal.SIGTERM)
        for service in ordered:
            if service.process is not None and service.incarnations[-1].ended is None:
                service.wait_exit(30.0)
        self.redis.stop()
