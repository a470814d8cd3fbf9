"""Helpers for the edge's security, limits, OpenAI, browser and fuzz tests.

* :func:`redis_server`: a real ``redis-server`` on a free port (:mod:`streams.testing.redis`).
* :func:`shared_worker`: one real ``specstream worker`` subprocess (streams/testing/stack.py)
  for every edge test module of the session, on a topic prefix of its own; the
  first module that asks starts it, the end of the session stops it. Loading the
  model takes a while on two cores, so the modules share it. Edges run in the
  test process (``streams.edge.server.serve_in_thread``) on that prefix.
* :func:`edge_options`: EdgeOptions for such an edge (auth on, a keys file of the
  test's own, the worker's context length), with more ``edge`` settings as keywords.
* :func:`request_topic_messages` / :func:`topic_records`: every message on a prefix's request topic (or any
  topic), to check that nothing malformed was published, or what a consumer published.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from engine.config import EngineConfig
from streams.config import (
    EdgeAuthSettings,
    EdgeSettings,
    FilesSettings,
    KafkaSettings,
    Settings,
    WorkerSettings,
)
from streams.edge.settings import EdgeOptions
from streams.testing.redis import redis_server  # noqa: F401 - the tests import it from here
from streams.testing.stack import Stack, running_stack

HEARTBEAT_S = 1.0
MAX_MODEL_LEN = 512
# The default weights (int4 for the default model), as users are served; a module that compares answers with
# transformers starts a worker of its own on fp32 (worker_stack).
WORKER_ENV = {
    "SPECSTREAM_WORKER__HEARTBEAT_S": str(HEARTBEAT_S),
    "SPECSTREAM_ENGINE__MAX_MODEL_LEN": str(MAX_MODEL_LEN),
    "SPECSTREAM_ENGINE__KV_CACHE_BYTES": "96MiB",
}


async def refused_429(coro: Any) -> Any:
    """The EdgeError a limiter's acquire raises: 429 rate_limit_exceeded with a Retry-After."""
    from streams.wire import errors

    with pytest.raises(errors.EdgeError) as caught:
        await coro
    assert caught.value.status == 429 and caught.value.code == "rate_limit_exceeded"
    assert int(caught.value.headers["Retry-After"]) >= 1
    return caught.value


_shared: dict[str, Any] = {}


@contextlib.contextmanager
def worker_stack(bootstrap_servers: str, **env: str) -> Iterator[Stack]:
    """A `specstream worker` subprocess (no edge) on a topic prefix of its own, with WORKER_ENV and `env`."""
    prefix = f"t-edge-{uuid.uuid4().hex[:8]}"
    with running_stack(bootstrap_servers, edge=False,
                       env={**WORKER_ENV, **env, "SPECSTREAM_KAFKA__TOPIC_PREFIX": prefix}) as stack:
        stack.topic_prefix = prefix
        yield stack


def shared_worker(bootstrap_servers: str) -> Iterator[Stack]:
    """Body of a session-scoped fixture: the session's one worker (see the module docstring)."""
    owner = "stack" not in _shared
    if owner:
        manager = worker_stack(bootstrap_servers)
        stack = manager.__enter__()
        _shared.update(stack=stack, manager=manager)
    try:
        yield _shared["stack"]
    finally:
        if owner:
            manager = _shared.pop("manager")
            _shared.pop("stack")
            manager.__exit__(None, None, None)


def edge_options(bootstrap_servers: str, prefix: str, edge_id: str, keys_file: Path | None,
                 **edge: Any) -> EdgeOptions:
    auth = EdgeAuthSettings(enabled=True, keys_file=str(keys_file) if keys_file else None)
    # Uploaded files next to the test's keys file (a temporary folder), never in the user's state folder.
    files = FilesSettings(dir=str(keys_file.parent / "files")) if keys_file else FilesSettings()
    return EdgeOptions(Settings(
        files=files,
        kafka=KafkaSettings(bootstrap_servers=bootstrap_servers, topic_prefix=prefix),
        # A test's edge stops with its test: 5 s for what is still in flight, not a pod's 20 s.
        edge=EdgeSettings(**{"edge_id": edge_id, "request_timeout_s": 120.0, "auth": auth, "shutdown_grace_s": 5.0,
                             **edge}),
        engine=EngineConfig(max_model_len=MAX_MODEL_LEN),
        worker=WorkerSettings(heartbeat_s=HEARTBEAT_S),
    ))


def wait_ready(base_url: str, stack: Stack | None = None, timeout_s: float = 300.0) -> None:
    """Until the edge's /readyz is 200 (the worker announced itself)."""
    deadline = time.monotonic() + timeout_s
    last = ""
    while time.monotonic() < deadline:
        if stack is not None:
            stack.check_alive()
        with contextlib.suppress(httpx.HTTPError):
            response = httpx.get(base_url + "/readyz", timeout=5)
            if response.status_code == 200:
                return
            last = response.text[:200]
        time.sleep(0.3)
    raise AssertionError(f"{base_url} not ready after {timeout_s:.0f}s: {last}\n{stack.logs() if stack else ''}")


@contextlib.contextmanager
def keyed_edge(bootstrap_servers: str, worker: Stack, keys_dir: Path, tenant: str, tag: str) -> Iterator[tuple[str, str]]:
    """An edge in this process before the shared worker, with one tenant's key: (its base URL, the key), once ready."""
    from streams.edge.keys import create_key
    from streams.edge.server import serve_in_thread

    keys_file = keys_dir / "keys.json"
    key, _ = create_key(keys_file, tenant)
    options = edge_options(bootstrap_servers, worker.topic_prefix, f"{tag}-{uuid.uuid4().hex[:6]}", keys_file)
    with serve_in_thread(options) as served:
        wait_ready(served.base_url, worker)
        yield served.base_url, key


async def request_topic_messages(bootstrap_servers: str, prefix: str) -> list[bytes]:
    """Every message on ``<prefix>.requests`` (all partitions, from the start)."""
    from schemas.topics import TopicCatalog

    records = await topic_records(bootstrap_servers, TopicCatalog(prefix=prefix).requests.name)
    return [r.value for r in records]


async def topic_records(bootstrap_servers: str, topic: str) -> list[Any]:
    """Every record of ``topic`` (all partitions, from the start up to the end it had when called)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_servers, enable_auto_commit=False,
                                auto_offset_reset="earliest")
    await consumer.start()
    try:
        partitions = consumer.partitions_for_topic(topic) or set()
        if not partitions:
            await consumer._client.force_metadata_update()  # noqa: SLF001 - a topic created a moment ago
            partitions = consumer.partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        if not tps:
            return []
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        out: list[Any] = []
        await consumer.seek_to_beginning(*tps)
        deadline = asyncio.get_running_loop().time() + 30
        while True:
            positions = [await consumer.position(tp) for tp in tps]
            if all(pos >= ends[tp] for pos, tp in zip(positions, tps)):
                return out
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"reading {topic} did not reach its end")
            batch = await consumer.getmany(timeout_ms=1000)
            for records in batch.values():
                out.extend(records)
    finally:
        await consumer.stop()


def forced_server_call(client: Any, model: str, messages: list[dict[str, Any]], tool: dict[str, Any],
                       *, max_tokens: int) -> tuple[Any, list[dict[str, Any]]]:
    """A non-streamed request whose `tool_choice` names `tool` (a tiny model calls it then, once): its message and
    the server's results, checked to answer exactly the message's one call of that tool."""
    name = tool["function"]["name"]
    response = client.chat.completions.create(model=model, messages=messages, tools=[tool], parallel_tool_calls=False,
                                              tool_choice={"type": "function", "function": {"name": name}},
                                              max_tokens=max_tokens)
    message = response.choices[0].message
    assert message.tool_calls and message.tool_calls[0].function.name == name
    results = (response.model_extra or {})["specstream"]["tool_results"]
    assert [r["tool_call_id"] for r in results] == [message.tool_calls[0].id]
    assert message.content and response.choices[0].finish_reason in ("stop", "length")
    return message, results
