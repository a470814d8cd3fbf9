"""The decoder layers of an engine step as one C++ call (engine/fused/decoder_step.cpp).

At batch 1 the eager decoder spent as long in Python and in dispatching ~5,500 small ops a
step as in its quantized linears, and a batch adds a Python loop over its sequences in every
layer (issue 17, 54e26a1:docs/benchmarks.md). Here the layers run in C++ with the eager path's ops on
the same views and the same kernel per row count, so each row gets the eager path's bits and
speculation stays lossless against plain decoding. Embedding, rotary factors and the LM head
stay in Python: a few ops a step.

Only what it was written for takes it: an fp32 CPU model whose linears are int4/int8/gguf (with or
without their bf16 copy) or bf16, with or without biases (Qwen2) and q/k norms (Qwen3), with SiLU
or Gemma's GeGLU, sandwich norms scaling by (1 + w), sliding-window layers with their own RoPE base and
Gemma 2's soft-capped attention scores, without experts or a LoRA wrapper (`_why_not` says which).
Every attention plan is the layers' own (Attention.plan: a windowed layer's rows and bands).
Anything else runs the eager path, which stays the reference.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from engine.fused.build import load_ops
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
SILU, GELU_TANH = 0, 1  # ... and activation codes


def _layer_linears(layer: nn.Module) -> tuple[nn.Module, ...]:
    """The four linears of a decoder layer, in the order the C++ step takes them."""
    a, m = layer.self_attn, layer.mlp
    return a.qkv_proj, a.o_proj, m.gate_up_proj, m.down_proj


def _activation(act: object) -> int | None:
    """The C++ code of an MLP's activation (F.silu, or transformers' GELUTanh as Gemma's gelu_pytorch_tanh), or
    None."""
    if act is F.silu:
        return SILU
    inner = getattr(act, "act", None)  # GELUTanh keeps F.gelu with approximate="tanh" as its act
    if getattr(inner, "func", None) is F.gelu and getattr(inner, "keywords", {}) == {"approximate": "tanh"}:
        return GELU_TANH
    return None


def _norms(layer: nn.Module) -> list[nn.Module]:
    """A layer's norms in the C++ step's order (Gemma's sandwich: four; else two)."""
    names = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
    return [getattr(layer, n) for n in names if hasattr(layer, n)]


def _norm_weight(norm: nn.Module) -> torch.Tensor:
    """What the C++ step scales by: the weight, or Gemma's (offset + w), computed as RMSNorm._offset_norm does."""
    return norm.weight.float() + norm.offset if norm.offset else norm.weight


def _why_not(model: Decoder) -> str | None:
    """Why the model cannot take the fused step (None: it can)."""
    cfg = model.cfg
    if model.device.type != "cpu" or model.dtype != torch.float32:
        return f"the model runs in {model.dtype} on {model.device.type}; the fused step knows fp32 on CPU"
    if cfg.num_experts:
        return f"{cfg.model_type}'s experts are not the fused step's"
    if len({w for w in cfg.layer_windows if w is not None}) > 1:
        return f"{cfg.model_type}'s layers have windows of several sizes"
    windowed = tuple(w is not None for w in cfg.layer_windows)
    if cfg.local_rope_layers and cfg.local_rope_layers != windowed:  # the step rotates the windowed layers by it
        return f"{cfg.model_type}'s layers with their own RoPE base are not its windowed ones"
    for i, layer in enumerate(model.layers):
        for lin in _layer_linears(layer):
            if not isinstance(lin, (QuantizedLinear, Bf16Linear)):
                return f"layer {i} has a {type(lin).__name__}; the fused step runs int4, int8 and bf16 linears"
            if isinstance(lin, QuantizedLinear) and isinstance(lin.narrow, DequantizedKernel):
                return f"layer {i}'s int8 blocks run dequantized (our kernel does not run here)"
        if _activation(layer.mlp.act) is None:
            return f"layer {i}'s activation ({cfg.hidden_act}) is not the fused step's (SiLU, GELU tanh)"
    return None


@dataclass
class FusedDecoderStep:
    """What the C++ step takes that does not change between steps: the weights' tensors and the shapes."""

    norms: list[torch.Tensor] = field(default_factory=list)  # 2 per layer (Gemma's sandwich: 4), then the final norm
    qk_norms: list[torch.Tensor] = field(default_factory=list)  # q's and k's per layer (Qwen3, Gemma 3), or none
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
    attn_scale: float | None = None  # SDPA's softmax scale (Attention.scale; None: 1 / sqrt(head_dim))
    attn_softcap: float | None = None  # Gemma 2's cap on the attention scores (engine.softcap_attention), or None
    sandwich: bool = False  # Gemma's layers: a norm after attention and on each side of the MLP
    act: int = SILU
    local_layers: list[int] = field(default_factory=list)  # 1 per sliding-window layer, or none
    global_attn: nn.Module | None = None  # an unwindowed layer's Attention: its plan is every such layer's
    local_attn: nn.Module | None = None  # a windowed layer's Attention, likewise
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
                   fast_norm=model.norm.kernel is not None, attn_scale=model.layers[0].self_attn.scale,
                   attn_softcap=cfg.attn_softcap,
                   sandwich=cfg.sandwich_norms,
                   act=_activation(model.layers[0].mlp.act) or SILU)  # fmt: skip
        norms = [n for layer in model.layers for n in (*_norms(layer), layer.self_attn.q_norm, layer.self_attn.k_norm)
                 if n is not None]
        if any((n.kernel is not None) != step.fast_norm for n in norms):
            return None, "the layers' norms run different kernels (RMSNorm.kernel)"
        for layer in model.layers:
            a = layer.self_attn
            if a.rows_as_decodes != step.rows_as_decodes or (a.row_attention is not None) != step.row_kernel:
                return None, "the layers attend verification rows differently (rows_as_decodes, row_attention)"
            step.norms += [_norm_weight(n) for n in _norms(layer)]
            if a.q_norm is not None and a.k_norm is not None:
                step.qk_norms += [_norm_weight(a.q_norm), _norm_weight(a.k_norm)]
            for lin in _layer_linears(layer):
                step._add(lin)
            if a.window is None:
                step.global_attn = step.global_attn or a
            else:
                step.local_attn = step.local_attn or a
        if step.local_attn is not None:
            step.local_layers = [int(layer.self_attn.window is not None) for layer in model.layers]
        step.norms.append(_norm_weight(model.norm))
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

    def __call__(self, h: torch.Tensor, rope: RopeStep, attn: AttentionMetadata, local: RopeStep | None = None
                 ) -> torch.Tensor:
        """h [T, hidden] embedded rows -> final-normed hidden states [T, hidden]; writes the rows' KV. local: the
        sliding layers' own rotary factors (Gemma 3's local base), or None (they rotate by rope)."""
        seqs, masks, routes = _plan(self.global_attn, attn)
        seqs_local, masks_local, routes_local = _plan(self.local_attn, attn)
        return torch.ops.specstream.decoder_step(
            h, rope.cos, rope.sin_rot, attn.slot_mapping, attn.kv_cache.kv, self.norms, self.qk_norms, self.wa, self.wb,
            self.wc, self.wide, self.biases, self.kinds, self.groups, self.outs, self.max_quant_rows, self.windows(),
            seqs, masks, routes, attn.holds_prompt_rows, self.fast_norm, self.num_heads,
            self.num_kv_heads, self.head_dim, self.intermediate, self.eps, self.attn_scale, self.sandwich, self.act,
            self.local_layers,
            None if local is None else local.cos, None if local is None else local.sin_rot, seqs_local, masks_local,
            routes_local, self.attn_softcap,
        )  # fmt: skip


def _plan(
    layer_attn: nn.Module | None, attn: AttentionMetadata
) -> tuple[list[int], list[torch.Tensor | None], list[int]]:
    """An attention plan as the C++ step takes it: the layer's own Attention.plan (a windowed layer narrows its
    rows' regions), flattened to (q_start, q_len, kv_start, kv_len) per piece, masks and route codes."""
    if layer_attn is None:
        return [], [], []
    plan = layer_attn.plan(attn.seqs, attn.kv_cache.kv.device)
    seqs = [v for s, _ in plan for v in (s.q_start, s.q_len, s.kv_start, s.kv_len)]
    return seqs, [s.mask for s, _ in plan], [int(route) for _, route in plan]
