"""Which matmul kernel a CPU step runs, by its row count: measured on this CPU (auto) or fixed.

Two choices, both per linear layer and by the step's rows:
* fp32 weights: torch's default GEMM on the plain weight, or a oneDNN-prepacked copy
  (engine/packed_linear.py). The copy costs one more copy of the weights, so it is made
  only when some row count runs on it.
* int4/int8 weights: the weight-only quantized kernel, or the bf16 copy of the same
  weights for wider steps (engine/quant/linear.py). When no measured row count runs on
  the copy it is dropped.

`engine.kernel_dispatch: auto` decides from engine.kernel_calibration's timings on the
model's real linears; `fixed` keeps the thresholds measured once on the Intel dev machine
(fp32 packed for 4..48 rows, quantized kernel up to 9), for reproducible benchmarks and tests.
The LM head follows its layers' decision (it is not timed: one matrix, same kernels).

Exactness (54e26a1:docs/benchmarks.md, "lossless per format"): int4/int8 speculative text equals
plain text bit for bit only while all of one request's steps (a 1-row decode, a 1 + k-row
verification) run on one kernel. So the quantized window is either empty (every step on the
bf16 copy, which is row-count invariant: Bf16Kernel) or reaches 1 + max_draft_tokens rows; a
measured crossover in between is raised to 1 + max_draft_tokens, and the start line says so.
A step with prompt rows runs the bf16 copy whatever its row count (engine.quant.linear.StepKind):
a prompt's chunks are not its own (a prefix-cache hit prefills a short tail of a prompt another
request prefilled whole), and its K/V must have the same bits whichever chunk made them.
fp32 promises no such thing across kernels (plain and packed GEMMs round differently, which
the fixed 4..48 window already mixed); a window that covers every step of a request is, if
anything, more uniform.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.config import DispatchMode, EngineConfig
from engine.kernel_calibration import KernelPair, KernelTimings, cache_key, calibrated, measure, sample_layers
from engine.model import Decoder
from engine.packed_linear import PackedRows, PrepackedWeight, packing_available
from engine.quant.formats import QUANTIZED_FORMATS
from engine.quant.linear import ACT_DTYPE, MAX_QUANT_ROWS, QuantizedLinear, nbytes
from engine.quant.vnni import VnniKernel

FIXED_PACKED_ROWS = PackedRows(min_rows=4, max_rows=48)
FIXED_QUANT_ROWS = MAX_QUANT_ROWS
NOISY = "timings too noisy (a busy machine?): the fixed thresholds, measured again next start"
# Our kernel's rows do not depend on the step (torch's, with the bf16 copy, round a batch otherwise): when the
# timings cannot tell, the step stays exact. It beat the bf16 copy at every row count measured on the dev machine.
NOISY_OURS = ("timings too noisy (a busy machine?): our kernel for every step (exact in any batch), measured again "
              "next start")
SAVING = 0.03  # the packed fp32 copy must save at least this share of a step: it costs memory


@dataclass(frozen=True)
class QuantWindow:
    """Rows 1..max_rows run the quantized kernel, wider steps the bf16 copy; max_rows None: every step."""

    max_rows: int | None
    note: str = ""  # why it differs from the measured crossover


def packed_window(t: KernelTimings) -> PackedRows | None:
    """fp32: the row counts where the packed copy wins (the longest run of winning measured counts; a boundary
    between a winner and a loser is set half way), or None when it wins nowhere."""
    wins = [alt < base * (1.0 - SAVING) for base, alt in zip(t.base_ms, t.alt_ms)]
    best: tuple[int, int] | None = None  # (first, last) index of the longest run
    i = 0
    while i < len(wins):
        if not wins[i]:
            i += 1
            continue
        j = i
        while j + 1 < len(wins) and wins[j + 1]:
            j += 1
        if best is None or j - i > best[1] - best[0]:
            best = (i, j)
        i = j + 1
    if best is None:
        return None
    first, last = best
    lo = t.rows[0] if first == 0 else (t.rows[first - 1] + t.rows[first]) // 2 + 1
    hi = t.rows[-1] if last == len(wins) - 1 else (t.rows[last] + t.rows[last + 1]) // 2
    return PackedRows(min_rows=lo, max_rows=hi)


def quant_window(t: KernelTimings, request_rows: int) -> QuantWindow:
    """int4/int8: the quantized kernel up to the first measured row count where the bf16 copy is faster
    (ties go to the quantized kernel: it is the smaller copy). request_rows = 1 + max_draft_tokens."""
    n = next((i for i, (base, alt) in enumerate(zip(t.base_ms, t.alt_ms)) if alt < base), None)
    if n is None:
        return QuantWindow(None)
    measured = 0 if n == 0 else (t.rows[n - 1] + t.rows[n]) // 2
    if not 0 < measured < request_rows:
        return QuantWindow(measured)
    # One kernel for all of a request's steps: whichever costs less over the measured counts up to request_rows.
    span = [i for i, r in enumerate(t.rows) if r <= request_rows]
    quant_wins = sum(t.base_ms[i] for i in span) <= sum(t.alt_ms[i] for i in span)
    chosen = request_rows if quant_wins else 0
    why = (
        f"measured crossover at {measured} rows, set to {chosen} so that one request's decode and verification steps "
        f"(1..{request_rows} rows) share a kernel: speculative text stays equal to plain text"
    )
    return QuantWindow(chosen, why)


def _figures(t: KernelTimings, names: str) -> str:
    pairs = ", ".join(f"{r}: {b:.1f}/{a:.1f}" for r, b, a in zip(t.rows, t.base_ms, t.alt_ms))
    return f"ms per step {names} by rows {pairs}; {'cached' if t.cached else 'measured now'}"


def _timings(
    model: Decoder,
    fmt: str,
    kind: type[nn.Module],
    layer_bytes: Callable[[nn.Module], int],
    pair: Callable[[nn.Module], KernelPair | None],
    dtype: torch.dtype,
    cache_dir: Path,
) -> KernelTimings:
    """Both kernels of every `kind` linear, timed on the first layers whose `layer_bytes` pass the sample size."""
    layers = [[m for m in layer.modules() if type(m) is kind] for layer in model.layers]
    shapes = [(lin.out_features, lin.in_features) for layer in layers for lin in layer]

    def run() -> KernelTimings:
        n, scale = sample_layers([sum(layer_bytes(lin) for lin in layer) for layer in layers])
        pairs = [p for layer in layers[:n] for lin in layer if (p := pair(lin)) is not None]
        return measure(pairs, dtype, scale)

    return calibrated(cache_dir, cache_key(fmt, shapes), run)


def _fp32_pair(lin: nn.Module) -> KernelPair:
    # A packed copy of a timed layer only, dropped after: the model's own are made once the window is known.
    packed = PrepackedWeight(lin.weight, lin.bias, FIXED_PACKED_ROWS)
    return KernelPair(lin.in_features, packed.plain, packed.prepacked)


def _fp32_timings(model: Decoder, cache_dir: Path) -> KernelTimings:
    return _timings(model, "fp32", nn.Linear, lambda lin: lin.weight.nbytes, _fp32_pair, torch.float32, cache_dir)


def _quant_timings(model: Decoder, fmt: str, cache_dir: Path) -> KernelTimings:
    # Sized by the quantized kernel's bytes (the smaller copy): it too must be timed reading memory. Cached per
    # kernel (ours or torch's, engine.quant_kernel): their crossovers differ.
    linears = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    narrow = {getattr(m.narrow, "key", type(m.narrow).__name__) for m in linears}
    return _timings(
        model, "+".join([fmt, *sorted(narrow)]), QuantizedLinear, lambda lin: nbytes(lin.narrow.tensors()),
        lambda lin: None if not lin.widenable else KernelPair(lin.in_features, lin.narrow, lin.trial_wide()),
        ACT_DTYPE, cache_dir,
    )


def _dispatch_fp32(model: Decoder, mode: DispatchMode, cache_dir: Path) -> str:
    if mode == "fixed":
        rows: PackedRows | None = FIXED_PACKED_ROWS
        why = "engine.kernel_dispatch: fixed"
    else:
        t = _fp32_timings(model, cache_dir)
        rows, why = packed_window(t), _figures(t, "plain/prepacked")
        if t.noisy():
            rows, why = FIXED_PACKED_ROWS, f"{NOISY}; {why}"
    if rows is None:
        return f"kernel dispatch: fp32 plain weights for every step, no prepacked copy ({why})"
    model.prepack_for_cpu(rows)
    return f"kernel dispatch: fp32 prepacked for rows {rows.min_rows}..{rows.max_rows}, plain otherwise ({why})"


def _dispatch_quant(model: Decoder, fmt: str, mode: DispatchMode, request_rows: int, cache_dir: Path) -> str:
    if mode == "fixed":
        window, why = QuantWindow(FIXED_QUANT_ROWS), "engine.kernel_dispatch: fixed"
    else:
        t = _quant_timings(model, fmt, cache_dir)
        window = quant_window(t, request_rows)
        if t.noisy():
            ours = all(isinstance(m.narrow, VnniKernel) for m in model.modules() if isinstance(m, QuantizedLinear))
            window = QuantWindow(None, NOISY_OURS) if ours else QuantWindow(FIXED_QUANT_ROWS, NOISY)
        why = "; ".join(filter(None, [window.note, _figures(t, f"{fmt}/bf16")]))
    _settle_wide(model, keep=window.max_rows is not None)
    for m in model.modules():
        if isinstance(m, QuantizedLinear):
            if window.max_rows is None:
                m.wide = None  # no step runs on it: its memory back (every step then takes the quantized kernel)
            else:
                m.max_quant_rows = window.max_rows
    if window.max_rows is None:
        return f"kernel dispatch: {fmt} kernel for every step, no bf16 copy ({why})"
    if window.max_rows == 0:
        return f"kernel dispatch: {fmt} weights run every step on the bf16 copy ({why})"
    return f"kernel dispatch: {fmt} kernel for rows 1..{window.max_rows}, bf16 copy beyond ({why})"


def dispatch_kernels(
    model: Decoder, weight_format: str, config: EngineConfig, max_draft_tokens: int, cache_root: Path
) -> str | None:
    """Set up the model's row-count dispatch for its weight format (logged); returns the line said at start,
    or None where there is no choice to make (CUDA, bf16's single kernel, engine.prepack_weights off, no bf16
    copy on this CPU). Deferred bf16 copies (QuantizedLinear.defer_wide) are made here where a step runs on them.
    KernelTimings are cached under cache_root/calibration."""
    try:
        line = _dispatch(model, weight_format, config, max_draft_tokens, cache_root / "calibration")
    finally:
        _settle_wide(model, keep=True)  # no window decided (no choice to make): the copies as asked
    if line is not None:
        logging.getLogger(__name__).info(line)
    return line


def _dispatch(model: Decoder, weight_format: str, config: EngineConfig, max_draft_tokens: int,
              cache_dir: Path) -> str | None:
    mode = config.kernel_dispatch  # one of DispatchMode: EngineConfig refuses any other, naming the key
    if not config.prepack_weights or model.device.type != "cpu":
        return None
    if weight_format == "fp32" and packing_available(model.device, model.dtype):
        return _dispatch_fp32(model, mode, cache_dir)  # type: ignore[arg-type]
    if weight_format in QUANTIZED_FORMATS and any(isinstance(m, QuantizedLinear) and m.widenable
                                                 for m in model.modules()):
        # Without a bf16 copy (a CPU oneDNN's bf16 GEMM refuses) every step runs the quantized kernel: no choice.
        return _dispatch_quant(model, weight_format, mode, 1 + max_draft_tokens, cache_dir)  # type: ignore[arg-type]
    return None


def _settle_wide(model: Decoder, keep: bool) -> None:
    for m in model.modules():
        if isinstance(m, QuantizedLinear):
            m.settle_wide(keep)
