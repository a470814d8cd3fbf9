"""The decoder layers of an engine step as one C++ call (engine/fused/decoder_step.cpp).

At batch 1 the eager decoder spent as long in Python and in dispatching ~5,500 small ops a
step as in its quantized linears, and a batch adds a Python loop over its sequences in every
layer (issue 17, 54e26a1:docs/benchmarks.md). Here the layers run in C++ with the eager path's ops on
the same views and the same kernel per row count, so each row gets the eager path's bits and
speculation stays lossless against plain decoding. Embedding, rotary factors and the LM head
stay in Python: a few ops a step.

Only what it was written for takes it: an fp32 CPU model whose linears are int4/int8 (with or
without their bf16 copy) or bf16, with or without biases (Qwen2) and q/k norms (Qwen3), with
SiLU, without experts, sandwich norms or a window narrower than max_model_len, and no LoRA
wrapper (`_why_not` says which).
Anything else runs the eager path, which stays the reference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.fused.build import load_ops
from engine.model import attention_route
from engine.quant.linear import (
    Bf16Kernel,
    Bf16Linear,
    DequantizedKernel,
    Int4Kernel,
    QuantizedLinear,
    bf16_row_window,
)
from engine.quant.vnni import VnniKernel

if TYPE_CHECKING:
    from engine.model import AttentionMetadata, Decoder
    from engine.rotary import RopeStep

INT4, INT8, BF16, Q4, Q8 = 0, 1, 2, 3, 4  # the C++ side's kernel codes


def _layer_linears(layer: nn.Module) -> tuple[nn.Module, ...]:
    """The four linears of a decoder layer, in the order the C++ step takes them."""
    a, m = layer.self_attn, layer.mlp
    return a.qkv_proj, a.o_proj, m.gate_up_proj, m.down_proj


def _why_not(model: Decoder) -> str | None:
    """Why the model cannot take the fused step (None: it can)."""
    cfg = model.cfg
    if model.device.type != "cpu" or model.dtype != torch.float32:
        return f"the model runs in {model.dtype} on {model.device.type}; the fused step knows fp32 on CPU"
    if cfg.num_experts:
        return f"{cfg.model_type}'s experts are not the fused step's"
    if cfg.sandwich_norms or cfg.embed_scale is not None:
        return f"{cfg.model_type}'s layers (sandwich norms, a scaled embedding) are not the fused step's"
    # A window no region outgrows (max_model_len within it) never narrows what a row sees.
    if any(w is not None and w < model.max_positions for w in cfg.layer_windows):
        return f"{cfg.model_type}'s sliding window is not the fused step's (max_model_len is past it)"
    if cfg.hidden_act != "silu":
        return f"{cfg.model_type}'s activation ({cfg.hidden_act}) is not the fused step's"
    for i, layer in enumerate(model.layers):
        for lin in _layer_linears(layer):
            if not isinstance(lin, (QuantizedLinear, Bf16Linear)):
                return f"layer {i} has a {type(lin).__name__}; the fused step runs int4, int8 and bf16 linears"
            if isinstance(lin, QuantizedLinear) and isinstance(lin.narrow, DequantizedKernel):
                return f"layer {i}'s int8 blocks run dequantized (our kernel does not run here)"
        if layer.mlp.act is not F.silu:
            return f"layer {i}'s activation is not SiLU"
    return None


@dataclass
class FusedDecoderStep:
    """What the C++ step takes that does not change between steps: the weights' tensors and the shapes."""

    norms: list[torch.Tensor] = field(default_factory=list)  # 2 per layer, then the final norm
    qk_norms: list[torch.Tensor] = field(default_factory=list)  # q's and k's per layer (Qwen3), or none
    wa: list[torch.Tensor] = field(default_factory=list)  # 4 linears per layer: the kernel's first tensor
    wb: list[torch.Tensor] = field(default_factory=list)  # ... its second (a bf16 kernel's: unused)
    wc: list[torch.Tensor | None] = field(default_factory=list)  # ... a third (our 4-bit kernel's mins), or None
    wide: list[torch.Tensor | None] = field(default_factory=list)  # the bf16 copy for wide steps
    biases: list[torch.Tensor | None] = field(default_factory=list)  # per linear (Qwen2's q/k/v), or None
    kinds: list[int] = field(default_factory=list)
    groups: list[int] = field(default_factory=list)
    outs: list[int] = field(default_factory=list)
    max_quant_rows: list[int] = field(default_factory=list)
    shapes: list[tuple[int, int]] = field(default_factory=list)  # (out, in): bf16 windows are per shape
    rows_as_decodes: int = 0
    row_kernel: bool = False  # the row and chunk kernels (Attention.row_attention / chunk_attention), as the layers
    fast_norm: bool = False  # the norms on step_ops.h's loop (RMSNorm.kernel), as the layers do
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    intermediate: int = 0
    eps: float = 0.0
    _windows: dict[int, list[int]] = field(default_factory=dict)  # torch threads -> bf16 rows per call

    @classmethod
    def build(cls, model: Decoder) -> tuple[FusedDecoderStep | None, str]:
        """(the fused step, what was done) or (None, why not); builds the C++ op on first use."""
        why = _why_not(model)
        if why is not None:
            return None, why
        built = load_ops("decoder_step")
        if built.library is None:
            return None, built.why
        cfg = model.cfg
        step = cls(num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                   intermediate=cfg.intermediate_size, eps=model.norm.eps,
                   rows_as_decodes=model.layers[0].self_attn.rows_as_decodes,
                   row_kernel=model.layers[0].self_attn.row_attention is not None,
                   fast_norm=model.norm.kernel is not None)  # fmt: skip
        norms = [n for layer in model.layers for n in (layer.input_layernorm, layer.post_attention_layernorm,
                                                       layer.self_attn.q_norm, layer.self_attn.k_norm) if n is not None]
        if any((n.kernel is not None) != step.fast_norm for n in norms):
            return None, "the layers' norms run different kernels (RMSNorm.kernel)"
        for layer in model.layers:
            a = layer.self_attn
            if a.rows_as_decodes != step.rows_as_decodes or (a.row_attention is not None) != step.row_kernel:
                return None, "the layers attend verification rows differently (rows_as_decodes, row_attention)"
            step.norms += [layer.input_layernorm.weight, layer.post_attention_layernorm.weight]
            if a.q_norm is not None and a.k_norm is not None:
                step.qk_norms += [a.q_norm.weight, a.k_norm.weight]
            for lin in _layer_linears(layer):
                step._add(lin)
        step.norms.append(model.norm.weight)
        step.windows()  # measured now, not in the first step
        return step, f"fused decoder step ({built.why})"

    def _add(self, lin: QuantizedLinear | Bf16Linear) -> None:
        if isinstance(lin, Bf16Linear):
            self._kernel(BF16, lin.kernel.packed, lin.kernel.packed, 0)
            self.wide.append(None)
            self.max_quant_rows.append(0)
        else:
            k = lin.narrow
            if isinstance(k, VnniKernel):
                self._kernel(Q4 if k.bits == 4 else Q8, k.codes, k.scales, 0, k.mins)
            elif isinstance(k, Int4Kernel):
                self._kernel(INT4, k.packed, k.scales_zeros, k.group_size)
            else:
                self._kernel(INT8, k.codes, k.scales, 0)
            # Without a bf16 copy every step runs the quantized kernel: the C++ side reads the bound only with a copy.
            self.wide.append(lin.wide.packed if isinstance(lin.wide, Bf16Kernel) else None)
            self.max_quant_rows.append(lin.max_quant_rows)
        self.biases.append(lin.bias)
        self.outs.append(lin.out_features)
        self.shapes.append((lin.out_features, lin.in_features))

    def _kernel(self, kind: int, a: torch.Tensor, b: torch.Tensor, group: int, c: torch.Tensor | None = None) -> None:
        self.kinds.append(kind)
        self.wa.append(a)
        self.wb.append(b)
        self.wc.append(c)
        self.groups.append(group)

    def windows(self) -> list[int]:
        """Per linear, the bf16 rows per call (Bf16Kernel's window) at this process's torch thread count."""
        threads = torch.get_num_threads()
        if threads not in self._windows:
            self._windows[threads] = [
                bf16_row_window(*shape) if kind == BF16 or wide is not None else 0
                for kind, wide, shape in zip(self.kinds, self.wide, self.shapes)
            ]
        return self._windows[threads]

    def __call__(self, h: torch.Tensor, rope: RopeStep, attn: AttentionMetadata) -> torch.Tensor:
        """h [T, hidden] embedded rows -> final-normed hidden states [T, hidden]; writes the rows' KV."""
        seqs = [v for s in attn.seqs for v in (s.q_start, s.q_len, s.kv_start, s.kv_len)]
        routes = [int(attention_route(s, self.rows_as_decodes, self.row_kernel)) for s in attn.seqs]
        return torch.ops.specstream.decoder_step(
            h, rope.cos, rope.sin_rot, attn.slot_mapping, attn.kv_cache.kv, self.norms, self.qk_norms, self.wa, self.wb,
            self.wc, self.wide, self.biases, self.kinds, self.groups, self.outs, self.max_quant_rows, self.windows(),
            seqs, [s.mask for s in attn.seqs], routes, attn.holds_prompt_rows, self.fast_norm, self.num_heads,
            self.num_kv_heads, self.head_dim, self.intermediate, self.eps,
        )  # fmt: skip
