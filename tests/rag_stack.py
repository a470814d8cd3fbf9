"""The rag service as a real process (`specstream rag`) for the edge and crash tests: started on a deployment's
prefix with a state folder of its own, ready once all its consumers announced themselves."""
from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from schemas.events import ServiceAnnouncement
from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.testing.stack import Process, _stop, spawn_process, stack_env

RAG_KINDS = ("indexer", "retriever", "index-admin")


async def ready_kinds(bootstrap: str, prefix: str, pid: int) -> set[str]:
    topic = TopicCatalog(prefix=prefix).services.name
    kinds: set[str] = set()
    with contextlib.suppress(Exception):
        for record in await clients.read_partition(bootstrap, topic, timeout_s=5):
            if not record.value:
                continue
            announcement = clients.decode(record.value, ServiceAnnouncement)
            if announcement.pid == pid and announcement.state == "ready":
                kinds.add(announcement.kind)
    return kinds


def start_rag(bootstrap: str, prefix: str, state_dir: Path, log_dir: Path, name: str = "rag",
              env: dict[str, str] | None = None) -> Process:
    extra = {"SPECSTREAM_RAG__STATE_DIR": str(state_dir), "SPECSTREAM_RAG__HEARTBEAT_S": "1",
             "SPECSTREAM_RAG__SESSION_TIMEOUT_MS": "6000", **(env or {})}
    return spawn_process(name, ["rag"], stack_env(bootstrap, prefix, "unused", 1, extra), log_dir)


def wait_rag_ready(process: Process, bootstrap: str, prefix: str, timeout_s: float = 180.0) -> None:
    import asyncio

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            raise RuntimeError(f"specstream rag exited with {process.popen.returncode}\n{process.tail()}")
        if set(RAG_KINDS) <= asyncio.run(ready_kinds(bootstrap, prefix, process.popen.pid)):
            return
        time.sleep(0.5)
    raise AssertionError(f"specstream rag not ready after {timeout_s:.0f} s\n{process.tail()}")


def kill_hard(process: Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.popen.pid, signal.SIGKILL)
    process.popen.wait(10)


@contextlib.contextmanager
def running_rag(bootstrap: str, prefix: str, state_dir: Path, log_dir: Path,
                env: dict[str, str] | None = None) -> Iterator[Process]:
    process = start_rag(bootstrap, prefix, state_dir, log_dir, env=env)
    try:
        wait_rag_ready(process, bootstrap, prefix)
        yield process
    finally:
        _stop(process, 20.0)
