"""Bad input never crashes the worker: each kind gets its precise ErrorEvent (when a reply route can be read)
and/or a dead letter, and the next request is served."""
from __future__ import annotations

import base64
import json

import pytest

from tests.conftest import TEST_MAX_MESSAGE_BYTES, TEST_MAX_MODEL_LEN, ReplyInbox, WorkerHarness

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.kafka, pytest.mark.model]


async def test_malformed_json_is_dead_lettered(worker_harness: WorkerHarness, reply_inbox: ReplyInbox):
    raw = b'{"request_id": "broken", "reply_to": {"topic": '
    sent = await worker_harness.publish_raw(raw, key=b"broken")

    letter = await worker_harness.dead_letter_for(sent)
    assert letter.reason.startswith("invalid_request: malformed JSON")
    assert base64.b64decode(letter.original_b64) == raw
    assert base64.b64decode(letter.original_key_b64 or "") == b"broken"
    assert letter.consumer == worker_harness.worker.worker_id
    await worker_harness.serves_a_request(reply_inbox)


async def test_unknown_field_is_named(worker_harness: WorkerHarness, reply_inbox: ReplyInbox):
    body = worker_harness.request(reply_inbox.topic, tempreature=0.7)
    sent = await worker_harness.publish(body)

    error = await reply_inbox.error_for(body["request_id"])
    assert error.code == "invalid_request"
    assert "tempreature" in error.message
    letter = await worker_harness.dead_letter_for(sent)
    assert "tempreature" in letter.reason
    assert json.loads(base64.b64decode(letter.original_b64)) == body
    await worker_harness.serves_a_request(reply_inbox)


async def test_wrong_type_names_the_nested_field(worker_harness: WorkerHarness, reply_inbox: ReplyInbox):
    body = worker_harness.request(reply_inbox.topic, sampling={"max_tokens": "many"})
    sent = await worker_harness.publish(body)

    error = await reply_inbox.error_for(body["request_id"])
    assert error.code == "invalid_request"
    assert "sampling.max_tokens" in error.message
    await worker_harness.dead_letter_for(sent)
    await worker_harness.serves_a_request(reply_inbox)


async def test_unknown_model_names_the_served_ones(worker_harness: WorkerHarness, reply_inbox: ReplyInbox):
    body = worker_harness.request(reply_inbox.topic, model="gpt-9")
    await worker_harness.publish(body)

    error = await reply_inbox.error_for(body["request_id"])
    assert error.code == "unknown_model"
    assert "gpt-9" in error.message and worker_harness.model in error.message
    await worker_harness.serves_a_request(reply_inbox)


async def test_prompt_over_the_context_length_is_rejected(worker_harness: WorkerHarness, reply_inbox: ReplyInbox):
    long_prompt = "kafka " * (TEST_MAX_MODEL_LEN + 50)
    body = worker_harness.request(reply_inbox.topic, messages=None, prompt=long_prompt)
    assert len(json.dumps(body)) < TEST_MAX_MESSAGE_BYTES  # rejected for its tokens, not its bytes
    await worker_harness.publish(body)

    error = await reply_inbox.error_for(body["request_id"])
    assert error.code == "context_length_exceeded"
    assert error.message
    await worker_harness.serves_a_request(reply_inbox)


async def test_unknown_schema_version_is_refused(worker_harness: WorkerHarness, reply_inbox: ReplyInbox):
    body = worker_harness.request(reply_inbox.topic, schema_version=2, a_field_from_the_future=True)
    sent = await worker_harness.publish(body)

    error = await reply_inbox.error_for(body["request_id"])
    assert error.code == "unsupported_schema_version"
    assert "2" in error.message
    letter = await worker_harness.dead_letter_for(sent)
    assert letter.reason.startswith("unsupported_schema_version")
    await worker_harness.serves_a_request(reply_inbox)


async def test_oversized_message_is_refused(worker_harness: WorkerHarness, reply_inbox: ReplyInbox):
    body = worker_harness.request(reply_inbox.topic, messages=None, prompt="x" * (TEST_MAX_MESSAGE_BYTES + 10))
    raw = json.dumps(body).encode()
    sent = await worker_harness.publish_raw(raw, key=body["request_id"].encode())

    error = await reply_inbox.error_for(body["request_id"])
    assert error.code == "message_too_large"
    assert str(TEST_MAX_MESSAGE_BYTES) in error.message
    letter = await worker_harness.dead_letter_for(sent)
    assert letter.reason.startswith("message_too_large")
    assert base64.b64decode(letter.original_b64) == raw
    await worker_harness.serves_a_request(reply_inbox)


async def test_json_that_is_not_an_object_is_dead_lettered(worker_harness: WorkerHarness, reply_inbox: ReplyInbox):
    sent = await worker_harness.publish_raw(b'["a", "list"]')
    letter = await worker_harness.dead_letter_for(sent)
    assert "expected a JSON object" in letter.reason
    await worker_harness.serves_a_request(reply_inbox)
