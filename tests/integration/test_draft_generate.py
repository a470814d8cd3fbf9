"""`draft train` learns from the target as it will be served: its answers are the greedy answers of the weight
format the head serves beside (engine.weights), and the target pass labels each position with that format's
greedy next token."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.config import SpeculationConfig, embedded_engine_config
from engine.llm_engine import LLMEngine
from engine.loader import load_model
from engine.quant.formats import resolve_weight_format
from engine.request import EngineRequest, SamplingOptions
from engine.speculative.eagle_train import collect_features
from streams.config import Settings
from streams.draft.prompts import builtin_prompts
from streams.draft.source import chat_prompt_ids
from streams.draft.train import DraftTrainOptions, _generated, _served_target
from tests.tiny_targets import tiny_chat_target

# The engine serves bf16 only on CPUs with AVX-512 and BF16 (elsewhere fp32, tested in test_quant_engine): the
# answers of a format it never serves here cannot be told from fp32's.
_BF16_FALLBACK = resolve_weight_format("bf16", torch.device("cpu")).note
pytestmark = [pytest.mark.model]


def _served_as_bf16(target: str) -> Settings:
    return Settings.model_validate(
        {"engine": {"model": target, "max_model_len": 256, "kv_cache_bytes": "8MiB", "weights": "bf16"}})


def _greedy(model: str, weights: str, prompts: list[str], max_tokens: int) -> list[list[int]]:
    loaded = load_model(model)
    engine = LLMEngine(loaded, embedded_engine_config(model=model, max_model_len=256, kv_cache_bytes=8 << 20, weights=weights,
                                            speculation=SpeculationConfig(enabled=False)))
    ids = [chat_prompt_ids(loaded.tokenizer, p) for p in prompts]
    outs = engine.generate([EngineRequest(f"r{i}", p, SamplingOptions(max_tokens=max_tokens, temperature=0.0))
                            for i, p in enumerate(ids)])
    return [p + outs[f"r{i}"].token_ids for i, p in enumerate(ids)]


@pytest.mark.skipif(_BF16_FALLBACK is not None, reason=f"this CPU: {_BF16_FALLBACK}")
def test_generated_answers_are_the_configured_formats_greedy_answers(tmp_path: Path) -> None:
    target = str(tiny_chat_target(tmp_path / "target", initializer_range=0.2))
    options = DraftTrainOptions(max_new_tokens=24)

    served = _served_target(_served_as_bf16(target), lambda _: None)
    got = _generated(served, 4, options, lambda _: None)

    expected = _greedy(target, "bf16", builtin_prompts(4, options.seed), 24)
    assert [tokens for tokens, _ in got] == expected
    fp32 = _greedy(target, "fp32", builtin_prompts(4, options.seed), 24)
    assert fp32 != expected, "the random target should round differently in bf16 (else this test proves nothing)"


def test_the_target_pass_labels_each_answer_position_with_the_served_formats_greedy_token(tmp_path: Path) -> None:
    served = _served_target(_served_as_bf16(str(tiny_chat_target(tmp_path / "target", initializer_range=0.2))), lambda _: None)
    sequences = _generated(served, 3, DraftTrainOptions(max_new_tokens=24), lambda _: None)

    examples = collect_features(served.model, sequences, lambda _: None)

    for example, (tokens, n_prompt) in zip(examples, sequences):
        # position j's label is the token the format chose after it: the answer's next token
        assert example.labels[n_prompt - 1 : len(tokens) - 1].tolist() == tokens[n_prompt:]
