"""Gemma 3's differences from the Llama family, as our decoder runs them.

Gemma 3 (model_type gemma3_text) keeps Llama's attention and gated MLP but adds: norms that scale by (1 + w), an
embedding scaled by sqrt(hidden), GeGLU (gelu tanh), q/k norms, a norm after attention and one on each side of the
MLP ("sandwich" norms), interleaved sliding-window and global layers whose RoPE bases differ, and a softmax scale of
query_pre_attn_scalar ** -0.5. The window is applied for real (engine.sliding_window): the engine's context is the
model's, not the window.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

if TYPE_CHECKING:
    import torch

    from engine.model import AttentionMetadata, DecoderConfig
    from engine.rotary import RopeStep

GEMMA_ARCHITECTURES = ("gemma3_text",)
# Norms Gemma has beyond Llama's two (input_layernorm, post_attention_layernorm), under HF's names.
GEMMA_EXTRA_NORMS = ("pre_feedforward_layernorm", "post_feedforward_layernorm")


class UnsupportedGemmaError(ValueError):
    pass


def gemma_fields(c: Any) -> dict[str, Any]:
    """The DecoderConfig fields a Gemma 3 text config sets beyond the Llama family's."""
    if getattr(c, "attn_logit_softcapping", None) is not None:
        raise UnsupportedGemmaError("attention logit softcapping (attn_logit_softcapping) is not supported")
    if getattr(c, "use_bidirectional_attention", False):
        raise UnsupportedGemmaError("bidirectional attention (use_bidirectional_attention) is not supported")
    layer_types = list(c.layer_types)
    return {
        "hidden_act": c.hidden_activation,
        "qk_norm": True,
        "norm_offset": 1.0,
        "embed_scale": c.hidden_size**0.5,
        "sandwich_norms": True,
        "attn_scale": c.query_pre_attn_scalar**-0.5,
        "final_softcap": getattr(c, "final_logit_softcapping", None),
        "local_rope_layers": tuple(t == "sliding_attention" for t in layer_types),
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
