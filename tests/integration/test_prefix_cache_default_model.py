"""Prefix caching on the real default model: a chat's turns, each resending the whole conversation, give the same
text with the cache on and off (greedy and seeded), and each turn computes only what is new."""
from __future__ import annotations

from typing import Any

import pytest

from bench.prefix_cache import PrefillTally
from engine.config import EngineConfig, SpeculationConfig
from engine.llm_engine import LLMEngine
from engine.prefix_cache import BLOCK_SIZE
from engine.request import EngineRequest, SamplingOptions
from tests.unit.engine._engine_factories import (  # noqa: F401  (fixtures)
    every_format_runs,
    single_thread,
)

pytestmark = [pytest.mark.model, pytest.mark.usefixtures("single_thread", "every_format_runs")]

MODEL = "smollm2-135m-instruct"
SYSTEM = ("You are a helpful assistant for an event-streaming team. Answer briefly and precisely; when unsure, "
          "say so. Prefer concrete commands and configuration keys over general advice.")
QUESTIONS = ["What is a Kafka consumer group?", "How does it rebalance?", "And what is a partition key for?"]


def _engine(prefix_caching: bool) -> LLMEngine:
    # The default format, as it is served: where oneDNN's bf16 GEMM runs, prompt chunks past the quantized kernel's
    # window run on the bf16 copy, with the cache on and off alike.
    cfg = EngineConfig(model=MODEL, weights="int4", kv_cache_bytes=64 << 20,
                       speculation=SpeculationConfig(enabled=True, method="ngram", adaptive=False),
                       prefix_caching=prefix_caching)
    return LLMEngine.from_config(cfg)


def _chat(engine: LLMEngine, sampling: SamplingOptions) -> tuple[list[str], dict[str, int], list[int]]:
    """Three turns; returns the answers, the prompt tokens each turn computed, and each turn's prompt length."""
    computed = PrefillTally(engine).tokens
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    answers, lengths = [], []
    for turn, question in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": question})
        text = engine.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompt = engine.tokenizer(text, add_special_tokens=False)["input_ids"]  # as the worker's intake does
        lengths.append(len(prompt))
        out = engine.generate([EngineRequest(f"turn{turn}", list(prompt), sampling)])[f"turn{turn}"]
        answers.append(out.text)
        messages.append({"role": "assistant", "content": out.text})
    return answers, computed, lengths


# Every format and KV dtype, on tiny models: test_prefix_cache_engine.
def test_a_chats_turns_are_the_same_with_the_cache_on_and_off_and_compute_only_the_new_messages() -> None:
    greedy = SamplingOptions(max_tokens=24)
    seeded = SamplingOptions(max_tokens=24, temperature=0.8, top_p=0.95, seed=7)
    off, on = _engine(prefix_caching=False), _engine(prefix_caching=True)
    for sampling in (greedy, seeded):
        want, _, _ = _chat(off, sampling)
        got, computed, lengths = _chat(on, sampling)
        assert got == want
        for turn in (1, 2):
            # The earlier turns' prompt (up to its last whole block) was not computed again.
            assert computed[f"turn{turn}"] <= lengths[turn] - lengths[turn - 1] + BLOCK_SIZE
