"""Which weight format a device runs: `engine.weights` resolved against the CPU's instructions.

int4 and int8 run on our kernel (engine/fused/qgemm.h: AVX512-VNNI, or qgemm_avx2.h: AVX2 with FMA
and F16C), else on torch's weight-only kernels, which are vectorised only with AVX-512 and need
AVX512_BF16 (or AMX-BF16) for their bf16 activations to be fast. bf16, and the bf16 copy int4/int8
keep for wide steps, run on oneDNN's bf16 GEMM, which refuses CPUs without AVX-512 (BW, VL, DQ):
there int4/int8 run every step on our kernel. A CPU that can run none of it gets fp32, with the reason
said at start. On CUDA the formats here do not apply (those kernels are CPU kernels): the weights stay
as engine.dtype loads them.

gguf serves a GGUF's tensors each as its type holds it (K-quants, Q5_0, Q6_K, Q8_0: engine/quant/gguf_repack.py),
on our kernel only: torch's would round their scales.

`auto` picks the fastest format that keeps the model's file exactly (engine/quant/source.py: int4 for
a GGUF of Q4_0/Q4_1 blocks, gguf for one of other types our kernel holds, bf16 for a bf16 checkpoint,
else fp32) where the CPU runs it. int4 is the
fastest measured (issue 17: one decode step's linears in 7-10 ms vs 15-16 ms int8 and 28-32 ms fp32
on the 2-core dev machine; on AVX2, bench/qgemm_bench.py: 3.6 ms against 31 ms fp32).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from engine.quant.source import WeightSource

WeightFormat = Literal["auto", "fp32", "bf16", "int8", "int4", "gguf"]
WEIGHT_FORMATS: tuple[WeightFormat, ...] = ("auto", "fp32", "bf16", "int8", "int4", "gguf")
QUANTIZED_FORMATS: tuple[WeightFormat, ...] = ("int8", "int4", "gguf")  # QuantizedLinear's (engine.quant.apply)
REDUCED_FORMATS: tuple[WeightFormat, ...] = ("bf16", *QUANTIZED_FORMATS)  # installed over fp32's linears


@dataclass(frozen=True)
class CpuFeatures:
    capability: str  # torch's dispatch level: "DEFAULT", "AVX2", "AVX512", ...
    bf16: bool  # AVX512_BF16 or AMX-BF16 advertised
    qgemm: str  # the instruction set our int4/int8 kernel runs on ("avx512vnni", "avx2"), "" where it cannot
    bf16_gemm: bool  # oneDNN packs bf16 weights here (the bf16 format, the int4/int8 copy for wide steps)

    @classmethod
    def detect(cls) -> CpuFeatures:
        from engine.quant.vnni import kernel_isa

        return cls(torch.backends.cpu.get_cpu_capability(), _has_bf16_flag(), kernel_isa(), onednn_bf16_error() is None)


def onednn_bf16_error() -> str | None:
    """Why oneDNN cannot pack a bf16 weight on this CPU at all, or None."""
    try:
        torch.ops.mkldnn._reorder_linear_weight(torch.zeros(8, 8, dtype=torch.bfloat16))
    except RuntimeError as exc:
        return str(exc).splitlines()[0]
    return None


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
    wide_copy: bool = True  # int4/int8 may keep a bf16 copy for wide steps (oneDNN's bf16 GEMM runs here)


def _missing(fmt: WeightFormat, cpu: CpuFeatures, kernel: str) -> str | None:
    """Why this CPU cannot run fmt fast, or None. kernel: engine.quant_kernel."""
    if fmt == "fp32" or (fmt in ("int4", "int8", "gguf") and kernel == "auto" and cpu.qgemm):
        return None
    if fmt == "gguf":
        why = "engine.quant_kernel is torch" if kernel != "auto" else "this CPU has neither AVX512-VNNI nor AVX2"
        return f"gguf's blocks run on our int4/int8 kernel only, and {why}"
    if "AVX512" not in cpu.capability:
        ours = ""
        if fmt != "bf16":
            ours = " (engine.quant_kernel: torch)" if kernel != "auto" else ", and ours needs AVX2 with FMA and F16C"
        return f"torch's {fmt} CPU kernels need AVX-512 and this CPU runs torch at {cpu.capability}{ours}"
    if not cpu.bf16:
        return f"{fmt} runs its matmuls on bf16 activations and this CPU has neither AVX512_BF16 nor AMX-BF16"
    return None


def _auto(source: WeightSource, cpu: CpuFeatures, kernel: str) -> ResolvedFormat:
    """auto, for a file some format other than fp32 keeps exactly (engine/quant/source.py): it, where this CPU runs
    it."""
    why = _missing(source.lossless, cpu, kernel)
    if why is not None:
        return ResolvedFormat("fp32", None, f"engine.weights auto: fp32 ({source.lossless} would keep {source.held} "
                              f"exactly, but {why})")
    return ResolvedFormat(source.lossless, None, f"engine.weights auto: {source.lossless}, the fastest format that "
                          f"keeps {source.held} exactly", cpu.bf16_gemm)


def resolve_weight_format(
    requested: WeightFormat,
    device: torch.device,
    cpu: CpuFeatures | None = None,
    *,
    kernel: str = "auto",
    source: WeightSource | None = None,
) -> ResolvedFormat:
    """The format to load, and a note when it is not the one asked for. kernel: engine.quant_kernel; source: what
    the model's file holds (auto keeps it exactly)."""
    if requested not in WEIGHT_FORMATS:
        raise ValueError(f"engine.weights {requested!r}: expected one of {', '.join(WEIGHT_FORMATS)}")
    if device.type != "cpu":
        if requested in ("auto", "fp32"):
            return ResolvedFormat("fp32", None)
        return ResolvedFormat("fp32", f"engine.weights {requested} is CPU-only; {device} keeps engine.dtype weights")
    if requested == "fp32":
        return ResolvedFormat("fp32", None)
    if requested == "gguf" and (source is None or not source.native):
        from engine.quant.source import NATIVE_TYPES

        held = source.held if source is not None else "the model's weights, which do not come from a GGUF file,"
        raise ValueError(f"engine.weights gguf: {held} are not all of the types it serves as they are "
                         f"({', '.join(sorted(NATIVE_TYPES))}); use auto, int4, int8, bf16 or fp32")
    if requested == "auto" and (source is None or source.lossless == "fp32"):  # no file (built in memory): fp32 too
        held = source.held if source is not None else "its in-memory weights"
        return ResolvedFormat("fp32", None, f"engine.weights auto: fp32, the format that keeps {held} exactly")
    features = cpu or CpuFeatures.detect()  # only here: on a fresh machine it builds our kernel (~1 min)
    if requested == "auto":
        assert source is not None
        return _auto(source, features, kernel)
    why = _missing(requested, features, kernel)
    if why is None:
        return ResolvedFormat(requested, None, None, features.bf16_gemm)
    return ResolvedFormat("fp32", f"engine.weights {requested} falls back to fp32: {why}")
