"""Batch work (the lowest priority) holds at most its share of the running slots and yields at admission only."""
from __future__ import annotations

import pytest
import torch
from _engine_factories import scheduler_step

from engine.kv_cache import KVCache
from engine.request import EngineRequest, SamplingOptions
from engine.scheduler import Scheduler, SchedulerOutput
from engine.sequence import Sequence

BATCH = 10


def make_scheduler(max_running: int = 8, share: float = 0.5, headroom: int = 0) -> Scheduler:
    cache = KVCache(1, 1, 2, 4000, torch.float32, "cpu")
    return Scheduler(cache, 256, max_running, 512, 0, batch_priority=BATCH, batch_max_share=share,
                     batch_headroom=headroom)


def make_seq(rid: str, priority: int = 0, max_tokens: int = 10) -> Sequence:
    return Sequence(request=EngineRequest(rid, [1, 2, 3, 4], SamplingOptions(max_tokens=max_tokens), priority=priority))


def step(sch: Scheduler) -> SchedulerOutput:
    return scheduler_step(sch)


def running_ids(sch: Scheduler) -> set[str]:
    return {s.request_id for s in sch.running}


def test_batch_work_holds_at_most_its_share_of_running_slots() -> None:
    sch = make_scheduler(max_running=8, share=0.5)
    for i in range(20):
        sch.add(make_seq(f"b{i}", BATCH))
    step(sch)
    assert sch.num_running_batch == 4
    assert sch.num_waiting == 16


def test_interactive_arrival_is_admitted_next_step_while_batch_runs() -> None:
    sch = make_scheduler(max_running=8, share=0.5)
    for i in range(20):
        sch.add(make_seq(f"b{i}", BATCH))
    step(sch)
    for i in range(4):
        sch.add(make_seq(f"i{i}", 0))
    step(sch)
    assert {f"i{i}" for i in range(4)} <= running_ids(sch)
    assert sch.num_running == 8 and sch.num_running_batch == 4


def test_batch_lines_never_take_an_interactive_slot_and_are_never_preempted() -> None:
    sch = make_scheduler(max_running=4, share=0.5)
    sch.add(make_seq("b0", BATCH))
    sch.add(make_seq("b1", BATCH))
    step(sch)
    for i in range(5):
        sch.add(make_seq(f"i{i}", 0))
    step(sch)
    # The two batch lines keep running; interactive requests still get all 4 slots, the fifth waits for one.
    assert {"b0", "b1", "i0", "i1", "i2", "i3"} == running_ids(sch)
    assert sch.num_waiting == 1


def test_interactive_requests_queue_ahead_of_earlier_batch_lines() -> None:
    sch = make_scheduler(max_running=2, share=1.0)
    sch.add(make_seq("b0", BATCH))
    sch.add(make_seq("i0", 0))
    step(sch)
    assert [s.request_id for s in sch.running] == ["i0"]  # b0's prompt waits for a step without i0's
    step(sch)
    assert [s.request_id for s in sch.running] == ["i0", "b0"]


def test_batch_takes_the_freed_slot_when_a_batch_line_finishes() -> None:
    sch = make_scheduler(max_running=4, share=0.5)
    for i in range(4):
        sch.add(make_seq(f"b{i}", BATCH, max_tokens=1))
    step(sch)  # prefill: b0 and b1 run and sample their only token
    assert running_ids(sch) == {"b0", "b1"}
    sch.finish(sch.get("b0"), "length")
    step(sch)
    assert running_ids(sch) == {"b1", "b2"}


def test_a_small_engine_still_runs_one_batch_line() -> None:
    sch = make_scheduler(max_running=1, share=0.5)
    sch.add(make_seq("b0", BATCH))
    step(sch)
    assert running_ids(sch) == {"b0"}


@pytest.mark.parametrize("share", [0.0, 1.5])
def test_share_outside_zero_to_one_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="batch_max_share"):
        make_scheduler(share=share)


def make_capped_scheduler(max_running: int = 8, batch_step_tokens: int = 8, kv_tokens: int = 4000) -> Scheduler:
    cache = KVCache(1, 1, 2, kv_tokens, torch.float32, "cpu")
    return Scheduler(cache, 256, max_running, 512, 0, batch_priority=BATCH, batch_max_share=0.5,
                     batch_step_tokens=batch_step_tokens)


def long_seq(rid: str, priority: int, prompt_len: int, max_tokens: int = 10) -> Sequence:
    prompt = list(range(1, prompt_len + 1))
    return Sequence(request=EngineRequest(rid, prompt, SamplingOptions(max_tokens=max_tokens), priority=priority))


def batch_step_tokens(out: SchedulerOutput, sch: Scheduler) -> int:
    return sum(s.num_new_tokens for s in out.scheduled if s.is_prefill and sch.is_batch(s.seq))


def test_batch_prefill_per_step_stays_within_batch_step_tokens() -> None:
    sch = make_capped_scheduler(batch_step_tokens=8)
    for i in range(4):
        sch.add(long_seq(f"b{i}", BATCH, prompt_len=6))
    seen = [batch_step_tokens(step(sch), sch) for _ in range(3)]
    assert seen == [8, 8, 8]  # 24 prompt tokens in chunks of at most 8 a step, never more
    assert sch.num_running_batch == 4


def test_interactive_prefill_step_carries_no_batch_prompt_tokens() -> None:
    sch = make_capped_scheduler(batch_step_tokens=8)
    for i in range(4):
        sch.add(long_seq(f"b{i}", BATCH, prompt_len=20))
    step(sch)  # b0 is part-way through its prompt; the rest wait
    sch.add(long_seq("i0", 0, prompt_len=30))
    out = step(sch)
    assert [s.seq.request_id for s in out.scheduled if s.is_prefill] == ["i0"]
    assert batch_step_tokens(out, sch) == 0
    out = step(sch)  # i0 decodes now: the batch prompts go on
    assert batch_step_tokens(out, sch) == 8


def test_batch_lines_skip_the_interactive_prefill_step_keeping_their_slot_and_kv() -> None:
    sch = make_capped_scheduler(batch_step_tokens=64)
    for i in range(2):
        sch.add(long_seq(f"b{i}", BATCH, prompt_len=4))
    step(sch)
    cached = {rid: sch.get(rid).kv.num_cached for rid in ("b0", "b1")}
    sch.add(long_seq("i0", 0, prompt_len=30))
    out = step(sch)
    assert [s.seq.request_id for s in out.scheduled] == ["i0"]  # its first step runs as if no batch were there
    assert running_ids(sch) == {"b0", "b1", "i0"}
    assert {rid: sch.get(rid).kv.num_cached for rid in ("b0", "b1")} == cached


def test_batch_lines_decode_again_in_the_step_after_the_interactive_prefill() -> None:
    sch = make_capped_scheduler(batch_step_tokens=64)
    for i in range(2):
        sch.add(long_seq(f"b{i}", BATCH, prompt_len=4))
    step(sch)
    sch.add(long_seq("i0", 0, prompt_len=30))
    step(sch)
    out = step(sch)  # i0 decodes: batch lines feed their rows beside it
    assert {s.seq.request_id: s.num_new_tokens for s in out.scheduled} == {"i0": 1, "b0": 1, "b1": 1}


def test_every_chunk_of_a_long_interactive_prompt_runs_without_batch_rows() -> None:
    cache = KVCache(1, 1, 2, 4000, torch.float32, "cpu")
    sch = Scheduler(cache, 256, 8, 16, 0, batch_priority=BATCH, batch_max_share=0.5, batch_step_tokens=8)
    for i in range(2):
        sch.add(long_seq(f"b{i}", BATCH, prompt_len=4))
    step(sch)
    sch.add(long_seq("i0", 0, prompt_len=40))
    chunks = [step(sch) for _ in range(3)]  # 16 + 16 + 8 prompt tokens
    assert [[(s.seq.request_id, s.num_new_tokens) for s in o.scheduled] for o in chunks] == [
        [("i0", 16)], [("i0", 16)], [("i0", 8)]]
    assert {s.seq.request_id for s in step(sch).scheduled} == {"i0", "b0", "b1"}


def test_an_interactive_request_short_of_memory_preempts_a_batch_line_which_resumes_after_it() -> None:
    sch = make_capped_scheduler(max_running=8, batch_step_tokens=8, kv_tokens=60)
    sch.add(long_seq("b0", BATCH, prompt_len=4, max_tokens=20))
    step(sch)
    step(sch)  # b0 has decoded: 2 output tokens
    sch.add(long_seq("i0", 0, prompt_len=30, max_tokens=20))  # needs 51 KV slots; b0 holds 25 of 60
    out = step(sch)
    assert [(s.seq.request_id, s.is_prefill) for s in out.scheduled] == [("i0", True)]
    b0 = sch.get("b0")
    assert b0 is not None and b0.kv is None and b0.num_preemptions == 1 and sch.num_preemptions == 1
    assert b0.output_ids == [7, 7]  # kept: it resumes where it was, recomputing its KV
    sch.finish(sch.get("i0"), "stop")
    resumed = step(sch)
    # The prompt is computed again (KV only, no new token from this chunk); the output's KV, kept aside, is put back.
    assert [(s.seq.request_id, s.num_new_tokens, s.needs_logits) for s in resumed.scheduled] == [("b0", 4, False)]
    assert b0.num_computed == 5 and b0.saved_output_kv is None  # every token but the last sampled one
    assert [(s.seq.request_id, s.is_prefill) for s in step(sch).scheduled] == [("b0", False)]


def test_batch_prompts_go_on_while_an_interactive_request_waits_for_memory_held_by_interactive_work() -> None:
    # The interactive head does not fit and may not preempt its peers: batch prefill must not wait on it.
    sch = make_capped_scheduler(max_running=8, batch_step_tokens=8, kv_tokens=70)
    sch.add(long_seq("i_a", 0, prompt_len=4, max_tokens=20))
    sch.add(long_seq("b0", BATCH, prompt_len=20, max_tokens=4))
    assert [batch_step_tokens(step(sch), sch) for _ in range(2)] == [0, 8]
    # i0 needs 51 KV slots; i_a holds 25 and b0 25 of 70: even without b0 it would not fit, so b0 stays.
    sch.add(long_seq("i0", 0, prompt_len=30, max_tokens=20))
    outs = [step(sch) for _ in range(2)]
    assert [batch_step_tokens(o, sch) for o in outs] == [8, 4]
    assert "i0" not in running_ids(sch) and sch.num_preemptions == 0


def test_batch_decodes_verify_drafts_only_in_steps_without_interactive_prefill() -> None:
    cache = KVCache(1, 1, 2, 4000, torch.float32, "cpu")
    sch = Scheduler(cache, 256, 8, 512, 4, batch_priority=BATCH, batch_max_share=0.5)
    sch.add(long_seq("b0", BATCH, prompt_len=4, max_tokens=20))
    step(sch)
    sch.add(long_seq("i0", 0, prompt_len=30, max_tokens=20))
    with_prefill = sch.schedule(draft_lens={"b0": 4})
    assert {s.seq.request_id: s.draft_budget for s in with_prefill.scheduled} == {"i0": 0}
    sch.update_from_step(with_prefill, {})
    sch.get("i0").output_ids.append(7)
    after = sch.schedule(draft_lens={"b0": 4, "i0": 2})
    assert {s.seq.request_id: s.draft_budget for s in after.scheduled} == {"b0": 4, "i0": 2}


def test_batch_prompts_then_batch_drafts_share_batch_step_tokens_beyond_one_row_per_line() -> None:
    cache = KVCache(1, 1, 2, 4000, torch.float32, "cpu")
    sch = Scheduler(cache, 256, 8, 512, 4, batch_priority=BATCH, batch_max_share=0.5, batch_step_tokens=6)
    for i in range(2):
        sch.add(long_seq(f"b{i}", BATCH, prompt_len=3, max_tokens=20))
    step(sch)  # b0's prompt (3) and b1's (3): the whole 6
    sch.add(long_seq("b2", BATCH, prompt_len=4, max_tokens=20))
    out = sch.schedule(draft_lens={"b0": 4, "b1": 4})
    tokens = {s.seq.request_id: (s.num_new_tokens, s.draft_budget) for s in out.scheduled}
    # One row per decoding line; of the 6 beyond them, b2's prompt (4) first, then 2 drafts for the first decode.
    assert tokens == {"b0": (3, 2), "b1": (1, 0), "b2": (4, 0)}
    assert sum(n for n, _ in tokens.values()) - 2 == 6




def test_a_finished_batch_line_is_not_replaced_while_it_would_take_the_headroom() -> None:
    sch = make_scheduler(max_running=8, share=0.5, headroom=2)
    for i in range(20):
        sch.add(make_seq(f"b{i}", BATCH))
    step(sch)
    assert sch.num_running_batch == 4  # the share binds first: 4 running, 4 slots free
    for i in range(3):
        sch.add(make_seq(f"i{i}", 0, max_tokens=100))
    step(sch)
    assert sch.num_running == 7  # one free slot left
    sch.finish(sch.get("b0"), "length")
    step(sch)
    assert sch.num_running_batch == 3 and sch.num_running == 6  # b0's slot stays free: 2 slots for arrivals
    for i in range(3, 5):
        sch.add(make_seq(f"i{i}", 0, max_tokens=100))
    step(sch)
    assert {"i3", "i4"} <= running_ids(sch)  # a burst of two finds its slots at once


def test_batch_lines_refill_up_to_their_share_once_interactive_work_leaves_the_headroom() -> None:
    sch = make_scheduler(max_running=8, share=0.5, headroom=2)
    for i in range(5):
        sch.add(make_seq(f"i{i}", 0, max_tokens=100))
    for i in range(20):
        sch.add(make_seq(f"b{i}", BATCH))
    step(sch)
    step(sch)
    assert sch.num_running_batch == 1  # 5 interactive + 1 batch leave the 2 slots of headroom
    for i in range(3):
        sch.finish(sch.get(f"i{i}"), "length")
    step(sch)
    assert sch.num_running_batch == 4  # back to its share


def test_a_one_slot_engine_still_runs_batch_work_whatever_the_headroom() -> None:
    sch = make_scheduler(max_running=1, share=0.5, headroom=2)
    sch.add(make_seq("b0", BATCH))
    step(sch)
    assert running_ids(sch) == {"b0"}
