"""Which weight format a device runs: `engine.weights` resolved against the CPU's instructions.

The weight-only kernels (torch's int4pack / int8pack CPU kernels and the
oneDNN bf16 GEMM) are vectorised only with AVX-512, and their bf16 activations
need AVX512_BF16 (or AMX-BF16) to be fast; elsewhere torch runs them as scalar
loops, slower than fp32. So a CPU without those instructions gets fp32, with
the reason said at start. On CUDA the formats here do not apply (those kernels
are CPU kernels): the weights stay as engine.dtype loads them.

`auto` picks the fastest format measured on a CPU that has the instructions:
int4 (issue 17: one decode step's linears in 7-10 ms vs 15-16 ms int8 and
28-32 ms fp32 on the 2-core dev machine).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

WeightFormat = Literal["auto", "fp32", "bf16", "int8", "int4"]
WEIGHT_FORMATS: tuple[WeightFormat, ...] = ("auto", "fp32", "bf16", "int8", "int4")
AUTO_CHOICE: WeightFormat = "int4"


@dataclass(frozen=True)
class CpuFeatures:
    capability: str  # torch's dispatch level: "DEFAULT", "AVX2", "AVX512", ...
    bf16: bool  # AVX512_BF16 or AMX-BF16 advertised

    @classmethod
    def detect(cls) -> CpuFeatures:
        return cls(torch.backends.cpu.get_cpu_capability(), _has_bf16_flag())


def _has_bf16_flag() -> bool:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no way to ask here, assume no
        return False
    flags = next((line.split() for line in text.splitlines() if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


@dataclass(frozen=True)
class ResolvedFormat:
    fmt: WeightFormat  # never "auto"
    note: str | None  # why it differs from what was asked, to say (and warn) at start
    choice: str | None = None  # what `auto` picked and why, to say at start (not a warning)


def _missing(fmt: WeightFormat, cpu: CpuFeatures) -> str | None:
    """Why this CPU cannot run fmt fast, or None."""
    if fmt == "fp32":
        return None
    if "AVX512" not in cpu.capability:
        return f"torch's {fmt} CPU kernels need AVX-512 and this CPU runs torch at {cpu.capability}"
    if not cpu.bf16:
        return f"{fmt} runs its matmuls on bf16 activations and this CPU has neither AVX512_BF16 nor AMX-BF16"
    return None


def resolve_weight_format(
    requested: WeightFormat, device: torch.device, cpu: CpuFeatures | None = None
) -> ResolvedFormat:
    """The format to load, and a note when it is not the one asked for."""
    if requested not in WEIGHT_FORMATS:
        raise ValueError(f"engine.weights {requested!r}: expected one of {', '.join(WEIGHT_FORMATS)}")
    if device.type != "cpu":
        if requested in ("auto", "fp32"):
            return ResolvedFormat("fp32", None)
        return ResolvedFormat("fp32", f"engine.weights {requested} is CPU-only; {device} keeps engine.dtype weights")
    features = cpu or CpuFeatures.detect()
    wanted: WeightFormat = AUTO_CHOICE if requested == "auto" else requested
    why = _missing(wanted, features)
    if why is None:
        picked = f"engine.weights auto: {wanted}, the fastest format measured on CPUs with AVX-512 and BF16"
        return ResolvedFormat(wanted, None, picked if requested == "auto" else None)
    return ResolvedFormat("fp32", f"engine.weights {requested} falls back to fp32: {why}")
