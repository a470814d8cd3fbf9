"""ArenaAllocator (first fit, coalescing) and the KV cache around it."""
from __future__ import annotations

import itertools
import random

import pytest
import torch

from engine.engine_setup import kv_cache_dtype
from engine.kv_cache import (
    ArenaAllocator,
    CacheSlot,
    KVCache,
    Region,
    kv_bytes_per_token,
)


def test_first_fit_takes_the_lowest_run_that_fits() -> None:
    a = ArenaAllocator(100)
    r1, r2, r3 = a.allocate(10), a.allocate(20), a.allocate(30)
    assert (r1, r2, r3) == (Region(0, 10), Region(10, 20), Region(30, 30))
    a.free(r2)  # hole [10, 30)
    assert a.allocate(25) == Region(60, 25)  # the hole is too small
    assert a.allocate(15) == Region(10, 15)  # first fit: the hole
    assert a.used == 10 + 30 + 25 + 15


def test_free_coalesces_with_both_neighbours() -> None:
    a = ArenaAllocator(90)
    regions = [a.allocate(30) for _ in range(3)]
    assert a.allocate(1) is None  # full: None, it waits
    a.free(regions[0])
    a.free(regions[2])
    assert a.free_runs() == [Region(0, 30), Region(60, 30)]
    a.free(regions[1])  # merges with the run before and the run after
    assert a.free_runs() == [Region(0, 90)]
    assert a.used == 0
    assert a.allocate(90) == Region(0, 90)


def test_double_free_and_bad_sizes_are_errors() -> None:
    a = ArenaAllocator(10)
    r = a.allocate(4)
    a.free(r)
    with pytest.raises(ValueError):
        a.free(r)
    with pytest.raises(ValueError):
        a.allocate(0)
    with pytest.raises(ValueError):
        ArenaAllocator(0)


def test_random_alloc_free_keeps_the_free_list_consistent() -> None:
    rng = random.Random(0)
    a = ArenaAllocator(1000)
    live: list[Region] = []
    for _ in range(2000):
        if live and rng.random() < 0.5:
            a.free(live.pop(rng.randrange(len(live))))
        else:
            r = a.allocate(rng.randint(1, 60))
            if r is not None:
                live.append(r)
        runs = a.free_runs()
        # Sorted, disjoint, never adjacent (adjacent runs would have been merged).
        assert all(x.end < y.start for x, y in itertools.pairwise(runs))
        spans = sorted([(r.start, r.end) for r in live] + [(r.start, r.end) for r in runs])
        assert spans[0][0] == 0 and spans[-1][1] == 1000
        assert all(p[1] == q[0] for p, q in itertools.pairwise(spans))  # live + free tile the arena
        assert a.used == sum(r.size for r in live)
    for r in live:
        a.free(r)
    assert a.free_runs() == [Region(0, 1000)]


def test_the_kv_cache_holds_what_its_budget_allows_and_views_its_writes_without_copying() -> None:
    per_token = kv_bytes_per_token(2, 2, 8, torch.float32)
    assert per_token == 2 * 2 * 2 * 8 * 4
    cache = KVCache.from_budget(per_token * 50 + 7, 2, 2, 8, torch.float32, "cpu")
    assert cache.num_tokens == 50
    assert cache.k.shape == (2, 2, 50, 8)
    slot = cache.allocate(20)
    assert slot is not None and slot.region == Region(0, 20)
    u = cache.usage()
    assert (u.used_tokens, u.total_tokens, u.used_bytes, u.total_bytes) == (20, 50, 20 * per_token, 50 * per_token)

    kv = torch.randn(3, 2, 2, 8)  # [T, K|V, Hkv, D]
    cache.write(1, torch.tensor([5, 6, 7]), kv)
    kv_k, kv_v = cache.view(1, 5, 3)  # [Hkv, 3, D]
    assert torch.equal(kv_k, kv[:, 0].transpose(0, 1)) and torch.equal(kv_v, kv[:, 1].transpose(0, 1))
    assert kv_k.data_ptr() == cache.k[1, :, 5:].data_ptr()  # a view, not a copy

    cache.free(slot)
    assert cache.usage().used_tokens == 0
    # The budget is capped at what could ever be used.
    assert KVCache.from_budget(10**9, 2, 2, 8, torch.float32, "cpu", max_tokens=64).num_tokens == 64
    with pytest.raises(ValueError):
        KVCache.from_budget(per_token - 1, 2, 2, 8, torch.float32, "cpu")


def test_rollback_only_lowers_the_cached_count() -> None:
    slot = CacheSlot(Region(0, 10), num_cached=8)
    slot.rollback(5)
    assert slot.num_cached == 5
    with pytest.raises(ValueError):
        slot.rollback(6)  # cannot roll forward


@pytest.mark.parametrize(
    "setting,weights,expected",
    [
        ("auto", "int4", torch.bfloat16), ("auto", "int8", torch.bfloat16), ("auto", "bf16", torch.bfloat16),
        ("auto", "fp32", torch.float32), ("float32", "int4", torch.float32), ("bfloat16", "fp32", torch.bfloat16),
    ],
)  # fmt: skip
def test_the_kv_dtype_is_bfloat16_beside_reduced_precision_weights_unless_set(
    setting: str, weights: str, expected: torch.dtype
) -> None:
    assert kv_cache_dtype(setting, torch.float32, weights) == expected


def test_an_unknown_kv_dtype_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype must be auto, float32 or bfloat16, got 'fp8'"):
        kv_cache_dtype("fp8", torch.float32, "int4")


def test_a_bfloat16_arena_holds_twice_the_tokens_of_a_budget_and_rounds_writes_to_nearest_even() -> None:
    fp32 = KVCache.from_budget(1 << 20, 2, 1, 64, torch.float32, "cpu")
    bf16 = KVCache.from_budget(1 << 20, 2, 1, 64, torch.bfloat16, "cpu")
    assert bf16.num_tokens == 2 * fp32.num_tokens and bf16.usage().total_bytes == fp32.usage().total_bytes
    kv = torch.randn(3, 2, 1, 64)  # [T, K/V, kv_heads, head_dim]
    bf16.write(1, torch.tensor([4, 0, 9]), kv)
    k, v = bf16.view(1, 0, 10)
    assert torch.equal(k[0, 4], kv[0, 0, 0].bfloat16()) and torch.equal(v[0, 9], kv[2, 1, 0].bfloat16())
