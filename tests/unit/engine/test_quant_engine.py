"""Weight formats through the whole engine: each format is what runs (not silently fp32),
speculation keeps the same quantized model's tokens (greedy and seeded), a CPU lacking the
instructions gets fp32 with the reason said, and int4 stays within 1.3x of its GGUF file."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from _engine_factories import (  # noqa: F401  (fixtures)
    every_format_runs,
    loaded_from_hf,
    make_engine,
    needs_bf16_gemm,
    random_prompts,
    single_thread,
    tiny_hf_model,
)

from engine.config import SpeculationConfig
from engine.weight_plan import apply_weights
from engine.quant import formats
from engine.quant.formats import CpuFeatures, resolve_weight_format
from engine.quant.source import WeightSource
from engine.quant.linear import Bf16Linear, QuantizedLinear
from engine.request import EngineRequest, SamplingOptions

pytestmark = pytest.mark.usefixtures("single_thread", "every_format_runs")

FORMATS = ["bf16", "int8", "int4"]
PROMPTS = random_prompts([9, 14, 5], seed=4)
PROMPTS[2] = PROMPTS[2] * 4  # repetitive: the n-gram proposer finds matches
PARAMS = [
    SamplingOptions(max_tokens=20, temperature=0.0, ignore_eos=True),
    SamplingOptions(max_tokens=20, temperature=0.8, top_p=0.9, seed=7, ignore_eos=True),
    SamplingOptions(max_tokens=20, temperature=0.0, ignore_eos=True),
]
NGRAM = SpeculationConfig(enabled=True, method="ngram", max_draft_tokens=4, adaptive=False)


@pytest.fixture(scope="module")
def target() -> Any:
    return tiny_hf_model("qwen2")  # biases on q/k/v and a tied head: both paths of the installer


def _tokens(engine: Any, ids: list[int]) -> dict[str, list[int]]:
    res = engine.generate([EngineRequest(f"r{i}", PROMPTS[i], PARAMS[i]) for i in ids])
    return {k: r.token_ids for k, r in res.items()}


@needs_bf16_gemm
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_requested_format_is_what_runs(target: Any, fmt: str) -> None:
    engine = make_engine(target, weights=fmt)
    assert engine.weight_format == fmt
    layer_type = Bf16Linear if fmt == "bf16" else QuantizedLinear
    linears = [m for m in engine.model.modules() if isinstance(m, layer_type)]
    # qkv, o, gate_up and down per layer, and the (tied) LM head
    assert len(linears) == 4 * target.config.num_hidden_layers + 1
    assert not any(isinstance(m, torch.nn.Linear) for m in engine.model.modules())


@needs_bf16_gemm
@pytest.mark.parametrize("fmt", FORMATS)
def test_speculation_keeps_the_quantized_models_own_tokens_one_request_at_a_time(target: Any, fmt: str) -> None:
    # 1 + 4 drafts stay inside the quantized kernel's row window: the same kernel as plain decoding.
    for i in range(len(PROMPTS)):
        assert _tokens(make_engine(target, weights=fmt, speculation=NGRAM), [i]) == _tokens(
            make_engine(target, weights=fmt), [i]
        )


@pytest.mark.parametrize("fmt", [pytest.param("bf16", marks=needs_bf16_gemm), "int8", "int4"])
def test_with_one_kernel_for_every_row_count_speculation_keeps_the_tokens_in_any_batch(target: Any, fmt: str) -> None:
    # bf16 has one kernel; int4/int8 without the wide copy run every step on the quantized one.
    # Either way a row's output does not depend on the step's other rows. (With the bf16 copy,
    # a batch's verification steps can leave the window that its plain steps stay in, and the
    # two kernels round differently: equal up to near ties, see engine.quant.linear.)
    ids = list(range(len(PROMPTS)))
    plain = _tokens(make_engine(target, weights=fmt, prepack_weights=False), ids)
    assert _tokens(make_engine(target, weights=fmt, prepack_weights=False, speculation=NGRAM), ids) == plain
    assert {f"r{i}": plain[f"r{i}"] for i in ids} == {
        k: v for i in ids for k, v in _tokens(make_engine(target, weights=fmt, prepack_weights=False), [i]).items()
    }


@needs_bf16_gemm
def test_quantized_models_differ_from_fp32_only_slightly(target: Any) -> None:
    # Not a format silently left at fp32, not a broken one: logits close to fp32's, not equal.
    ids = torch.tensor(PROMPTS[0])
    logits = {}
    for fmt in ["fp32", "int8", "int4"]:
        engine = make_engine(target, weights=fmt)
        logits[fmt] = engine.model.compute_logits(engine.model.embed_tokens(ids))  # [T, vocab]
    for fmt in ["int8", "int4"]:
        diff = (logits[fmt] - logits["fp32"]).abs().max().item()
        assert 0 < diff < 0.1 * logits["fp32"].abs().max().item(), fmt


@pytest.mark.parametrize(
    ("cpu", "reason"),
    [
        (CpuFeatures("AVX2", True, "", False), "need AVX-512 and this CPU runs torch at AVX2"),
        (CpuFeatures("AVX512", False, "", True), "neither AVX512_BF16 nor AMX-BF16"),
    ],
)
@pytest.mark.parametrize("requested", ["int4", "int8", "bf16"])
def test_a_cpu_without_the_instructions_falls_back_to_fp32_saying_why(cpu: CpuFeatures, reason: str, requested: str) -> None:
    resolved = resolve_weight_format(requested, torch.device("cpu"), cpu)  # type: ignore[arg-type]
    assert resolved.fmt == "fp32"
    assert resolved.note is not None and f"engine.weights {requested} falls back to fp32" in resolved.note
    assert reason in resolved.note


@pytest.mark.parametrize("requested", ["int4", "int8"])
def test_an_avx2_cpu_runs_int4_and_int8_on_our_kernel_at_every_step(requested: str) -> None:
    avx2 = CpuFeatures("AVX2", False, "avx2", False)
    resolved = resolve_weight_format(requested, torch.device("cpu"), avx2)  # type: ignore[arg-type]
    assert resolved.fmt == requested and resolved.note is None
    assert not resolved.wide_copy  # no oneDNN bf16 GEMM here: no bf16 copy for wide steps
    torch_kernels = resolve_weight_format(requested, torch.device("cpu"), avx2, kernel="torch")  # type: ignore[arg-type]
    assert torch_kernels.fmt == "fp32" and torch_kernels.note is not None
    assert "(engine.quant_kernel: torch)" in torch_kernels.note
    bf16 = resolve_weight_format("bf16", torch.device("cpu"), avx2)
    assert bf16.fmt == "fp32" and bf16.note is not None and "AVX-512" in bf16.note


def test_auto_on_a_cpu_that_runs_nothing_else_is_fp32_saying_why_without_a_warning() -> None:
    bare = CpuFeatures("DEFAULT", False, "", False)
    q4 = WeightSource("int4", "m.gguf's Q4_1 linears and Q8_0 embedding")
    resolved = resolve_weight_format("auto", torch.device("cpu"), bare, source=q4)
    assert resolved.fmt == "fp32" and resolved.note is None
    assert resolved.choice is not None and resolved.choice.startswith("engine.weights auto: fp32 (int4 would keep")


def test_auto_keeps_a_model_without_a_file_in_fp32_and_an_explicit_format_says_nothing_more() -> None:
    capable = CpuFeatures("AVX512", True, "avx512vnni", True)
    auto = resolve_weight_format("auto", torch.device("cpu"), capable)  # no source: weights built in memory
    assert auto.fmt == "fp32" and auto.note is None
    assert auto.choice == "engine.weights auto: fp32, the format that keeps its in-memory weights exactly"
    assert resolve_weight_format("int4", torch.device("cpu"), capable).choice is None
    assert resolve_weight_format("fp32", torch.device("cpu"), CpuFeatures("DEFAULT", False, "", False)).note is None


def test_cuda_keeps_its_dtype_weights_and_says_the_formats_are_cpu_only() -> None:
    resolved = resolve_weight_format("int4", torch.device("cuda"))
    assert resolved.fmt == "fp32" and resolved.note is not None and "CPU-only" in resolved.note


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="engine.weights 'int3'"):
        resolve_weight_format("int3", torch.device("cpu"))  # type: ignore[arg-type]


def test_loading_says_the_fallback_at_start(target: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(formats.CpuFeatures, "detect", classmethod(lambda cls: cls("AVX2", False, "", False)))
    said: list[str] = []
    loaded = loaded_from_hf(target)
    assert apply_weights(loaded, "int4", wide=True, progress=said.append) == "fp32"
    assert said == ["engine.weights int4 falls back to fp32: torch's int4 CPU kernels need AVX-512 and this CPU runs "
                    "torch at AVX2, and ours needs AVX2 with FMA and F16C"]
    assert any(isinstance(m, torch.nn.Linear) for m in loaded.model.modules())


def test_loading_with_auto_says_which_format_it_picked(target: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    real = formats.CpuFeatures.detect()
    monkeypatch.setattr(formats.CpuFeatures, "detect", classmethod(lambda cls: cls("AVX512", True, real.qgemm,
                                                                                 real.bf16_gemm)))
    said: list[str] = []
    # A model built in memory has no file to keep: its fp32 weights (the shipped GGUF's int4:
    # tests/integration/test_engine_quant_default_model.py).
    assert apply_weights(loaded_from_hf(target), "auto", wide=False, progress=said.append) == "fp32"
    assert said == ["engine.weights auto: fp32, the format that keeps its in-memory weights exactly"]


def test_without_onednns_bf16_gemm_int4_keeps_no_wide_copy_and_says_so(
    target: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = formats.CpuFeatures.detect()
    if not real.qgemm:
        pytest.skip("our int4/int8 kernel does not run here")
    monkeypatch.setattr(formats.CpuFeatures, "detect", classmethod(lambda cls: cls("AVX2", False, real.qgemm, False)))
    said: list[str] = []
    loaded = loaded_from_hf(target)
    assert apply_weights(loaded, "int4", wide=True, progress=said.append) == "int4"
    assert "no bf16 copy for wide steps (oneDNN's bf16 GEMM does not run on this CPU): every step runs int4" in said
    linears = [m for m in loaded.model.modules() if isinstance(m, QuantizedLinear)]
    assert linears and all(m.wide is None for m in linears)
