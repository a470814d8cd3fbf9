"""Our int4 / int8 CPU kernel (engine/fused/qgemm.h, and qgemm_avx2.h on CPUs without AVX512-VNNI): int8
activations, exact integer dot products, the same bits on either instruction set.

torch's weight-only kernels dequantize each weight to bf16 in their inner loop: at one row they
are memory bound, but a verification step of 9 rows costs ~4x a decode, and int8 loses to the
bf16 copy from 3 rows on (54e26a1:docs/benchmarks.md). qgemm.h quantizes each activation row to int8
blocks of 32, as llama.cpp does against its Q4_0/Q8_0 weights, and sums codes with AVX-512
VNNI, reading each weight once for a tile of rows. Each row's output depends on that row
alone, so a decode and a verification row round alike and speculation stays lossless in any
batch.

Here: the weights' packing into qgemm.h's tiles of 16 outputs (see its header comment), and the
kernel object QuantizedLinear runs. The numbers are the QuantizedTensor's own, w = q * scale [+ min]:
scales and mins per block of 32 in fp16 where fp16 holds them exactly (GGUF's Q4_0, Q4_1, Q5_0, Q8_0
blocks; a Q4_0-like min of -8 * scale is taken off in integers instead), else in fp32 (K-quants' sub-block
scales); 8-bit also per half block (Q6_K, fp32) or one fp32 scale per output.
The activations are the kernel's: int8 blocks of 32 (activations_as_used gives them in fp32).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

import torch
import torch.nn.functional as F

from engine.fused.build import load_ops
from engine.quant.tensor import QuantizedTensor

BLOCK = 32  # inputs per activation scale (and per int4 weight scale)
LANES = 16  # outputs per tile


_ISA_NAMES = {"avx512vnni": "AVX512-VNNI, engine/fused/qgemm.h", "avx2": "AVX2, engine/fused/qgemm_avx2.h"}

QuantKernel = Literal["auto", "torch"]
QUANT_KERNELS: tuple[str, ...] = get_args(QuantKernel)


def available() -> tuple[bool, str]:
    """(whether qlinear runs here, which kernel runs int4/int8 weights and why)."""
    built = load_ops("decoder_step")
    if built.library is None:
        return False, f"torch's weight-only kernels ({built.why})"
    isa = kernel_isa()
    if not isa:
        return False, "torch's weight-only kernels (this CPU has neither AVX512-VNNI nor AVX2 for ours)"
    return True, f"our int8-activation kernel ({_ISA_NAMES[isa]})"


def kernel_isa() -> str:
    """The instruction set our kernel runs on here: "avx512vnni", "avx2", or "" (not built, or neither)."""
    return torch.ops.specstream.qlinear_isa() if load_ops("decoder_step").library is not None else ""


def chosen(choice: str) -> tuple[bool, str]:
    """engine.quant_kernel resolved on this machine: (ours, the line to say at start)."""
    if choice not in QUANT_KERNELS:
        raise ValueError(f"engine.quant_kernel {choice!r}: expected one of {', '.join(QUANT_KERNELS)}")
    if choice == "torch":
        return False, "int4/int8 kernel: torch's weight-only kernels (engine.quant_kernel: torch)"
    ours, why = available()
    return ours, f"int4/int8 kernel: {why}"


def takes(qt: QuantizedTensor) -> bool:
    """Whether the kernel's layout holds this tensor: in_features a multiple of 32, int4 in groups of 32, int8 per
    row or in groups of 32 or 16."""
    if qt.shape[1] % BLOCK:
        return False
    if qt.fmt == "int4":
        return qt.group_size == BLOCK and qt.mins is not None
    return not qt.blocked or qt.group_size in (BLOCK, BLOCK // 2)


def fits(qt: QuantizedTensor) -> bool:
    """Whether the kernel runs here and takes this tensor."""
    return takes(qt) and available()[0]


def activations_as_used(x: torch.Tensor) -> torch.Tensor:
    """The activations [T, in] the kernel multiplies, in fp32: each block of 32 rounded to steps of
    max|x| / 127 (ties to even), as quantize_row in qgemm.h does; for references in tests and benchmarks."""
    blocks = x.float().view(x.shape[0], -1, BLOCK)  # [T, in / 32, 32]
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    # 127 / amax as one IEEE division, as the kernel does it (a scalar over a tensor is amax.reciprocal() * 127 in
    # torch: an ulp off now and then, which turns near-ties of the rounding the other way).
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    return (torch.round(blocks * inv) * (amax / 127.0)).view_as(x)


def _tiles(codes: torch.Tensor) -> torch.Tensor:
    """codes [out, in] -> [out / 16, blocks, 8, 16, 4]: per tile and block, vector k's lane j holds output j's codes
    for inputs 4k .. 4k + 3 of the block (outputs padded to a tile with code 0)."""
    out, inp = codes.shape
    padded = F.pad(codes, (0, 0, 0, -out % LANES))
    return padded.view(-1, LANES, inp // BLOCK, 8, 4).permute(0, 2, 3, 1, 4)


# Rows packed per piece: a piece's temporaries (the widened codes, the padding, the permuted copy) stay a few MB
# even for the 262k-row LM head of a tied embedding, where whole-tensor ones were several times its 178 MB.
PACK_PIECE_ROWS = 4096


def _packed(codes: torch.Tensor, bytes_per_tile: int, pack_tiles: Callable[[torch.Tensor], torch.Tensor],
            packed: torch.Tensor | None = None) -> torch.Tensor:
    """codes [out, in] -> [out / 16, bytes_per_tile], packed PACK_PIECE_ROWS rows at a time (a multiple of 16).
    packed: where to write them; it may be codes' own memory, as each piece is read whole before it is written."""
    out = codes.shape[0]
    if packed is None:
        packed = torch.empty(-(-out // LANES), bytes_per_tile, dtype=torch.uint8)
    for r0 in range(0, out, PACK_PIECE_ROWS):
        piece = pack_tiles(codes[r0 : r0 + PACK_PIECE_ROWS])
        packed[r0 // LANES : r0 // LANES + piece.shape[0]] = piece.reshape(piece.shape[0], -1)
    return packed


def pack8(codes: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """int8 codes [out, in] -> qgemm.h's 8-bit tiles [out / 16, in / 32 * 512] of the codes offset to 0..255.
    in_place: in codes' own memory where the tiles fit it exactly (whole tiles, contiguous), so that a large
    tensor is never held twice; codes then hold the tiles (the caller gives them up)."""

    def tiles(rows: torch.Tensor) -> torch.Tensor:
        return _tiles((rows.to(torch.int16) + 128).to(torch.uint8))

    width = codes.shape[1] // BLOCK * 512
    fits = in_place and codes.shape[0] % LANES == 0 and codes.is_contiguous()
    own = codes.view(torch.uint8).view(codes.shape[0] // LANES, width) if fits else None
    return _packed(codes, width, tiles, own)


def pack4(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [out, in] in 0..15 -> qgemm.h's 4-bit tiles [out / 16, in / 32 * 256]: vector k (0..3) in the
    low nibbles, vector k + 4 in the high ones."""

    def tiles(rows: torch.Tensor) -> torch.Tensor:
        t = _tiles(rows)
        return t[:, :, :4] | (t[:, :, 4:] << 4)  # [tiles, blocks, 4, 16, 4]

    return _packed(codes, codes.shape[1] // BLOCK * 256, tiles)


def pack_block_scales(scales: torch.Tensor, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """[out, groups] -> [out / 16, groups, 16] in dtype (padding outputs get 0); groups of 16 make [out / 16, blocks,
    2, 16], a block's two halves."""
    padded = F.pad(scales.float(), (0, 0, 0, -scales.shape[0] % LANES))
    return padded.view(-1, LANES, scales.shape[1]).transpose(1, 2).to(dtype).contiguous()


def _fp16_exact(*tables: torch.Tensor | None) -> bool:
    return all(t is None or torch.equal(t.half().float(), t) for t in tables)


def _pack_scales(qt: QuantizedTensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The tensor's scales and mins in the kernel's layout (qlinear_add in decoder_step.cpp reads which kind from it):
    fp16 where that is exact (the 4-bit Q4_0-like min -8 * scale left to the kernel's integers), else fp32 (8-bit
    mins always: Q5_1's fp16 d and m too)."""
    out = qt.shape[0]
    if not qt.blocked:  # 8-bit per row: fp32 [out]
        return F.pad(qt.scales.float(), (0, -out % LANES)).contiguous(), None
    if qt.group_size < BLOCK:  # 8-bit halves (Q6_K): fp32 [tiles, blocks, 2, 16]
        mins = None if qt.mins is None else pack_block_scales(qt.mins, torch.float32)
        return pack_block_scales(qt.scales, torch.float32), mins
    mins = qt.mins
    if qt.fmt == "int4" and mins is not None and torch.equal(mins, -8 * qt.scales) and _fp16_exact(qt.scales):
        mins = None  # Q4_0-like: the kernel takes the 8 off in integers
    if _fp16_exact(qt.scales, mins) and (mins is None or qt.fmt == "int4"):
        return pack_block_scales(qt.scales), None if mins is None else pack_block_scales(mins)
    mins = torch.zeros_like(qt.scales) if mins is None else mins  # fp32 block scales come with mins
    return pack_block_scales(qt.scales, torch.float32), pack_block_scales(mins, torch.float32)


class VnniKernel:
    """QuantizedLinear's narrow kernel on qgemm.h: fp32 activations in and out (quantized to int8 inside)."""

    act_dtype = torch.float32

    def __init__(self, qt: QuantizedTensor, consume: bool = False) -> None:
        """consume: qt's codes are not read again by anyone, and 8-bit tiles may be packed in their memory."""
        out, inp = qt.shape
        library = load_ops("decoder_step").library
        if library is None:
            raise RuntimeError(f"the VNNI kernel is not built: {load_ops('decoder_step').why}")
        self.key = f"vnni@{library.parent.name}"  # the build (sources, flags, compiler): calibration caches by it
        if inp % BLOCK:
            raise ValueError(f"the VNNI kernel needs in_features a multiple of {BLOCK}, got {inp}")
        self.bits = 4 if qt.fmt == "int4" else 8
        self.out_features = out
        if not takes(qt):
            raise ValueError(f"the VNNI kernel's int4 groups are {BLOCK} inputs (with mins), its int8 groups {BLOCK} "
                             f"or {BLOCK // 2}, got {qt.fmt} in groups of {qt.group_size}")
        if self.bits == 4:
            self.codes = pack4(qt.codes)
        else:
            self.codes = pack8(qt.codes, in_place=consume)
            i = torch.arange(inp)  # rows(): where input i of a tile's lane 0 sits (+ 4 bytes per lane)
            self._columns = (i // BLOCK) * 512 + (i % BLOCK // 4) * 64 + i % 4
        self.scales, self.mins = _pack_scales(qt)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out] fp32."""
        y = torch.ops.specstream.qlinear(x.float(), self.codes, self.scales, self.mins, self.bits)
        return y if y.shape[1] == self.out_features else y[:, : self.out_features]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """8-bit: the int8 codes [len(ids), in] of output rows ids, read back from the tiles."""
        if self.bits != 8:
            raise ValueError("rows() reads 8-bit codes back; 4-bit rows are not kept in a readable layout")
        index = self._columns[None, :] + 4 * (ids % LANES)[:, None]
        return (self.codes[ids // LANES].gather(1, index).to(torch.int16) - 128).to(torch.int8)

    def tensors(self) -> list[torch.Tensor]:
        return [self.codes, self.scales] + ([] if self.mins is None else [self.mins])
