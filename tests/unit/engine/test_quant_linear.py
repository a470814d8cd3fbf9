"""Weight-only quantized linears: every row count a step can have gives the dequantized
weight's matmul (within bf16 activations' precision), the quantized kernel serves the few-row
steps and the bf16 copy the rest, and quantizing stays within half a step of the weights."""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from _engine_factories import make_engine, needs_bf16_gemm, threads, tiny_hf_model  # noqa: F401

from engine.quant import vnni
from engine.quant.linear import (
    MAX_QUANT_ROWS, Bf16Linear, Int4Kernel, Int8Kernel, QuantizedEmbedding, QuantizedLinear, StepKind,
    bf16_piece_rows, bf16_row_window, nbytes, quant_kernel,
)  # fmt: skip
from engine.quant.tensor import QuantizedTensor, quantize
from engine.quant.vnni import VnniKernel, activations_as_used

ROW_COUNTS = [*range(1, MAX_QUANT_ROWS + 3), 16, 33, 64, 129]  # decode, verification, batches, prefill


def _reference(qt: QuantizedTensor, x: torch.Tensor, bias: torch.Tensor | None, kernel: object) -> torch.Tensor:
    """The matmul the kernel stands for: the activations as the kernel rounds them (int8 blocks for ours, bf16 for
    torch's and the bf16 copy) times the dequantized weight, in fp32."""
    used = activations_as_used(x) if isinstance(kernel, VnniKernel) else x.bfloat16().float()
    return F.linear(used, qt.dequantize(), bias)


@pytest.mark.parametrize("fmt", ["int4", "int8"])
@pytest.mark.parametrize("wide", [False, pytest.param(True, marks=needs_bf16_gemm)])  # the wide copy is a bf16 GEMM
@pytest.mark.parametrize("shape", [(192, 576), (200, 96)])  # the default model's k/v rows; an output not a multiple of 64
def test_quantized_linear_matches_the_dequantized_matmul_at_every_row_count(
    fmt: str, wide: bool, shape: tuple[int, int]
) -> None:
    torch.manual_seed(0)
    qt = quantize(torch.randn(shape) * 0.05, fmt)  # type: ignore[arg-type]
    bias = torch.randn(shape[0])
    layer = QuantizedLinear(qt, bias, wide=wide)
    for rows in ROW_COUNTS:
        x = torch.randn(rows, shape[1])
        y = layer(x)
        assert y.dtype == torch.float32 and y.shape == (rows, shape[0])
        kernel = layer.kernel_for(rows)
        # torch's kernels round outputs to bf16 (~2^-8 of the largest output); ours sums exactly in fp32
        tol = 1e-4 if isinstance(kernel, VnniKernel) else 2e-2
        torch.testing.assert_close(y, _reference(qt, x, bias, kernel), rtol=tol, atol=tol, msg=f"{fmt} rows={rows}")


@needs_bf16_gemm
@pytest.mark.parametrize("fmt", ["bf16", "int4", "int8"])
def test_a_rows_output_does_not_depend_on_how_many_rows_the_step_has(fmt: str, threads: int) -> None:
    # The default model's down projection (in 1536): the shape where oneDNN's 1-row bf16 GEMM
    # sums in another order than its multi-row one. A plain decode step (1 row) and the
    # verification of its drafts (1 + k rows) must give a row bit-identical outputs, or seeded
    # speculation drifts from plain decoding.
    torch.manual_seed(2)
    w = torch.randn(576, 1536) * 0.05
    layer = Bf16Linear(w, None) if fmt == "bf16" else QuantizedLinear(quantize(w, fmt), None)  # type: ignore[arg-type]
    x = torch.randn(max(ROW_COUNTS), 1536)
    wide = layer(x)  # [129, 576]: the bf16 GEMM, whatever the format
    for rows in ROW_COUNTS:
        y = layer(x[:rows])
        if fmt == "bf16" or rows > MAX_QUANT_ROWS:
            assert torch.equal(y, wide[:rows]), f"{fmt} at {rows} rows"
        else:  # the quantized kernel: each row alone gives the same
            assert torch.equal(y, torch.cat([layer(x[r : r + 1]) for r in range(rows)])), f"{fmt} at {rows} rows"
    if fmt == "bf16":  # a plain decode of any of these rows
        for r in range(64):
            assert torch.equal(layer(x[r : r + 1]), wide[r : r + 1]), f"bf16 row {r} alone"


@needs_bf16_gemm
@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_few_row_steps_run_the_quantized_kernel_and_wider_steps_the_bf16_copy(fmt: str) -> None:
    layer = QuantizedLinear(quantize(torch.randn(64, 64), fmt), None, wide=True)  # type: ignore[arg-type]
    seen: list[str] = []

    class Seen:
        def __init__(self, kernel: Any, name: str) -> None:
            self.kernel, self.name, self.act_dtype = kernel, name, kernel.act_dtype

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(self.name)
            return self.kernel(x)

    layer.narrow, layer.wide = Seen(layer.narrow, "quant"), Seen(layer.wide, "bf16")
    for rows in (1, MAX_QUANT_ROWS, MAX_QUANT_ROWS + 1, 128):
        layer(torch.randn(rows, 64))
    assert seen == ["quant", "quant", "bf16", "bf16"]


@needs_bf16_gemm
@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_a_step_with_prompt_rows_runs_the_bf16_copy_at_every_row_count(fmt: str) -> None:
    # A prompt position's bits must not follow its chunk's length (a prefix-cache hit leaves a short tail).
    step = StepKind(prompt=True)
    qt = quantize(torch.randn(64, 64), fmt)  # type: ignore[arg-type]
    layer = QuantizedLinear(qt, None, wide=True, step=step)
    assert all(layer.kernel_for(rows) is layer.wide for rows in (1, MAX_QUANT_ROWS, 128))
    step.prompt = False  # the model's next step: decodes and verifications
    assert layer.kernel_for(MAX_QUANT_ROWS) is layer.narrow
    lean = QuantizedLinear(qt, None, wide=False, step=StepKind(prompt=True))  # no copy: the quantized kernel
    assert lean.kernel_for(128) is lean.narrow


@needs_bf16_gemm
def test_without_the_wide_copy_every_step_runs_the_quantized_kernel_and_keeps_a_quarter_of_bf16() -> None:
    qt = quantize(torch.randn(256, 512), "int4")
    lean = QuantizedLinear(qt, None, wide=False)
    full = QuantizedLinear(qt, None, wide=True)
    assert lean.wide is None
    bf16_bytes = 256 * 512 * 2
    # 4-bit codes + a bf16 (scale, zero) per 32 weights: 0.5 + 4/32 bytes per weight
    assert nbytes(lean.tensors()) == 256 * 512 // 2 + 256 * 512 // 32 * 4
    assert nbytes(full.tensors()) == nbytes(lean.tensors()) + bf16_bytes


@needs_bf16_gemm
def test_a_models_bf16_piece_is_its_narrowest_linears_window_and_none_without_a_bf16_kernel() -> None:
    qt = quantize(torch.randn(64, 64), "int4")
    mixed = torch.nn.Sequential(Bf16Linear(torch.randn(96, 64), None), QuantizedLinear(qt, None, wide=True))
    assert bf16_piece_rows(mixed) == min(bf16_row_window(96, 64), bf16_row_window(64, 64))
    assert bf16_piece_rows(torch.nn.Sequential(QuantizedLinear(qt, None, wide=False), torch.nn.Linear(4, 4))) is None
    llama = tiny_hf_model("llama")  # the engine bounds each step's drafts by it (engine.scheduler.draft_room)
    bf16 = make_engine(llama, weights="bf16")
    assert bf16.bf16_piece_rows == bf16_piece_rows(bf16.model) is not None
    assert make_engine(llama, weights="fp32").bf16_piece_rows is None


@pytest.mark.parametrize("fmt", ["int4", "int8"])
def test_quantizing_moves_each_weight_by_at_most_half_a_step(fmt: str) -> None:
    torch.manual_seed(1)
    w = torch.randn(48, 128)
    qt = quantize(w, fmt)  # type: ignore[arg-type]
    err = (qt.dequantize() - w).abs()
    if fmt == "int8":
        step = qt.scales[:, None].expand_as(w)
    else:
        step = qt.scales.repeat_interleave(qt.group_size, dim=1)
    assert bool((err <= step / 2 + 1e-6).all())


def test_fused_rows_and_permutations_act_on_the_codes_like_on_the_dequantized_weight() -> None:
    a, b = quantize(torch.randn(8, 64), "int4"), quantize(torch.randn(4, 64), "int4")
    fused = QuantizedTensor.cat([a, b])
    assert torch.equal(fused.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    index = torch.randperm(12)
    assert torch.equal(fused.rows(index).dequantize(), fused.dequantize()[index])


def test_int4_without_whole_groups_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of the int4 group size"):
        quantize(torch.randn(4, 48), "int4")


def test_quantized_embedding_looks_up_the_dequantized_rows() -> None:
    qt = quantize(torch.randn(300, 64), "int8")
    ids = torch.tensor([0, 299, 7, 7])
    torch.testing.assert_close(QuantizedEmbedding(qt, torch.float32)(ids), qt.dequantize()[ids], rtol=0, atol=0)


# Where our kernel cannot run or take a tensor (tests/unit/engine/test_vnni_kernel.py covers it where it can).


def test_tensors_the_kernel_cannot_take_go_to_torchs() -> None:
    odd = quantize(torch.randn(16, 64), "int4", group_size=64)  # groups of 64: not the kernel's blocks
    assert not vnni.fits(odd) and isinstance(quant_kernel(odd), Int4Kernel)


def test_a_cpu_without_our_kernel_gets_torchs_with_the_reason_said(monkeypatch: pytest.MonkeyPatch) -> None:
    why = "torch's weight-only kernels (this CPU lacks AVX512-VNNI for ours)"
    monkeypatch.setattr(vnni, "available", lambda: (False, why))
    qt4, qt8 = quantize(torch.randn(32, 64), "int4"), quantize(torch.randn(32, 64), "int8")
    assert isinstance(quant_kernel(qt4), Int4Kernel) and isinstance(quant_kernel(qt8), Int8Kernel)
    assert vnni.chosen("auto") == (False, f"int4/int8 kernel: {why}")
