"""Applying llguidance's packed token bitmasks to logits rows.

A bitmask row is [ceil(V / 32)] int32: bit j of word w allows token 32 * w + j. We unpack with
plain tensor ops (no torch.compile, whose first call costs seconds on a CPU worker), byte by byte:
on a little-endian machine byte b of word w holds tokens 32 * w + 8 * b .. + 7, so the bytes in
memory order, each read from its lowest bit, are the tokens in order, and the intermediate is one
byte per token rather than four.
"""
from __future__ import annotations

import sys

import torch
from torch import Tensor

_BITS = torch.arange(8, dtype=torch.uint8)  # [8]
if sys.byteorder != "little":  # pragma: no cover  (x86, ARM and CUDA hosts are little-endian)
    raise ImportError("engine.grammar.bitmask reads int32 bitmasks byte by byte and needs a little-endian host")


def bitmask_words(vocab_size: int) -> int:
    """Words of one bitmask row."""
    return (vocab_size + 31) // 32


def allowed_tokens(bitmask: Tensor, vocab_size: int) -> Tensor:
    """bitmask [n, W] int32 -> [n, V] bool: which tokens each row allows."""
    octets = bitmask.contiguous().view(torch.uint8)  # [n, 4W]
    bits = (octets.unsqueeze(-1) >> _BITS.to(bitmask.device)) & 1  # [n, 4W, 8]
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
