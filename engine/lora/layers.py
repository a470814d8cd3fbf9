"""The LoRA delta of a mixed batch: every row gets its own adapter's x A B, in one batched computation.

Each decoder linear (fused qkv, o, fused gate_up, down) is wrapped by a
`LoRALinear` that keeps, per PEFT projection it covers (a "part" of its
output columns), the adapters' weights stacked by slot:

    a [n_slots, in, max_rank]     b [n_slots, max_rank, part_out]     slot 0 = zeros (the base model)

A step's rows carry slot ids (`StepRows`). The delta takes the slots active in
the step (S of them, usually a handful) and computes, for all T rows at once,

    shrink = einsum(x [T, in], a[active] [S, in, r]) * onehot [T, S, 1]   # [T, S, r]
    delta  = einsum(shrink, b[active] [S, r, out])                          # [T, out]

i.e. SGMV with the segments expressed as a one-hot mask: two GEMMs whose
inner size is S * r (tens of columns), so prefill chunks and decode rows take
the same path. Why not gather a [T, in, r] copy of the weights per row (BGMV)
and bmm: on CPU that copies T times the adapter's weights every step, while
the masked GEMM reads each active adapter once; the masked-out columns are
exact zeros, so each row's result is its own adapter's (tests compare it to
a per-row loop). A step with no adapter rows skips the delta entirely.

The delta is added to whatever the wrapped module returns (plain, prepacked
or quantized linear), so every weight format serves adapters.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.lora.adapter import LoRAAdapter, projection_shapes
from engine.model import Decoder

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
        self.active: torch.Tensor | None = None  # [S] int64: slots with rows this step (0 excluded)
        self.onehot: torch.Tensor | None = None  # [T, S, 1]: 1 where row t belongs to active slot s
        self.rank = 0  # the largest rank among the active slots (columns past it are zeros)
        self.num_rows = 0

    def set(self, row_slots: list[int], ranks: dict[int, int], device: torch.device, dtype: torch.dtype) -> None:
        """row_slots: one slot per row of the flat batch (0 = base model)."""
        used = sorted({s for s in row_slots if s != 0})
        self.num_rows = len(row_slots)
        if not used:
            self.clear()
            return
        slots = torch.tensor(row_slots, dtype=torch.long)
        active = torch.tensor(used, dtype=torch.long)
        self.active = active.to(device)
        self.onehot = (slots[:, None] == active[None, :]).to(device=device, dtype=dtype)[:, :, None]  # [T, S, 1]
        self.rank = max(ranks[s] for s in used)

    def clear(self) -> None:
        self.active, self.onehot, self.rank = None, None, 0


class LoRALinear(nn.Module):
    """A decoder linear plus the per-row LoRA delta of the adapters in its slots."""

    def __init__(self, base: nn.Module, parts: list[Part], in_features: int, rows: StepRows) -> None:
        super().__init__()
        self.base = base
        self.parts = parts
        self.in_features = in_features
        self.rows = rows
        # Per part: a [n_slots, in, max_rank], b [n_slots, max_rank, size]; allocated on the first adapter.
        self.a: list[torch.Tensor] = []
        self.b: list[torch.Tensor] = []

    def allocate(self, n_slots: int, max_rank: int, device: torch.device, dtype: torch.dtype) -> None:
        self.a = [torch.zeros(n_slots, self.in_features, max_rank, device=device, dtype=dtype) for _ in self.parts]
        self.b = [torch.zeros(n_slots, max_rank, p.size, device=device, dtype=dtype) for p in self.parts]

    def write(self, slot: int, layer: int, adapter: LoRAAdapter | None) -> None:
        """Put the adapter's weights of this layer into `slot` (None: zeros, the slot is free)."""
        for part, a, b in zip(self.parts, self.a, self.b):
            a[slot].zero_()
            b[slot].zero_()
            pair = adapter.weights.get((layer, part.projection)) if adapter is not None else None
            if pair is not None:
                a_t, b_t = pair  # [in, r], [r, size]
                r = a_t.shape[1]
                a[slot, :, :r] = a_t
                b[slot, :r] = b_t

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)  # [T, out]
        rows = self.rows
        if rows.active is None or rows.onehot is None:
            return y
        if rows.num_rows != x.shape[0]:
            raise RuntimeError(f"LoRA rows were set for {rows.num_rows} rows, the forward has {x.shape[0]}")
        r = rows.rank
        xa = x.to(self.a[0].dtype)
        for part, a, b in zip(self.parts, self.a, self.b):
            shrink = torch.einsum("ti,sir->tsr", xa, a[rows.active, :, :r]) * rows.onehot  # [T, S, r]
            delta = torch.einsum("tsr,sro->to", shrink, b[rows.active, :r])  # [T, size]
            y[:, part.offset : part.offset + part.size] += delta.to(y.dtype)
        return y


def install_lora_linears(model: Decoder, rows: StepRows) -> list[tuple[int, LoRALinear]]:
    """Wrap every decoder linear in a LoRALinear (after the weight format is applied); returns (layer, wrapper)."""
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
