"""Weight-only quantized linear layers for CPU, with the kernel chosen by the step's row count.

Why two kernels: torch's CPU weight-only kernels read 4 or 8 bits per weight, so a
memory-bound decode step (few rows) gets faster with the bytes read, but they
dequantize inside the inner loop and lose to a plain bf16 GEMM once a step has
enough rows to be compute-bound. Measured on the 2-core dev machine (issue 17,
the default model's linears of one step, bf16 activations): int4 (group 64)
7-10 ms and int8 15-16 ms against 28-32 ms for fp32 at one row, both slower than
bf16 from 9 rows on; with fp32 activations they are 7-20x slower than fp32, so
activations are cast to bf16 for them.

The quantized kernel is ours where the CPU has AVX512-VNNI or AVX2 (engine/quant/vnni.py,
engine.quant_kernel: auto): int8 activations, exact integer sums, 2.7 ms for the default model's
layers at one row and 6.0 ms at nine on the same machine, faster than the bf16 copy at every row
count the start-up calibration measures there (1-128); elsewhere torch's. On a CPU without
oneDNN's bf16 GEMM (AVX2 only) there is no bf16 copy and every step runs ours. So a QuantizedLinear runs
    rows <= max_quant_rows : the quantized kernel (int4 / int8)
    rows >  max_quant_rows : a oneDNN-prepacked bf16 copy of the SAME dequantized
                             weight (verification of long drafts, batches, prefill)
    a step with prompt rows: the bf16 copy, whatever its row count (StepKind)
The wide copy costs 2 bytes per weight (4x an int4 weight); without it
(`wide=False`, engine.prepack_weights: false) every step runs the quantized kernel.
Why prompt rows never take the quantized kernel: a prompt's chunking is not the
prompt's own (a prefix-cache hit prefills only the tail after the cached blocks,
max_batched_tokens cuts chunks, other requests share the step), so with the row
count deciding, a prompt position's K/V came from either kernel, and a repeated
prompt read cached K/V that its own prefill would not have made: the same greedy
request gave other text the second time.
The window is measured per CPU at start (engine.kernel_dispatch; MAX_QUANT_ROWS is
the fixed fallback) and always covers a decode step and the verification of up to
max_draft_tokens drafts, or none of them, so a single sequence's speculative steps
and its plain steps run the same kernel (same numerics: text equal with and without
speculation). In a batch, a
verification step can pass 9 rows where the plain step stays under: the two
kernels round differently (bf16 weight vs in-kernel dequantization), so the text
is equal up to near ties there. Without the wide copy every step runs the
quantized kernel, whose rows are independent, and equality is exact in any batch;
the same holds for the `bf16` format, whose one kernel is made row-count
invariant (Bf16Kernel).
`bench/quant_crossover.py` measures the crossover per linear shape, in more detail than the start-up calibration.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from engine.quant.tensor import QuantizedTensor

if TYPE_CHECKING:
    from engine.quant.vnni import VnniKernel

ACT_DTYPE = torch.bfloat16  # what the CPU weight-only kernels are fast with
MAX_QUANT_ROWS = 9  # engine.kernel_dispatch: fixed (1 + the default max_draft_tokens, 8)


class Kernel(Protocol):
    act_dtype: torch.dtype  # what the kernel takes its activations in

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] in act_dtype -> [T, out] in act_dtype."""
        ...

    def tensors(self) -> list[torch.Tensor]:
        """What the kernel keeps resident."""
        ...


def nbytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of distinct storages (the tied head's codes are the embedding's: counted once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t.is_mkldnn:  # oneDNN-packed: no storage to share, its own bytes
            seen[id(t)] = t.numel() * t.element_size()
        else:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


class Int4Kernel:
    """torch's _weight_int4pack_mm_for_cpu: 4-bit codes packed two per byte, bf16 scale and zero per group."""

    act_dtype = ACT_DTYPE

    def __init__(self, qt: QuantizedTensor) -> None:
        if qt.fmt != "int4":
            raise ValueError(f"Int4Kernel needs int4 codes, got {qt.fmt}")
        self.group_size = qt.group_size
        self.out_features = qt.shape[0]
        assert qt.mins is not None
        # The packing wants a multiple of 16 output rows: pad with rows of weight 0 (scale 0, zero 0).
        pad = -self.out_features % 16
        codes = F.pad(qt.codes.to(torch.int32), (0, 0, 0, pad), value=8)  # [out + pad, in]
        # torch's convention: w = (q - 8) * scale + zero.
        scales, zeros = F.pad(qt.scales, (0, 0, 0, pad)), F.pad(qt.mins + 8 * qt.scales, (0, 0, 0, pad))
        # innerKTiles is ignored by the CPU packing; it is part of the op's signature.
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.contiguous(), 1)
        # [in / group, out + pad, 2]: the kernel's layout for (scale, zero).
        self.scales_zeros = torch.stack([scales.t(), zeros.t()], dim=-1).to(ACT_DTYPE).contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self.packed, self.group_size, self.scales_zeros)
        return y if y.shape[1] == self.out_features else y[:, : self.out_features]

    def tensors(self) -> list[torch.Tensor]:
        return [self.packed, self.scales_zeros]


class Int8Kernel:
    """torch's _weight_int8pack_mm: int8 codes [out, in], one bf16 scale per output row."""

    act_dtype = ACT_DTYPE

    def __init__(self, qt: QuantizedTensor) -> None:
        if qt.fmt != "int8":
            raise ValueError(f"Int8Kernel needs int8 codes, got {qt.fmt}")
        self.codes = qt.codes.contiguous()
        self.scales = qt.scales.to(ACT_DTYPE)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x, self.codes, self.scales)

    def tensors(self) -> list[torch.Tensor]:
        return [self.codes, self.scales]


class DequantizedKernel:
    """Int8 weights in GGUF's blocks where our kernel does not run (torch's int8 kernel has one scale per row):
    the dequantized weight in fp32, exact, at fp32's cost."""

    act_dtype = torch.float32

    def __init__(self, qt: QuantizedTensor) -> None:
        self.weight = qt.dequantize().contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight)

    def tensors(self) -> list[torch.Tensor]:
        return [self.weight]


PROBE_ROWS = 64  # the widest piece a step is cut into, whatever the CPU allows
_row_windows: dict[tuple[int, int, int], int] = {}  # (out, in, threads) -> invariant rows


def _gemm_call(packed: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """One oneDNN call; a single row runs as two (the copy's output dropped).

    On some CPUs a 1-row call takes another kernel that sums long reductions in another
    order; the weight is read once either way (`bench/quant_crossover.py`, "bf16 unpadded")."""
    if x.shape[0] == 1:
        return torch.ops.mkldnn._linear_pointwise(x.expand(2, -1).contiguous(), packed, None, "none", [], "")[:1]
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, None, "none", [], "")


def _measure_row_window(out_features: int, in_features: int) -> int:
    """The most rows W such that every call of 1..W rows gives each row what it gives alone.

    oneDNN picks its GEMM blocking by the row count, and with it the order in which a long
    reduction is summed: on the AVX512-BF16 Xeons we run on, calls of up to 32 rows agree
    bit for bit and wider ones differ by an ulp here and there. The blocking depends on the
    shape and the thread count, not on the values, so a random weight of the shape answers."""
    g = torch.Generator().manual_seed(0)
    packed = torch.ops.mkldnn._reorder_linear_weight(torch.randn(out_features, in_features, generator=g).to(ACT_DTYPE))
    x = torch.randn(PROBE_ROWS, in_features, generator=g).to(ACT_DTYPE)
    alone = torch.cat([_gemm_call(packed, x[r : r + 1]) for r in range(PROBE_ROWS)])  # [PROBE_ROWS, out]
    for rows in range(2, PROBE_ROWS + 1):
        if not torch.equal(_gemm_call(packed, x[:rows]), alone[:rows]):
            return rows - 1
    return PROBE_ROWS


def bf16_row_window(out_features: int, in_features: int) -> int:
    """bf16 GEMM rows a call may have for its rows to stay row-count invariant, measured once per shape and
    thread count in this process."""
    key = (out_features, in_features, torch.get_num_threads())
    if key not in _row_windows:
        with torch.inference_mode():
            _row_windows[key] = _measure_row_window(out_features, in_features)
    return _row_windows[key]


def bf16_piece_rows(model: nn.Module) -> int | None:
    """The fewest rows a bf16 GEMM call of the model's linears takes (Bf16Kernel runs a wider step as pieces):
    None where no linear has a bf16 kernel (fp32 weights, or int4/int8 without their bf16 copy)."""
    kernels = [k for m in model.modules() for k in (getattr(m, "wide", None), getattr(m, "kernel", None))
               if isinstance(k, Bf16Kernel)]
    return min((bf16_row_window(k.out_features, k.in_features) for k in kernels), default=None)


class Bf16Kernel:
    """A bf16 weight [out, in], oneDNN-prepacked (the packed copy is the only one kept).

    Row-count invariant: a row's output does not depend on how many rows the call has, so a
    plain decode (1 row), the verification of its drafts (1 + k rows) and a batch or prefill
    step give a row the same bits and seeded speculation cannot drift from plain decoding.
    oneDNN is so only within a window of row counts that depends on the CPU
    (bf16_row_window), so a wider step runs as pieces of at most that many rows; what the
    pieces cost in prefill is in 54e26a1:docs/benchmarks.md ("bf16 row-count invariance")."""

    act_dtype = ACT_DTYPE

    def __init__(self, weight: torch.Tensor) -> None:
        with torch.no_grad():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(ACT_DTYPE).contiguous())
        self.out_features, self.in_features = weight.shape
        bf16_row_window(self.out_features, self.in_features)  # measured at load, not in the first step

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        window = bf16_row_window(self.out_features, self.in_features)  # a dict lookup once measured
        if x.shape[0] <= window:
            return _gemm_call(self.packed, x)
        return torch.cat([_gemm_call(self.packed, piece) for piece in x.split(window)])

    def tensors(self) -> list[torch.Tensor]:
        return [self.packed]


def quant_kernel(qt: QuantizedTensor, choice: str = "auto", consume: bool = False) -> Kernel:
    """engine.quant_kernel auto: our kernel (engine/quant/vnni.py) where it runs and takes the tensor, else
    torch's (or, for int8 blocks torch's kernel cannot take, the dequantized weight); torch: the same without ours.
    consume: qt's codes are not read after this (our kernel may pack 8-bit tiles in their memory)."""
    from engine.quant import vnni

    if choice == "auto" and vnni.fits(qt):
        return vnni.VnniKernel(qt, consume)
    if qt.fmt == "int4":
        return Int4Kernel(qt)
    return DequantizedKernel(qt) if qt.blocked else Int8Kernel(qt)


@dataclasses.dataclass
class StepKind:
    """What the step being run holds, as far as a model's quantized linears choose their kernel by it: one object
    per model, shared by its linears (and its LM head), set once a step by Decoder.forward."""

    prompt: bool = False  # the step holds prompt rows: the bf16 copy for every row (see the module docstring)


class QuantizedLinear(nn.Module):
    """y = x W^T + b for an inference-only layer whose W is stored quantized.

    Takes and returns activations in the model's dtype (fp32 on CPU); only the
    matmul runs in bf16, so norms, rotary and attention keep their precision.
    """

    def __init__(
        self,
        qt: QuantizedTensor,
        bias: torch.Tensor | None,
        wide: bool = True,
        max_quant_rows: int = MAX_QUANT_ROWS,
        kernel: str = "auto",
        step: StepKind | None = None,  # the model's (engine.quant.apply); none: a step never holds prompt rows
        defer_wide: bool = False,
        reread: Callable[[], QuantizedTensor] | None = None,
    ) -> None:
        """defer_wide: the bf16 copy is made by settle_wide, once the kernel dispatch knows whether any step runs
        on it (the first copies of a process cost ~2 s on 2 cores, for nothing when every step stays narrow).
        reread: qt again (from the file it was read from), so that a deferred copy does not hold qt meanwhile; qt's
        codes are then the kernel's to pack in place (the caller reads them no more)."""
        super().__init__()
        self.step = step if step is not None else StepKind()
        self.out_features, self.in_features = qt.shape
        self.fmt = qt.fmt
        self.max_quant_rows = max_quant_rows
        self.wide: Kernel | None = Bf16Kernel(qt.dequantize()) if wide and not defer_wide else None
        self.narrow: Kernel = quant_kernel(qt, kernel, consume=reread is not None)
        # What settle_wide dequantizes, until it runs: qt itself, or how to read it again.
        self.source: QuantizedTensor | Callable[[], QuantizedTensor] | None = None
        if wide and defer_wide:
            self.source = qt if reread is None else reread
        self.register_buffer("bias", bias, persistent=False)

    @property
    def widenable(self) -> bool:
        return self.wide is not None or self.source is not None

    def trial_wide(self) -> Kernel | None:
        """The bf16 copy to time against the narrow kernel: the deferred one made now (dropped by the caller)."""
        return Bf16Kernel(self._source().dequantize()) if self.source is not None else self.wide

    def settle_wide(self, keep: bool) -> None:
        """Make the deferred bf16 copy (keep) or not; either way the source goes."""
        if self.source is not None and keep:
            self.wide = Bf16Kernel(self._source().dequantize())
        self.source = None

    def _source(self) -> QuantizedTensor:
        assert self.source is not None
        return self.source if isinstance(self.source, QuantizedTensor) else self.source()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, in] (model dtype) -> [T, out] (model dtype)."""
        kernel = self.kernel_for(x.shape[0])
        y = kernel(x.to(kernel.act_dtype)).to(x.dtype)
        return y if self.bias is None else y + self.bias

    def kernel_for(self, rows: int) -> Kernel:
        """The kernel a step of `rows` rows runs: the quantized one, or the bf16 copy beyond max_quant_rows or
        for a step with prompt rows."""
        if self.wide is None or (rows <= self.max_quant_rows and not self.step.prompt):
            return self.narrow
        return self.wide

    def tensors(self) -> list[torch.Tensor]:
        """This layer's weight copies: the narrow kernel's and the wide one (what stays resident)."""
        wide = [] if self.wide is None else self.wide.tensors()
        return self.narrow.tensors() + wide


class Bf16Linear(nn.Module):
    """The `bf16` weight format: one prepacked bf16 copy for every row count, fp32 activations outside."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.kernel = Bf16Kernel(weight)
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.kernel(x.to(ACT_DTYPE)).to(x.dtype)
        return y if self.bias is None else y + self.bias

    def tensors(self) -> list[torch.Tensor]:
        return self.kernel.tensors()


class QuantizedEmbedding(nn.Module):
    """Token embeddings kept quantized (they are the tied LM head's weight too); rows dequantized on lookup.

    tied: the tied head's VNNI kernel, whose packed codes are then the only copy kept (read back per row)."""

    def __init__(self, qt: QuantizedTensor, dtype: torch.dtype, tied: VnniKernel | None = None) -> None:
        super().__init__()
        self.tied = tied
        # Not a view of the codes (it would keep them alive): an empty tensor of their kind.
        self.qt = qt if tied is None else dataclasses.replace(qt, codes=qt.codes.new_empty(0, qt.shape[1]))
        self.dtype = dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] -> [T, hidden] in the model dtype."""
        if self.tied is None:
            return self.qt.rows(ids).dequantize().to(self.dtype)
        mins = None if self.qt.mins is None else self.qt.mins[ids]
        qt = QuantizedTensor(self.qt.fmt, self.tied.rows(ids), self.qt.scales[ids], mins, self.qt.group_size)
        return qt.dequantize().to(self.dtype)

    def tensors(self) -> list[torch.Tensor]:
        qt = self.qt
        return [qt.codes, qt.scales] + ([] if qt.mins is None else [qt.mins])

