"""Linear layers that keep a second, oneDNN-prepacked copy of their weight for some step sizes on CPU.

Why: on CPU, torch's default fp32 GEMM (MKL) and oneDNN's prepacked GEMM win at
different row counts, and which wins where depends on the CPU. One machine's
example, the 2-core Intel dev machine with the default model's shapes (all 30
layers' linears, fp32, best of 6, ms per step):

    rows               1     2     4     9     16    32    64    128
    F.linear (MKL)   15.3  17.6  27.6  36.3  39.1  48.1  66.6  110.2
    oneDNN prepacked 19.7  20.4  21.6  26.0  30.4  42.7  69.3  108.8

there steps of 4..48 rows (speculative verification, small batches) ran faster
on the packed copy; on an AMD EPYC (AVX-512, no AMX) the packed copy won at every
row count, by 1.7x at one row. So the window is measured on the machine the engine
runs on (engine.kernel_calibration, engine.kernel_dispatch; `engine.kernel_dispatch:
fixed` keeps 4..48). The price is one more copy of the weights in memory, paid only
when some row count uses it. The weight is packed once at load; rows outside the
window never touch it.

`bench/engine_bench.py` measures the effect end to end (verification steps are
most of a speculating request's time).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class PackedRows:
    """Row counts (inclusive) that take the prepacked path (the default: the Intel machine's window)."""

    min_rows: int = 4
    max_rows: int = 48

    def __post_init__(self) -> None:
        if not 1 <= self.min_rows <= self.max_rows:
            raise ValueError(f"need 1 <= min_rows <= max_rows, got {self.min_rows}, {self.max_rows}")


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN prepacking applies to CPU weights in fp32 or bf16 when torch was built with oneDNN."""
    return device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and torch.backends.mkldnn.is_available()


class PrepackedWeight:
    """A weight [out, in] (+ bias) with its oneDNN-prepacked twin; `apply` picks by row count."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, rows: PackedRows) -> None:
        self.weight = weight
        self.bias = bias
        self.rows = rows
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous())

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out]."""
        if self.rows.min_rows <= x.shape[0] <= self.rows.max_rows and x.dim() == 2:
            return self.prepacked(x)
        return self.plain(x)

    def prepacked(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] -> [T, out] on the packed copy (engine.kernel_calibration times both paths)."""
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [], "")

    def plain(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class PrepackedLinear(nn.Module):
    """Drop-in for an inference-only nn.Linear: same parameters, plus the packed copy."""

    def __init__(self, linear: nn.Linear, rows: PackedRows) -> None:
        super().__init__()
        # The same Parameter objects, so state_dict() and .to() keep seeing them.
        self.weight = linear.weight
        self.bias = linear.bias
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self._packed = PrepackedWeight(self.weight, self.bias, rows)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._packed.apply(x)


def prepack_linears(module: nn.Module, rows: PackedRows) -> int:
    """Replace every nn.Linear under module by a PrepackedLinear; returns how many were replaced."""
    replaced = 0
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is nn.Linear:
                setattr(parent, name, PrepackedLinear(child, rows))
                replaced += 1
    return replaced
