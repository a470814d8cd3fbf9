"""The real Gemma 3 270M (Q4_K_M GGUF from PyPI) through our engine at fp32: greedy output equals transformers'
on the same file, with speculation off and on, including a prompt longer than the 512-token sliding window."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from engine.config import SpeculationConfig, embedded_engine_config
from engine.llm_engine import LLMEngine
from engine.loader import convert_gguf
from engine.model_ref import KNOWN_MODELS
from engine.request import EngineRequest, SamplingOptions

MODEL = "gemma-3-270m"
pytestmark = [
    pytest.mark.model,
    # A fresh machine converts the GGUF once (transformers reads the 262k-token vocabulary: a minute or more on a
    # busy 2-core machine).
    pytest.mark.timeout(1200),
]
MAX_TOKENS = 32

_LONG = " ".join(
    f"Entry {i}: the river town of Ostvel traded {i * 7 % 50} barrels of salt for {i * 3 % 40} bolts of wool."
    for i in range(28)
)
PROMPTS = [
    "The three primary colors are",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    _LONG + "\nSummary of the ledger: the town traded",
]


@pytest.fixture(scope="module")
def hf() -> Any:
    from transformers import AutoModelForCausalLM

    # transformers' own dequantisation of the file, saved once as safetensors (engine.loader.convert_gguf): the same
    # tensors as from_pretrained(gguf_file=...), without parsing the GGUF's vocabulary again.
    return AutoModelForCausalLM.from_pretrained(convert_gguf(KNOWN_MODELS[MODEL].locate(), MODEL),
                                                dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def plain() -> Iterator[LLMEngine]:
    yield LLMEngine.from_config(embedded_engine_config(
        model=MODEL, kv_cache_bytes=1 << 28, max_model_len=1024, speculation=SpeculationConfig(enabled=False)))


@pytest.fixture(scope="module")
def prompts(plain: LLMEngine) -> list[list[int]]:
    ids = [list(plain.tokenizer(p)["input_ids"]) for p in PROMPTS]
    assert len(ids[2]) > 600  # past the sliding window (512): the local layers attend to the last 512 only
    return ids


@pytest.fixture(scope="module")
def reference(hf: Any, prompts: list[list[int]]) -> list[list[int]]:
    out = []
    with torch.inference_mode():
        for p in prompts:
            ref = hf.generate(torch.tensor([p]), max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=None,
                              pad_token_id=0, attention_mask=torch.ones(1, len(p), dtype=torch.long))
            out.append(ref[0, len(p):].tolist())
    return out


def _greedy(engine: LLMEngine, prompts: list[list[int]]) -> tuple[list[list[int]], int]:
    params = SamplingOptions(max_tokens=MAX_TOKENS, ignore_eos=True)
    res = engine.generate([EngineRequest(f"p{i}", p, params) for i, p in enumerate(prompts)])
    return [res[f"p{i}"].token_ids for i in range(len(prompts))], sum(r.spec.drafted for r in res.values())


def test_gemma_is_served_at_its_own_context_without_another_models_chat_template(plain: LLMEngine) -> None:
    assert plain.model_name == MODEL and plain.max_model_len == 1024
    assert not plain.tokenizer.chat_template  # the base model's GGUF has none: never SmolLM2's ChatML


def test_greedy_equals_transformers_on_the_same_gguf(
        plain: LLMEngine, prompts: list[list[int]], reference: list[list[int]]) -> None:
    assert _greedy(plain, prompts)[0] == reference


def test_ngram_speculation_keeps_transformers_greedy(prompts: list[list[int]], reference: list[list[int]]) -> None:
    engine = LLMEngine.from_config(embedded_engine_config(
        model=MODEL, kv_cache_bytes=1 << 28, max_model_len=1024,
        speculation=SpeculationConfig(enabled=True, method="ngram", max_draft_tokens=4)))
    tokens, drafted = _greedy(engine, prompts)
    assert drafted > 0 and tokens == reference
