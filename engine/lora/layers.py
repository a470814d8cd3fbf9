"""The LoRA delta of a mixed batch: every row gets its own adapter's x A B, and the same bits in any batch.

Each decoder linear (fused qkv, o, fused gate_up, down) is wrapped by a
`LoRALinear` that keeps, per PEFT projection it covers (a "part" of its
output columns), the adapters' weights stacked by slot:

    a [n_slots, max_rank, in] (A^T per slot)   b [n_slots, max_rank, part_out]   ranks [n_slots]   slot 0 = zeros

A step's rows carry slot ids (`StepRows`). On a CPU in fp32 (where the engine's
C++ ops build) one call per linear, torch.ops.specstream.lora_add_
(engine/fused/lora_delta.h), adds to each row its own adapter's delta on that
adapter's weights alone (BGMV without copies: the row reads its slot's A and B
in place). Why not torch's GEMMs, as this did before: torch's fp32 GEMM rounds
a row by the shape of the whole call (on the dev machine other bits from 4 rows
on; and the columns are the step's active adapters x their largest rank), so an
adapter row's bits depended on the requests beside it. With int4/int8 weights,
whose kernel rounds a row alike in any batch, that was the one batch-dependent
step, and a mixed batch could give a request other greedy text than alone.
The row kernel sums each row in a fixed order of its own.

Elsewhere (no C++ ops, another device or dtype) the delta is the masked SGMV:
for the S slots active in the step and r, their largest rank,

    shrink = x [T, in] @ A [in, P*S*r]          one GEMM for every part and active adapter
    shrink *= onehot [T, 1, S, 1]               row t keeps only its own adapter's columns
    y[:, part] += shrink[:, p] [T, S*r] @ B_p [S*r, part_out]     one addmm per part

each row its own adapter's result, up to rounding that depends on the batch.
A and B_p (the active slots' weights, gathered for these GEMMs) are rebuilt
only when the active set or a slot's contents change. A step with no adapter
rows skips the delta entirely; prefill chunks, decodes and verification rows
take the same path.

The delta is added to whatever the wrapped module returns (plain, prepacked
or quantized linear), so every weight format serves adapters.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.fused.build import load_ops
from engine.lora.adapter import LoRAAdapter, projection_shapes
from engine.model import Decoder, UnsupportedModelError

# Our fused module (under each layer) -> the PEFT projections it holds, in output-column order.
FUSED: dict[str, tuple[str, ...]] = {
    "self_attn.qkv_proj": ("q_proj", "k_proj", "v_proj"),
    "self_attn.o_proj": ("o_proj",),
    "mlp.gate_up_proj": ("gate_proj", "up_proj"),
    "mlp.down_proj": ("down_proj",),
}


@dataclass(frozen=True)
class Part:
    projection: str  # PEFT's name, e.g. "k_proj"
    offset: int  # first output column of the fused linear it covers
    size: int


class StepRows:
    """The current step's row -> adapter slot assignment, shared by every LoRALinear of one model."""

    def __init__(self) -> None:
        self.slots: torch.Tensor | None = None  # [T] int64 on the CPU: each row's slot (the row kernel's)
        self.active: torch.Tensor | None = None  # [S] int64: slots with rows this step (0 excluded)
        self.onehot: torch.Tensor | None = None  # [T, 1, S, 1]: 1 where row t belongs to active slot s
        self.rank = 0  # the largest rank among the active slots (columns past it are zeros)
        self.num_rows = 0
        self.version = 0  # bumped whenever a slot's weights change (the wrappers' gathered copies go stale)
        self.key: tuple[object, ...] = ()  # (active slots, rank, version): what the gathered copies were built for

    def set(self, row_slots: list[int], ranks: dict[int, int], device: torch.device, dtype: torch.dtype) -> None:
        """row_slots: one slot per row of the flat batch (0 = base model)."""
        used = sorted({s for s in row_slots if s != 0})
        self.num_rows = len(row_slots)
        if not used:
            self.clear()
            return
        slots = torch.tensor(row_slots, dtype=torch.long)
        active = torch.tensor(used, dtype=torch.long)
        self.slots = slots
        self.active = active.to(device)
        self.onehot = (slots[:, None] == active[None, :]).to(device=device, dtype=dtype)[:, None, :, None]
        self.rank = max(ranks[s] for s in used)
        self.key = (tuple(used), self.rank, self.version)

    def clear(self) -> None:
        self.slots, self.active, self.onehot, self.rank = None, None, None, 0


def row_kernel_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether lora_add_ (engine/fused/lora_delta.h) serves weights of this device and dtype here: CPU fp32, with the
    engine's C++ ops built (once per process; cached on disk)."""
    return device.type == "cpu" and dtype == torch.float32 and load_ops("decoder_step").library is not None


class LoRALinear(nn.Module):
    """A decoder linear plus the per-row LoRA delta of the adapters in its slots."""

    def __init__(self, base: nn.Module, parts: list[Part], in_features: int, rows: StepRows) -> None:
        super().__init__()
        self.base = base
        self.parts = parts
        self.in_features = in_features
        self.rows = rows
        # Per part: a [n_slots, max_rank, in] (A^T), b [n_slots, max_rank, size], ranks [n_slots] int64 (the slot's
        # rank on this part, 0: no delta there); allocated on the first adapter.
        self.a: list[torch.Tensor] = []
        self.b: list[torch.Tensor] = []
        self.ranks: list[torch.Tensor] = []
        self.offsets = [p.offset for p in parts]
        self.row_kernel = False  # lora_add_ runs the delta (else the masked GEMMs); set by allocate
        # The active slots' weights laid out for the step's GEMMs, and the StepRows.key they were built for.
        self._a_act = torch.empty(0)  # [in, P * S * r]
        self._b_act: list[torch.Tensor] = []  # per part [S * r, size]
        self._key: tuple[object, ...] = ()

    def allocate(self, n_slots: int, max_rank: int, device: torch.device, dtype: torch.dtype) -> None:
        self.a = [torch.zeros(n_slots, max_rank, self.in_features, device=device, dtype=dtype) for _ in self.parts]
        self.b = [torch.zeros(n_slots, max_rank, p.size, device=device, dtype=dtype) for p in self.parts]
        self.ranks = [torch.zeros(n_slots, dtype=torch.long) for _ in self.parts]
        self.row_kernel = row_kernel_runs(device, dtype)

    def write(self, slot: int, layer: int, adapter: LoRAAdapter | None) -> None:
        """Put the adapter's weights of this layer into `slot` (None: zeros, the slot is free)."""
        for part, a, b, ranks in zip(self.parts, self.a, self.b, self.ranks):
            a[slot].zero_()
            b[slot].zero_()
            ranks[slot] = 0
            pair = adapter.weights.get((layer, part.projection)) if adapter is not None else None
            if pair is not None:
                a_t, b_t = pair  # [in, r], [r, size]
                r = a_t.shape[1]
                a[slot, :r] = a_t.t()
                b[slot, :r] = b_t
                ranks[slot] = r

    def _gather(self, active: torch.Tensor, r: int) -> None:
        a_act = torch.stack([a[active, :r].permute(2, 0, 1) for a in self.a], dim=1)  # [in, P, S, r]
        self._a_act = a_act.reshape(self.in_features, -1).contiguous()  # [in, P * S * r]
        self._b_act = [b[active, :r].reshape(-1, b.shape[-1]).contiguous() for b in self.b]  # [S * r, size]
        self._key = self.rows.key

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # [T, out]
        rows = self.rows
        if rows.active is None or rows.onehot is None:
            return y
        T = x.shape[0]
        if rows.num_rows != T:
            raise RuntimeError(f"LoRA rows were set for {rows.num_rows} rows, the forward has {T}")
        if self.row_kernel and rows.slots is not None and x.dtype == torch.float32:
            y = y if y.stride(1) == 1 else y.contiguous()
            torch.ops.specstream.lora_add_(y, x.contiguous(), rows.slots, self.a, self.b, self.ranks, self.offsets)
            return y
        return self._masked_delta(x, y)

    def _masked_delta(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """y + each row's delta through the masked GEMMs (where the row kernel does not run); in place."""
        rows = self.rows
        assert rows.active is not None and rows.onehot is not None
        T = x.shape[0]
        if self._key != rows.key:
            self._gather(rows.active, rows.rank)
        S, r = rows.active.shape[0], rows.rank
        shrink = (x.to(self._a_act.dtype) @ self._a_act).view(T, len(self.parts), S, r)  # [T, P, S, r]
        shrink.mul_(rows.onehot)  # each row keeps its own adapter's columns
        for p, (part, b_act) in enumerate(zip(self.parts, self._b_act)):
            # [T, S * r] @ [S * r, size], added in place to the part's columns.
            y[:, part.offset : part.offset + part.size].addmm_(shrink[:, p].reshape(T, S * r), b_act.to(y.dtype))
        return y


def install_lora_linears(model: Decoder, rows: StepRows) -> list[tuple[int, LoRALinear]]:
    """Wrap every decoder linear in a LoRALinear (after the weight format is applied); returns (layer, wrapper)."""
    if model.cfg.num_experts:
        raise UnsupportedModelError(f"{model.cfg.model_type}: LoRA adapters are not served for a mixture of experts "
                                    "yet: remove engine.lora.adapters")
    shapes = projection_shapes(model.cfg)
    wrapped: list[tuple[int, LoRALinear]] = []
    for i, layer in enumerate(model.layers):
        for path, projections in FUSED.items():
            parent_name, _, name = path.rpartition(".")
            parent = layer.get_submodule(parent_name)
            parts, offset = [], 0
            for proj in projections:
                size = shapes[proj][1]
                parts.append(Part(proj, offset, size))
                offset += size
            wrapper = LoRALinear(getattr(parent, name), parts, shapes[projections[0]][0], rows)
            setattr(parent, name, wrapper)
            wrapped.append((i, wrapper))
    return wrapped
