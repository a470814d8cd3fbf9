"""Suffix decoding fed by the bus, on the real broker: a worker drafting by suffix decoding reads the completions
topic from its start when it starts (warm), skips the records it cannot read, learns one written after its start
as it arrives, keeps each tenant's answers for that tenant (never those of a tenant with log_prompts false), and a
request repeating an answer another worker gave its tenant is drafted from it."""
from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from engine.config import EngineConfig
from schemas.events import Completion, GenerateRequest, ReplyRoute, SamplingParams
from streams.kafka import clients
from tests.completion_records import publish, record
from tests.conftest import ReplyInbox, worker_test_settings
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401
from tests.tiny_targets import tiny_chat_target

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.kafka, pytest.mark.model,
              pytest.mark.timeout(300)]

WARM_RECORDS = 2_000
PROMPT = "The weather report for the coast:"


def _record(rid: str, model: str, text: str, tenant: str, *, log_prompt: bool = True) -> Any:
    return record(rid, "q", text, model=model, tenant=tenant, log_prompt=log_prompt, worker="another-worker")


async def _send(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = clients.make_producer(bootstrap, client_id="pytest-poison")
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()


def _plain_answer(target: Path) -> tuple[str, str]:
    """What the tiny target answers PROMPT greedily (the answer "another worker" recorded), and its name."""
    from engine.llm_engine import LLMEngine
    from engine.request import EngineRequest, SamplingOptions

    engine = LLMEngine.from_config(EngineConfig(model=str(target), max_model_len=256, kv_cache_bytes="8MiB",
                                                speculation={"enabled": False}))
    prompt = engine.tokenizer(PROMPT)["input_ids"]
    out = engine.generate([EngineRequest("plain", prompt, SamplingOptions(max_tokens=32, ignore_eos=True))])
    return engine.tokenizer.decode(out["plain"].token_ids), engine.model_name


async def test_a_worker_starts_warm_from_the_completions_topic_and_drafts_per_tenant(
    kafka_bootstrap: str, tmp_path: Path, caplog: pytest.LogCaptureFixture  # noqa: F811
) -> None:
    from streams.worker import EngineWorker

    target = tiny_chat_target(tmp_path / "target", seed=0, initializer_range=0.2)
    answer, model = _plain_answer(target)
    prefix = f"test-suffix-{uuid.uuid4().hex[:8]}"
    filler = [_record(f"f{i}", model, f"Order {i}: status shipped, carrier {i % 7}.", "acme")
              for i in range(WARM_RECORDS)]
    records = [*filler, _record("answer", model, answer, "acme"),
               _record("private", model, "a secret answer", "secretive", log_prompt=False),
               _record("elsewhere", "another-model", "an answer of another model", "acme")]
    await publish(kafka_bootstrap, f"{prefix}.completions", records)
    # Poison among the backlog: skipped with a warning, and the backlog still ends where it ends.
    poison = [b"{not json", record("v2", "q", "x", model=model, tenant="acme", worker="w").model_dump_json()
              .replace('"schema_version":1', '"schema_version":2').encode()]
    await _send(kafka_bootstrap, f"{prefix}.completions", poison)

    base = worker_test_settings(kafka_bootstrap, prefix, worker_id=f"pytest-{uuid.uuid4().hex[:6]}")
    engine = EngineConfig(model=str(target), max_model_len=256, kv_cache_bytes="8MiB",
                          speculation={"method": "suffix", "max_draft_tokens": 4, "adaptive": False})
    settings = base.model_copy(update={"engine": engine})
    worker = EngineWorker(settings)
    started = time.perf_counter()
    await worker.start()
    reply_topic = settings.catalog.replies(f"t-{uuid.uuid4().hex[:8]}")
    inbox = ReplyInbox(kafka_bootstrap, reply_topic.name)
    try:
        feed = worker.suffix_feed
        assert feed is not None
        while feed.read < len(records) and time.perf_counter() - started < 120:
            await asyncio.sleep(0.2)
        await feed.drained()
        warm_s = time.perf_counter() - started
        print(f"warm start: {feed.read} completion records read, {feed.learned} learned in {warm_s:.1f}s")
        assert feed.learned == WARM_RECORDS + 1  # the private record and another model's were left out
        skipped = [r.getMessage() for r in caplog.records if "suffix feed: skipping" in r.getMessage()]
        assert len(skipped) == 2 and "malformed JSON" in skipped[0] and "schema_version 2" in skipped[1], skipped
        outputs = worker.engine.proposer.outputs  # type: ignore[union-attr]
        assert outputs.num_sequences_of("tenant:acme") == WARM_RECORDS + 1
        assert outputs.num_sequences_of("tenant:secretive") == 0
        # A record written after the start is learned as it arrives.
        live = _record("live", model, answer, "initech")
        await _send(kafka_bootstrap, f"{prefix}.completions", [clients.encode(live)])
        while outputs.num_sequences_of("tenant:initech") == 0 and time.perf_counter() - started < 120:
            await asyncio.sleep(0.1)
        assert feed.read == len(records) + 1 and feed.learned == WARM_RECORDS + 2

        await clients.ensure_topics(kafka_bootstrap, [reply_topic])
        await inbox.start()
        producer = clients.make_producer(kafka_bootstrap, client_id="pytest-suffix-requests")
        await producer.start()
        try:
            accepted = {}
            for tenant in ("acme", "globex"):
                request = GenerateRequest(request_id=f"{tenant}-{uuid.uuid4().hex[:6]}", prompt=PROMPT,
                                          model=model, tenant=tenant,
                                          sampling=SamplingParams(max_tokens=32, ignore_eos=True),
                                          reply_to=ReplyRoute(topic=inbox.topic))
                await producer.send_and_wait(settings.catalog.requests.name, clients.encode(request),
                                             key=request.request_id.encode())
                final = (await inbox.events_for(request.request_id))[-1]
                assert isinstance(final, Completion) and final.text == answer
                accepted[tenant] = final.spec.accepted
        finally:
            await producer.stop()
        # acme's answer was recorded by another worker: most of the repeat comes from drafts; globex has none.
        assert accepted["acme"] >= 16 > accepted["globex"], accepted
    finally:
        with contextlib.suppress(Exception):
            await inbox.stop()
        await worker.stop()
        with contextlib.suppress(Exception):
            await clients.delete_topics(kafka_bootstrap, [reply_topic.name,
                                                          *(t.name for t in settings.catalog.shared_topics())])
