"""Attention with its logits soft-capped (Gemma 2's attn_logit_softcapping): scores -> cap * tanh(scores / cap)
before the mask and the softmax.

SDPA takes no cap, so these layers' SDPA routes attend eagerly, in transformers' order (scale, cap, mask, softmax
in fp32, cast, weights @ V), under SDPA's signature so the layer's routes stay as they are; the fused step's SDPA
route runs the same ops (decoder_step.cpp), and the row and chunk kernels cap their scores themselves.
"""
from __future__ import annotations

import torch


def softcapped_sdpa(
    query: torch.Tensor,  # [Hq, q, D]
    key: torch.Tensor,  # [Hkv, kv, D]
    value: torch.Tensor,  # [Hkv, kv, D]
    attn_mask: torch.Tensor | None = None,  # [q, kv] bool, True = may attend
    is_causal: bool = False,
    enable_gqa: bool = True,
    scale: float | None = None,
    *,
    softcap: float,
) -> torch.Tensor:
    """[Hq, q, D]: F.scaled_dot_product_attention's answer, with the scores capped."""
    q_len, kv_len = query.shape[-2], key.shape[-2]
    groups = query.shape[0] // key.shape[0]
    if groups > 1:  # GQA: each K/V head serves `groups` query heads, as transformers' repeat_kv
        key, value = key.repeat_interleave(groups, dim=0), value.repeat_interleave(groups, dim=0)
    scores = torch.matmul(query, key.transpose(-1, -2)) * (query.shape[-1] ** -0.5 if scale is None else scale)
    scores = torch.tanh(scores / softcap) * softcap  # [Hq, q, kv]
    if is_causal:  # SDPA's: aligned to the top-left (the rows are the whole sequence)
        attn_mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=query.device).tril()
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value)
