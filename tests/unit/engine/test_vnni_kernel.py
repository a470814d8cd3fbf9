"""Our int4/int8 kernel (engine/fused/qgemm.h, qgemm_avx2.h through engine/quant/vnni.py): it computes the dequantized
weight's matmul on the activations as it rounds them, gives a row the same bits whatever the row count and the
thread count (speculation stays lossless), and refuses malformed weights with the reason."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from _engine_factories import loaded_from_hf, threads, tiny_hf_model  # noqa: F401

from engine.quant import vnni
from engine.quant.apply import install_quantized
from engine.quant.linear import (
    DequantizedKernel,
    Int4Kernel,
    Int8Kernel,
    QuantizedEmbedding,
    QuantizedLinear,
    nbytes,
    quant_kernel,
)
from engine.quant.tensor import QuantizedTensor, quantize

pytestmark = pytest.mark.skipif(not vnni.available()[0], reason=vnni.available()[1])
# The kernel runs on AVX512-VNNI (qgemm.h) or AVX2 (qgemm_avx2.h), whichever the CPU has; every test here holds on
# either, and one compares the two where a CPU has both.

# decode, verification, batches, prefill pieces; 8 + 12 and 8 + 8 + 5 rows: a tile's passes
ROW_COUNTS = [1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 16, 20, 21, 33]
SHAPES = [(960, 576), (576, 1536), (200, 96)]  # the default model's qkv and down; outputs not a multiple of 16


def _q4_0(shape: tuple[int, int]) -> QuantizedTensor:
    """A Q4_0-like tensor (min -8 * scale: w = (q - 8) * scale), as GGUF's Q4_0 blocks load."""
    qt = quantize(torch.randn(shape) * 0.05, "int4")
    return QuantizedTensor("int4", qt.codes, qt.scales, -8 * qt.scales, qt.group_size)


def _q8_0(shape: tuple[int, int], low: int = -127, high: int = 127) -> QuantizedTensor:
    """int8 with an fp16 scale per block of 32, as GGUF's Q8_0 (and, codes -16..15, Q5_0) blocks load."""
    codes = torch.randint(low, high + 1, shape, dtype=torch.int8)
    scales = (torch.rand(shape[0], shape[1] // 32) * 1e-3).half().float()
    return QuantizedTensor("int8", codes, scales, None, 32)


def _k_scales(shape: tuple[int, int], group: int, levels: tuple[int, int]) -> torch.Tensor:
    """A K-quant's scales [out, in / group]: an fp16 super-block scale (per 256 inputs) times a sub-block integer,
    exact in fp32 and mostly not in fp16."""
    out, groups = shape[0], shape[1] // group
    d = (torch.rand(out, -(-groups // (256 // group))) * 1e-4).half().float().repeat_interleave(256 // group, dim=1)
    return d[:, :groups] * torch.randint(*levels, (out, groups)).float()


def _q4_k(shape: tuple[int, int]) -> QuantizedTensor:
    """int4 with fp32 scales and mins per 32, as GGUF's Q4_K blocks load."""
    codes = torch.randint(0, 16, shape, dtype=torch.uint8)
    return QuantizedTensor("int4", codes, _k_scales(shape, 32, (1, 64)), -_k_scales(shape, 32, (0, 64)), 32)


def _q5_k(shape: tuple[int, int]) -> QuantizedTensor:
    """int8 codes 0..31 with fp32 scales and mins per 32, as GGUF's Q5_K blocks load."""
    codes = torch.randint(0, 32, shape, dtype=torch.int8)
    return QuantizedTensor("int8", codes, _k_scales(shape, 32, (1, 64)), -_k_scales(shape, 32, (0, 64)), 32)


def _q5_1(shape: tuple[int, int]) -> QuantizedTensor:
    """int8 codes 0..31 with an fp16 scale and min per 32, as GGUF's Q5_1 blocks load."""
    codes = torch.randint(0, 32, shape, dtype=torch.int8)
    scales = (torch.rand(shape[0], shape[1] // 32) * 1e-3).half().float()
    return QuantizedTensor("int8", codes, scales, -(torch.rand_like(scales) * 1e-2).half().float(), 32)


def _q6_k(shape: tuple[int, int]) -> QuantizedTensor:
    """int8 codes -32..31 with an fp32 scale per 16, as GGUF's Q6_K blocks load."""
    codes = torch.randint(-32, 32, shape, dtype=torch.int8)
    return QuantizedTensor("int8", codes, _k_scales(shape, 16, (-128, 128)), None, 16)


def _tensors(shape: tuple[int, int]) -> dict[str, QuantizedTensor]:
    torch.manual_seed(0)
    w = torch.randn(shape) * 0.05
    half = (shape[0] // 2, shape[1])
    return {"int4 (Q4_1-like)": quantize(w, "int4"), "int4 (Q4_0-like)": _q4_0(shape), "int8": quantize(w, "int8"),
            "int8 (Q8_0-like)": _q8_0(shape), "int8 (Q5_0-like)": _q8_0(shape, -16, 15), "int4 (Q4_K)": _q4_k(shape),
            "int8 (Q5_K)": _q5_k(shape), "int8 (Q5_1)": _q5_1(shape), "int8 (Q6_K)": _q6_k(shape),
            "int8 (Q5_K fused beside Q8_0)": QuantizedTensor.cat([_q5_k(half), _q8_0((shape[0] - half[0], shape[1]))]),
            "int8 (Q4_K fused beside Q6_K)": QuantizedTensor.cat([_q4_k(half), _q6_k((shape[0] - half[0], shape[1]))])}


def test_each_kind_reads_the_scales_it_needs_exactly() -> None:
    kernels = {name: vnni.VnniKernel(qt) for name, qt in _tensors((64, 256)).items()}
    fp16 = {name for name, k in kernels.items() if k.scales.dtype == torch.float16}
    assert fp16 == {"int4 (Q4_1-like)", "int4 (Q4_0-like)", "int8 (Q8_0-like)", "int8 (Q5_0-like)"}
    assert kernels["int4 (Q4_0-like)"].mins is None  # the 8 comes off in integers
    assert kernels["int8 (Q5_1)"].mins is not None and kernels["int8 (Q5_1)"].mins.dtype == torch.float32
    halves = (64 // 16, 2 * 256 // 32, 16)  # [tiles, 2 per block, lanes]
    assert kernels["int8 (Q6_K)"].scales.shape == halves and kernels["int8 (Q6_K)"].mins is None
    fused = kernels["int8 (Q4_K fused beside Q6_K)"]
    assert fused.scales.shape == halves and fused.mins is not None and fused.mins.shape == halves


@pytest.mark.parametrize("shape", SHAPES)
def test_every_row_count_gives_the_dequantized_matmul_of_the_rounded_activations(shape: tuple[int, int]) -> None:
    for name, qt in _tensors(shape).items():
        kernel = vnni.VnniKernel(qt)
        for rows in ROW_COUNTS:
            x = torch.randn(rows, shape[1])
            want = F.linear(vnni.activations_as_used(x).double(), qt.dequantize().double()).float()
            got = kernel(x)
            assert got.shape == (rows, shape[0])
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=f"{name} at {rows} rows")


def test_a_rows_bits_do_not_depend_on_the_row_count_or_the_threads(threads: int) -> None:
    torch.manual_seed(3)
    x = torch.randn(max(ROW_COUNTS), 1536)
    for name, qt in _tensors((576, 1536)).items():
        kernel = vnni.VnniKernel(qt)
        alone = torch.cat([kernel(x[r : r + 1]) for r in range(len(x))])
        torch.set_num_threads(1)
        one_thread = kernel(x)
        torch.set_num_threads(threads)
        for rows in ROW_COUNTS:
            assert torch.equal(kernel(x[:rows]), alone[:rows]), f"{name} at {rows} rows, {threads} threads"
        assert torch.equal(one_thread, alone), name


def test_activation_rounding_ties_go_to_even_and_zero_blocks_stay_zero() -> None:
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 1], x[0, 2] = 127.0, 0.5, 1.5  # block 0's step is 1: 0.5 -> 0, 1.5 -> 2; block 1 all zeros
    used = vnni.activations_as_used(x)
    assert used[0, :3].tolist() == [127.0, 0.0, 2.0] and not used[0, 32:].any()
    qt = quantize(torch.eye(64), "int8")  # one scale a row: the identity exactly
    assert torch.equal(vnni.VnniKernel(qt)(x), used)


@pytest.mark.parametrize("blocked", [False, True], ids=["per-row scales", "Q8_0 blocks"])
def test_the_tied_embedding_reads_its_rows_from_the_heads_tiles_and_keeps_no_second_copy(blocked: bool) -> None:
    torch.manual_seed(4)
    table = _q8_0((200, 96)) if blocked else quantize(torch.randn(200, 96), "int8")
    head = vnni.VnniKernel(table)
    ids = torch.tensor([0, 15, 16, 199, 7])
    assert torch.equal(head.rows(ids), table.codes[ids])
    embedding = QuantizedEmbedding(table, torch.float32, tied=head)
    assert torch.equal(embedding(ids), table.rows(ids).dequantize())
    assert embedding.qt.codes.numel() == 0  # the codes live in the head's tiles only
    with pytest.raises(ValueError, match="4-bit rows"):
        vnni.VnniKernel(quantize(torch.randn(16, 64), "int4")).rows(ids)


def test_a_tied_quantized_model_keeps_its_head_codes_once() -> None:
    from engine.quant.apply import quantize_decoder

    model = loaded_from_hf(tiny_hf_model("qwen2")).model  # tied embeddings
    tensors = quantize_decoder(model, "int4")
    codes = tensors["embed_tokens"].codes.numel()
    install_quantized(model, tensors, wide=False)
    assert not tensors  # each original taken as it is installed: none held to the end
    head = model.head_kernel.narrow
    assert isinstance(head, vnni.VnniKernel) and model.embed_tokens.tied is head
    assert nbytes(model.embed_tokens.tensors()) < codes  # scales only, not the codes again


def test_engine_quant_kernel_torch_keeps_torchs_kernels_and_an_unknown_choice_is_refused() -> None:
    qt4, qt8 = quantize(torch.randn(32, 64), "int4"), quantize(torch.randn(32, 64), "int8")
    assert isinstance(quant_kernel(qt4, "torch"), Int4Kernel) and isinstance(quant_kernel(qt8, "torch"), Int8Kernel)
    assert isinstance(quant_kernel(qt4, "auto"), vnni.VnniKernel)
    assert isinstance(QuantizedLinear(qt8, None, wide=False).narrow, vnni.VnniKernel)
    assert vnni.chosen("torch") == (False, "int4/int8 kernel: torch's weight-only kernels (engine.quant_kernel: torch)")
    with pytest.raises(ValueError, match="engine.quant_kernel 'vnni': expected one of auto, torch"):
        vnni.chosen("vnni")


def test_q8_0_blocks_without_our_kernel_run_as_their_exact_dequantized_weight() -> None:
    qt = _q8_0((48, 64))
    kernel = quant_kernel(qt, "torch")  # torch's int8 kernel has one scale per row: it cannot take the blocks
    assert isinstance(kernel, DequantizedKernel) and torch.equal(kernel.weight, qt.dequantize())
    x = torch.randn(3, 64)
    assert torch.equal(kernel(x), F.linear(x, qt.dequantize()))


@pytest.mark.skipif(vnni.kernel_isa() != "avx512vnni", reason="compares AVX2 with AVX512-VNNI on a CPU that has both")
def test_avx2_gives_every_row_the_bits_of_avx512_vnni() -> None:
    torch.manual_seed(6)
    x = torch.randn(max(ROW_COUNTS), 1536)
    for name, qt in _tensors((576, 1536)).items():
        kernel = vnni.VnniKernel(qt)
        vnni_rows = kernel(x)
        try:
            assert torch.ops.specstream.qlinear_isa("avx2") == "avx2"
            avx2_rows = kernel(x)
        finally:
            torch.ops.specstream.qlinear_isa("avx512vnni")
        assert torch.equal(avx2_rows, vnni_rows), name


def test_malformed_weights_are_refused_naming_the_problem() -> None:
    k = vnni.VnniKernel(quantize(torch.randn(32, 64), "int4"))
    op = torch.ops.specstream.qlinear
    x = torch.randn(2, 64)
    with pytest.raises(RuntimeError, match="in_features 48 is not a multiple of 32"):
        op(torch.randn(2, 48), k.codes, k.scales, k.mins, 4)
    with pytest.raises(RuntimeError, match="bits must be 4 or 8, got 3"):
        op(x, k.codes, k.scales, k.mins, 3)
    with pytest.raises(RuntimeError, match="mins must be contiguous, of the scales' dtype and shape"):
        op(x, k.codes, k.scales.float(), k.mins, 4)
    with pytest.raises(RuntimeError, match="scales must be contiguous fp16 or fp32"):
        op(x, k.codes, k.scales.double(), k.mins, 4)
    with pytest.raises(RuntimeError, match="4-bit fp32 scales come with mins"):
        op(x, k.codes, k.scales.float(), None, 4)
    k8 = vnni.VnniKernel(_q5_1((32, 64)))  # 8-bit with mins: fp32 tables
    with pytest.raises(RuntimeError, match="8-bit mins come in fp32"):
        op(x, k8.codes, k8.scales.half(), k8.mins.half(), 8)
    with pytest.raises(RuntimeError, match="x must be \\[T, in\\] fp32"):
        op(x.double(), k.codes, k.scales, k.mins, 4)


@pytest.mark.parametrize("rows", [96, 40])
def test_8bit_tiles_packed_in_a_tensors_own_memory_are_the_copys_bits(
        rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vnni, "PACK_PIECE_ROWS", 32)  # several pieces, each read whole before it is written over
    codes = torch.randint(-128, 128, (rows, 64), dtype=torch.int8)
    copy = vnni.pack8(codes.clone())
    own = codes.clone()
    packed = vnni.pack8(own, in_place=True)
    assert torch.equal(packed, copy)
    # Whole tiles only: 40 rows need a padded tile, so they are packed in new memory and the codes are kept.
    assert (packed.data_ptr() == own.data_ptr()) == (rows % 16 == 0)
    assert rows % 16 == 0 or torch.equal(own, codes)
