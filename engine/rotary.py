"""Rotary position embeddings applied: one step's factors and the rotation.

A forward gathers its factors once (Decoder.rope_step) and every layer, the
EAGLE head's included, rotates q and k with them in place (issue 17: the
per-layer re-slicing and the four ops of rotate_half were a visible share of a
batch-1 decode step's dispatches).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass(frozen=True)
class RopeStep:
    """One step's rotary factors, gathered once for every layer (not re-sliced per layer).

    sin_rot is sin with rotate_half's negation folded in ([-sin_a, sin_b] for the halves a, b),
    so a rotation is the halves swapped times sin_rot: x2 * -s == -x2 * s exactly in IEEE
    arithmetic, the same bits as `x * cos + rotate_half(x) * sin` with fewer ops.
    """

    cos: torch.Tensor  # [T, 1, D]
    sin_rot: torch.Tensor  # [T, 1, D]


def apply_rotary_(x: torch.Tensor, rope: RopeStep) -> None:
    """Rotate x [T, H, D] in place (x may be a view into the fused qkv output, whose K then sits next to V)."""
    swapped = x.unflatten(-1, (2, -1)).flip(-2).flatten(-2)  # [T, H, D]: halves (b, a), a fresh tensor
    torch.add(x * rope.cos, swapped.mul_(rope.sin_rot), out=x)
