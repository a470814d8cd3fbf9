"""The worker's suffix-decoding feed (streams.worker.suffix_feed) without a broker: which completion records reach
the engine's index of past outputs, in which scope, and how requests are scoped to match (streams.worker.intake).
The bus itself: tests/integration/test_worker_suffix_bus.py."""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from schemas.events import GenerateRequest, ReplyRoute, SamplingParams
from streams.config import Settings
from streams.service.intake import Rejection
from streams.worker.intake import draft_scope, to_engine_request
from streams.worker.suffix_feed import CompletionDigest, SuffixFeed, follows_completions, read_digest
from tests.completion_records import record

MODEL = "m"
LIMIT = 1024 * 1024


def _request(rid: str, tenant: str = "acme", log_prompt: bool = True) -> GenerateRequest:
    return GenerateRequest(request_id=rid, prompt="hi", model=MODEL, tenant=tenant, log_prompt=log_prompt,
                           sampling=SamplingParams(max_tokens=8), reply_to=ReplyRoute(topic="replies"))


def _record(rid: str, text: str, *, worker: str = "other", tenant: str = "acme", log_prompt: bool = True,
            model: str = MODEL) -> CompletionDigest:
    return _digest(record(rid, "q", text, model=model, tenant=tenant, log_prompt=log_prompt, worker=worker))


def _digest(full: Any) -> CompletionDigest:
    """What the feed reads of the record a worker writes (streams.worker.completions_log)."""
    digest = read_digest(full.model_dump_json().encode(), LIMIT)
    assert isinstance(digest, CompletionDigest)
    return digest


class _Tokenizer:
    """A character per token; called on one text (a prompt) or a batch, as a Hugging Face tokenizer is."""

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict[str, Any]:
        if isinstance(text, list):
            return {"input_ids": [[ord(c) for c in t] for t in text]}
        return {"input_ids": [ord(c) for c in text]}


class _Engine:
    """Records what it was asked to learn, as LLMEngine.learn_outputs takes it."""

    def __init__(self) -> None:
        self.learned: list[tuple[str, list[int]]] = []

    def learn_outputs(self, outputs: list[tuple[str, list[int]]]) -> int:
        self.learned += outputs
        return len(outputs)


async def _fed(records: list[Any], shared: bool = False) -> tuple[SuffixFeed, _Engine]:
    engine = _Engine()
    feed = SuffixFeed("me", shared=shared, served=lambda: [MODEL], started_at=1.0)  # records here: recorded later

    async def call(fn: Any) -> Any:
        return fn(engine)

    feed.take(records[0])  # read before the engine is loaded: handed over once it is
    feed.backlog_read()
    feed.attach(call, _Tokenizer())
    for rec in records[1:]:
        feed.take(rec)
    await feed.drained()
    return feed, engine


async def test_other_workers_answers_reach_the_engine_in_their_tenants_scope() -> None:
    feed, engine = await _fed([_record("a", "ab", tenant="acme"), _record("b", "cd", tenant="globex")])
    assert engine.learned == [("tenant:acme", [97, 98]), ("tenant:globex", [99, 100])]
    assert feed.read == feed.learned == 2


async def test_this_workers_records_of_an_earlier_run_are_read_like_any_others() -> None:
    earlier = _record("before-restart", "ab", worker="me").model_copy(update={"recorded_at": 0.0})
    _, engine = await _fed([earlier, _record("this-run", "cd", worker="me")])
    assert engine.learned == [("tenant:acme", [97, 98])]


async def test_shared_outputs_go_to_the_shared_scope() -> None:
    _, engine = await _fed([_record("a", "ab", tenant="acme")], shared=True)
    assert engine.learned == [("", [97, 98])]


async def test_own_prompt_less_other_models_and_empty_answers_are_left_out() -> None:
    feed, engine = await _fed([
        _record("own", "xx", worker="me"),  # the engine kept it when it finished
        _record("private", "yy", log_prompt=False),  # a tenant with log_prompts false
        _record("other-model", "zz", model="another"),
        _record("empty", ""),
        _record("kept", "ok"),
    ])
    assert engine.learned == [("tenant:acme", [111, 107])]
    assert feed.read == 5 and feed.learned == 1


async def test_a_backlog_larger_than_the_index_hands_over_only_its_newest_answers_once_read() -> None:
    engine = _Engine()
    feed = SuffixFeed("me", shared=False, served=lambda: [MODEL], started_at=time.time() + 60, max_outputs=3)

    async def call(fn: Any) -> Any:
        return fn(engine)

    feed.attach(call, _Tokenizer())
    for i in range(10):  # all written before this worker started
        feed.take(_record(f"r{i}", str(i)))
        await asyncio.sleep(0.01)
        assert engine.learned == []  # nothing while the backlog is being read
    feed.backlog_read()
    await feed.drained()
    assert engine.learned == [("tenant:acme", [ord(str(i))]) for i in (7, 8, 9)]
    assert feed.read == 10 and feed.learned == 3


def test_a_tenants_requests_draft_from_the_scope_its_answers_go_to() -> None:
    request = _request("r", tenant="acme")
    assert to_engine_request(request, _Tokenizer(), arrival_time=0.0).draft_scope == draft_scope("acme", False)
    assert to_engine_request(request, _Tokenizer(), arrival_time=0.0, shared_outputs=True).draft_scope == ""
    private = to_engine_request(request.model_copy(update={"log_prompt": False}), _Tokenizer(), arrival_time=0.0)
    assert private.keep_output is False


def test_only_a_worker_drafting_by_suffix_decoding_follows_the_completions() -> None:
    def settings(**speculation: Any) -> Settings:
        return Settings(engine={"speculation": speculation})

    assert follows_completions(settings(method="suffix"))
    assert not follows_completions(settings(method="ngram"))
    assert not follows_completions(settings(method="suffix", suffix_follow_completions=False))
    assert not follows_completions(settings(method="suffix", enabled=False))
    assert follows_completions(settings(method="eagle", draft_head="/h", eagle_suffix=True))
    assert not follows_completions(settings(method="eagle", draft_head="/h"))
    assert SuffixFeed.from_settings(settings(method="ngram"), "me", served=list) is None
    feed = SuffixFeed.from_settings(settings(method="suffix", suffix_shared=True), "me", served=list)
    assert feed is not None and feed.shared


def test_the_digest_reads_what_the_completion_record_says() -> None:
    full = record("r", "q", "the answer", model=MODEL, tenant="acme", worker="w")
    digest = _digest(full)
    for name in CompletionDigest.model_fields:
        if name not in ("request", "completion"):
            assert getattr(digest, name) == getattr(full, name), name
    assert digest.completion is not None and full.completion is not None
    assert digest.completion.text == full.completion.text and digest.request is not None
    assert _record("r", "x", log_prompt=False).request is None


def test_records_the_feed_cannot_read_say_why() -> None:
    good = record("r", "q", "a", model=MODEL, tenant="acme", worker="w").model_dump()

    def reason(value: bytes) -> str:
        digest = read_digest(value, LIMIT)
        assert isinstance(digest, Rejection), value[:40]
        return digest.message

    assert "malformed JSON" in reason(b"{nope")
    assert "limit" in reason(json.dumps({**good, "pad": "x" * LIMIT}).encode())
    for version in (2, True):
        assert "schema_version" in reason(json.dumps({**good, "schema_version": version}).encode())
    assert "tenant" in reason(json.dumps({k: v for k, v in good.items() if k != "tenant"}).encode())
