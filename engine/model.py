"""Our decoder for the Llama family (llama, mistral, qwen2, qwen3, phi3, mixtral: engine.moe) and Gemma 2 and 3
(engine.gemma), on a flat varlen batch.

Why not run the HF module: HF attention wants a padded [B, S] batch and its own
cache objects. Here every step is ONE flat batch of T tokens from many
sequences (prefill chunks and decodes mixed), so all the linear layers run as
single [T, hidden] matmuls, which is where batching pays off on CPU; only
attention is per sequence, on views of that sequence's contiguous KV region.

Weights come from a loaded HF model (transformers does the file formats,
GGUF dequantisation and checkpoint quirks); we copy them, fusing q/k/v and
gate/up into one matmul each, and the HF module is dropped.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.gemma import (
    GEMMA_EXTRA_NORMS,
    SandwichDecoderLayer,
)
from engine.decoder_config import (  # noqa: F401  (importers name them from here too)
    PRE_FUSED_ARCHITECTURES,
    SUPPORTED_ARCHITECTURES,
    DecoderConfig,
    UnsupportedModelError,
    rope_inv_freq,
)
from engine.kv_cache import KVCache
from engine.meta_init import skeleton
from engine.moe import SparseMoE, Take, expert_tensors
from engine.packed_linear import PackedRows, PrepackedWeight, packing_available, prepack_linears
from engine.quant.linear import StepKind
from engine.rotary import RopeStep, apply_rotary_
from engine.sliding_window import needs_window, window_band, window_rows
from engine.softcap_attention import softcapped_sdpa

if TYPE_CHECKING:
    from engine.fused.decoder_step import FusedDecoderStep

@dataclass
class SeqAttention:
    """Where one sequence sits in the flat batch and in the arena."""

    q_start: int  # first row of this sequence in the flat batch
    q_len: int  # rows fed this step (prefill chunk, or 1 + number of drafts)
    kv_start: int  # arena slot of the sequence's position 0
    kv_len: int  # positions holding KV once this step's rows are written (prefix + q_len)
    # [q_len, kv_len] bool, True = may attend. None when q_len == 1 (the one query sees
    # everything) or when the rows are the whole sequence (q_len == kv_len: plain causal).
    mask: torch.Tensor | None = None
    # The rows are a prompt chunk (a prefill), not a decode's row or a verification's rows: with the C++ kernels
    # (Attention.route) each kind has its kernel whatever its row count, so a row's bits follow what it is.
    prompt: bool = False

    def __post_init__(self) -> None:
        if self.mask is None and self.q_len > 1 and self.q_len != self.kv_len:
            raise ValueError(f"{self.q_len} rows after a cached prefix need a mask (kv_len {self.kv_len})")


class Route(IntEnum):
    """How one sequence's rows attend (the fused step takes the same codes)."""

    SDPA = 0  # one SDPA call: masked after a cached prefix, causal for a whole sequence
    SDPA_ROWS = 1  # one SDPA call per row, each as the decode of its position (Attention._rows_as_decodes)
    ROW_KERNEL = 2  # decodes and verification rows (engine/fused/row_attention.h)
    CHUNK_KERNEL = 3  # prompt chunks (engine/fused/chunk_attention.h)


def attention_route(s: SeqAttention, rows_as_decodes: int, kernels: bool) -> Route:
    """The one place that decides; kernels: the row and chunk kernels are installed (they come together)."""
    if kernels:
        return Route.CHUNK_KERNEL if s.prompt else Route.ROW_KERNEL
    if rows_as_decodes and s.mask is not None and s.q_len <= rows_as_decodes:
        return Route.SDPA_ROWS
    return Route.SDPA


@dataclass
class AttentionMetadata:
    seqs: list[SeqAttention]
    slot_mapping: torch.Tensor  # [T] int64: arena slot where each row's K/V is written
    kv_cache: KVCache

    @property
    def holds_prompt_rows(self) -> bool:
        """Some sequence's rows are a prompt chunk (engine.quant.linear.StepKind: their linears' kernel)."""
        return any(s.prompt for s in self.seqs)


def causal_mask_at_end(q_len: int, kv_len: int, device: torch.device | str) -> torch.Tensor:
    """[q_len, kv_len] bool: query i (the chunk's i-th token) sees the prefix and chunk[: i + 1].

    The queries are the LAST q_len positions of the kv_len keys, so the diagonal
    is aligned to the bottom-right; SDPA's is_causal aligns it to the top-left,
    which is only right when q_len == kv_len.
    """
    q_pos = torch.arange(kv_len - q_len, kv_len, device=device)  # [q_len]
    k_pos = torch.arange(kv_len, device=device)  # [kv_len]
    return k_pos[None, :] <= q_pos[:, None]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, offset: float = 0.0) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        # Gemma's norms scale by (1 + w): added at each call, in fp32 as HF does, rather than folded into a
        # bf16 weight, where 1 + w would lose w's low bits.
        self.offset = offset
        # (x, weight, eps) -> the norm, one C++ loop (engine/fused/norm.py), where the fused step runs; None: ATen's.
        self.kernel: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.offset:
            return self._offset_norm(x)
        if self.kernel is not None:
            return self.kernel(x, self.weight, self.eps)
        if x.dtype == torch.float32 and self.weight.dtype == torch.float32:
            # One call instead of seven Python-level ops (61 norms a step); in fp32 it gives
            # exactly the steps below (tests/unit/engine/test_step_ops.py).
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # Same order of operations as HF (normalise in fp32, cast, then scale) so bf16 results match.
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)

    def _offset_norm(self, x: torch.Tensor) -> torch.Tensor:
        """Gemma's order: normalise and scale by (offset + w) in fp32, then cast."""
        scale = self.weight.float() + self.offset
        if x.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, scale, self.eps)
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * scale).to(x.dtype)


def widened(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A region's K and V in q's dtype for SDPA: a bfloat16 arena's (engine.kv_cache_dtype) widened exactly,
    as the C++ kernels read it; the views themselves when the dtypes already match."""
    return k.to(q.dtype), v.to(q.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.num_heads = cfg.num_heads
        self.num_kv_heads = cfg.num_kv_heads
        self.head_dim = cfg.head_dim
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        # q, k and v in one matmul.
        self.qkv_proj = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=cfg.o_bias)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, cfg.norm_offset) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, cfg.norm_offset) if cfg.qk_norm else None
        self.scale = cfg.attn_scale  # None: SDPA's 1 / sqrt(head_dim)
        # Every SDPA route's call: Gemma 2's soft-capped scores go eager (engine.softcap_attention).
        self.sdpa: Callable[..., torch.Tensor] = F.scaled_dot_product_attention if cfg.attn_softcap is None \
            else partial(softcapped_sdpa, softcap=cfg.attn_softcap)
        self.window = cfg.layer_windows[layer] if cfg.layer_windows else None  # applied (engine.sliding_window)
        # > 0: masked steps of up to this many rows (verifications) attend row by row like decodes
        # (set by engine.quant.apply for bf16-activation formats; see _rows_as_decodes).
        self.rows_as_decodes = 0
        # With rows_as_decodes, the C++ kernels (engine.fused.row_attention, set by the engine; see route): a
        # decode's row and a verification's rows in one call whose rows round alike whatever their count, and a
        # prompt chunk's rows in another, each row's bits whatever the chunking. None: SDPA.
        self.row_attention: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor] | None = None
        self.chunk_attention: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor, rope: RopeStep, attn: AttentionMetadata) -> torch.Tensor:
        T = x.shape[0]
        qkv = self.qkv_proj(x)  # [T, q_size + 2 * kv_size], a fresh tensor: rotated in place
        # q and k sit side by side in qkv: normed and rotated as one [T, Hq + Hkv, D] block, in place,
        # so the rotated K stays next to V and the KV write is one copy.
        qk = qkv[:, : self.q_size + self.kv_size].view(T, self.num_heads + self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            qk[:, : self.num_heads] = self.q_norm(qk[:, : self.num_heads])
            qk[:, self.num_heads :] = self.k_norm(qk[:, self.num_heads :])
        apply_rotary_(qk, rope)
        cache = attn.kv_cache
        cache.write(self.layer, attn.slot_mapping, qkv[:, self.q_size :].view(T, 2, self.num_kv_heads, self.head_dim))

        # Per sequence, attention over views: the layer's arena [Hkv, N, D] sliced to
        # the sequence's region (prefix + this step's rows), no gather copies.
        k_arena, v_arena = cache.k[self.layer], cache.v[self.layer]  # [Hkv, N, D]
        q_heads = qk[:, : self.num_heads].transpose(0, 1)  # [Hq, T, D]
        plan = self.plan(attn.seqs, k_arena.device)
        if len(plan) == 1 and plan[0][1] == Route.SDPA:
            # One sequence (a batch-1 decode or verification): its output is the step's, no buffer to fill.
            out = self._attend(q_heads, k_arena, v_arena, plan[0][0]).transpose(0, 1)  # [T, Hq, D]
            return self.o_proj(out.reshape(T, self.q_size))  # [T, hidden]
        out = qkv.new_empty(T, self.num_heads, self.head_dim)  # [T, Hq, D]
        out_heads = out.transpose(0, 1)  # [Hq, T, D], writes land in `out`
        for s, route in plan:
            kernel = self.row_attention if route == Route.ROW_KERNEL else \
                self.chunk_attention if route == Route.CHUNK_KERNEL else None
            if kernel is not None:
                rows, kv = slice(s.q_start, s.q_start + s.q_len), slice(s.kv_start, s.kv_start + s.kv_len)
                out[rows] = kernel(qk[rows, : self.num_heads], k_arena[:, kv], v_arena[:, kv], s.kv_len - s.q_len + 1)
            elif route == Route.SDPA_ROWS:
                self._rows_as_decodes(q_heads, k_arena, v_arena, out_heads, s)
            else:
                out_heads[:, s.q_start : s.q_start + s.q_len] = self._attend(q_heads, k_arena, v_arena, s)
        return self.o_proj(out.view(T, self.q_size))  # [T, hidden]

    def route(self, s: SeqAttention) -> Route:
        return attention_route(s, self.rows_as_decodes, self.row_attention is not None)

    def plan(self, seqs: list[SeqAttention], device: torch.device) -> list[tuple[SeqAttention, Route]]:
        """Each sequence with its route; a sliding-window layer narrows the regions its rows may see: rows that
        would attend as decodes stay decodes over their own window, other rows go to SDPA with a band mask (the
        C++ chunk kernel takes no mask)."""
        plan = []
        for s in seqs:
            route = self.route(s)
            if self.window is None or not needs_window(s, self.window):
                plan.append((s, route))
            elif s.q_len == 1 or route in (Route.SDPA_ROWS, Route.ROW_KERNEL):
                plan += [(row, self.route(row)) for row in window_rows(s, self.window)]
            else:
                plan.append((window_band(s, self.window, device), Route.SDPA))
        return plan

    def _attend(
        self, q_heads: torch.Tensor, k_arena: torch.Tensor, v_arena: torch.Tensor, s: SeqAttention
    ) -> torch.Tensor:
        """The sequence's rows attending to its region: [Hq, q_len, D]."""
        kv = slice(s.kv_start, s.kv_start + s.kv_len)
        # No mask on several rows means the rows are the whole sequence: plain causal.
        causal = s.mask is None and s.q_len > 1
        return self.sdpa(
            q_heads[:, s.q_start : s.q_start + s.q_len], *widened(q_heads, k_arena[:, kv], v_arena[:, kv]),
            attn_mask=s.mask, is_causal=causal, enable_gqa=True, scale=self.scale,
        )

    def _rows_as_decodes(
        self, q_heads: torch.Tensor, k_arena: torch.Tensor, v_arena: torch.Tensor, out_heads: torch.Tensor,
        s: SeqAttention,
    ) -> None:
        """A verification step's rows one by one, each exactly the SDPA call a decode of that position
        makes: SDPA's rounding depends on the query count, and bf16 activations magnify the difference
        enough to flip sampled tokens, so speculative text would drift from plain decoding."""
        first_kv_end = s.kv_start + s.kv_len - s.q_len + 1  # row 0 sees the prefix and itself
        for i in range(s.q_len):
            row, kv = s.q_start + i, slice(s.kv_start, first_kv_end + i)
            out_heads[:, row : row + 1] = self.sdpa(
                q_heads[:, row : row + 1], *widened(q_heads, k_arena[:, kv], v_arena[:, kv]), enable_gqa=True,
                scale=self.scale,
            )  # [Hq, 1, D]


class MLP(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        self.intermediate_size = cfg.intermediate_size
        # gate and up in one matmul.
        self.gate_up_proj = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=cfg.mlp_bias)
        # SiLU (every supported model's) as the function: one module call less per layer and step.
        self.act = F.silu if cfg.hidden_act == "silu" else ACT2FN[cfg.hidden_act]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)  # 2 x [T, I]
        return self.down_proj(self.act(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp: nn.Module = SparseMoE(cfg) if cfg.num_experts else MLP(cfg)

    def forward(self, h: torch.Tensor, rope: RopeStep, attn: AttentionMetadata) -> torch.Tensor:
        h = h + self.self_attn(self.input_layernorm(h), rope, attn)
        return h + self.mlp(self.post_attention_layernorm(h))


class Decoder(nn.Module):
    def __init__(self, cfg: DecoderConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        layer_cls = SandwichDecoderLayer if cfg.sandwich_norms else DecoderLayer
        self.layers = nn.ModuleList(layer_cls(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)
        self.lm_head = None if cfg.tie_word_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # cos/sin tables [max_positions, head_dim] in fp32, set by init_rope; buffers so
        # that .to(device) moves them, non-persistent because they are derived.
        self.rope_cos: torch.Tensor | None
        self.rope_sin: torch.Tensor | None
        self.register_buffer("rope_cos", None, persistent=False)
        self.register_buffer("rope_sin", None, persistent=False)
        self.rope_sin_rot: torch.Tensor | None  # rope_sin with rotate_half's sign folded in (RopeStep)
        self.register_buffer("rope_sin_rot", None, persistent=False)
        # The sliding layers' own tables (Gemma 3's local RoPE base), when cfg.local_rope_layers says so.
        self.local_rope: tuple[torch.Tensor, torch.Tensor] | None = None  # (cos, sin_rot)
        # The LM head's matmul [n, hidden] -> [n, vocab] when its weight (maybe the tied
        # embedding) lives in another form: prepacked (prepack_for_cpu) or quantized (engine.quant.apply).
        self.head_matmul: Callable[[torch.Tensor], torch.Tensor] | None = None
        # The layers of a step in one C++ call, where the model allows it (engine.fused.decoder_step;
        # set by the engine after the weight format, the kernel dispatch and LoRA).
        self.fused_step: FusedDecoderStep | None = None
        # What the step holds, for the quantized linears' (and head's) kernel choice (engine.quant.apply shares it).
        self.step_kind = StepKind()

    def prepack_for_cpu(self, rows: PackedRows = PackedRows()) -> bool:
        """On CPU, give every linear layer and the LM head a oneDNN-prepacked copy for
        steps of rows.min_rows..rows.max_rows rows (see engine.packed_linear). Costs one
        more copy of the weights; returns False (and does nothing) where it does not apply."""
        if self.head_matmul is not None:
            return True
        if not packing_available(self.device, self.dtype):
            return False
        prepack_linears(self.layers, rows)
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        self.head_matmul = PrepackedWeight(weight, None, rows).apply
        return True

    @property
    def dtype(self) -> torch.dtype:
        # The final norm, not the embedding: a quantized model's embedding holds integer codes.
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    def init_rope(self, hf_config: Any, max_positions: int) -> None:
        inv_freq, scale = rope_inv_freq(hf_config, self.device)  # [D / 2]
        pos = torch.arange(max_positions, device=self.device, dtype=torch.float)
        freqs = pos[:, None] * inv_freq[None, :]  # [P, D / 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [P, D]
        self.rope_cos = emb.cos() * scale
        self.rope_sin = emb.sin() * scale
        half = inv_freq.shape[0]
        self.rope_sin_rot = torch.cat((-self.rope_sin[:, :half], self.rope_sin[:, half:]), dim=-1)
        if any(self.cfg.local_rope_layers):
            inv_freq, scale = rope_inv_freq(hf_config, self.device, "sliding_attention")
            emb = torch.cat((pos[:, None] * inv_freq[None, :],) * 2, dim=-1)  # [P, D]
            sin = emb.sin() * scale
            self.local_rope = (emb.cos() * scale, torch.cat((-sin[:, :half], sin[:, half:]), dim=-1))

    @property
    def max_positions(self) -> int:
        return 0 if self.rope_cos is None else self.rope_cos.shape[0]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: AttentionMetadata) -> torch.Tensor:
        """input_ids, positions [T] -> final-normed hidden states [T, hidden]."""
        rope = self.rope_step(positions, self.dtype)
        local = None  # the sliding layers' own factors (Gemma 3's local base), where the model has them
        if self.local_rope is not None:
            cos, sin_rot = self.local_rope
            local = RopeStep(cos[positions, None].to(self.dtype), sin_rot[positions, None].to(self.dtype))
        h = self.embed(input_ids)  # [T, hidden]
        self.step_kind.prompt = attn.holds_prompt_rows  # stays for compute_logits on this step's rows
        if self.fused_step is not None:
            return self.fused_step(h, rope, attn, local)
        local = local if local is not None else rope
        for i, layer in enumerate(self.layers):
            h = layer(h, local if self.cfg.local_rope_layers and self.cfg.local_rope_layers[i] else rope, attn)
        return self.norm(h)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> the first layer's input [T, hidden] (Gemma scales it, in the weights' dtype as HF)."""
        h = self.embed_tokens(input_ids)
        if self.cfg.embed_scale is None:
            return h
        return h * torch.tensor(self.cfg.embed_scale, dtype=h.dtype, device=h.device)

    def rope_step(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeStep:
        """The rotary factors of positions [T], for every layer of one forward."""
        if self.rope_cos is None or self.rope_sin_rot is None:
            raise RuntimeError("init_rope() was not called")
        # HF computes cos/sin in fp32 and casts them to the activation dtype.
        return RopeStep(self.rope_cos[positions, None].to(dtype), self.rope_sin_rot[positions, None].to(dtype))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, hidden] (only the rows that need a next-token distribution) -> fp32 logits [n, vocab]."""
        if self.head_matmul is not None:
            logits = self.head_matmul(hidden)
        else:
            logits = F.linear(hidden, self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight)
        cap = self.cfg.final_softcap
        return logits.float() if cap is None else (torch.tanh(logits / cap) * cap).float()

    @classmethod
    def from_hf(cls, hf_model: nn.Module, max_positions: int) -> Decoder:
        """Copy (and fuse) the weights of a loaded HF *ForCausalLM; keeps its device and dtype."""
        return cls.from_checkpoint(hf_model.config, hf_model.state_dict(), max_positions)

    @classmethod
    def from_checkpoint(cls, hf_config: Any, sd: Mapping[str, torch.Tensor], max_positions: int) -> Decoder:
        """Fuse an HF checkpoint's tensors (its own names: model.layers.N.self_attn.q_proj.weight, ...) into
        our layout; keeps their device and dtype. Each is read once (sd may read them lazily)."""
        cfg = DecoderConfig.from_hf(hf_config)

        def take(name: str) -> torch.Tensor:
            if name not in sd:
                raise UnsupportedModelError(f"{cfg.model_type} checkpoint has no weight {name!r}")
            return sd[name]

        ours: dict[str, torch.Tensor] = {
            "embed_tokens.weight": take("model.embed_tokens.weight"),
            "norm.weight": take("model.norm.weight"),
        }
        if not cfg.tie_word_embeddings:
            ours["lm_head.weight"] = take("lm_head.weight")
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            ours[f"layers.{i}.input_layernorm.weight"] = take(p + "input_layernorm.weight")
            ours[f"layers.{i}.post_attention_layernorm.weight"] = take(p + "post_attention_layernorm.weight")
            for norm in GEMMA_EXTRA_NORMS if cfg.sandwich_norms else ():
                ours[f"layers.{i}.{norm}.weight"] = take(f"{p}{norm}.weight")
            ours |= _attention_tensors(cfg, take, p + "self_attn.", f"layers.{i}.self_attn.")
            ours |= (expert_tensors(cfg, take, sd.__contains__, p, f"layers.{i}.mlp.") if cfg.num_experts
                     else _mlp_tensors(cfg, take, p + "mlp.", f"layers.{i}.mlp."))

        # Build on the meta device and adopt the tensors: no second random-initialised copy.
        with skeleton():
            model = cls(cfg)
        model.load_state_dict(ours, strict=True, assign=True)
        model.eval().requires_grad_(False)
        model.init_rope(hf_config, max_positions)
        return model



def _fuse(parts: list[torch.Tensor]) -> torch.Tensor:
    """Weights stacked along their rows. Placeholders (meta: engine.weight_plan leaves them unread) are shaped, not
    concatenated: any op on a meta tensor imports torch._dynamo and triton (seconds and ~100 MB of a start)."""
    if any(p.is_meta for p in parts):
        return torch.empty(sum(p.shape[0] for p in parts), *parts[0].shape[1:], dtype=parts[0].dtype, device="meta")
    return torch.cat(parts)


def _attention_tensors(cfg: DecoderConfig, take: Take, a: str, ours: str) -> dict[str, torch.Tensor]:
    """One layer's attention weights, from the checkpoint's names under ``a`` to ours under ``ours``."""
    out: dict[str, torch.Tensor] = {}
    if cfg.model_type in PRE_FUSED_ARCHITECTURES:  # q, k and v rows already in our order
        out[ours + "qkv_proj.weight"] = take(a + "qkv_proj.weight")
    else:
        out[ours + "qkv_proj.weight"] = _fuse([take(a + f"{x}_proj.weight") for x in "qkv"])
    if cfg.qkv_bias:
        out[ours + "qkv_proj.bias"] = torch.cat([take(a + f"{x}_proj.bias") for x in "qkv"])
    out[ours + "o_proj.weight"] = take(a + "o_proj.weight")
    if cfg.o_bias:
        out[ours + "o_proj.bias"] = take(a + "o_proj.bias")
    if cfg.qk_norm:
        out[ours + "q_norm.weight"] = take(a + "q_norm.weight")
        out[ours + "k_norm.weight"] = take(a + "k_norm.weight")
    return out


def _mlp_tensors(cfg: DecoderConfig, take: Take, m: str, ours: str) -> dict[str, torch.Tensor]:
    """One layer's dense MLP weights, from the checkpoint's names under ``m`` to ours under ``ours``."""
    out: dict[str, torch.Tensor] = {}
    if cfg.model_type in PRE_FUSED_ARCHITECTURES:  # gate and up rows already in our order
        out[ours + "gate_up_proj.weight"] = take(m + "gate_up_proj.weight")
    else:
        out[ours + "gate_up_proj.weight"] = _fuse([take(m + "gate_proj.weight"), take(m + "up_proj.weight")])
    out[ours + "down_proj.weight"] = take(m + "down_proj.weight")
    if cfg.mlp_bias:
        out[ours + "gate_up_proj.bias"] = torch.cat([take(m + "gate_proj.bias"), take(m + "up_proj.bias")])
        out[ours + "down_proj.bias"] = take(m + "down_proj.bias")
    return out

