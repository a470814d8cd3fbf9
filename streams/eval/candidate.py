"""The candidate worker group of a replay: an engine worker process on a topic namespace of its own.

`eval replay --candidate FILE` starts ``specstream --config <derived> worker``, where the derived file (private, in a
temporary folder) is the candidate file with the recording's Kafka connection (servers, security, replication), a
topic prefix of its own (``<prefix>.eval-<tag>``), its own consumer group and worker id, and the replay's reply
topics as its only reply route. It waits until the
worker announces itself ready, and stops it (SIGTERM: it drains) and deletes its topics afterwards. The worker's
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
from typing import Any

import yaml
from aiokafka import TopicPartition
from pydantic import SecretStr, ValidationError

from schemas.events import ENGINE_WORKER_KIND, ServiceAnnouncement
from streams.kafka import clients
from streams.config import KafkaSettings, Settings, read_yaml

STOP_TIMEOUT_S = 60.0
_PROGRESS_EVERY_S = 15.0
# Caches are shared; every other SPECSTREAM_* variable of ours would override the candidate's file.
_KEPT_ENV = ("SPECSTREAM_CACHE_DIR", "SPECSTREAM_STATE_DIR")


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


def derived_config(config: Path, kafka: KafkaSettings, prefix: str, reply_prefix: str, folder: Path) -> Path:
    """The candidate file on the recording's Kafka, under ``prefix``, never in the serving consumer group, answering
    on ``<reply_prefix>.replies.*`` (where the replay reads, as a rollout's candidate pool answers on stable's)."""
    data: dict[str, Any] = read_yaml(config)
    connection = {k: v.get_secret_value() if isinstance(v, SecretStr) else v for k, v in kafka.model_dump().items()}
    data["kafka"] = {**connection, "topic_prefix": prefix}
    data["worker"] = {**(data.get("worker") or {}), "group_id": f"{prefix}.engine-workers",
                      "id": f"{prefix.rsplit('.', 1)[-1]}-worker"}
    data["delivery"] = {**(data.get("delivery") or {}), "reply_topic_patterns": [f"{reply_prefix}.replies.*"]}
    path = folder / "candidate-derived.yaml"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(descriptor, 0o600)  # private even if it existed: it may hold the SASL password
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(yaml.safe_dump(data, sort_keys=False))
    return path


@contextlib.asynccontextmanager
async def started_candidate(settings: Settings, config: Path, kafka: KafkaSettings, reply_prefix: str, *,
                            ready_timeout_s: float, progress: Callable[[str], None]) -> AsyncIterator[Candidate]:
    """A candidate worker on a new prefix, ready to serve; stopped and its topics deleted on exit."""
    prefix = f"{kafka.topic_prefix}.eval-{uuid.uuid4().hex[:8]}"
    candidate_kafka = kafka.model_copy(update={"topic_prefix": prefix})
    candidate_settings = settings.model_copy(update={"kafka": candidate_kafka})
    topics = candidate_settings.catalog.shared_topics()
    await clients.ensure_topics(candidate_kafka, topics, replication_factor=kafka.replication_factor,
                                 min_insync_replicas=kafka.min_insync_replicas)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECSTREAM_") or k in _KEPT_ENV}
    with tempfile.TemporaryDirectory(prefix="specstream-eval-") as folder:
        derived = derived_config(config, kafka, prefix, reply_prefix, Path(folder))
        log = Path(folder) / "candidate-worker.log"
        with open(log, "wb") as handle:
            process = subprocess.Popen([sys.executable, "-m", "streams.cli", "--config", str(derived), "worker"],
                                       env={**env, "PYTHONUNBUFFERED": "1"}, stdout=handle, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True)
        candidate = Candidate(candidate_settings, process, log)
        progress(f"candidate worker started (pid {process.pid}) on topic prefix {prefix}")
        try:
            await wait_ready(candidate, ready_timeout_s, progress)
            yield candidate
        finally:
            await asyncio.to_thread(_stop, process)
            with contextlib.suppress(Exception):
                await clients.delete_topics(candidate_kafka, [t.name for t in topics])


async def wait_ready(candidate: Candidate, timeout_s: float, progress: Callable[[str], None]) -> None:
    """Until a worker of the candidate's prefix announces `ready` on its services topic."""
    catalog = candidate.settings.catalog
    topics = [TopicPartition(catalog.services.name, 0)]
    consumer = clients.make_consumer(candidate.settings.kafka, enable_auto_commit=False, auto_offset_reset="earliest")
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
    with contextlib.suppress(ValidationError):
        announcement = clients.decode(value, ServiceAnnouncement)
        return announcement.state == "ready" and announcement.kind == ENGINE_WORKER_KIND
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
