"""A real engine worker on the real default model, driven through Kafka: streaming, text integrity, stop strings,
cancellation, commits and announcements."""
from __future__ import annotations

import asyncio
import os
import time

import pytest
from aiokafka import TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from schemas.events import CancelRequest, Completion, ServiceAnnouncement
from streams.kafka import clients
from tests.conftest import ReplyInbox, WorkerHarness, chunks_and_completion

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.kafka, pytest.mark.model]


async def _run(harness: WorkerHarness, inbox: ReplyInbox, **fields: object) -> tuple[list, Completion]:
    body = harness.request(inbox.topic, **fields)
    await harness.publish(body)
    return chunks_and_completion(await inbox.events_for(body["request_id"]))


async def test_chunks_stream_in_order_before_the_completion(worker_harness: WorkerHarness, reply_inbox: ReplyInbox):
    chunks, completion = await _run(worker_harness, reply_inbox, sampling={"max_tokens": 12})

    assert len(chunks) >= 2
    assert "".join(c.text for c in chunks) == completion.text
    assert completion.text.strip()
    assert completion.finish_reason in ("length", "stop")
    assert all(c.finish_reason is None for c in chunks[:-1]) and chunks[-1].finish_reason == completion.finish_reason
    assert completion.usage.completion_tokens == sum(len(c.token_ids) for c in chunks) <= 12
    assert completion.usage.prompt_tokens > 10  # the chat template wraps the question
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    assert 0 < completion.timings.ttft_s <= completion.timings.total_s
    assert completion.model == worker_harness.model


async def test_raw_prompt_is_served(worker_harness: WorkerHarness, reply_inbox: ReplyInbox):
    prompt = "The capital of France is"
    chunks, completion = await _run(worker_harness, reply_inbox, messages=None, prompt=prompt,
                                    sampling={"max_tokens": 4})
    # Tokenized as is: no chat template around it.
    tokenizer = worker_harness.worker.engine.tokenizer
    assert completion.usage.prompt_tokens == len(tokenizer(prompt)["input_ids"])
    assert completion.text


async def test_multibyte_characters_arrive_intact(worker_harness: WorkerHarness, reply_inbox: ReplyInbox):
    # Greedy SmolLM2 answers this with food emoji, each several byte-level tokens long: a chunk
    # boundary inside one of them would surface as U+FFFD if text were cut at token boundaries.
    chunks, completion = await _run(
        worker_harness, reply_inbox,
        messages=[{"role": "user", "content": "Give me three emojis about food."}],
        sampling={"max_tokens": 12, "speculation": False},
    )
    wide = [ch for ch in completion.text if ord(ch) > 0xFFFF]
    assert wide, f"expected emoji in {completion.text!r}"
    assert "\ufffd" not in completion.text
    assert all("\ufffd" not in c.text for c in chunks)
    assert "".join(c.text for c in chunks) == completion.text
    # More tokens than characters: some character was split across tokens (and steps).
    assert completion.usage.completion_tokens > len(completion.text)


async def test_stop_string_spanning_two_chunks_ends_generation_unemitted(
    worker_harness: WorkerHarness, reply_inbox: ReplyInbox
):
    question = [{"role": "user", "content": "Describe a sunny day at the beach in two sentences."}]
    # Speculation off: one token per step, so one chunk per token and many boundaries to choose from.
    sampling = {"max_tokens": 24, "speculation": False}
    chunks, first = await _run(worker_harness, reply_inbox, messages=question, sampling=sampling)
    full = first.text

    stop, cut = None, None
    offset = 0
    for left, right in zip(chunks, chunks[1:]):
        offset += len(left.text)
        if len(left.text) >= 2 and len(right.text) >= 2 and offset >= 6:
            candidate = left.text[-2:] + right.text[:2]
            if full.find(candidate) == offset - 2:  # first occurrence is this straddle
                stop, cut = candidate, offset - 2
                break
    assert stop is not None, f"no chunk boundary usable for a stop string in {[c.text for c in chunks]}"

    chunks2, second = await _run(worker_harness, reply_inbox, messages=question,
                                 sampling={**sampling, "stop": [stop]})
    assert second.finish_reason == "stop"
    assert second.text == full[:cut]
    assert stop not in second.text
    assert all(stop not in c.text for c in chunks2)
    assert "".join(c.text for c in chunks2) == second.text


async def test_cancellation_aborts_a_running_request(worker_harness: WorkerHarness, reply_inbox: ReplyInbox):
    body = worker_harness.request(reply_inbox.topic, sampling={"max_tokens": 300, "speculation": False})
    await worker_harness.publish(body)
    # Wait until it runs (its first chunk arrived), then cancel as an edge would.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 60
    while not reply_inbox._events[body["request_id"]]:
        assert loop.time() < deadline, "request never started"
        await reply_inbox._pump(0.2)
    cancel = CancelRequest(request_id=body["request_id"], reason="test")
    await worker_harness.producer.send_and_wait(worker_harness.settings.catalog.cancellations.name,
                                                clients.encode(cancel), key=clients.request_key(cancel.request_id))

    chunks, completion = chunks_and_completion(await reply_inbox.events_for(body["request_id"], timeout_s=60))
    assert completion.finish_reason == "abort"
    assert chunks[-1].finish_reason == "abort"
    assert completion.usage.completion_tokens < 300


async def test_expired_deadline_is_not_started(worker_harness: WorkerHarness, reply_inbox: ReplyInbox):
    body = worker_harness.request(reply_inbox.topic, deadline=time.time() - 1)
    await worker_harness.publish(body)
    error = await reply_inbox.error_for(body["request_id"])
    assert error.code == "deadline_exceeded"


async def test_offsets_are_committed_once_answered(worker_harness: WorkerHarness, reply_inbox: ReplyInbox):
    body = worker_harness.request(reply_inbox.topic, sampling={"max_tokens": 3})
    sent = await worker_harness.publish(body)
    await reply_inbox.events_for(body["request_id"])
    admin = AIOKafkaAdminClient(bootstrap_servers=worker_harness.bootstrap_servers)
    await admin.start()
    try:
        tp = TopicPartition(sent.topic, sent.partition)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while True:
            committed = await admin.list_consumer_group_offsets(worker_harness.worker.group_id, partitions=[tp])
            position = committed[tp].offset if tp in committed else -1
            if position >= sent.offset + 1:
                break
            assert loop.time() < deadline, f"offset {sent.offset} not committed (committed position {position})"
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def test_worker_announces_itself_ready_on_the_services_topic(worker_harness: WorkerHarness):
    worker = worker_harness.worker
    ready = await worker_harness.first_event(
        worker_harness.settings.catalog.services.name, ServiceAnnouncement,
        lambda a: (a.kind, a.service_id, a.state) == ("engine-worker", worker.worker_id, "ready"), timeout_s=10,
    )
    assert ready is not None, "no ready announcement"
    assert worker_harness.model in ready.models
    assert ready.pid == os.getpid() and ready.host and ready.started_at <= ready.at


async def test_concurrent_requests_share_the_engine(worker_harness: WorkerHarness, reply_inbox: ReplyInbox):
    bodies = [worker_harness.request(reply_inbox.topic, sampling={"max_tokens": 6}) for _ in range(4)]
    for body in bodies:
        await worker_harness.publish(body)
    for body in bodies:
        chunks, completion = chunks_and_completion(await reply_inbox.events_for(body["request_id"]))
        assert completion.text and "".join(c.text for c in chunks) == completion.text
