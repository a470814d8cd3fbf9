"""Applying llguidance's packed token bitmasks to logits rows.

A bitmask row is [ceil(V / 32)] int32: bit j of word w allows token 32 * w + j. We unpack with
plain tensor ops (no torch.compile, whose first call costs seconds on a CPU worker).
"""
from __future__ import annotations

import torch
from torch import Tensor

_BITS = torch.arange(32, dtype=torch.int32)  # [32]


def bitmask_words(vocab_size: int) -> int:
    """Words of one bitmask row."""
    return (vocab_size + 31) // 32


def allowed_tokens(bitmask: Tensor, vocab_size: int) -> Tensor:
    """bitmask [n, W] int32 -> [n, V] bool: which tokens each row allows."""
    bits = (bitmask.unsqueeze(-1) >> _BITS.to(bitmask.device)) & 1  # [n, W, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()  # [n, V]


def mask_rows_(logits: Tensor, rows: Tensor, bitmask: Tensor) -> None:
    """In place: logits[rows[i]] keeps only the tokens bitmask[i] allows (the others become -inf).

    logits [R, V]; rows [n] int64 on logits' device; bitmask [n, W] int32 (any device).
    """
    if rows.numel() == 0:
        return
    allowed = allowed_tokens(bitmask.to(logits.device, non_blocking=True), logits.shape[1])  # [n, V]
    picked = logits.index_select(0, rows)  # [n, V]
    logits.index_copy_(0, rows, picked.masked_fill_(~allowed, float("-inf")))
