"""Our int4 / int8 CPU kernel (engine/fused/qgemm.h): int8 activations, exact integer dot products.

torch's weight-only kernels dequantize each weight to bf16 in their inner loop: at one row they
are memory bound, but a verification step of 9 rows costs ~4x a decode, and int8 loses to the
bf16 copy from 3 rows on (docs/benchmarks.md). qgemm.h quantizes each activation row to int8
blocks of 32, as llama.cpp does against its Q4_0/Q8_0 weights, and sums codes with AVX-512
VNNI, reading each weight once for a tile of rows. Each row's output depends on that row
alone, so a decode and a verification row round alike and speculation stays lossless in any
batch.

Here: the weights' packing into qgemm.h's group layout (see its header comment), and the
kernel object QuantizedLinear runs. The numbers are the same QuantizedTensor's: 4-bit
w = q * scale + min with min = zero - 8 * scale, 8-bit w = (q + 128 - 128) * scale.
"""
from __future__ import annotations

from typing import Literal, get_args

import torch

from engine.fused.build import load_ops
from engine.quant.tensor import QuantizedTensor

BLOCK = 32  # inputs per activation scale (and per int4 weight scale)
GROUP = 16  # blocks per vector lane group


QuantKernel = Literal["auto", "torch"]
QUANT_KERNELS: tuple[str, ...] = get_args(QuantKernel)


def available() -> tuple[bool, str]:
    """(whether qlinear runs here, which kernel runs int4/int8 weights and why)."""
    built = load_ops("decoder_step")
    if built.library is None:
        return False, f"torch's weight-only kernels ({built.why})"
    if not torch.ops.specstream.qlinear_supported():
        return False, "torch's weight-only kernels (this CPU lacks AVX512-VNNI for ours)"
    return True, "our int8-activation VNNI kernel (engine/fused/qgemm.h)"


def chosen(choice: str) -> tuple[bool, str]:
    """engine.quant_kernel resolved on this machine: (ours, the line to say at start)."""
    if choice not in QUANT_KERNELS:
        raise ValueError(f"engine.quant_kernel {choice!r}: expected one of {', '.join(QUANT_KERNELS)}")
    if choice == "torch":
        return False, "int4/int8 kernel: torch's weight-only kernels (engine.quant_kernel: torch)"
    ours, why = available()
    return ours, f"int4/int8 kernel: {why}"


def fits(qt: QuantizedTensor) -> bool:
    """Whether the kernel runs here and takes this tensor (int4 in groups of 32, in_features a multiple of 32)."""
    if qt.shape[1] % BLOCK or (qt.fmt == "int4" and (qt.group_size != BLOCK or qt.zeros is None)):
        return False
    return available()[0]


def activations_as_used(x: torch.Tensor) -> torch.Tensor:
    """The activations [T, in] the kernel multiplies, in fp32: each block of 32 rounded to steps of
    max|x| / 127 (ties to even), as quantize_row in qgemm.h does; for references in tests and benchmarks."""
    blocks = x.float().view(x.shape[0], -1, BLOCK)  # [T, in / 32, 32]
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.round(blocks * inv) * (amax / 127.0)).view_as(x)


def group_order(in_features: int) -> torch.Tensor:
    """For each byte of a row in the 8-bit group layout, the input index it holds: packed = row[:, order]."""
    blocks = in_features // BLOCK
    parts = []
    for g0 in range(0, blocks, GROUP):
        b = min(GROUP, blocks - g0)
        # element 4k + j of block l at byte 4b*k + 4l + j: index [k, l, j] -> input (g0 + l) * 32 + 4k + j
        k, lane, j = torch.meshgrid(torch.arange(8), torch.arange(b), torch.arange(4), indexing="ij")
        parts.append(((g0 + lane) * BLOCK + 4 * k + j).reshape(-1))
    return torch.cat(parts)


def pack8(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [out, in] (already offset to 0..255) -> the 8-bit group layout [out, in]."""
    return codes[:, group_order(codes.shape[1])].contiguous()


def pack4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [out, in] in 0..15 -> [out, in / 2]: vector k's byte in the low nibble, vector k + 4's high."""
    out, inp = codes.shape
    ordered = codes[:, group_order(inp)]  # the 8-bit layout: per group 8 vectors of 4b bytes
    parts, start = [], 0
    for g0 in range(0, inp // BLOCK, GROUP):
        size = 32 * min(GROUP, inp // BLOCK - g0)  # the group's bytes in the 8-bit layout
        vectors = ordered[:, start : start + size].view(out, 2, size // 2)  # [out, low k = 0..3 | high k = 4..7, ...]
        parts.append(vectors[:, 0] | (vectors[:, 1] << 4))
        start += size
    return torch.cat(parts, dim=1).contiguous()


class VnniKernel:
    """QuantizedLinear's narrow kernel on qgemm.h: fp32 activations in and out (quantized to int8 inside)."""

    act_dtype = torch.float32

    def __init__(self, qt: QuantizedTensor) -> None:
        out, inp = qt.shape
        library = load_ops("decoder_step").library
        if library is None:
            raise RuntimeError(f"the VNNI kernel is not built: {load_ops('decoder_step').why}")
        self.key = f"vnni@{library.parent.name}"  # the build (sources, flags, compiler): calibration caches by it
        if inp % BLOCK:
            raise ValueError(f"the VNNI kernel needs in_features a multiple of {BLOCK}, got {inp}")
        self.bits = 4 if qt.fmt == "int4" else 8
        self.mins: torch.Tensor | None = None
        if self.bits == 4:
            if qt.group_size != BLOCK or qt.zeros is None:
                raise ValueError(f"the VNNI kernel's int4 groups are {BLOCK} inputs, got {qt.group_size}")
            self.codes = pack4(qt.codes)
            # fp16 as in GGUF's blocks (exact for their d and m); quantize() makes its scales fp16 too.
            self.scales = qt.scales.half().contiguous()
            if bool(qt.zeros.any()):  # Q4_1-like: w = q * scale + min; else Q4_0's (q - 8) * scale, the 8 in integers
                self.mins = (qt.zeros.float() - 8 * qt.scales.float()).half().contiguous()
        else:
            self.codes = pack8((qt.codes.to(torch.int16) + 128).to(torch.uint8))
            self.scales = qt.scales.float().contiguous()
            self._unpack = torch.argsort(group_order(inp))  # packed[:, _unpack] is the row in input order

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out] fp32."""
        return torch.ops.specstream.qlinear(x.float(), self.codes, self.scales, self.mins, self.bits)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """8-bit: the int8 codes [len(ids), in] of output rows ids, read back from the packed layout."""
        if self.bits != 8:
            raise ValueError("rows() reads 8-bit codes back; 4-bit rows are not kept in a readable layout")
        return (self.codes[ids][:, self._unpack].to(torch.int16) - 128).to(torch.int8)

    def tensors(self) -> list[torch.Tensor]:
        return [self.codes, self.scales] + ([] if self.mins is None else [self.mins])
