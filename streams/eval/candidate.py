"""The candidate worker group of a replay: an engine worker process on a topic namespace of its own.

`eval replay --candidate FILE` starts ``specstream --config FILE worker`` with a derived topic prefix
(``<prefix>.eval-<tag>``), consumer group and worker id given through the environment (which wins over the file),
waits until it announces itself ready, and stops it (SIGTERM: it drains) and deletes its topics afterwards. Its
output goes to a log file whose tail is shown when it fails to start.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer, TopicPartition
from pydantic import ValidationError

from schemas.events import ServiceAnnouncement, WorkerAnnouncement
from streams import kafka_io
from streams.config import Settings

STOP_TIMEOUT_S = 60.0
_PROGRESS_EVERY_S = 15.0


class CandidateError(RuntimeError):
    """The candidate worker could not be started (message: why, and the tail of its log)."""


@dataclass(frozen=True)
class Candidate:
    settings: Settings  # as the candidate worker sees them (its own prefix)
    process: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(encoding="utf-8", errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def derived_prefix(prefix: str) -> str:
    return f"{prefix}.eval-{uuid.uuid4().hex[:8]}"


def candidate_env(config: Path, prefix: str, bootstrap_servers: str) -> dict[str, str]:
    # The file describes the candidate: our own SPECSTREAM_* overrides stay out (caches excepted).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SPECSTREAM_") or k in ("SPECSTREAM_CACHE_DIR", "SPECSTREAM_STATE_DIR")}
    env.update({
        "SPECSTREAM_CONFIG": str(config),
        "SPECSTREAM_KAFKA__TOPIC_PREFIX": prefix,
        "SPECSTREAM_KAFKA__BOOTSTRAP_SERVERS": bootstrap_servers,
        # Never join (or take requests from) the serving group, whatever the file says.
        "SPECSTREAM_WORKER__GROUP_ID": f"{prefix}.engine-workers",
        "SPECSTREAM_WORKER__ID": f"{prefix.rsplit('.', 1)[-1]}-worker",
        "PYTHONUNBUFFERED": "1",
    })
    return env


@contextlib.asynccontextmanager
async def started_candidate(settings: Settings, config: Path, bootstrap_servers: str, *, ready_timeout_s: float,
                            progress: Callable[[str], None]) -> AsyncIterator[Candidate]:
    """A candidate worker on a new prefix, ready to serve; stopped and its topics deleted on exit."""
    prefix = derived_prefix(settings.kafka.topic_prefix)
    env = candidate_env(config, prefix, bootstrap_servers)
    candidate_settings = settings.model_copy(update={"kafka": settings.kafka.model_copy(
        update={"topic_prefix": prefix, "bootstrap_servers": bootstrap_servers})})
    kafka, topics = candidate_settings.kafka, candidate_settings.catalog.shared_topics()
    await kafka_io.ensure_topics(bootstrap_servers, topics, replication_factor=kafka.replication_factor,
                                 min_insync_replicas=kafka.min_insync_replicas)
    with tempfile.TemporaryDirectory(prefix="specstream-eval-") as folder:
        log = Path(folder) / "candidate-worker.log"
        with open(log, "wb") as handle:
            process = subprocess.Popen([sys.executable, "-m", "streams.cli", "worker"], env=env, stdout=handle,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        candidate = Candidate(candidate_settings, process, log)
        progress(f"candidate worker started (pid {process.pid}) on topic prefix {prefix}")
        try:
            await wait_ready(candidate, ready_timeout_s, progress)
            yield candidate
        finally:
            await asyncio.to_thread(_stop, process)
            with contextlib.suppress(Exception):
                await kafka_io.delete_topics(bootstrap_servers, [t.name for t in topics])


async def wait_ready(candidate: Candidate, timeout_s: float, progress: Callable[[str], None]) -> None:
    """Until a worker of the candidate's prefix announces `ready` (on the workers or the services topic)."""
    catalog = candidate.settings.catalog
    topics = [TopicPartition(catalog.workers.name, 0), TopicPartition(catalog.services.name, 0)]
    consumer = AIOKafkaConsumer(bootstrap_servers=candidate.settings.kafka.bootstrap_servers,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign(topics)
        started = last_note = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if candidate.process.poll() is not None:
                raise CandidateError(f"candidate worker exited with status {candidate.process.returncode}:\n"
                                     f"{candidate.tail()}")
            batch = await consumer.getmany(timeout_ms=500)
            if any(_is_ready(r.value or b"") for records in batch.values() for r in records):
                progress(f"candidate worker ready after {time.monotonic() - started:.0f} s")
                return
            if time.monotonic() - last_note > _PROGRESS_EVERY_S:
                last_note = time.monotonic()
                progress(f"waiting for the candidate worker to load its model ({last_note - started:.0f} s)")
        raise CandidateError(f"candidate worker not ready after {timeout_s:.0f} s:\n{candidate.tail()}")
    finally:
        await consumer.stop()


def _is_ready(value: bytes) -> bool:
    for model in (WorkerAnnouncement, ServiceAnnouncement):
        with contextlib.suppress(ValidationError):
            announcement = kafka_io.decode(value, model)
            return announcement.state == "ready" and getattr(announcement, "kind", "engine-worker") == "engine-worker"
    return False


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(10)
