"""The fused one-sequence step (engine.fused): a decode or a verification of one request runs as one C++ call
that gives every row the layer-by-layer path's bits, so speculation stays lossless; any other step, model or
machine runs layer by layer, and a model or machine it cannot serve gets the reason."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from _engine_factories import make_engine, random_prompts, single_thread, tiny_hf_model  # noqa: F401

from engine.config import LoRAConfig, SpeculationConfig
from engine.fused import build
from engine.fused.one_sequence import OneSequenceStep
from engine.request import EngineRequest, SamplingOptions
from engine.runner import FlatBatchBuilder

pytestmark = pytest.mark.usefixtures("single_thread")

FORMATS = ["int8", "int4"]
NGRAM = SpeculationConfig(enabled=True, method="ngram", max_draft_tokens=4, adaptive=False)
PROMPTS = random_prompts([9, 14], seed=5)
PROMPTS[1] = PROMPTS[1] * 4  # repetitive: the n-gram proposer drafts, so verification steps run
PARAMS = [
    SamplingOptions(max_tokens=24, temperature=0.0, ignore_eos=True),
    SamplingOptions(max_tokens=24, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True),
]


@pytest.fixture(scope="module")
def llama() -> Any:
    return tiny_hf_model("llama")


def _forward(engine: Any, tokens: list[int], num_cached: int, fused: OneSequenceStep | None) -> torch.Tensor:
    """One step of the request whose region starts at slot 0: [rows, hidden]."""
    engine.model.one_sequence = fused
    builder = FlatBatchBuilder("cpu")
    builder.add(tokens, num_cached, 0)
    ids, positions, attn = builder.build(engine.kv_cache)
    with torch.inference_mode():
        return engine.model(ids, positions, attn)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 5, 9], ids=["decode", "verify-4", "verify-8"])
def test_the_fused_step_gives_each_row_and_its_kv_the_layer_by_layer_bits(llama: Any, fmt: str, rows: int) -> None:
    engine = make_engine(llama, weights=fmt)
    fused = engine.model.one_sequence
    assert fused is not None and fused.max_rows >= 9
    prompt, step = PROMPTS[1][:20], PROMPTS[1][20 : 20 + rows]
    _forward(engine, prompt, 0, None)
    before = engine.kv_cache.kv.clone()
    eager = _forward(engine, step, len(prompt), None)
    eager_kv = engine.kv_cache.kv.clone()
    engine.kv_cache.kv.copy_(before)
    calls = []
    real_call = OneSequenceStep.__call__

    def counted(self: OneSequenceStep, *args: Any) -> torch.Tensor:
        calls.append(1)
        return real_call(self, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(OneSequenceStep, "__call__", counted)
        out = _forward(engine, step, len(prompt), fused)
    assert calls == [1]  # it was the fused step that ran
    assert torch.equal(out, eager)
    # As bits: the arena's unwritten slots hold whatever memory held, NaNs included.
    assert torch.equal(engine.kv_cache.kv.view(torch.int32), eager_kv.view(torch.int32))
    assert torch.equal(engine.model.compute_logits(out), engine.model.compute_logits(eager))


@pytest.mark.parametrize("fmt", FORMATS)
def test_speculation_on_the_fused_step_keeps_the_layer_by_layer_tokens_greedy_and_seeded(llama: Any, fmt: str) -> None:
    for i, params in enumerate(PARAMS):
        requests = [EngineRequest("r", PROMPTS[i], params)]
        fused = make_engine(llama, weights=fmt, speculation=NGRAM)
        eager = make_engine(llama, weights=fmt, fused_step=False)
        assert fused.model.one_sequence is not None and eager.model.one_sequence is None
        got = fused.generate(requests)["r"]
        assert got.token_ids == eager.generate([EngineRequest("r", PROMPTS[i], params)])["r"].token_ids
        if i == 1:
            assert got.stats.spec.drafted > 0  # verification steps did run


def test_steps_it_was_not_written_for_run_layer_by_layer(llama: Any) -> None:
    engine = make_engine(llama, weights="int4")
    fused = engine.model.one_sequence
    assert fused is not None

    def attn(*seqs: tuple[int, int]) -> Any:
        builder = FlatBatchBuilder("cpu")
        for n, cached in seqs:
            builder.add([1] * n, cached, 64 * len(builder.seqs))
        return builder.build(engine.kv_cache)[2]

    assert fused.applies(attn((1, 10)), 1)  # a decode
    assert fused.applies(attn((9, 10)), 9)  # the verification of 8 drafts
    assert not fused.applies(attn((1, 10), (1, 12)), 2)  # two requests in one step
    assert not fused.applies(attn((12, 0)), 12)  # a first prefill chunk (causal, many rows)
    assert not fused.applies(attn((fused.max_rows + 1, 10)), fused.max_rows + 1)  # past the quantized window


def test_models_and_formats_it_cannot_serve_are_refused_with_the_reason(llama: Any) -> None:
    assert make_engine(llama, weights="fp32").model.one_sequence is None  # fp32: no build is even tried
    qwen3 = make_engine(tiny_hf_model("qwen3"), weights="int4", fused_step=False)
    step, why = OneSequenceStep.build(qwen3.model)
    assert step is None and "qwen3" in why and "q/k norms" in why
    plain = make_engine(llama, weights="int4", fused_step=False)
    step, why = OneSequenceStep.build(plain.model)
    assert step is not None and "fused one-sequence step for 1..9 rows" in why


def test_a_model_with_lora_adapters_runs_layer_by_layer(llama: Any, tmp_path: Any) -> None:
    engine = make_engine(llama, weights="int4", lora=LoRAConfig(adapters={}, max_loaded=2))
    assert engine.model.one_sequence is None
    step, why = OneSequenceStep.build(engine.model)
    assert step is None and "LoRALinear" in why


def test_a_machine_without_a_compiler_gets_the_reason_and_the_layer_by_layer_path(
    llama: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    monkeypatch.setattr(build, "_loaded", {})
    engine = make_engine(llama, weights="int4", fused_step=False)
    step, why = OneSequenceStep.build(engine.model)
    assert step is None and why == "no C++ compiler (g++ or $CXX) on this machine"


def test_a_build_that_fails_says_the_compilers_first_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    (tmp_path / "broken.cpp").write_text("this is not C++\n")
    monkeypatch.setattr(build, "SOURCE_DIR", tmp_path)
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setenv("SPECSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    built = build.load_ops("broken")
    assert built.library is None and built.why.startswith("building broken.cpp failed")
    assert "broken.cpp:1:1: error:" in built.why
