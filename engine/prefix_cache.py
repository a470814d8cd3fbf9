"""Automatic prefix caching: the KV of earlier and running sequences, reused by any request whose prefix matches.

Identity. A sequence's tokens are cut into blocks of `block_size`; a block's
hash chains its parent's hash with its own tokens (sha256, as vLLM hashes
blocks), and the chain starts from the sequence's *salt*: everything besides
the tokens that changes KV (the LoRA adapter and where it was read from). So
a block hash names the whole prefix up to the block's end under one adapter,
and a match of block i implies blocks 0..i-1 match too. Weight format and KV
dtype are fixed per engine, positions are implied by the chain.

Memory: copy, not pages. Every sequence keeps one contiguous region of the
arena (engine.kv_cache; the C++ row and chunk kernels read plain slices of
it). A hit copies the matched blocks from whichever region holds them into the
new sequence's region (one strided copy, all layers): for SmolLM2-135M in fp32
K and V are 46 KiB a token, so a 1,500-token prefix is 69 MB. A smoke run of
`python -m bench.prefix_cache copy --quick` on the shared 2-core dev machine
(busy) copied 256 tokens in 15 ms (bfloat16 KV: half the bytes); prefilling
them takes a forward over every layer. A paged arena would save that copy but needs block tables in
both C++ kernels and every attention path; the copy keeps them untouched.

Holders. A region whose leading blocks are indexed is a holder: a running
sequence's own region (its prompt's blocks are indexed as their KV is
committed, so requests arriving while it runs reuse them), and, once it
finishes, what is left of it (shrunk to those blocks) as an unreferenced holder
in LRU order. An
allocation that does not fit evicts unreferenced holders, least recently used
first. A holder made redundant (another holder has all its blocks, as when the
next turn of a conversation copied the whole previous turn) is freed at once,
so one conversation holds one copy of its history.

Lossless: the copied KV is the KV a cache-off run computes for those positions
(same tokens, same positions, same adapter, same kernels), and the last prompt
token is always computed again, for the first sample's logits. Only prompt
positions are indexed, never those a decode wrote: a decode's row goes through
the row-attention kernel, a later prompt's chunk through the chunk kernel, and
the two round differently (on the real model in int4, reusing a turn's answer
KV flipped a near tie in the third turn of a chat; prompt-only reuse gives the
cache-off text). So the next turn of a chat computes the previous answer and
the new message, not the whole history.
"""
from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

from engine.kv_cache import CacheSlot, CacheUsage, KVCache, Region
from engine.sequence import Sequence

BLOCK_SIZE = 16  # vLLM's default block size: the unit of matching


def salt_hash(salt: str) -> bytes:
    """The chain's root: the inputs besides the tokens that change KV (empty for the base model)."""
    return hashlib.sha256(b"specstream-prefix\0" + salt.encode()).digest()[:16]


def chain_hashes(tokens: list[int], parent: bytes, first_block: int, num_blocks: int, block_size: int) -> list[bytes]:
    """Hashes of blocks first_block..first_block + num_blocks - 1 of `tokens`, chained from `parent` (the hash of
    block first_block - 1, or the salt's)."""
    out: list[bytes] = []
    for b in range(first_block, first_block + num_blocks):
        block = array("q", tokens[b * block_size : (b + 1) * block_size]).tobytes()
        parent = hashlib.sha256(parent + block).digest()[:16]
        out.append(parent)
    return out


@dataclass(eq=False)
class Holder:
    """A region of the arena whose first len(hashes) blocks hold indexed KV."""

    region: Region
    hashes: list[bytes] = field(default_factory=list)
    # The running sequence whose region this is; None: cached only (evictable).
    owner: str | None = None


@dataclass(frozen=True)
class PrefixHit:
    holder: Holder
    num_blocks: int


class PrefixCache:
    """Allocation of sequence regions through the prefix index (a pass-through when disabled)."""

    def __init__(self, kv_cache: KVCache, enabled: bool = True, block_size: int = BLOCK_SIZE) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be at least 1, got {block_size}")
        self.kv_cache = kv_cache
        self.enabled = enabled
        self.block_size = block_size
        self._index: dict[bytes, dict[Holder, None]] = {}  # block hash -> holders having it (insertion order)
        self._lru: OrderedDict[Holder, None] = OrderedDict()  # unreferenced holders, least recently used first
        self._running: dict[str, Holder] = {}
        self._cached_tokens = 0  # slots held by unreferenced holders
        # vLLM's counters, in tokens: prompt tokens looked up, and of them found cached.
        self.queries = 0
        self.hits = 0

    # ------------------------------------------------------------- allocation

    def allocate(self, seq: Sequence, need: int) -> CacheSlot | None:
        """A region of `need` slots for `seq` with its longest cached prefix copied in (num_cached set), evicting
        unreferenced holders as needed; None when it cannot fit now."""
        # Cached KV comes without logits: a request asking for prompt logprobs computes its prompt (as vLLM does);
        # it still indexes its blocks for others.
        hit = self._lookup(seq) if self.enabled and not seq.wants_prompt_rows else None
        if hit is not None and hit.holder.owner is None:
            self._lru.pop(hit.holder)  # pinned: the eviction below must not take the source
        slot = self._allocate(need)
        if hit is not None and hit.holder.owner is None:
            self._lru[hit.holder] = None  # back, most recently used
            if slot is None:  # only evicting the source itself makes room: a miss then, never a wait for nothing
                hit, slot = None, self._allocate(need)
        if slot is None:
            return None
        self._running[seq.request_id] = holder = Holder(slot.region, owner=seq.request_id)
        if not self.enabled:
            return slot
        target = seq.prefill_target
        self.queries += target
        if hit is not None:
            n = hit.num_blocks * self.block_size
            self.kv_cache.copy(hit.holder.region.start, slot.region.start, n)
            slot.num_cached = n
            self.hits += n
            self._add_blocks(holder, seq.block_hashes[: hit.num_blocks])
            if hit.holder.owner is None and len(hit.holder.hashes) <= hit.num_blocks:
                self._drop(hit.holder)  # the new sequence holds every block of it now
        if seq.num_cached_prompt_tokens is None:  # the first admission reports it (not a resume after preemption)
            seq.num_cached_prompt_tokens = slot.num_cached
        return slot

    def can_free(self, need: int, extra: list[Region]) -> bool:
        """Whether `need` slots could become free by evicting every unreferenced holder and freeing `extra`
        (ignoring where the runs lie)."""
        free = self.kv_cache.num_tokens - self.kv_cache.allocator.used
        return free + self._cached_tokens + sum(r.size for r in extra) >= need

    def _allocate(self, need: int) -> CacheSlot | None:
        while True:
            slot = self.kv_cache.allocate(need)
            if slot is not None or not self._lru:
                return slot
            self._drop(next(iter(self._lru)))  # least recently used

    # ---------------------------------------------------------- bookkeeping

    def committed(self, seq: Sequence) -> None:
        """After a step: index the blocks of `seq`'s prompt whose KV is now committed (not those of its output:
        a decode's KV rounds differently from what a later prompt's prefill computes for the same tokens)."""
        holder = self._running.get(seq.request_id)
        if not self.enabled or holder is None:
            return
        full = min(seq.num_computed, seq.num_prompt_tokens, holder.region.size) // self.block_size
        if full > len(holder.hashes):
            self._extend_hashes(seq, full)
            self._add_blocks(holder, seq.block_hashes[len(holder.hashes) : full])

    def release(self, seq: Sequence) -> None:
        """`seq` leaves its region (finished, aborted, preempted): its blocks stay cached, the rest is freed."""
        holder = self._running.pop(seq.request_id, None)
        if seq.kv is None or holder is None:
            return
        seq.kv = None
        holder.owner = None
        if not holder.hashes or self._redundant(holder):
            self._drop(holder)
            return
        holder.region = self.kv_cache.allocator.shrink(holder.region, len(holder.hashes) * self.block_size)
        self._cached_tokens += holder.region.size
        self._lru[holder] = None

    def usage(self) -> CacheUsage:
        """KV in use by running sequences (cached-only blocks are free for the taking, as vLLM counts them)."""
        used = self.kv_cache.allocator.used - self._cached_tokens
        per = self.kv_cache.bytes_per_token
        total = self.kv_cache.num_tokens
        return CacheUsage(used, total, used * per, total * per, cached_tokens=self._cached_tokens)

    # -------------------------------------------------------------- internals

    def _lookup(self, seq: Sequence) -> PrefixHit | None:
        # Never the last token to compute: the step that completes the prefill needs its row (its logits, or at
        # least one row to schedule).
        blocks = (seq.prefill_target - 1) // self.block_size
        if blocks <= 0:
            return None
        self._extend_hashes(seq, blocks)
        n = 0
        while n < blocks and seq.block_hashes[n] in self._index:
            n += 1
        if n == 0:
            return None
        holder = next(iter(self._index[seq.block_hashes[n - 1]]))
        return PrefixHit(holder, n)

    def _extend_hashes(self, seq: Sequence, num_blocks: int) -> None:
        have = len(seq.block_hashes)
        if num_blocks <= have:
            return
        parent = seq.block_hashes[-1] if have else salt_hash(seq.cache_salt)
        seq.block_hashes.extend(chain_hashes(seq.all_token_ids(), parent, have, num_blocks - have, self.block_size))

    def _add_blocks(self, holder: Holder, hashes: list[bytes]) -> None:
        for h in hashes:
            self._index.setdefault(h, {})[holder] = None
        holder.hashes.extend(hashes)

    def _redundant(self, holder: Holder) -> bool:
        """Another holder has every block of this one (the chain: having its last block means having them all)."""
        return len(self._index.get(holder.hashes[-1], {})) > 1

    def _drop(self, holder: Holder) -> None:
        for h in holder.hashes:
            holders = self._index.get(h)
            if holders is not None:
                holders.pop(holder, None)
                if not holders:
                    del self._index[h]
        if holder.owner is None and self._lru.pop(holder, 0) is None:
            self._cached_tokens -= holder.region.size
        self.kv_cache.allocator.free(holder.region)
