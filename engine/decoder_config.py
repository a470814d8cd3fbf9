"""What a decoder is made of, read from a Hugging Face config: the supported architectures, their shape and
options (DecoderConfig), and RoPE's inverse frequencies."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.gemma import GEMMA_ARCHITECTURES, UnsupportedGemmaError, gemma_fields

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "mixtral", "gemma2", "gemma3_text")
# Checkpoints whose attention and MLP projections come fused (self_attn.qkv_proj, mlp.gate_up_proj), in our order.
PRE_FUSED_ARCHITECTURES = ("phi3",)


class UnsupportedModelError(ValueError):
    pass


@dataclass(frozen=True)
class DecoderConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    hidden_act: str
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    # Gemma's (engine.gemma.gemma_fields); the defaults are the Llama family's.
    norm_offset: float = 0.0  # norms scale by (offset + w)
    embed_scale: float | None = None  # the embedding's output times this
    sandwich_norms: bool = False  # norms after attention and around the MLP (engine.gemma.SandwichDecoderLayer)
    attn_scale: float | None = None  # softmax scale; None: head_dim ** -0.5
    final_softcap: float | None = None  # logits -> cap * tanh(logits / cap)
    attn_softcap: float | None = None  # attention scores -> cap * tanh(scores / cap) (Gemma 2)
    # Per layer: the sliding window, None for a global layer; () when no layer has one. Applied (engine.sliding_window),
    # so a windowed model serves its whole context.
    layer_windows: tuple[int | None, ...] = ()
    local_rope_layers: tuple[bool, ...] = ()  # per layer: rotates with the sliding_attention RoPE parameters
    # Mixtral's sparse MLP (engine.moe): experts per layer and how many each token takes; 0: a dense MLP.
    num_experts: int = 0
    experts_per_token: int = 0

    @classmethod
    def from_hf(cls, hf_config: Any) -> DecoderConfig:
        model_type = getattr(hf_config, "model_type", "?")
        if model_type not in SUPPORTED_ARCHITECTURES:
            archs = getattr(hf_config, "architectures", None) or [model_type]
            raise UnsupportedModelError(
                f"unsupported model architecture {archs[0]!r} (model_type {model_type!r}); "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        c = hf_config
        num_heads = c.num_attention_heads
        head_dim = getattr(c, "head_dim", None) or c.hidden_size // num_heads
        family: dict[str, Any] = {}  # fields beyond the Llama family's
        if model_type in GEMMA_ARCHITECTURES:
            try:
                family = gemma_fields(c)
            except UnsupportedGemmaError as e:
                raise UnsupportedModelError(f"{model_type}: {e}") from None
        return cls(
            model_type=model_type,
            vocab_size=c.vocab_size,
            hidden_size=c.hidden_size,
            intermediate_size=c.intermediate_size,
            num_layers=c.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(c, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            rms_norm_eps=c.rms_norm_eps,
            hidden_act=family.get("hidden_act") or c.hidden_act,
            # qwen2 always has q/k/v biases; llama-style configs say so with attention_bias.
            qkv_bias=model_type == "qwen2" or bool(getattr(c, "attention_bias", False)),
            o_bias=model_type != "qwen2" and bool(getattr(c, "attention_bias", False)),
            mlp_bias=bool(getattr(c, "mlp_bias", False)),
            qk_norm=model_type == "qwen3" or bool(family.get("qk_norm")),
            tie_word_embeddings=bool(getattr(c, "tie_word_embeddings", False)),
            max_position_embeddings=_exact_context(c),
            layer_windows=_layer_windows(c),
            num_experts=getattr(c, "num_local_experts", 0) if model_type == "mixtral" else 0,
            experts_per_token=getattr(c, "num_experts_per_tok", 0) if model_type == "mixtral" else 0,
            **{k: v for k, v in family.items() if k not in ("hidden_act", "qk_norm")},
        )


def _layer_windows(c: Any) -> tuple[int | None, ...]:
    """Each layer's window as transformers applies it: every layer of mistral, phi3 and mixtral (their configs have
    no layer types), the sliding_attention layers of those that have them (qwen2's use_sliding_window and
    max_window_layers resolve into layer types)."""
    window = getattr(c, "sliding_window", None)
    layer_types = getattr(c, "layer_types", None)
    if not window:
        return ()
    if layer_types is None:
        return (window,) * c.num_hidden_layers if c.model_type in ("mistral", "phi3", "mixtral") else ()
    if "sliding_attention" not in layer_types:
        return ()
    return tuple(window if t == "sliding_attention" else None for t in layer_types)


def _exact_context(hf_config: Any) -> int:
    """The context within which our RoPE is HF's: longrope and dynamic scaling switch HF to other frequencies past
    the original context, where ours stay fixed, so that is the context served (longer is refused by name)."""
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    context = hf_config.max_position_embeddings
    if params.get("rope_type", params.get("type")) in ("longrope", "dynamic"):
        original = params.get("original_max_position_embeddings") or getattr(
            hf_config, "original_max_position_embeddings", None)
        return min(context, original or context)
    return context


def rope_inv_freq(
    hf_config: Any, device: torch.device | str = "cpu", layer_type: str = "full_attention"
) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [head_dim / 2] and the cos/sin scale, exactly as HF computes them.

    layer_type: which entry of rope_parameters when they are given per layer type (Gemma 3's local and
    global layers have their own bases).

    rope_scaling variants (linear, llama3, yarn, ...) come from transformers'
    own ROPE_INIT_FUNCTIONS so they match HF. "dynamic" and "longrope" change
    with the sequence length in HF past the original context; we use the
    frequencies HF uses within it (max_model_len never exceeds the model context).
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = getattr(hf_config, "rope_parameters", None)
    if not params:  # pre-5.0 configs
        scaling = getattr(hf_config, "rope_scaling", None) or {}
        params = {
            "rope_type": scaling.get("rope_type", scaling.get("type", "default")),
            "rope_theta": getattr(hf_config, "rope_theta", 10000.0),
        }
    per_type = "full_attention" in params
    if per_type:
        params = params[layer_type]
    rope_type = params.get("rope_type", "default")
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise UnsupportedModelError("partial rotary embeddings (partial_rotary_factor < 1) are not supported")
    if rope_type == "default":
        dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
        base = params["rope_theta"]
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(device, torch.float) / dim))
        return inv_freq, 1.0
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise UnsupportedModelError(f"unsupported rope_type {rope_type!r}")
    extra = {"layer_type": layer_type} if per_type else {}
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](hf_config, device, **extra)
    return inv_freq.to(device, torch.float), float(scaling)


