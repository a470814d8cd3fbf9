"""Prompt logprobs: the target's raw log_softmax at each prompt position, computed during prefill (whole or chunked),
never served from the prefix cache (cached KV has no logits), and max_tokens 0 scoring a prompt alone."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from _engine_factories import make_engine, random_prompts, tiny_hf_model

from engine.logprobs import LogprobEntry
from engine.outputs import RequestOutputAccum
from engine.request import EngineRequest, SamplingOptions

torch.set_num_threads(1)

PROMPT = random_prompts([40], seed=11)[0]


@pytest.fixture(scope="module")
def llama() -> Any:
    return tiny_hf_model("llama")


@torch.inference_mode()
def _hf_prompt_logprobs(hf: Any, prompt: list[int]) -> torch.Tensor:
    """[len(prompt) - 1, V]: transformers' log_softmax at positions 0..P-2 (the distributions of tokens 1..P-1)."""
    return hf(torch.tensor([prompt])).logits[0, :-1].float().log_softmax(dim=-1)


def _assert_matches(entries: list[LogprobEntry] | None, prompt: list[int], want: torch.Tensor, top: int) -> None:
    assert entries is not None and [e.token_id for e in entries] == prompt[1:]
    for j, entry in enumerate(entries):
        assert abs(entry.logprob - want[j, entry.token_id].item()) < 1e-4, j
        best = want[j].topk(top)
        assert [t for t, _ in entry.top] == best.indices.tolist(), j
        assert all(abs(lp - w) < 1e-4 for (_, lp), w in zip(entry.top, best.values.tolist(), strict=True)), j


@pytest.mark.parametrize("max_batched_tokens", [512, 7], ids=["whole-prefill", "chunked-prefill"])
def test_prompt_logprobs_equal_transformers_log_softmax(llama: Any, max_batched_tokens: int) -> None:
    engine = make_engine(llama, max_batched_tokens=max_batched_tokens)
    params = SamplingOptions(max_tokens=3, logprobs=2, prompt_logprobs=3, repetition_penalty=1.3)
    out = engine.generate([EngineRequest("p", PROMPT, params)])["p"]
    want = _hf_prompt_logprobs(llama, PROMPT)
    _assert_matches(out.prompt_logprobs, PROMPT, want, 3)
    assert out.logprobs is not None and len(out.logprobs) == len(out.token_ids) == 3


def test_a_prefix_cache_hit_is_skipped_for_prompt_logprobs_and_its_blocks_still_cached(llama: Any) -> None:
    engine = make_engine(llama, prefix_caching=True)
    plain = SamplingOptions(max_tokens=2)
    scored = SamplingOptions(max_tokens=2, prompt_logprobs=1)
    want = _hf_prompt_logprobs(llama, PROMPT)
    first = engine.generate([EngineRequest("warm", PROMPT, plain)])["warm"]
    assert first.stats is not None and first.stats.cached_prompt_tokens == 0
    for rid in ("again", "and-again"):  # the prompt's blocks are cached: both compute it anyway
        out = engine.generate([EngineRequest(rid, PROMPT, scored)])[rid]
        assert out.stats is not None and out.stats.cached_prompt_tokens == 0
        _assert_matches(out.prompt_logprobs, PROMPT, want, 1)
        assert out.token_ids == first.token_ids
    after = engine.generate([EngineRequest("plain", PROMPT, plain)])["plain"]
    assert after.stats is not None and after.stats.cached_prompt_tokens == 32  # two 16-token blocks, reused


def test_max_tokens_zero_scores_the_prompt_and_generates_nothing(llama: Any) -> None:
    engine = make_engine(llama)
    res = engine.generate([EngineRequest("score", PROMPT, SamplingOptions(max_tokens=0, logprobs=1, prompt_logprobs=0)),
                           EngineRequest("echo", PROMPT, SamplingOptions(max_tokens=0))])
    score = res["score"]
    assert score.token_ids == [] and score.text == "" and score.finish_reason == "length"
    assert score.logprobs == [] and score.stats is not None and score.stats.completion_tokens == 0
    _assert_matches(score.prompt_logprobs, PROMPT, _hf_prompt_logprobs(llama, PROMPT), 0)
    echo = res["echo"]
    assert echo.token_ids == [] and echo.finish_reason == "length" and echo.prompt_logprobs is None
    assert not engine.has_unfinished() and engine.cache_usage().used_tokens == 0


def test_no_prompt_logprobs_unless_asked_and_a_one_token_prompt_has_none_to_give(llama: Any) -> None:
    engine = make_engine(llama)
    res = engine.generate([EngineRequest("a", PROMPT, SamplingOptions(max_tokens=2)),
                           EngineRequest("b", [7], SamplingOptions(max_tokens=2, prompt_logprobs=2))])
    assert res["a"].prompt_logprobs is None
    assert res["b"].prompt_logprobs == [] and len(res["b"].token_ids) == 2


def test_a_request_preempted_mid_prefill_still_gets_every_prompt_logprob_once(llama: Any) -> None:
    # 100 slots, 8 tokens a step: the line (45 slots) is part-way through its prompt when the chat (61) preempts it.
    engine = make_engine(llama, kv_tokens=100, max_batched_tokens=8)
    chat_prompt = random_prompts([50], seed=12)[0]
    engine.add_request(EngineRequest("line", PROMPT, SamplingOptions(max_tokens=4, prompt_logprobs=2), priority=10))
    outs = {rid: RequestOutputAccum(rid) for rid in ("line", "chat")}
    for _ in range(2):
        for out in engine.step():
            outs[out.request_id].add(out)
    engine.add_request(EngineRequest("chat", chat_prompt, SamplingOptions(max_tokens=10)))
    while engine.has_unfinished():
        for out in engine.step():
            outs[out.request_id].add(out)
    line = outs["line"]
    assert line.stats is not None and line.stats.preemptions == 1 and len(line.token_ids) == 4
    _assert_matches(line.prompt_logprobs, PROMPT, _hf_prompt_logprobs(llama, PROMPT), 2)
