"""Gemma 2's and 3's differences from the Llama family, as our decoder runs them.

Both keep Llama's attention and gated MLP but add: norms that scale by (1 + w), an embedding scaled by
sqrt(hidden), GeGLU (gelu tanh), a norm after attention and one on each side of the MLP ("sandwich" norms),
interleaved sliding-window and global layers, and a softmax scale of query_pre_attn_scalar ** -0.5. Gemma 2
(gemma2) soft-caps the attention scores (engine.softcap_attention) and the final logits; Gemma 3 (gemma3_text) has
q/k norms instead of the attention cap, and its local layers rotate with their own RoPE base. Windows are applied
for real (engine.sliding_window): the engine's context is the model's, not the window.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    import torch

    from engine.model import AttentionMetadata, DecoderConfig
    from engine.rotary import RopeStep

GEMMA_ARCHITECTURES = ("gemma2", "gemma3_text")
# Norms Gemma has beyond Llama's two (input_layernorm, post_attention_layernorm), under HF's names.
GEMMA_EXTRA_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")


class UnsupportedGemmaError(ValueError):
    pass


def gemma_fields(c: Any) -> dict[str, Any]:
    """The DecoderConfig fields a Gemma 2 or Gemma 3 text config sets beyond the Llama family's."""
    if getattr(c, "use_bidirectional_attention", False):
        raise UnsupportedGemmaError("bidirectional attention (use_bidirectional_attention) is not supported")
    layer_types = list(c.layer_types)
    local_rope = "sliding_attention" in (getattr(c, "rope_parameters", None) or {})  # Gemma 3's per-type bases
    return {
        "hidden_act": c.hidden_activation,
        "qk_norm": c.model_type == "gemma3_text",
        "norm_offset": 1.0,
        "embed_scale": c.hidden_size**0.5,
        "sandwich_norms": True,
        "attn_scale": c.query_pre_attn_scalar**-0.5,
        "final_softcap": getattr(c, "final_logit_softcapping", None),
        "attn_softcap": getattr(c, "attn_logit_softcapping", None),
        "local_rope_layers": tuple(t == "sliding_attention" for t in layer_types) if local_rope else (),
    }


class SandwichDecoderLayer(nn.Module):
    """Gemma's layer: x + post_norm(attn(in_norm(x))), then h + post_ff_norm(mlp(pre_ff_norm(h))).

    Module names are HF's, so the checkpoint's norms load under their own names; note that Gemma's
    post_attention_layernorm normalizes the attention's output (Llama's normalizes the MLP's input)."""

    def __init__(self, cfg: DecoderConfig, layer: int) -> None:
        super().__init__()
        from engine.model import MLP, Attention, RMSNorm

        def norm() -> RMSNorm:
            return RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, cfg.norm_offset)

        self.input_layernorm = norm()
        self.self_attn = Attention(cfg, layer)
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.post_feedforward_layernorm = norm()
        self.mlp = MLP(cfg)

    def forward(self, h: torch.Tensor, rope: RopeStep, attn: AttentionMetadata) -> torch.Tensor:
        h = h + self.post_attention_layernorm(self.self_attn(self.input_layernorm(h), rope, attn))
        return h + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(h)))
