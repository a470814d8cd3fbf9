"""Helpers for the fault-injection tests (tests/integration/test_reliability_*.py) and bench/soak.py.

* :class:`Answer` / :func:`run_ws`: many requests on one websocket, every frame
  each client received kept, so a test can count them: chunk indexes 0..n-1
  without gaps or repeats, exactly one ``done``, text == concatenated chunks.
* :class:`Fleet`: engine worker subprocesses around a :class:`streams.testing.stack.Stack`
  (add, kill -9, SIGTERM, wait until the group's partitions are spread over the
  live workers, peak RSS from ``/proc/<pid>/status``).
* Kafka probes: committed offsets of the worker group, end offsets of the
  request topic, reply-topic records (to find regenerated requests and measure
  failover).
"""
from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from streams.kafka import clients
from streams.testing.stack import Process, Stack, spawn_process

# Small and quick on 2 cores: the model work of these tests is a few dozen tokens per request.
WORKER_ENV = {
    "SPECSTREAM_WORKER__HEARTBEAT_S": "1",
    "SPECSTREAM_ENGINE__MAX_MODEL_LEN": "512",
    "SPECSTREAM_ENGINE__KV_CACHE_BYTES": "96MiB",
}

PROMPTS = [
    "What is Apache Kafka?",
    "Name three primary colors.",
    "Why is the sky blue?",
    "What does a compiler do?",
    "Describe a cat in one sentence.",
    "What is the capital of France?",
    "How do plants make food?",
    "What is a prime number?",
    "Explain what a database index is.",
    "What is the boiling point of water?",
    "Who wrote Romeo and Juliet?",
    "What is machine learning?",
]


# --- clients -----------------------------------------------------------------------------------------------------------


@dataclass
class Answer:
    """Everything one websocket client received for one request."""

    tag: str
    sent_at: float
    request_id: str | None = None
    prompt: str = ""
    chunks: list[dict[str, Any]] = field(default_factory=list)
    dones: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    first_chunk_at: float | None = None
    final_at: float | None = None

    @property
    def final(self) -> bool:
        return bool(self.dones or self.errors)

    @property
    def text(self) -> str:
        return "".join(c["text"] for c in self.chunks)

    @property
    def latency_s(self) -> float | None:
        return None if self.final_at is None else self.final_at - self.sent_at

    def record(self, frame: dict[str, Any], now: float) -> None:
        """File one websocket frame of this request (chunk, done or error) received at `now`."""
        if frame["type"] == "chunk":
            self.request_id = frame["request_id"]
            self.first_chunk_at = self.first_chunk_at or now
            self.chunks.append(frame)
        elif frame["type"] == "done":
            self.dones.append(frame)
            self.final_at = now
        elif frame["type"] == "error":
            self.errors.append(frame)
            self.final_at = now

    def problems(self) -> list[str]:
        """Why this answer is not 'complete, exactly once' (empty when it is)."""
        out: list[str] = []
        if self.errors:
            out.append(f"error(s): {self.errors}")
        if len(self.dones) != 1:
            out.append(f"{len(self.dones)} done frames")
        indexes = [c["index"] for c in self.chunks]
        if indexes != list(range(len(indexes))):
            out.append(f"chunk indexes {indexes} (gap or repeat)")
        if self.dones:
            done = self.dones[0]
            if done["text"] != self.text:
                out.append(f"chunks {self.text!r} != done text {done['text']!r}")
            if done.get("num_chunks") is not None and done["num_chunks"] != len(self.chunks):
                out.append(f"num_chunks {done['num_chunks']} but {len(self.chunks)} chunks received")
        return out


def chat_body(tag: str, prompt: str, *, model: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"id": tag, "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, **extra}


async def run_ws(url: str, api_key: str, bodies: list[dict[str, Any]], *, timeout_s: float = 240.0,
                 on_frame: Callable[[dict[str, Answer]], None] | None = None,
                 spacing_s: float = 0.0) -> dict[str, Answer]:
    """Send every body on one websocket and read until each has its final frame (or ``timeout_s``).

    ``on_frame(answers)`` runs after every frame (fault injection hooks in here)."""
    from websockets.asyncio.client import connect

    answers: dict[str, Answer] = {}
    async with connect(url, additional_headers={"Authorization": f"Bearer {api_key}"}, max_size=None,
                       open_timeout=30) as ws:
        for body in bodies:
            answers[str(body["id"])] = Answer(str(body["id"]), time.time())
            await ws.send(json.dumps(body))
            if spacing_s:
                await asyncio.sleep(spacing_s)
        deadline = time.monotonic() + timeout_s
        while not all(a.final for a in answers.values()):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                frame = json.loads(await asyncio.wait_for(ws.recv(), timeout=remaining))
            except TimeoutError:
                break
            answer = answers.get(str(frame.get("id")))
            if answer is None:
                continue
            answer.record(frame, time.time())
            if on_frame is not None:
                on_frame(answers)
    return answers


def max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    best = current = 0
    for _, delta in events:
        current += delta
        best = max(best, current)
    return best


# --- workers -------------------------------------------------------------------------------------------------------------


def vm_kib(pid: int, field_name: str = "VmHWM") -> int:
    """A /proc/<pid>/status memory field in KiB (VmHWM: peak RSS; VmRSS: current)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise KeyError(field_name)


_ASSIGNED = re.compile(r"specstream\.service: assigned (.*)$")


class Fleet:
    """Engine workers of one stack. The stack's own worker (if any) is adopted as the first."""

    def __init__(self, stack: Stack, log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.stack = stack
        self.log_dir = log_dir
        self.env = {**stack.env, **(env or {})}
        self.workers: list[Process] = [p for p in stack.processes if p.name.startswith("worker")]
        self._n = len(self.workers)

    @property
    def alive(self) -> list[Process]:
        return [w for w in self.workers if w.popen.poll() is None]

    def add(self, extra_env: dict[str, str] | None = None) -> Process:
        self._n += 1
        name = f"worker{self._n}"
        env = {**self.env, "SPECSTREAM_WORKER__ID": name, **(extra_env or {})}
        process = spawn_process(name, ["worker"], env, self.log_dir)
        self.workers.append(process)
        self.stack.processes.insert(0, process)  # stopped by running_stack's cleanup too (after the edge)
        return process

    def forget_dead(self) -> None:
        """Drop exited workers from the stack (its check_alive would report them)."""
        self.stack.processes = [p for p in self.stack.processes if p not in self.workers or p.popen.poll() is None]

    def kill(self, worker: Process, sig: signal.Signals = signal.SIGKILL) -> float:
        """Signal the worker (default kill -9); the time it was sent."""
        at = time.time()
        os.kill(worker.popen.pid, sig)
        return at

    def wait_exit(self, worker: Process, timeout_s: float) -> int:
        return worker.popen.wait(timeout_s)

    def assignment(self, worker: Process) -> set[str]:
        """The request partitions this worker's log says it holds now."""
        try:
            lines = worker.log.read_text(errors="replace").splitlines()
        except OSError:
            return set()
        for line in reversed(lines):
            match = _ASSIGNED.search(line)
            if match:
                listed = match.group(1)
                return set() if listed == "no partitions" else {p.strip() for p in listed.split(",")}
        return set()

    def wait_balanced(self, partitions: int, timeout_s: float = 300.0) -> None:
        """Until every live worker holds some partitions and together they hold each exactly once."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            alive = self.alive
            held = [self.assignment(w) for w in alive]
            flat = [p for h in held for p in h]
            if alive and all(held) and len(flat) == partitions and len(set(flat)) == partitions:
                return
            time.sleep(0.5)
        raise TimeoutError(f"partitions not spread over {len(self.alive)} worker(s): "
                           f"{[sorted(self.assignment(w)) for w in self.alive]}\n{self.stack.logs()}")

    def log_text(self) -> str:
        return "\n".join(w.log.read_text(errors="replace") for w in self.workers if w.log.exists())


# --- Kafka probes ----------------------------------------------------------------------------------------------------------


async def group_lag(bootstrap: str, group_id: str, topic: str) -> tuple[dict[int, int], dict[int, int]]:
    """(committed offset, end offset) per partition of ``topic`` for ``group_id`` (-1: nothing committed)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await admin.start()
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        if not partitions:
            await consumer._client.force_metadata_update()  # noqa: SLF001
            partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        ends = await consumer.end_offsets(tps)
        committed_raw = await admin.list_consumer_group_offsets(group_id)
        committed = {tp.partition: -1 for tp in tps}
        for tp, meta in committed_raw.items():
            if tp.topic == topic:
                committed[tp.partition] = meta.offset
        return committed, {tp.partition: ends[tp] for tp in tps}
    finally:
        await consumer.stop()
        await admin.close()


async def leading_broker(bootstrap: str, topic: str) -> int:
    """The node that leads most of ``topic``'s partitions (the broker whose death hurts most)."""
    admin = clients.make_admin(bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
        return collections.Counter(p["leader"] for p in described["partitions"]).most_common(1)[0][0]
    finally:
        await admin.close()


async def reply_records(bootstrap: str, topic: str, timeout_s: float = 30.0) -> list[tuple[float, dict[str, Any]]]:
    """Every record of a reply topic as (broker timestamp in s, decoded JSON); records without a value skipped."""
    records = await clients.read_partition(bootstrap, topic, timeout_s=timeout_s)
    return [(record.timestamp / 1000, json.loads(record.value)) for record in records if record.value]


def regenerated(records: list[tuple[float, dict[str, Any]]], since: float = 0.0) -> dict[str, float]:
    """request_id -> time of its regeneration's first chunk, for requests whose stream restarted at offset 0 after
    ``since`` (their worker died and another one generated them again)."""
    first_seen: dict[str, float] = {}
    again: dict[str, float] = {}
    for at, event in records:
        if event.get("type") != "chunk" or event.get("text_offset") != 0:
            continue
        rid = event["request_id"]
        if rid in first_seen and at >= since and rid not in again:
            again[rid] = at
        first_seen.setdefault(rid, at)
    return again
