"""The fused decoder step (engine.fused): an engine step's layers as one C++ call that gives every row and its KV the
layer-by-layer path's bits, for any mix of decodes, verifications and prefill chunks, so speculation stays lossless;
a model or machine it cannot serve runs layer by layer and gets the reason."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from _engine_factories import (  # noqa: F401  (fixtures)
    every_format_runs,
    make_engine,
    needs_bf16_gemm,
    random_prompts,
    single_thread,
    tiny_hf_model,
)

from engine.config import LoRAConfig, SpeculationConfig
from engine.fused import build
from engine.fused.decoder_step import FusedDecoderStep
from engine.request import EngineRequest, SamplingOptions
from engine.runner import FlatBatchBuilder

# The formats' own arithmetic on every CPU, not fp32 under their names (see every_format_runs).
pytestmark = pytest.mark.usefixtures("single_thread", "every_format_runs")

# (format, engine.prepack_weights, engine.kv_cache_dtype): int4/int8 with and without their bf16 copy for steps past
# 9 rows; the KV arena in bfloat16 (what auto gives these formats) and in fp32.
# The bf16 copy is oneDNN's bf16 GEMM, which some CPUs cannot run at all; without it every step is int4/int8's.
FORMATS = [pytest.param("int8", True, "auto", marks=needs_bf16_gemm),
           pytest.param("int4", True, "auto", marks=needs_bf16_gemm), ("int4", False, "float32"),
           ("int8", False, "auto"),
           pytest.param("bf16", True, "auto", marks=needs_bf16_gemm)]  # fmt: skip
NGRAM = SpeculationConfig(enabled=True, method="ngram", max_draft_tokens=4, adaptive=False)
PROMPTS = random_prompts([9, 14, 40], seed=5)
PROMPTS[1] = PROMPTS[1] * 4  # repetitive: the n-gram proposer drafts, so verification steps run
PARAMS = [
    SamplingOptions(max_tokens=24, temperature=0.0, ignore_eos=True),
    SamplingOptions(max_tokens=24, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True),
]
REGION = 128  # arena slots between the test's sequences

# Steps as (rows fed, positions already cached, a prompt chunk?) per sequence, each in its own region.
STEPS = {
    "decode": [(1, 20, False)],
    "verify-4": [(5, 20, False)],
    "verify-8": [(9, 20, False)],
    "verify-11": [(12, 20, False)],  # past rows_as_decodes: still the row kernel, as its decodes
    "first-prefill-chunk": [(12, 0, True)],
    "later-prefill-chunk": [(16, 20, True)],
    "one-row-prefill-chunk": [(1, 20, True)],  # the chunk kernel, as the prompt's other rows
    "mixed-batch": [(1, 20, False), (5, 33, False), (12, 0, True), (1, 7, False), (16, 20, True), (3, 9, True)],
}


@pytest.fixture(scope="module")
def llama() -> Any:
    return tiny_hf_model("llama")


@pytest.fixture(scope="module",
                params=["llama", "qwen2", "qwen3", "gemma2", "gemma2-kernels", "gemma3", "mistral-window"])
def family(request: pytest.FixtureRequest) -> Any:
    """Llama's layers, Qwen2's q/k/v biases, Qwen3's q/k norms, Gemma 2's soft-capped attention scores (with the tiny
    config's softmax scale, attended by SDPA; with 1 / sqrt(head_dim), as Gemma 2 2B and 9B have it, by the row and
    chunk kernels), Gemma 3's (sandwich norms scaling by 1 + w, GeGLU, windows of 8 on two layers of three with their
    own RoPE base, its softmax scale), Mistral's window of 8 on every layer: the steps' rows reach past the windows."""
    if request.param == "mistral-window":
        return tiny_hf_model("mistral", sliding_window=8)
    if request.param == "gemma2-kernels":
        return tiny_hf_model("gemma2", query_pre_attn_scalar=tiny_hf_model("gemma2").config.head_dim)
    return tiny_hf_model(request.param)


def _forward(engine: Any, seqs: list[tuple[int, int, bool]], fused: FusedDecoderStep | None, feed_cached: bool) -> Any:
    """One step over the test's sequences (sequence i in region i): [rows, hidden]. With feed_cached, first
    writes every sequence's cached positions (layer by layer)."""
    engine.model.fused_step = fused
    tokens = PROMPTS[2] * 2
    builder = FlatBatchBuilder("cpu")
    for i, (n, cached, prompt) in enumerate(seqs):
        if not feed_cached:
            builder.add(tokens[cached : cached + n], cached, REGION * i, prompt=prompt)
        elif cached:
            builder.add(tokens[:cached], 0, REGION * i, prompt=True)
    ids, positions, attn = builder.build(engine.kv_cache)
    with torch.inference_mode():
        return engine.model(ids, positions, attn) if ids.numel() else None


def _bits(t: torch.Tensor) -> torch.Tensor:
    # The arena's unwritten slots hold whatever memory held, NaNs included: compare bits, not values.
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


@pytest.mark.parametrize("fmt,wide,kv", FORMATS)
@pytest.mark.parametrize("step", list(STEPS))
def test_the_fused_step_gives_each_row_and_its_kv_the_layer_by_layer_bits(
    family: Any, fmt: str, wide: bool, kv: str, step: str
) -> None:
    engine = make_engine(family, weights=fmt, prepack_weights=wide, kv_cache_dtype=kv)
    assert engine.kv_cache.dtype == (torch.float32 if kv == "float32" else torch.bfloat16)
    fused = engine.model.fused_step
    assert fused is not None
    _forward(engine, STEPS[step], None, feed_cached=True)
    before = engine.kv_cache.kv.clone()
    eager = _forward(engine, STEPS[step], None, feed_cached=False)
    eager_kv = engine.kv_cache.kv.clone()
    engine.kv_cache.kv.copy_(before)
    calls = []
    real_call = FusedDecoderStep.__call__

    def counted(self: FusedDecoderStep, *args: Any) -> torch.Tensor:
        calls.append(1)
        return real_call(self, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FusedDecoderStep, "__call__", counted)
        out = _forward(engine, STEPS[step], fused, feed_cached=False)
    assert calls == [1]  # it was the fused step that ran
    assert torch.equal(out, eager)
    assert torch.equal(_bits(engine.kv_cache.kv), _bits(eager_kv))


# What shares a prompt tail's step: nothing, or another sequence's decode (sequence 1, in region 1).
BESIDE = {"alone": [], "beside-a-decode": [(1, 20, False)]}


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "layer-by-layer"])
@pytest.mark.parametrize("beside", list(BESIDE))
@pytest.mark.parametrize("fmt", [pytest.param(f, marks=needs_bf16_gemm) for f in ("int4", "int8")])  # the bf16 copy
def test_a_prompt_rows_bits_and_kv_do_not_depend_on_how_many_rows_its_chunk_has(
    family: Any, fmt: str, beside: str, fused: bool
) -> None:
    # A prompt prefilled whole (36 rows: past the quantized kernel's 9), then its last 4 positions again as the tail
    # a prefix-cache hit on the first 32 leaves: the tail's rows and K/V must be the whole prefill's, or the same
    # greedy request gives other text the second time (and speculated text differs from plain text).
    engine = make_engine(family, weights=fmt)  # with the bf16 copy for wide steps
    step = engine.model.fused_step if fused else None
    assert engine.model.fused_step is not None and engine.model.layers[0].self_attn.qkv_proj.wide is not None
    tail = [(4, 32, True), *BESIDE[beside]]
    _forward(engine, tail, None, feed_cached=True)  # the decode's cached positions
    whole = _forward(engine, [(36, 0, True)], step, feed_cached=False)
    whole_kv = engine.kv_cache.kv[..., 32:36, :].clone()
    rows = _forward(engine, tail, step, feed_cached=False)
    assert torch.equal(rows[:4], whole[32:36])
    assert torch.equal(_bits(engine.kv_cache.kv[..., 32:36, :]), _bits(whole_kv))


@pytest.mark.parametrize("step", ["decode", "verify-4", "verify-11", "later-prefill-chunk", "mixed-batch"])
def test_without_a_kernel_for_its_head_size_the_fused_step_attends_by_sdpa_as_the_layers_do(step: str) -> None:
    # Head size 24: no row or chunk kernel, so the fused step takes SDPA (row by row for verifications), as the
    # layers do; its rows must still get the layer-by-layer bits.
    engine = make_engine(tiny_hf_model("llama", head_dim=24), weights="int4")
    fused = engine.model.fused_step
    assert fused is not None and not fused.row_kernel
    _forward(engine, STEPS[step], None, feed_cached=True)
    before = engine.kv_cache.kv.clone()
    eager = _forward(engine, STEPS[step], None, feed_cached=False)
    engine.kv_cache.kv.copy_(before)
    assert torch.equal(_forward(engine, STEPS[step], fused, feed_cached=False), eager)


@pytest.mark.parametrize("fmt,wide,kv", FORMATS)
def test_speculation_on_the_fused_step_keeps_the_layer_by_layer_and_the_plain_tokens_greedy_and_seeded_in_a_batch(
    family: Any, fmt: str, wide: bool, kv: str
) -> None:
    engine = make_engine(family, weights=fmt, prepack_weights=wide, speculation=NGRAM, kv_cache_dtype=kv)
    fused = engine.model.fused_step
    # A softmax scale other than the row kernel's 1 / sqrt(head_dim) (the tiny Gemmas'): SDPA row by row, as the
    # layers attend.
    cfg = engine.model.cfg
    assert fused is not None and fused.row_kernel == (cfg.attn_scale in (None, cfg.head_dim**-0.5))

    def run(step: FusedDecoderStep | None, ids: list[int], speculation: bool | None = None) -> dict[str, list[int]]:
        engine.model.fused_step = step
        out = engine.generate([EngineRequest(f"r{i}", PROMPTS[i], PARAMS[i % 2], speculation=speculation) for i in ids])
        if "r1" in out:  # the repetitive prompt: drafts are found exactly when speculation is on
            assert (out["r1"].stats.spec.drafted > 0) == (speculation is None)
        return {k: r.token_ids for k, r in out.items()}

    assert run(fused, [0, 1, 2]) == run(None, [0, 1, 2])  # a batch: the same rows, the same bits
    # Alone, speculative text is plain text. (In a batch the quantized kernels' rounding of a row can follow the
    # step's row count, so a batch's speculative and plain steps may part at a near tie, fused or not.)
    for i in range(3):
        assert run(fused, [i]) == run(fused, [i], speculation=False)


def test_models_and_formats_it_cannot_serve_are_refused_with_the_reason(llama: Any) -> None:
    assert make_engine(llama, weights="fp32").model.fused_step is None  # fp32: no build is even tried
    gelu = make_engine(tiny_hf_model("llama", hidden_act="gelu"), weights="int4", fused_step=False)
    step, why = FusedDecoderStep.build(gelu.model)
    assert step is None and why == "layer 0's activation (gelu) is not the fused step's (SiLU, GELU tanh)"
    experts = make_engine(tiny_hf_model("mixtral"), weights="int4", fused_step=False)
    step, why = FusedDecoderStep.build(experts.model)
    assert step is None and why == "mixtral's experts are not the fused step's"
    plain = make_engine(llama, weights="int4", fused_step=False)
    step, why = FusedDecoderStep.build(plain.model)
    assert step is not None and why.startswith("fused decoder step (")


def test_a_model_with_lora_adapters_runs_layer_by_layer(llama: Any) -> None:
    engine = make_engine(llama, weights="int4", lora=LoRAConfig(adapters={}, max_loaded=2))
    assert engine.model.fused_step is None
    step, why = FusedDecoderStep.build(engine.model)
    assert step is None and "LoRALinear" in why


def test_a_machine_without_a_compiler_gets_the_reason_and_the_layer_by_layer_path(
    llama: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    monkeypatch.setattr(build, "_loaded", {})
    engine = make_engine(llama, weights="int4")  # engine.fused_step on, nothing to build it with
    assert engine.model.fused_step is None
    assert len(engine.generate([EngineRequest("r", PROMPTS[0], PARAMS[0])])["r"].token_ids) == 24
    step, why = FusedDecoderStep.build(engine.model)
    assert step is None and why == "no C++ compiler (g++ or $CXX) on this machine"


def test_a_build_that_fails_says_the_compilers_first_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    (tmp_path / "broken.cpp").write_text("this is not C++\n")
    monkeypatch.setattr(build, "SOURCE_DIR", tmp_path)
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setenv("SPECSTREAM_CACHE_DIR", str(tmp_path / "cache"))
    built = build.load_ops("broken")
    assert built.library is None and built.why.startswith("building broken.cpp failed")
    assert "broken.cpp:1:1: error:" in built.why


def test_a_source_missing_from_the_install_is_said(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setattr(build, "SOURCE_DIR", tmp_path)
    monkeypatch.setattr(build, "_loaded", {})
    built = build.load_ops("decoder_step")
    assert built.library is None and built.why == f"{tmp_path / 'decoder_step.cpp'} is not installed (package data)"
