"""A weight-only quantized matrix in a kernel-neutral form: codes + per-group (or per-row) scales.

Two producers fill it: GGUF repacking (engine.quant.gguf_repack, the file's own
codes carried over) and quantizing a float checkpoint once (`quantize`). Two
consumers read it: the CPU kernels (engine.quant.linear packs it into their
layout) and the embedding lookup. Everything is per output row, so fusing
q/k/v (concatenating rows) and llama.cpp's q/k row permutation apply to the
codes directly, never to dequantized floats.

Formats (w = the float weight the model means), GGUF's own convention, so that a
file's blocks carry over with no arithmetic on their numbers:
    int4: codes uint8 in 0..15, groups of `group_size` (32) along in_features,
          w = q * scale + min     (Q4_0: min = -8 * scale; Q4_1, Q4_K: the file's)
    int8: codes int8, w = q * scale [+ min], one scale per output row (group_size = in_features: what
          quantize makes, and all torch's _weight_int8pack_mm takes), or per group of 32 (Q8_0, Q5_0; with
          mins Q5_1, Q5_K, codes 0..31) or 16 (Q6_K)
Scales and mins are fp32: a K-quant's are a super-block's fp16 times a sub-block's integer, exact in fp32.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import torch

QuantFormat = Literal["int4", "int8"]
INT4_GROUP = 32  # GGUF's block size; torch's int4 CPU kernel takes 32, 64, 128 or 256


@dataclass(frozen=True)
class QuantizedTensor:
    fmt: QuantFormat
    codes: torch.Tensor  # int4: uint8 [out, in] in 0..15; int8: int8 [out, in]
    scales: torch.Tensor  # fp32 [out, in / group]; int8 per row: fp32 [out]
    mins: torch.Tensor | None  # fp32 [out, in / group], or None (int4 always has them)
    group_size: int  # elements per group (in_features for int8 per row)

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def dequantize(self) -> torch.Tensor:
        """The float weight [out, in] in fp32, exactly as the kernels' convention defines it (GGUF's: q * d + m in
        one fp32 multiply and add)."""
        out, inp = self.codes.shape
        if not self.blocked:
            return self.codes.float() * self.scales[:, None]
        q = self.codes.float().view(out, inp // self.group_size, self.group_size)  # [out, groups, group]
        w = q * self.scales[..., None]
        return (w if self.mins is None else w + self.mins[..., None]).view(out, inp)

    @property
    def blocked(self) -> bool:
        """Scales per group (int4 always; int8 from GGUF's blocks) rather than per row."""
        return self.scales.dim() == 2

    def rows(self, index: torch.Tensor | slice) -> QuantizedTensor:
        """A row subset / permutation (every field is per output row)."""
        mins = None if self.mins is None else self.mins[index]
        return QuantizedTensor(self.fmt, self.codes[index], self.scales[index], mins, self.group_size)

    def as_groups_of(self, group_size: int) -> QuantizedTensor:
        """The same weights in smaller groups (each scale and min repeated): exact."""
        if group_size == self.group_size:
            return self
        if not self.blocked or self.group_size % group_size:
            raise ValueError(f"groups of {self.group_size} do not split into groups of {group_size}")
        n = self.group_size // group_size
        mins = None if self.mins is None else self.mins.repeat_interleave(n, dim=1)
        return QuantizedTensor(self.fmt, self.codes, self.scales.repeat_interleave(n, dim=1), mins, group_size)

    def as_int8(self) -> QuantizedTensor:
        """int4 codes as int8 ones, exact: a Q4_0-like min of -8 * scale as codes q - 8 without mins, else the same
        codes (0..15 fits), scales and mins."""
        if self.fmt == "int8":
            return self
        assert self.mins is not None
        if torch.equal(self.mins, -8 * self.scales):
            return QuantizedTensor("int8", self.codes.to(torch.int8) - 8, self.scales, None, self.group_size)
        return QuantizedTensor("int8", self.codes.to(torch.int8), self.scales, self.mins, self.group_size)

    def with_mins(self) -> QuantizedTensor:
        """Zero mins where there are none (w unchanged): exact."""
        return self if self.mins is not None else dataclasses.replace(self, mins=torch.zeros_like(self.scales))

    @staticmethod
    def cat(parts: list[QuantizedTensor]) -> QuantizedTensor:
        """Stack along output rows, e.g. q, k, v into one fused matrix. Blocked parts of different kinds (a GGUF
        mixing types) are first brought to one kind that holds them all exactly (int8, the smallest group, mins where
        any part has them); int8 blocks beside int8 rows are quantized again per row, like the rows."""
        if any(p.blocked for p in parts) and not all(p.blocked for p in parts):
            parts = [quantize(p.dequantize(), "int8") if p.blocked else p for p in parts]
        elif parts[0].blocked:
            if len({p.fmt for p in parts}) > 1:
                parts = [p.as_int8() for p in parts]
            group = min(p.group_size for p in parts)
            parts = [p.as_groups_of(group) for p in parts]
            if any(p.mins is not None for p in parts):
                parts = [p.with_mins() for p in parts]
        first = parts[0]
        mins = None if first.mins is None else torch.cat([p.mins for p in parts if p.mins is not None])
        codes = torch.cat([p.codes for p in parts])
        return QuantizedTensor(first.fmt, codes, torch.cat([p.scales for p in parts]), mins, first.group_size)


def quantize(weight: torch.Tensor, fmt: QuantFormat, group_size: int = INT4_GROUP) -> QuantizedTensor:
    """Round-to-nearest weight-only quantization of a float [out, in] matrix.

    int4: asymmetric per group (min/max, like GGUF's Q4_1); int8: symmetric per row.
    """
    w = weight.detach().float()
    out, inp = w.shape
    if fmt == "int8":
        scales = w.abs().amax(dim=1).clamp_min(1e-12) / 127  # [out]
        codes = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
        return QuantizedTensor("int8", codes, scales, None, inp)
    if inp % group_size:
        raise ValueError(f"in_features {inp} is not a multiple of the int4 group size {group_size}")
    g = w.view(out, inp // group_size, group_size)  # [out, groups, group]
    # Scale and minimum rounded to fp16, as GGUF's Q4_1 stores them (and our kernel reads them, in 20 bytes a block).
    lo, hi = g.amin(dim=-1).half().float(), g.amax(dim=-1)  # [out, groups]
    scales = ((hi - lo) / 15).half().float().clamp_min(2**-24)
    q = torch.round((g - lo[..., None]) / scales[..., None]).clamp(0, 15)
    return QuantizedTensor("int4", q.to(torch.uint8).view(out, inp), scales, lo, group_size)  # w = q * scale + lo
