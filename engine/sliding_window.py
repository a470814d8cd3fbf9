"""A sliding-window layer's view of one sequence's rows: which keys each row may see.

Query at position p sees keys k with p - window < k <= p (transformers' sliding_window_overlay). The arena
keeps every position of a sequence (slot = kv_start + position), so a window is a narrower region, not a
smaller cache: a single row attends to the last `window` keys of its region, exactly as an unwindowed
decode of a shorter sequence would (the same SDPA call or C++ kernel, the same bits); several rows attend
through a band mask over the region from the first row's oldest visible key.
"""
from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from engine.model import SeqAttention


def needs_window(s: SeqAttention, window: int) -> bool:
    """Some row of s would see a key older than the window (the longest row sees kv_len keys)."""
    return s.kv_len > window


def window_rows(s: SeqAttention, window: int) -> list[SeqAttention]:
    """s's rows one by one, each over its own last `window` keys (no mask: a single row sees all its region)."""
    rows = []
    first_end = s.kv_len - s.q_len + 1  # keys row 0 sees, itself included
    for i in range(s.q_len):
        end = first_end + i
        lo = max(0, end - window)
        rows.append(replace(s, q_start=s.q_start + i, q_len=1, kv_start=s.kv_start + lo, kv_len=end - lo, mask=None))
    return rows


def window_band(s: SeqAttention, window: int, device: torch.device) -> SeqAttention:
    """s's rows together over the region from the oldest key any of them sees, with a causal band mask."""
    first_pos = s.kv_len - s.q_len  # row 0's position
    lo = max(0, first_pos - window + 1)
    q_pos = torch.arange(first_pos, s.kv_len, device=device)[:, None]  # [q_len, 1]
    k_pos = torch.arange(lo, s.kv_len, device=device)[None, :]  # [1, kv_len - lo]
    band = (k_pos <= q_pos) & (k_pos > q_pos - window)  # [q_len, kv_len - lo]
    if s.mask is not None:  # a caller's mask (speculation's rows) narrows further
        band &= s.mask[:, lo:].to(device)
    return replace(s, kv_start=s.kv_start + lo, kv_len=s.kv_len - lo, mask=band)
