"""bench/lookup_replay.py counts a replayed prompt lookup as the greedy verifier would."""
from __future__ import annotations

from bench.lookup_replay import Replay, replay


def test_an_answer_that_copies_the_prompt_is_drafted_k_at_a_time_and_each_step_adds_one() -> None:
    prompt = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    answer = [3, 4, 5, 6, 7, 8, 9]  # after "...9, 3": copied from the prompt
    got = replay(prompt + [2], answer, k=3, ngram_min=1)
    # step 1: 3, 4, 5 accepted and the target's own 6; step 2: 7, 8, 9 accepted, which end the answer
    assert (got.steps, got.drafted, got.accepted) == (2, 6, 6)


def test_drafts_that_miss_cost_rows_but_no_tokens() -> None:
    got = replay([5, 6, 5, 7], [5, 8], k=2, ngram_min=1)  # "5" last seen before 7; the answer goes 5, 8
    assert got.accepted == 0 and got.steps == 2 and got.drafted > 0


def test_the_modelled_rate_counts_steps_and_draft_rows() -> None:
    assert Replay("x", steps=10, drafted=5, accepted=3).row(13, step_ms=5.0, row_ms=1.0) == "| x | 10 | 5 | 3 | 236.4 |"
