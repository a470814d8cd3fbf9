"""The per-step shortcuts of engine.model give exactly what the plain operations give:
a fused op may save dispatches, never change a bit (speculation's equality rests on it)."""
from __future__ import annotations

import pytest
import torch
from _engine_factories import tiny_hf_model
from torch import nn

from engine.kv_cache import KVCache
from engine.model import (
    AttentionMetadata,
    Decoder,
    RMSNorm,
    SeqAttention,
    causal_mask_at_end,
)
from engine.rotary import RopeStep, apply_rotary_, rotate_half


def _hf_order(norm: RMSNorm, x: torch.Tensor) -> torch.Tensor:
    """HF's RMSNorm: normalise in fp32, cast back, then scale."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)
    return norm.weight * x32.to(x.dtype)


@pytest.mark.parametrize("shape", [(1, 576), (9, 576), (130, 576), (5, 3, 64)])  # hidden rows; q/k heads (qwen3)
def test_the_fused_fp32_rms_norm_is_bit_identical_to_the_hf_order(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    norm = RMSNorm(shape[-1], 1e-5)
    norm.weight.data = torch.randn(shape[-1])
    x = torch.randn(shape) * 3
    assert torch.equal(norm(x), _hf_order(norm, x))


def test_bf16_keeps_the_hf_order() -> None:
    norm = RMSNorm(64, 1e-6).to(torch.bfloat16)
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    assert torch.equal(norm(x), _hf_order(norm, x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_in_place_rotation_is_bit_identical_to_rotate_half_and_leaves_v_alone(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    T, Hq, Hkv, D = 5, 4, 2, 16
    qkv = (torch.randn(T, (Hq + 2 * Hkv) * D) * 3).to(dtype)  # the fused projection's output
    pos = torch.tensor([0, 3, 7, 8, 100])
    emb = torch.randn(128, D // 2).repeat(1, 2)  # [P, D], the halves alike as in init_rope
    cos, sin = emb.cos(), emb.sin()
    sin_rot = torch.cat((-sin[:, : D // 2], sin[:, D // 2 :]), dim=-1)
    qk = qkv[:, : (Hq + Hkv) * D].view(T, Hq + Hkv, D)  # a strided view, as in Attention.forward
    c, s = cos[pos, None].to(dtype), sin[pos, None].to(dtype)
    expected = qk * c + rotate_half(qk) * s
    v_before = qkv[:, (Hq + Hkv) * D :].clone()

    apply_rotary_(qk, RopeStep(c, sin_rot[pos, None].to(dtype)))

    assert torch.equal(qk, expected)
    assert torch.equal(qkv[:, (Hq + Hkv) * D :], v_before)


class _RowwiseQkv(nn.Module):
    """q|k|v taken from the input's columns: no reduction, so a row's output cannot depend on the others."""

    def __init__(self, out: int) -> None:
        super().__init__()
        self.out = out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat((x, x), dim=-1)[:, : self.out] * 0.5


@pytest.mark.parametrize("rows", [1, 4])
def test_a_sequence_alone_in_a_step_attends_exactly_as_it_does_beside_another(rows: int) -> None:
    """The batch-1 shortcut (no output buffer) gives the bits the per-sequence loop gives."""
    torch.manual_seed(0)
    hf = tiny_hf_model("llama")
    model = Decoder.from_hf(hf, 256)
    attn_layer = model.layers[0].self_attn
    attn_layer.qkv_proj = _RowwiseQkv(attn_layer.q_size + 2 * attn_layer.kv_size)
    attn_layer.o_proj = nn.Identity()
    cfg = model.cfg
    cache = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, 256, torch.float32, "cpu")
    cache.k.normal_()
    cache.v.normal_()  # a prefix of 20 cached positions in each region
    x = torch.randn(rows + 1, cfg.hidden_size)
    mask = causal_mask_at_end(rows, 20 + rows, "cpu") if rows > 1 else None
    own = SeqAttention(0, rows, 0, 20 + rows, mask)
    other = SeqAttention(rows, 1, 100, 21, None)
    positions = torch.tensor([*range(20, 20 + rows), 20])
    rope = model.rope_step(positions, torch.float32)
    with torch.inference_mode():
        both = attn_layer(x, rope, AttentionMetadata([own, other], torch.tensor([*range(20, 20 + rows), 120]), cache))
        alone = attn_layer(x[:rows], model.rope_step(positions[:rows], torch.float32),
                           AttentionMetadata([own], torch.arange(20, 20 + rows), cache))
    assert torch.equal(alone, both[:rows])
