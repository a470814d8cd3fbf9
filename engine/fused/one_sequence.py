"""A step of ONE sequence's decode or verification as one C++ call (engine/fused/one_sequence.cpp).

At batch 1 the eager decoder spent as long in Python and in dispatching ~5,500 small ops a
step as in its quantized linears (issue 17, docs/benchmarks.md). For the steps where that
matters (one sequence in the step, feeding 1 row, or 1 + k rows that attend like decodes,
all on the quantized kernel) the layers run in C++ with the same ops on the same views, so
each row gets the eager path's bits and speculation stays lossless against plain decoding.

Only what it was written for takes it: int4/int8 linears without biases, no q/k norms, SiLU,
no LoRA wrapper. Any other model or step runs the eager path, which stays the reference.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from engine.fused.build import load_ops
from engine.quant.linear import Int4Kernel, Int8Kernel, QuantizedLinear

if TYPE_CHECKING:
    from engine.model import AttentionMetadata, Decoder
    from engine.rotary import RopeStep

INT4, INT8 = 0, 1  # the C++ side's kernel codes


def _why_not(model: Decoder) -> str | None:
    """Why the model cannot take the fused step (None: it can)."""
    cfg = model.cfg
    if model.device.type != "cpu" or model.dtype != torch.float32:
        return f"the model runs in {model.dtype} on {model.device.type}, the fused step knows fp32 on CPU"
    if cfg.qkv_bias or cfg.o_bias or cfg.mlp_bias or cfg.qk_norm or cfg.hidden_act != "silu":
        return f"{cfg.model_type}'s layers (biases, q/k norms or activation) are not the fused step's"
    for i, layer in enumerate(model.layers):
        a, m = layer.self_attn, layer.mlp
        for lin in (a.qkv_proj, a.o_proj, m.gate_up_proj, m.down_proj):
            if not isinstance(lin, QuantizedLinear) or not isinstance(lin.narrow, (Int4Kernel, Int8Kernel)):
                return f"layer {i} has a {type(lin).__name__}, the fused step runs int4/int8 linears"
        if m.act is not F.silu:
            return f"layer {i}'s activation is not SiLU"
    return None


@dataclass
class OneSequenceStep:
    """The fused step's arguments that do not change between steps (the weights' tensors, the shapes)."""

    norms: list[torch.Tensor]  # 2 per layer, then the final norm
    wa: list[torch.Tensor]  # 4 linears per layer: the kernel's first tensor (codes)
    wb: list[torch.Tensor]  # ... and its second (scales)
    kinds: list[int]
    groups: list[int]
    outs: list[int]
    max_rows: int  # the widest step that runs the quantized kernel and attends row by row
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    eps: float

    @classmethod
    def build(cls, model: Decoder) -> tuple[OneSequenceStep | None, str]:
        """(the fused step, what was done) or (None, why not); builds the C++ op on first use."""
        why = _why_not(model)
        if why is not None:
            return None, why
        built = load_ops("one_sequence")
        if built.library is None:
            return None, built.why
        cfg = model.cfg
        step = cls([], [], [], [], [], [], 0, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim,
                   cfg.intermediate_size, model.norm.eps)  # fmt: skip
        # A step wider than a linear's quantized window runs its bf16 copy; more rows than rows_as_decodes
        # attend as one masked call: both stay eager.
        bounds = []
        for layer in model.layers:
            a, m = layer.self_attn, layer.mlp
            step.norms += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
            bounds.append(max(1, a.rows_as_decodes))
            for lin in (a.qkv_proj, a.o_proj, m.gate_up_proj, m.down_proj):
                step._add(lin)
                if lin.wide is not None:
                    bounds.append(lin.max_quant_rows)
        step.norms.append(model.norm.weight)
        step.max_rows = min(bounds)
        if step.max_rows < 1:
            return None, "every step runs the bf16 copy (kernel dispatch), not the quantized kernel"
        return step, f"fused one-sequence step for 1..{step.max_rows} rows ({built.why})"

    def _add(self, lin: QuantizedLinear) -> None:
        k = lin.narrow
        if isinstance(k, Int4Kernel):
            self.wa.append(k.packed), self.wb.append(k.scales_zeros), self.kinds.append(INT4)
            self.groups.append(k.group_size)
        else:
            self.wa.append(k.codes), self.wb.append(k.scales), self.kinds.append(INT8)
            self.groups.append(0)
        self.outs.append(lin.out_features)

    def applies(self, attn: AttentionMetadata, rows: int) -> bool:
        """One sequence feeding all the step's rows: a decode, or a verification of at most max_rows rows."""
        if len(attn.seqs) != 1 or rows > self.max_rows:
            return False
        s = attn.seqs[0]
        return rows == 1 or s.mask is not None  # several rows after a cached prefix attend like decodes

    def __call__(self, h: torch.Tensor, rope: RopeStep, attn: AttentionMetadata) -> torch.Tensor:
        """h [T, hidden] embedded rows -> final-normed hidden states [T, hidden]; writes the rows' KV."""
        s = attn.seqs[0]
        return torch.ops.specstream.one_sequence(
            h, rope.cos, rope.sin_rot, attn.slot_mapping, attn.kv_cache.kv, self.norms, self.wa, self.wb,
            self.kinds, self.groups, self.outs, self.num_heads, self.num_kv_heads, self.head_dim,
            self.intermediate, self.eps, s.kv_start, s.kv_len,
        )  # fmt: skip
