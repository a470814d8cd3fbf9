"""Preemption under KV pressure (engine.scheduler decides when): who gives its region back, and how a victim's
output KV survives until it runs again.

A victim recomputes its prompt when it resumes (a copy, for the blocks the prefix cache still holds), as vLLM v1
recomputes. Its output's KV is not recomputed: the decodes that wrote it ran the row kernel, a recompute would run
the chunk kernel, and the two round differently (in int4 on the real model that flipped tokens). So the output's KV
is saved outside the arena at preemption and put back once the prompt is computed again: the sequence goes on bit
for bit as if never preempted. That copy is the only KV outside engine.kv_cache_bytes.
"""
from __future__ import annotations

from collections.abc import Iterable

from engine.kv_cache import KVCache
from engine.sequence import Sequence


def victims_for(seq: Sequence, running: Iterable[Sequence]) -> list[Sequence]:
    """Running sequences `seq` may preempt, in the order to take them: strictly lower priorities only (batch lines
    sort last of all), the lowest first, then the newest."""
    return sorted(
        (r for r in running if r.request.priority > seq.request.priority),
        key=lambda r: (r.request.priority, r.request.arrival_time),
        reverse=True,
    )


def save_output(seq: Sequence, kv_cache: KVCache) -> None:
    """Before `seq` gives its region back: keep the KV of its output positions (not when it still waits to have an
    earlier copy put back)."""
    kv = seq.kv
    if kv is not None and seq.output_ids and seq.saved_output_kv is None:
        start = kv.region.start + seq.num_prompt_tokens
        seq.saved_output_kv = kv_cache.save(start, kv.num_cached - seq.num_prompt_tokens)


def restore_output(seq: Sequence, kv_cache: KVCache) -> None:
    """After a step: a resumed sequence whose prompt is computed again gets its output's KV back."""
    saved, kv = seq.saved_output_kv, seq.kv
    if saved is None or kv is None or kv.num_cached < seq.num_prompt_tokens:
        return
    kv_cache.load(kv.region.start + seq.num_prompt_tokens, saved)
    kv.num_cached = seq.num_prompt_tokens + saved.shape[3]
    seq.saved_output_kv = None
