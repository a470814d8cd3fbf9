"""Scheduler policy on CPU, without a model: budgets, chunked prefill, queue order, admission, expiry."""
from __future__ import annotations

import time

import pytest
import torch

from engine.kv_cache import KVCache
from engine.request import EngineRequest, RequestRejected, SamplingOptions
from engine.scheduler import Scheduler, SchedulerOutput, draft_cap, draft_room
from engine.sequence import Sequence, SequenceStatus
from engine.speculative.proposer import DraftProposal


def make_scheduler(kv_tokens: int = 1000, max_running: int = 8, max_batched: int = 64, max_draft: int = 0,
                   max_model_len: int = 256) -> Scheduler:
    cache = KVCache(1, 1, 2, kv_tokens, torch.float32, "cpu")
    return Scheduler(cache, max_model_len, max_running, max_batched, max_draft)


def make_seq(rid: str, prompt_len: int, max_tokens: int = 10, priority: int = 0, arrival: float | None = None,
             deadline: float | None = None, speculate: bool = False) -> Sequence:
    req = EngineRequest(rid, list(range(1, prompt_len + 1)), SamplingOptions(max_tokens=max_tokens), priority=priority,
                        deadline=deadline)
    if arrival is not None:
        req.arrival_time = arrival
    return Sequence(request=req, speculate=speculate)


def run_step(sch: Scheduler, out: SchedulerOutput, sampled: int = 7) -> None:
    """What the engine would do after the forward: no draft accepted, one sampled token where logits were needed."""
    sch.update_from_step(out, {})
    for s in out.scheduled:
        if s.needs_logits:
            s.seq.output_ids.append(sampled)


def plan(out: SchedulerOutput) -> list[tuple[str, int, bool]]:
    return [(s.seq.request_id, s.num_new_tokens, s.is_prefill) for s in out.scheduled]


def test_chunked_prefill_never_stalls_decodes() -> None:
    sch = make_scheduler(max_batched=16)
    sch.add(make_seq("short", 4))
    out = sch.schedule()
    assert plan(out) == [("short", 4, True)]
    assert out.scheduled[0].needs_logits  # the chunk completes the prompt
    run_step(sch, out)
    sch.add(make_seq("long", 40))
    # Each step: the decode first (1 token), the long prompt's chunk fills the other 15.
    chunks = []
    for _ in range(3):
        out = sch.schedule()
        assert out.scheduled[0].seq.request_id == "short" and not out.scheduled[0].is_prefill
        assert out.num_batched_tokens <= 16
        chunks.append(out.scheduled[1].num_new_tokens)
        assert out.scheduled[1].needs_logits == (sum(chunks) == 40)
        run_step(sch, out)
    assert chunks == [15, 15, 10]
    out = sch.schedule()
    assert plan(out) == [("short", 1, False), ("long", 1, False)]


def test_decodes_reserve_draft_tokens_and_trim_them_to_the_budget() -> None:
    sch = make_scheduler(max_batched=10, max_draft=4)
    for rid in ("a", "b", "c"):
        sch.add(make_seq(rid, 2, max_tokens=50, speculate=True))
    run_step(sch, sch.schedule())
    out = sch.schedule(draft_lens={"a": 4, "b": 4, "c": 4})
    # 1 + 4, 1 + 4, then nothing left for c this step.
    assert [(s.seq.request_id, s.num_new_tokens, s.draft_budget) for s in out.scheduled] == [("a", 5, 4), ("b", 5, 4)]
    # Drafts never run past max_tokens: with 2 tokens left, at most 1 draft.
    sch2 = make_scheduler(max_batched=64, max_draft=4)
    sch2.add(make_seq("x", 2, max_tokens=3, speculate=True))
    run_step(sch2, sch2.schedule())
    assert sch2.schedule(draft_lens={"x": 4}).scheduled[0].draft_budget == 1


def test_queue_order_is_priority_then_arrival() -> None:
    sch = make_scheduler(max_running=1)
    t = time.time()
    sch.add(make_seq("late-normal", 3, arrival=t + 2))
    sch.add(make_seq("early-normal", 3, arrival=t + 1))
    sch.add(make_seq("urgent", 3, priority=-1, arrival=t + 3))
    order = []
    while sch.has_unfinished():
        out = sch.schedule()
        for s in out.scheduled:
            if s.is_prefill:
                order.append(s.seq.request_id)
        run_step(sch, out)
        for seq in list(sch.running):
            sch.finish(seq, "length")
    assert order == ["urgent", "early-normal", "late-normal"]


def test_a_request_that_does_not_fit_now_waits_for_memory() -> None:
    # Each request needs 10 + 10 + 1 = 21 slots; the arena holds 50: two at a time.
    sch = make_scheduler(kv_tokens=50)
    for i in range(3):
        sch.add(make_seq(f"r{i}", 10, max_tokens=10))
    run_step(sch, sch.schedule())
    assert [s.request_id for s in sch.running] == ["r0", "r1"] and sch.num_waiting == 1
    assert sch.kv_cache.usage().used_tokens == 42
    sch.finish(sch.running[0], "stop")  # frees at once
    assert sch.kv_cache.usage().used_tokens == 21
    out = sch.schedule()
    assert ("r2", 10, True) in plan(out)


def test_impossible_requests_are_rejected_at_add() -> None:
    sch = make_scheduler(kv_tokens=100, max_model_len=64)
    with pytest.raises(RequestRejected) as e:
        sch.add(make_seq("too-long", 60, max_tokens=10))
    assert e.value.code == "context_length_exceeded"
    assert e.value.message == (
        "prompt has 60 tokens and max_tokens is 10: 60+10 exceeds the model's context of 64 tokens"
    )
    small = make_scheduler(kv_tokens=30, max_model_len=64)
    with pytest.raises(RequestRejected, match="needs 41 KV cache slots but the whole KV cache holds 30 tokens"):
        small.add(make_seq("too-big", 20, max_tokens=20))
    with pytest.raises(RequestRejected, match="empty"):
        sch.add(make_seq("empty", 0))
    sch.add(make_seq("dup", 3))
    with pytest.raises(RequestRejected, match="already"):
        sch.add(make_seq("dup", 3))
    assert not small.has_unfinished()


def test_deadlines_expire_waiting_and_running_requests() -> None:
    sch = make_scheduler(max_running=1)
    now = time.time()
    sch.add(make_seq("runs", 3, deadline=now + 100))
    sch.add(make_seq("waits", 3, deadline=now + 1))
    run_step(sch, sch.schedule(now=now))
    out = sch.schedule(now=now + 2)  # "waits" expired while queued
    assert [s.request_id for s in out.finished] == ["waits"]
    waits = out.finished[0]
    assert waits.finish_reason == "deadline" and waits.first_scheduled_time is None and waits.kv is None
    out = sch.schedule(now=now + 101)
    assert [s.request_id for s in out.finished] == ["runs"] and out.is_empty
    assert sch.kv_cache.usage().used_tokens == 0 and not sch.has_unfinished()


def test_abort_frees_the_region_immediately() -> None:
    sch = make_scheduler()
    sch.add(make_seq("a", 5))
    sch.add(make_seq("queued", 5))
    run_step(sch, sch.schedule())
    used = sch.kv_cache.usage().used_tokens
    seq = sch.abort("a")
    assert seq is not None and seq.status is SequenceStatus.FINISHED and seq.finish_reason == "abort"
    assert sch.kv_cache.usage().used_tokens == used - 16
    assert sch.abort("queued") is not None and sch.abort("unknown") is None
    assert not sch.has_unfinished() and sch.schedule().is_empty


def test_max_running_requests_bounds_admission() -> None:
    sch = make_scheduler(max_running=2)
    for i in range(4):
        sch.add(make_seq(f"r{i}", 2))
    out = sch.schedule()
    assert [s.seq.request_id for s in out.scheduled] == ["r0", "r1"]
    assert sch.num_running == 2 and sch.num_waiting == 2


def test_decodes_beyond_the_token_budget_take_turns() -> None:
    sch = make_scheduler(max_batched=8, max_running=8)
    for i in range(6):
        sch.add(make_seq(f"r{i}", 1, max_tokens=50))
    run_step(sch, sch.schedule())  # all six prefilled
    sch.max_batched_tokens = 4  # now fewer tokens per step than decoding sequences
    seen: dict[str, int] = {}
    for _ in range(3):
        out = sch.schedule()
        assert out.num_batched_tokens == 4
        for s in out.scheduled:
            seen[s.seq.request_id] = seen.get(s.seq.request_id, 0) + 1
        run_step(sch, out)
    assert sorted(seen) == [f"r{i}" for i in range(6)]  # nobody starves
    assert sum(seen.values()) == 12


# ---------------------------------------------------------------- the draft length cap


def decoding_seq(max_tokens: int, emitted: int) -> Sequence:
    seq = make_seq("d", 2, max_tokens=max_tokens, speculate=True)
    seq.output_ids.extend([7] * emitted)
    return seq


def test_draft_cap_is_k_max_when_nothing_else_binds() -> None:
    assert draft_cap(decoding_seq(max_tokens=50, emitted=1), max_draft_tokens=4) == 4
    assert draft_cap(decoding_seq(max_tokens=50, emitted=1), max_draft_tokens=4, free_tokens=64) == 4


def test_draft_cap_never_drafts_past_max_tokens() -> None:
    # A step emits up to k + 1 tokens: with t tokens left, at most t - 1 drafts.
    assert draft_cap(decoding_seq(max_tokens=10, emitted=7), max_draft_tokens=8) == 2
    assert draft_cap(decoding_seq(max_tokens=10, emitted=9), max_draft_tokens=8) == 0


def test_draft_cap_leaves_the_decode_its_own_token_in_the_budget() -> None:
    assert draft_cap(decoding_seq(max_tokens=50, emitted=1), max_draft_tokens=8, free_tokens=3) == 2
    assert draft_cap(decoding_seq(max_tokens=50, emitted=1), max_draft_tokens=8, free_tokens=1) == 0


def test_draft_cap_is_never_negative() -> None:
    assert draft_cap(decoding_seq(max_tokens=5, emitted=5), max_draft_tokens=4) == 0
    assert draft_cap(decoding_seq(max_tokens=50, emitted=1), max_draft_tokens=4, free_tokens=0) == 0
    assert draft_cap(decoding_seq(max_tokens=50, emitted=1), max_draft_tokens=0) == 0


def test_scheduled_drafts_set_the_rows_fed_and_more_than_the_budget_is_refused() -> None:
    sch = make_scheduler(max_draft=4)
    sch.add(make_seq("a", 2, max_tokens=50, speculate=True))
    run_step(sch, sch.schedule())
    [dec] = sch.schedule(draft_lens={"a": 3}).scheduled
    assert (dec.draft_budget, dec.num_new_tokens) == (3, 4)
    dec.set_drafts(DraftProposal([11]))  # fewer than asked: no match, say
    assert (dec.draft_tokens, dec.num_new_tokens) == ([11], 2)
    with pytest.raises(ValueError, match="4 drafts for a budget of 3"):
        dec.set_drafts(DraftProposal([1, 2, 3, 4]))


# ---------------------------------------------------------------- the KV counter


def test_update_from_step_keeps_the_fed_token_and_the_accepted_drafts_only() -> None:
    sch = make_scheduler(max_batched=64, max_draft=4)
    sch.add(make_seq("a", 5, max_tokens=50, speculate=True))
    sch.add(make_seq("b", 3, max_tokens=50, speculate=True))
    run_step(sch, sch.schedule())
    a, b = sch.running
    assert (a.num_computed, b.num_computed) == (5, 3)  # a prefill keeps every row it fed
    out = sch.schedule(draft_lens={"a": 3, "b": 2})
    out.scheduled[0].set_drafts(DraftProposal([1, 2, 3]))
    out.scheduled[1].set_drafts(DraftProposal([4, 5]))
    sch.update_from_step(out, {"a": 1, "b": 2})
    # a: its last token + 1 of 3 drafts; b: its last token + both drafts.
    assert (a.num_computed, b.num_computed) == (5 + 2, 3 + 3)


def test_a_prefill_chunk_without_logits_advances_by_its_chunk() -> None:
    sch = make_scheduler(max_batched=16)
    sch.add(make_seq("long", 40))
    out = sch.schedule()
    assert not out.scheduled[0].needs_logits
    sch.update_from_step(out, {})
    assert sch.running[0].num_computed == 16


def test_a_steps_draft_room_ends_where_its_bf16_gemms_would_take_one_more_piece() -> None:
    assert [draft_room(rows, 64) for rows in (1, 16, 63, 64, 65, 128)] == [63, 48, 1, 0, 63, 0]
    assert draft_room(64, None) is None  # no bf16 pieces: no bound
