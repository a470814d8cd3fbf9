"""KV cache: one arena allocated once, one contiguous region per sequence.

Why contiguous regions instead of pages: attention then runs on plain views of
the arena (no gather copies, no paged-attention kernel needed on CPU), and a
sequence never grows past the region it got on admission because the region is
sized for its whole life (prompt + max_tokens + draft slack). Rolling back
rejected draft tokens is O(1): the KV written past `num_cached` is simply
ignored and overwritten later.

Layout: K and V are `[layers, kv_heads, arena_tokens, head_dim]`, so a region
of one layer, `k[layer, :, start:start + n]`, is `[kv_heads, n, head_dim]`
with contiguous rows: exactly what `scaled_dot_product_attention` takes. Both
are views of one `[layers, 2, kv_heads, arena_tokens, head_dim]` arena, so a
step's K and V (adjacent in the fused qkv output) are written by one copy.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Region:
    """A run of arena token slots [start, start + size)."""

    start: int
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size


class ArenaAllocator:
    """First-fit allocator over [0, capacity) with a free list that coalesces on free."""

    def __init__(self, capacity: int) -> None:
        if capacity <= 0:
            raise ValueError(f"arena capacity must be positive, got {capacity}")
        self.capacity = capacity
        # Free runs as parallel sorted lists (by start) so neighbours are found with bisect.
        self._free_starts: list[int] = [0]
        self._free_sizes: list[int] = [capacity]
        self._allocated: dict[int, int] = {}  # start -> size
        self.used = 0

    def free_runs(self) -> list[Region]:
        return [Region(s, n) for s, n in zip(self._free_starts, self._free_sizes)]

    def allocate(self, size: int) -> Region | None:
        """The lowest free run that fits `size` slots, or None when none fits right now."""
        if size <= 0:
            raise ValueError(f"allocation size must be positive, got {size}")
        for i, run in enumerate(self._free_sizes):
            if run >= size:
                start = self._free_starts[i]
                if run == size:
                    del self._free_starts[i]
                    del self._free_sizes[i]
                else:
                    self._free_starts[i] = start + size
                    self._free_sizes[i] = run - size
                self._allocated[start] = size
                self.used += size
                return Region(start, size)
        return None

    def free(self, region: Region) -> None:
        if self._allocated.get(region.start) != region.size:
            raise ValueError(f"{region} is not an allocated region")
        del self._allocated[region.start]
        self.used -= region.size
        self._free_run(region.start, region.size)

    def shrink(self, region: Region, size: int) -> Region:
        """Keep the first `size` slots of an allocated region and free the rest (a finished sequence's cached
        prefix keeps its blocks, not the room it had reserved for its completion)."""
        if self._allocated.get(region.start) != region.size:
            raise ValueError(f"{region} is not an allocated region")
        if not 0 < size <= region.size:
            raise ValueError(f"cannot shrink {region} to {size} slots")
        if size < region.size:
            self._allocated[region.start] = size
            self.used -= region.size - size
            self._free_run(region.start + size, region.size - size)
        return Region(region.start, size)

    def _free_run(self, start: int, size: int) -> None:
        """Return [start, start + size) to the free list, merged with its neighbours."""
        end = start + size
        i = bisect.bisect_left(self._free_starts, start)
        # Merge with the run just after, then with the run just before.
        if i < len(self._free_starts) and self._free_starts[i] == end:
            size += self._free_sizes[i]
            del self._free_starts[i]
            del self._free_sizes[i]
        if i > 0 and self._free_starts[i - 1] + self._free_sizes[i - 1] == start:
            self._free_sizes[i - 1] += size
        else:
            self._free_starts.insert(i, start)
            self._free_sizes.insert(i, size)


def region_size(num_tokens: int, max_draft_tokens: int) -> int:
    """Slots a sequence of up to `num_tokens` tokens reserves for its whole life.

    The last sampled token is never fed back, drafts may run up to
    max_draft_tokens positions past the accepted ones; +1 keeps a slot of slack.
    """
    return num_tokens + max_draft_tokens + 1


@dataclass
class CacheSlot:
    """A sequence's region of the arena and how many of its positions hold valid KV."""

    region: Region
    num_cached: int = 0

    def rollback(self, num_tokens: int) -> None:
        """Keep only the first `num_tokens` positions (drop rejected drafts): O(1)."""
        if not 0 <= num_tokens <= self.num_cached:
            raise ValueError(f"cannot roll back to {num_tokens} tokens, {self.num_cached} are cached")
        self.num_cached = num_tokens


@dataclass(frozen=True)
class CacheUsage:
    used_tokens: int
    total_tokens: int
    used_bytes: int
    total_bytes: int
    # Slots held only by the prefix cache (finished sequences' blocks): free for the taking, not in used_tokens.
    cached_tokens: int = 0

    @property
    def fraction(self) -> float:
        return self.used_tokens / self.total_tokens if self.total_tokens else 0.0


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    # K and V, every layer.
    return 2 * num_layers * num_kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()


def available_memory_bytes(device: torch.device) -> int:
    """Memory that can still be claimed on `device` right now."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    raise RuntimeError("cannot tell how much memory is available (no psutil, no /proc/meminfo)")


def kv_budget_bytes(device: torch.device, kv_cache_bytes: int | None, kv_cache_fraction: float) -> int:
    if kv_cache_bytes is not None:
        if kv_cache_bytes <= 0:
            raise ValueError(f"kv_cache_bytes must be positive, got {kv_cache_bytes}")
        return kv_cache_bytes
    if not 0.0 < kv_cache_fraction <= 1.0:
        raise ValueError(f"kv_cache_fraction must be in (0, 1], got {kv_cache_fraction}")
    return int(available_memory_bytes(device) * kv_cache_fraction)


class KVCache:
    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_tokens: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if num_tokens <= 0:
            raise ValueError(f"the KV arena needs at least one token slot, got {num_tokens}")
        self.num_layers = num_layers
        self.num_tokens = num_tokens
        self.bytes_per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)
        # torch.empty: on CPU the pages are only committed when first written, and
        # positions past a sequence's num_cached are never read, so no zeroing is needed.
        self.kv = torch.empty(num_layers, 2, num_kv_heads, num_tokens, head_dim, dtype=dtype, device=device)
        self.k, self.v = self.kv[:, 0], self.kv[:, 1]  # each [layers, kv_heads, arena_tokens, head_dim]
        self.allocator = ArenaAllocator(num_tokens)

    @classmethod
    def from_budget(
        cls,
        budget_bytes: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        max_tokens: int | None = None,
    ) -> KVCache:
        """The largest arena within `budget_bytes` (capped at `max_tokens` slots: more could never be used)."""
        per_token = kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype)
        num_tokens = budget_bytes // per_token
        if max_tokens is not None:
            num_tokens = min(num_tokens, max_tokens)
        if num_tokens <= 0:
            raise ValueError(
                f"a KV budget of {budget_bytes} bytes holds no token ({per_token} bytes per token)"
            )
        return cls(num_layers, num_kv_heads, head_dim, num_tokens, dtype, device)

    def allocate(self, num_tokens: int) -> CacheSlot | None:
        region = self.allocator.allocate(num_tokens)
        return CacheSlot(region) if region is not None else None

    def free(self, slot: CacheSlot) -> None:
        self.allocator.free(slot.region)
        slot.num_cached = 0

    @property
    def dtype(self) -> torch.dtype:
        """The arena's element (engine.kv_cache_dtype)."""
        return self.kv.dtype

    def write(self, layer: int, slot_mapping: torch.Tensor, kv: torch.Tensor) -> None:
        """Store the new tokens' K and V: slot_mapping [T] arena slots; kv [T, 2, kv_heads, head_dim]."""
        # One index_copy_ per layer for the whole flat batch, K and V together (rounded to a bfloat16 arena's
        # dtype first, to nearest even, as the fused step's write rounds).
        self.kv[layer].index_copy_(2, slot_mapping, kv.permute(1, 2, 0, 3).to(self.dtype))

    def copy(self, src_start: int, dst_start: int, length: int) -> None:
        """Copy the KV of arena slots [src_start, +length) to [dst_start, +length), every layer, K and V: one
        strided copy (a cached prefix into a new sequence's region; the regions never overlap)."""
        self.kv[:, :, :, dst_start : dst_start + length].copy_(self.kv[:, :, :, src_start : src_start + length])

    def save(self, start: int, length: int) -> torch.Tensor:
        """A copy, outside the arena, of the KV of slots [start, +length), every layer (a preempted sequence's
        output positions, put back by `load` when it resumes)."""
        return self.kv[:, :, :, start : start + length].clone()

    def load(self, start: int, saved: torch.Tensor) -> None:
        """Write KV taken by `save` back at slots [start, +its length)."""
        self.kv[:, :, :, start : start + saved.shape[3]].copy_(saved)

    def view(self, layer: int, start: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K, V of arena slots [start, start + length): views, each [kv_heads, length, head_dim]."""
        return self.k[layer, :, start : start + length], self.v[layer, :, start : start + length]

    def usage(self) -> CacheUsage:
        used = self.allocator.used
        return CacheUsage(
            used_tokens=used,
            total_tokens=self.num_tokens,
            used_bytes=used * self.bytes_per_token,
            total_bytes=self.num_tokens * self.bytes_per_token,
        )
