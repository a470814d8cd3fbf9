"""The prefix index and admission around it, without a model: chained block identity, reuse from running and
finished sequences, LRU eviction, and a queue head that does not fit holding back nobody (for a while)."""
from __future__ import annotations

import torch
from _engine_factories import scheduler_step

from engine.kv_cache import KVCache
from engine.prefix_cache import BLOCK_SIZE, PrefixCache, chain_hashes, salt_hash
from engine.request import EngineRequest, SamplingOptions
from engine.scheduler import HEAD_BYPASS_LIMIT, Scheduler, SchedulerOutput
from engine.sequence import Sequence, SequenceStatus


def cache(tokens: int) -> KVCache:
    return KVCache(1, 1, 2, tokens, torch.float32, "cpu")


def seq(rid: str, prompt: list[int], max_tokens: int = 4, salt: str = "", priority: int = 0) -> Sequence:
    s = Sequence(request=EngineRequest(rid, prompt, SamplingOptions(max_tokens=max_tokens), priority=priority))
    s.cache_salt = salt
    return s


def computed(pc: PrefixCache, s: Sequence, need: int) -> Sequence:
    """`s` admitted through the cache and its whole prompt's KV written (filled with its token ids)."""
    slot = pc.allocate(s, need)
    assert slot is not None
    s.kv = slot
    start = slot.region.start
    n = s.num_prompt_tokens
    pc.kv_cache.kv[:, :, :, start + slot.num_cached : start + n] = torch.tensor(
        s.request.prompt_token_ids[slot.num_cached :], dtype=torch.float32)[:, None]
    slot.num_cached = n
    pc.committed(s)
    return s


PROMPT = list(range(100, 150))  # 50 tokens: three full blocks


def test_a_block_hash_names_the_whole_prefix_and_the_salt() -> None:
    root = salt_hash("")
    a = chain_hashes(PROMPT, root, 0, 3, BLOCK_SIZE)
    assert chain_hashes(PROMPT, a[0], 1, 2, BLOCK_SIZE) == a[1:]  # incremental hashing continues the chain
    changed = [7] + PROMPT[1:]
    assert chain_hashes(changed, root, 0, 3, BLOCK_SIZE)[2] != a[2]  # a change in block 0 changes block 2's hash
    assert chain_hashes(PROMPT, salt_hash("lora\0x\01"), 0, 3, BLOCK_SIZE) != a  # another adapter: other blocks


def test_a_hit_copies_the_cached_blocks_and_leaves_the_last_prompt_token_to_compute() -> None:
    pc = PrefixCache(cache(400))
    first = computed(pc, seq("a", PROMPT), 60)
    second = seq("b", PROMPT[:48] + [1, 2])
    slot = pc.allocate(second, 60)
    assert slot is not None and slot.num_cached == 48
    got = pc.kv_cache.kv[0, 0, 0, slot.region.start : slot.region.start + 48, 0]
    assert got.tolist() == [float(t) for t in PROMPT[:48]]  # copied from the running sequence's region
    assert first.kv is not None and (pc.queries, pc.hits) == (100, 48)
    exact = seq("c", PROMPT[:48])  # 48 tokens = 3 blocks: only 2 may be reused
    assert pc.allocate(exact, 60).num_cached == 32
    assert exact.num_cached_prompt_tokens == 32


def test_another_salt_misses() -> None:
    pc = PrefixCache(cache(400))
    computed(pc, seq("a", PROMPT), 60)
    assert pc.allocate(seq("b", PROMPT, salt="lora\0x\01"), 60).num_cached == 0


def test_a_finished_sequence_keeps_its_full_blocks_only_and_they_count_as_free() -> None:
    pc = PrefixCache(cache(400))
    a = computed(pc, seq("a", PROMPT), 60)
    pc.release(a)
    usage = pc.usage()
    assert (usage.used_tokens, usage.cached_tokens) == (0, 48)
    assert pc.kv_cache.allocator.used == 48  # the region shrank to its three blocks


def test_unreferenced_blocks_are_evicted_least_recently_used_first_and_running_ones_never() -> None:
    pc = PrefixCache(cache(150))
    prompts = {rid: [base + i for i in range(40)] for rid, base in [("a", 0), ("b", 1000), ("c", 2000)]}
    for rid in "ab":
        pc.release(computed(pc, seq(rid, prompts[rid]), 40))  # each leaves two blocks (32 slots) cached
    a2 = computed(pc, seq("a2", prompts["a"]), 40)  # a used again (and a2 now holds all of it): b is the oldest
    assert a2.num_cached_prompt_tokens == 32
    c = computed(pc, seq("c", prompts["c"]), 50)  # no run of 50 free slots: b goes
    pc.release(c)
    assert pc.allocate(seq("b2", prompts["b"]), 30).num_cached == 0  # evicted
    assert pc.allocate(seq("a3", prompts["a"]), 40).num_cached == 32  # a2 runs: never evicted


def test_a_holder_copied_whole_by_the_next_turn_is_freed_at_once() -> None:
    pc = PrefixCache(cache(400))
    pc.release(computed(pc, seq("turn1", PROMPT), 60))
    assert pc.usage().cached_tokens == 48
    turn2 = computed(pc, seq("turn2", PROMPT + [9] * 20), 80)
    assert turn2.kv.num_cached == 70 and pc.usage().cached_tokens == 0  # one copy of the conversation
    pc.release(turn2)
    assert pc.usage().cached_tokens == 64


def test_disabled_it_only_allocates_and_frees() -> None:
    pc = PrefixCache(cache(400), enabled=False)
    a = computed(pc, seq("a", PROMPT), 60)
    pc.release(a)
    assert pc.kv_cache.allocator.used == 0 and (pc.queries, pc.hits) == (0, 0)
    assert pc.allocate(seq("b", PROMPT), 60).num_cached == 0


def scheduler(kv_tokens: int) -> Scheduler:
    return Scheduler(cache(kv_tokens), 256, 8, 64, 0, prefix_caching=True)


def step(sch: Scheduler) -> SchedulerOutput:
    return scheduler_step(sch, finish_at_max_tokens=True)


def test_a_head_that_does_not_fit_holds_back_nobody_behind_it_that_does() -> None:
    sch = scheduler(100)
    sch.add(seq("running", list(range(1, 41)), max_tokens=10))  # 51 slots
    step(sch)
    sch.add(seq("big", list(range(200, 260)), max_tokens=10))  # 71: waits for "running"
    sch.add(seq("small", [1, 2, 3], max_tokens=4))  # 8: fits beside it
    step(sch)
    assert {s.request_id for s in sch.running} == {"running", "small"}


def test_a_passed_head_blocks_the_queue_once_enough_requests_went_ahead() -> None:
    sch = scheduler(100)
    sch.add(seq("running", list(range(1, 41)), max_tokens=30))  # 71 slots
    step(sch)
    sch.add(seq("big", list(range(200, 260)), max_tokens=10))  # 71: waits for "running"
    for i in range(HEAD_BYPASS_LIMIT + 3):
        sch.add(seq(f"s{i}", [1, 2, 3], max_tokens=1))  # 5 slots, done in one step
    for _ in range(10):  # "running" runs on; small ones pass "big" until HEAD_BYPASS_LIMIT of them have
        step(sch)
    waiting = {rid for rid in ["big", *(f"s{i}" for i in range(HEAD_BYPASS_LIMIT + 3))]
               if sch.get(rid) is not None and sch.get(rid).status is SequenceStatus.WAITING}
    assert waiting == {"big", *(f"s{HEAD_BYPASS_LIMIT + i}" for i in range(3))}  # the last three wait behind it
    sch.finish(sch.get("running"), "stop")
    step(sch)
    assert "big" in {s.request_id for s in sch.running}
