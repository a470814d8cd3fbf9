"""A weight-only quantized matrix in a kernel-neutral form: codes + per-group (or per-row) scales.

Two producers fill it: GGUF repacking (engine.quant.gguf_repack, the file's own
codes carried over) and quantizing a float checkpoint once (`quantize`). Two
consumers read it: the CPU kernels (engine.quant.linear packs it into their
layout) and the embedding lookup. Everything is per output row, so fusing
q/k/v (concatenating rows) and llama.cpp's q/k row permutation apply to the
codes directly, never to dequantized floats.

Formats (w = the float weight the model means):
    int4: codes uint8 in 0..15, groups of `group_size` along in_features,
          w = (q - 8) * scale + zero     (torch's int4pack convention)
    int8: codes int8, w = q * scale, one scale per output row (group_size = in_features: what quantize
          makes, and all torch's _weight_int8pack_mm takes) or per block of 32 (GGUF's Q8_0, kept as it is
          for our kernel)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

QuantFormat = Literal["int4", "int8"]
INT4_GROUP = 32  # GGUF's block size; torch's int4 CPU kernel takes 32, 64, 128 or 256


@dataclass(frozen=True)
class QuantizedTensor:
    fmt: QuantFormat
    codes: torch.Tensor  # int4: uint8 [out, in] in 0..15; int8: int8 [out, in]
    scales: torch.Tensor  # int4: fp32 [out, in / group]; int8: fp32 [out] per row, or [out, in / group]
    zeros: torch.Tensor | None  # int4: fp32 [out, in / group]; int8: None
    group_size: int  # int4: elements per group; int8: in_features

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def dequantize(self) -> torch.Tensor:
        """The float weight [out, in] in fp32, exactly as the kernels' convention defines it."""
        out, inp = self.codes.shape
        if self.fmt == "int8" and not self.blocked:
            return self.codes.float() * self.scales[:, None]
        if self.fmt == "int8":
            q = self.codes.float().view(out, inp // self.group_size, self.group_size)  # [out, groups, group]
            return (q * self.scales[..., None]).view(out, inp)
        assert self.zeros is not None
        q = self.codes.float().view(out, inp // self.group_size, self.group_size)  # [out, groups, group]
        return ((q - 8) * self.scales[..., None] + self.zeros[..., None]).view(out, inp)

    @property
    def blocked(self) -> bool:
        """int8 with a scale per block (GGUF's Q8_0) rather than per row."""
        return self.fmt == "int8" and self.scales.dim() == 2

    def rows(self, index: torch.Tensor | slice) -> QuantizedTensor:
        """A row subset / permutation (every field is per output row)."""
        zeros = None if self.zeros is None else self.zeros[index]
        return QuantizedTensor(self.fmt, self.codes[index], self.scales[index], zeros, self.group_size)

    @staticmethod
    def cat(parts: list[QuantizedTensor]) -> QuantizedTensor:
        """Stack along output rows, e.g. q, k, v into one fused matrix. int8 blocks beside int8 rows (a GGUF mixing
        Q8_0 with other types) are quantized per row like the rest."""
        if any(p.blocked for p in parts) and not all(p.blocked for p in parts):
            parts = [quantize(p.dequantize(), "int8") if p.blocked else p for p in parts]
        first = parts[0]
        if any(p.fmt != first.fmt or p.group_size != first.group_size for p in parts):
            raise ValueError("cannot fuse quantized tensors of different formats or group sizes")
        zeros = None if first.zeros is None else torch.cat([p.zeros for p in parts if p.zeros is not None])
        codes = torch.cat([p.codes for p in parts])
        return QuantizedTensor(first.fmt, codes, torch.cat([p.scales for p in parts]), zeros, first.group_size)


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
    # Scale and minimum rounded to fp16, as GGUF's Q4_1 stores them (and our VNNI kernel reads them).
    lo, hi = g.amin(dim=-1).half().float(), g.amax(dim=-1)  # [out, groups]
    scales = ((hi - lo) / 15).half().float().clamp_min(2**-24)
    q = torch.round((g - lo[..., None]) / scales[..., None]).clamp(0, 15)
    # w = q * scale + lo = (q - 8) * scale + (lo + 8 * scale)
    zeros = lo + 8 * scales
    return QuantizedTensor("int4", q.to(torch.uint8).view(out, inp), scales, zeros, group_size)
