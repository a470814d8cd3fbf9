"""Bad input and expired requests never stall a worker: poison messages go to the dead-letter topic (and can be
listed and re-driven with `specstream dlq`), expired requests are not started, late ones stop mid-generation."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from schemas.events import Completion, DeadLetter, ErrorEvent, TokenChunk
from streams.kafka import clients
from tests.conftest import TEST_MAX_MESSAGE_BYTES, ReplyInbox, WorkerHarness

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.kafka, pytest.mark.model]

REPO = Path(__file__).resolve().parents[2]


async def _cli(harness: WorkerHarness, *args: str) -> tuple[int, str, str]:
    """`specstream <args>` against the harness's deployment, without blocking the loop the worker runs on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECSTREAM_")}
    env.update({"SPECSTREAM_CONFIG": os.devnull, "SPECSTREAM_KAFKA__MANAGE_LOCAL": "false",
                "SPECSTREAM_KAFKA__BOOTSTRAP_SERVERS": harness.bootstrap_servers,
                "SPECSTREAM_KAFKA__TOPIC_PREFIX": harness.settings.kafka.topic_prefix, "PYTHONPATH": str(REPO)})
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "streams.cli", *args, cwd=REPO, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 120)
    return process.returncode or 0, out.decode(), err.decode()


async def test_poison_messages_are_dead_lettered_and_the_worker_keeps_serving(
        worker_harness: WorkerHarness, reply_inbox: ReplyInbox) -> None:
    h = worker_harness
    valid = [h.request(reply_inbox.topic, sampling={"max_tokens": 4}) for _ in range(3)]
    poison: dict[str, bytes] = {
        "malformed JSON": b'{"request_id": "p1", "model": ',
        "not UTF-8": b'{"request_id": "p2", "prompt": "\xff\xfe"}',
        "unsupported_schema_version": json.dumps({**h.request(reply_inbox.topic), "schema_version": 99}).encode(),
        "message_too_large": json.dumps({**h.request(reply_inbox.topic),
                                         "prompt": "x" * (TEST_MAX_MESSAGE_BYTES + 10), "messages": None}).encode(),
        "unknown field": json.dumps({**h.request(reply_inbox.topic), "tempreature": 0.5}).encode(),
    }
    # Interleaved: each valid request sits behind poison on the bus.
    sent = {}
    await h.publish(valid[0])
    for i, (kind, raw) in enumerate(poison.items()):
        sent[kind] = await h.publish_raw(raw, key=f"poison-{i}".encode())
        if i == 2:
            await h.publish(valid[1])
    await h.publish(valid[2])

    for kind, meta in sent.items():
        letter = await h.dead_letter_for(meta)
        assert base64.b64decode(letter.original_b64) == poison[kind], kind
        assert (letter.source_topic, letter.source_offset) == (meta.topic, meta.offset)
        assert letter.consumer == h.worker.worker_id
        words = {"malformed JSON": "malformed JSON", "not UTF-8": "not UTF-8",
                 "unknown field": "unknown field 'tempreature'"}
        assert words.get(kind, kind) in letter.reason, (kind, letter.reason)
    for body in valid:  # the consumer went on past every poison message
        events = await reply_inbox.events_for(body["request_id"])
        assert isinstance(events[-1], Completion), events

    # specstream dlq list: the letters, with reasons and source offsets.
    code, out, err = await _cli(h, "dlq", "list", "--limit", "50", "--json")
    assert code == 0, err
    listed = [json.loads(line) for line in out.splitlines()]
    by_source = {(item["source_topic"], item["source_partition"], item["source_offset"]): item for item in listed}
    for kind, meta in sent.items():
        item = by_source[(meta.topic, meta.partition, meta.offset)]
        assert item["original_bytes"] == len(poison[kind]) and item["reason"]

    # specstream dlq redrive: a letter rejected by a (since fixed) worker bug, then a still-bad one.
    fixed = h.request(reply_inbox.topic, sampling={"max_tokens": 3})
    producer_letter = DeadLetter(
        reason="internal_error: the worker failed to handle this message", source_topic=h.request_topic,
        source_partition=0, source_offset=0, original_b64=base64.b64encode(json.dumps(fixed).encode()).decode(),
        original_key_b64=base64.b64encode(fixed["request_id"].encode()).decode(), consumer="old-worker", at=time.time())
    meta = await h.producer.send_and_wait(h.settings.catalog.dead_letters.name, clients.encode(producer_letter))
    code, out, err = await _cli(h, "dlq", "redrive", "--offset", str(meta.offset))
    assert code == 0, err
    assert out.strip().startswith(f"{meta.offset} -> {h.request_topic}/"), out
    events = await reply_inbox.events_for(fixed["request_id"])
    assert isinstance(events[-1], Completion), events

    refused = sent["unsupported_schema_version"]
    bad = by_source[(refused.topic, refused.partition, refused.offset)]
    code, out, err = await _cli(h, "dlq", "redrive", "--offset", str(bad["offset"]))
    assert code == 0, err
    partition, offset = out.strip().split(" -> ")[1].split("/")[1].split("@")
    again = await h.dead_letter_for(SimpleNamespace(topic=h.request_topic, partition=int(partition),  # type: ignore[arg-type]
                                                    offset=int(offset)))
    assert "unsupported_schema_version" in again.reason

    code, out, err = await _cli(h, "dlq", "redrive", "--offset", "999999999")
    assert code == 1 and "no dead letter" in err


async def test_expired_request_is_not_started_and_its_client_gets_deadline_exceeded(
        worker_harness: WorkerHarness, reply_inbox: ReplyInbox) -> None:
    body = worker_harness.request(reply_inbox.topic, deadline=time.time() - 1.0)
    await worker_harness.publish(body)
    error = await reply_inbox.error_for(body["request_id"])
    assert isinstance(error, ErrorEvent) and error.code == "deadline_exceeded", error


async def test_request_passing_its_deadline_mid_generation_stops_and_frees_its_cache(
        worker_harness: WorkerHarness, reply_inbox: ReplyInbox) -> None:
    # ignore_eos: a model answering in under a second on a fast CPU would finish before its deadline
    body = worker_harness.request(reply_inbox.topic, sampling={"max_tokens": 400, "ignore_eos": True},
                                  deadline=time.time() + 1.0,
                                  request_id=f"late-{uuid.uuid4().hex[:8]}")
    await worker_harness.publish(body)
    events = await reply_inbox.events_for(body["request_id"])
    *chunks, final = events
    assert isinstance(final, Completion) and final.finish_reason == "deadline", final
    assert chunks and all(isinstance(c, TokenChunk) for c in chunks)  # it had started
    assert final.usage.completion_tokens < 400
    engine = worker_harness.worker.engine
    assert engine.cache_usage().used_tokens == 0
