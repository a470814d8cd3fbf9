"""Prefix caching through the whole LLMEngine on tiny random models: a hit prefills only the uncached tail, and the
tokens are the same with the cache on and off (every weight format and KV dtype, speculation, LoRA, chunked prefill,
eviction, preemption)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _engine_factories import (  # noqa: F401
    every_format_runs,
    make_engine,
    needs_bf16_gemm,
    random_prompts,
    single_thread,
    tiny_hf_model,
)

from bench.prefix_cache import PrefillTally, generate_staggered
from engine.config import LoRAConfig, SpeculationConfig
from engine.llm_engine import LLMEngine
from engine.prefix_cache import BLOCK_SIZE
from engine.request import EngineRequest, SamplingOptions
from tests.lora_support import save_random_adapter

pytestmark = pytest.mark.usefixtures("single_thread")
NGRAM = SpeculationConfig(enabled=True, method="ngram", max_draft_tokens=4, adaptive=False)
SYSTEM = random_prompts([37], seed=11)[0]  # a shared "system prompt": two full blocks and a bit
TAILS = random_prompts([5, 12, 20, 3], seed=12)


@pytest.fixture(scope="module")
def llama() -> Any:
    return tiny_hf_model("llama")


def _req(rid: str, prompt: list[int], n: int = 12, seed: int | None = None, **kw: Any) -> EngineRequest:
    sampling = SamplingOptions(max_tokens=n, ignore_eos=True, temperature=0.8 if seed is not None else 0.0,
                               top_p=0.9, seed=seed)
    return EngineRequest(rid, prompt, sampling, **kw)


def _waves(engine: LLMEngine, waves: list[list[EngineRequest]]) -> dict[str, list[int]]:
    """Each wave's requests run together; a wave starts once the one before it has finished."""
    out: dict[str, list[int]] = {}
    for wave in waves:
        out.update({rid: r.token_ids for rid, r in engine.generate(wave).items()})
    return out


def _conversation_waves(first_turn: dict[str, list[int]] | None) -> list[list[EngineRequest]]:
    """Wave 1: four prompts sharing SYSTEM, two of them seeded (hits on running sequences' blocks); wave 2: each
    conversation's next turn (its prompt, the answer, a new message) and SYSTEM's prompts again."""
    prompts = [SYSTEM + t for t in TAILS]
    wave1 = [_req(f"t1-{i}", p, seed=i if i % 2 else None) for i, p in enumerate(prompts)]
    if first_turn is None:
        return [wave1]
    wave2 = [_req(f"t2-{i}", p + first_turn[f"t1-{i}"] + TAILS[-1 - i], seed=i if i % 2 else None)
             for i, p in enumerate(prompts)]
    wave2.append(_req("again", prompts[2]))
    return [wave1, wave2]


def _same_with_cache_on_and_off(make: Any) -> dict[str, Any]:
    off = make(prefix_caching=False)
    first = _waves(off, _conversation_waves(None))
    want = _waves(off, _conversation_waves(first))
    on = make(prefix_caching=True)
    counter = PrefillTally(on)
    assert _waves(on, _conversation_waves(first)) == want
    return {"engine": on, "prefill": counter.tokens}


def test_a_repeated_prompt_prefills_only_its_uncached_tail_and_says_how_much_was_cached(llama: Any) -> None:
    engine = make_engine(llama)
    counter = PrefillTally(engine)
    prompt = SYSTEM + TAILS[0]  # 42 tokens: two full blocks can be reused, the last token is always computed
    first = engine.generate([_req("a", prompt)])["a"]
    second = engine.generate([_req("b", prompt)])["b"]
    assert second.token_ids == first.token_ids
    assert counter.tokens == {"a": 42, "b": 42 - 2 * BLOCK_SIZE}
    assert first.stats is not None and first.stats.cached_prompt_tokens == 0
    assert second.stats is not None and second.stats.cached_prompt_tokens == 2 * BLOCK_SIZE
    counters = engine.prefix_cache_counters()
    assert (counters.queries, counters.hits, counters.preemptions) == (84, 32, 0)
    usage = engine.cache_usage()
    assert usage.used_tokens == 0 and usage.cached_tokens > 0  # cached blocks are free for the taking


def test_a_prompt_of_exactly_whole_blocks_still_computes_its_last_token(llama: Any) -> None:
    engine = make_engine(llama)
    counter = PrefillTally(engine)
    prompt = (SYSTEM + TAILS[2])[: 2 * BLOCK_SIZE]
    engine.generate([_req("a", prompt)])
    assert engine.generate([_req("b", prompt)])["b"].stats.cached_prompt_tokens == BLOCK_SIZE
    assert counter.tokens["b"] == BLOCK_SIZE


def test_the_next_turn_prefills_only_the_new_messages_and_the_conversation_holds_one_copy(llama: Any) -> None:
    engine = make_engine(llama)
    counter = PrefillTally(engine)
    turn1 = SYSTEM + TAILS[1]
    answer = engine.generate([_req("turn1", turn1, n=20)])["turn1"].token_ids
    new = TAILS[2]
    turn2 = turn1 + answer + new
    engine.generate([_req("turn2", turn2, n=8)])
    # Turn 1's prompt (but its partial last block) was reused; its answer and the new message are computed (a
    # decode's KV is never reused: it rounds differently from a prefill's).
    assert len(answer) + len(new) <= counter.tokens["turn2"] <= len(answer) + len(new) + BLOCK_SIZE
    # Turn 2 copied every block turn 1 left: turn 1's copy was freed at once, turn 2's prompt is what stays.
    assert engine.cache_usage().cached_tokens == len(turn2) // BLOCK_SIZE * BLOCK_SIZE


def test_outputs_are_the_same_with_the_cache_on_and_off_with_speculation_and_chunked_prefill(llama: Any) -> None:
    got = _same_with_cache_on_and_off(lambda **kw: make_engine(llama, speculation=NGRAM, max_batched_tokens=8, **kw))
    assert got["engine"].prefix_cache_counters().hits > 0
    assert got["prefill"]["again"] < len(SYSTEM + TAILS[2])


@pytest.mark.usefixtures("every_format_runs")
@pytest.mark.parametrize("kv_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("fmt", [pytest.param("bf16", marks=needs_bf16_gemm), "int8", "int4", "fp32"])
def test_outputs_are_the_same_with_the_cache_on_and_off_in_every_weight_format_and_kv_dtype(
    fmt: str, kv_dtype: str
) -> None:
    target = tiny_hf_model("qwen2")
    # Without the wide bf16 copy the quantized formats run one kernel for every row count (engine/quant/linear.py).
    got = _same_with_cache_on_and_off(lambda **kw: make_engine(
        target, weights=fmt, kv_cache_dtype=kv_dtype, prepack_weights=fmt == "fp32", speculation=NGRAM, **kw))
    assert got["engine"].weight_format == fmt and got["engine"].prefix_cache_counters().hits > 0


def test_the_lora_adapter_is_part_of_the_key(llama: Any, tmp_path: Path) -> None:
    adapters = {"all": str(save_random_adapter(llama, tmp_path / "all", r=4, alpha=8, seed=1))}
    make = lambda **kw: make_engine(llama, lora=LoRAConfig(adapters=adapters), speculation=NGRAM, **kw)
    prompt = SYSTEM + TAILS[1]
    jobs = [[_req("base", prompt)], [_req("lora", prompt, lora="all")], [_req("lora-again", prompt, lora="all")],
            [_req("base-again", prompt), _req("mixed", prompt, lora="all", seed=3)]]
    want = _waves(make(prefix_caching=False), jobs)
    on = make(prefix_caching=True)
    counter = PrefillTally(on)
    assert _waves(on, jobs) == want
    assert want["lora"] != want["base"]
    assert counter.tokens["lora"] == len(prompt)  # the base model's blocks are not the adapter's
    # 49 tokens: the first three blocks are reused (48 tokens), the last is computed.
    assert counter.tokens["lora-again"] == counter.tokens["base-again"] == len(prompt) - 3 * BLOCK_SIZE == 1


def test_least_recently_used_blocks_are_evicted_under_pressure_and_outputs_stay_the_same(llama: Any) -> None:
    prompts = random_prompts([40, 45, 50, 41, 44], seed=21)
    jobs = [[_req(f"p{i}", p)] for i, p in enumerate(prompts)] + [[_req("p4-again", prompts[4])]]
    # 120 slots: each request needs ~60 while it runs, so earlier prompts' blocks must make room.
    want = _waves(make_engine(llama, kv_tokens=120, prefix_caching=False), jobs)
    on = make_engine(llama, kv_tokens=120)
    counter = PrefillTally(on)
    assert _waves(on, jobs) == want
    assert counter.tokens["p4-again"] == 44 - 2 * BLOCK_SIZE  # the most recent prompt survived
    usage = on.cache_usage()
    assert usage.used_tokens == 0 and 0 < usage.cached_tokens <= 120


def test_a_hit_whose_source_must_be_evicted_to_make_room_runs_as_a_miss_instead_of_waiting(llama: Any) -> None:
    prompt = SYSTEM + TAILS[0]  # 42 tokens: 55 slots with 12 new; its two cached blocks and 55 do not fit in 60
    engine = make_engine(llama, kv_tokens=60)
    first = engine.generate([_req("a", prompt)])["a"]
    second = engine.generate([_req("b", prompt)])["b"]
    assert second.token_ids == first.token_ids and second.stats.cached_prompt_tokens == 0


def test_an_interactive_request_preempts_a_batch_line_which_resumes_with_the_same_output(llama: Any) -> None:
    batch_prompt, chat_prompt = random_prompts([30, 40], seed=31)
    alone = {
        "line": make_engine(llama).generate([_req("line", batch_prompt, n=30, seed=5, priority=10)])["line"].token_ids,
        "chat": make_engine(llama).generate([_req("chat", chat_prompt, n=20)])["chat"].token_ids,
    }
    # 100 slots: the line holds 61, the chat needs 61.
    engine = make_engine(llama, kv_tokens=100, speculation=NGRAM)
    engine.add_request(_req("line", batch_prompt, n=30, seed=5, priority=10))
    got: dict[str, list[int]] = {}
    for _ in range(6):
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.token_ids)
    engine.add_request(_req("chat", chat_prompt, n=20))
    stats = {}
    while engine.has_unfinished():
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.token_ids)
            if out.finished:
                stats[out.request_id] = out.stats
    assert got == alone
    assert engine.prefix_cache_counters().preemptions == 1
    assert stats["line"].preemptions == 1 and stats["chat"].preemptions == 0
    assert list(stats) == ["chat", "line"]  # the chat did not wait for the line to end


def test_under_kv_pressure_every_request_completes_with_its_output_alone_and_urgent_arrivals_preempt(
        llama: Any) -> None:
    prompts = random_prompts([30 + 3 * i for i in range(16)], seed=41)

    def jobs() -> list[EngineRequest]:  # the first half at a low priority, the second half urgent
        return [_req(f"r{i}", p, n=24, seed=i if i % 2 else None, priority=2 if i < 8 else 0)
                for i, p in enumerate(prompts)]

    alone = {j.request_id: make_engine(llama, prefix_caching=False).generate([j])[j.request_id].token_ids
             for j in jobs()}
    need = sum(len(p) + 24 + 1 for p in prompts)
    engine = make_engine(llama, kv_tokens=need // 4, max_batched_tokens=32)
    # The urgent half arrives while the low-priority half holds the KV, mid-decode (interactive, like them).
    got = generate_staggered(engine, jobs()[:8], jobs()[8:], steps_between=6)
    assert {rid: r.token_ids for rid, r in got.items()} == alone
    preemptions = engine.prefix_cache_counters().preemptions
    assert preemptions > 0 and sum(got[f"r{i}"].stats.preemptions for i in range(8)) == preemptions
    assert engine.cache_usage().used_tokens == 0
