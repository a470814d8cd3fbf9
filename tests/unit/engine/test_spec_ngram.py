"""engine.speculative.ngram: prompt-lookup proposals, incremental indexing, speed."""
from __future__ import annotations

import random
import time

import pytest

from engine.request import SamplingOptions
from engine.speculative.ngram import NgramProposer
from engine.speculative.proposer import ProposalInput, Proposer

P = SamplingOptions()


def inp(tokens: list[int], seq_id: str = "s") -> ProposalInput:
    return ProposalInput(seq_id=seq_id, token_ids=tokens, params=P)


def test_the_ngram_proposer_implements_the_proposer_protocol() -> None:
    assert isinstance(NgramProposer(), Proposer)


def test_finds_copy_of_earlier_text() -> None:
    prop = NgramProposer(ngram_min=2, ngram_max=4)
    tokens = [10, 11, 12, 13, 14, 15, 16, 99, 50, 11, 12, 13]
    [out] = prop.propose([inp(tokens)], [3])
    assert out.tokens == [14, 15, 16]
    assert out.probs is None  # deterministic


def test_respects_max_tokens_and_context_end() -> None:
    prop = NgramProposer(ngram_min=2, ngram_max=3)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2]
    assert prop.propose([inp(tokens)], [2])[0].tokens == [3, 4]
    assert prop.propose([inp(tokens)], [0])[0].tokens == []
    assert prop.propose([inp(tokens)], [20])[0].tokens == [3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3, 4]


def test_no_match_no_proposal() -> None:
    prop = NgramProposer(ngram_min=2, ngram_max=4)
    assert prop.propose([inp([1, 2, 3, 4, 5, 6])], [4])[0].tokens == []
    assert prop.propose([inp([7])], [4])[0].tokens == []  # shorter than ngram_min
    assert prop.propose([inp([], "empty")], [4])[0].tokens == []


def test_prefers_longest_then_most_recent_match() -> None:
    prop = NgramProposer(ngram_min=1, ngram_max=3)
    # "5 6" occurs twice: followed by 7 (older, as part of "4 5 6") and 8 (newer).
    tokens = [4, 5, 6, 7, 0, 5, 6, 8, 0, 4, 5, 6]
    assert prop.propose([inp(tokens, "a")], [1])[0].tokens == [7]  # the 3-gram "4 5 6" wins
    tokens = [4, 5, 6, 7, 0, 5, 6, 8, 0, 9, 5, 6]
    assert prop.propose([inp(tokens, "b")], [1])[0].tokens == [8]  # only 2-grams: the most recent


def test_a_repeating_pattern_is_continued_past_its_last_occurrence() -> None:
    prop = NgramProposer(ngram_min=1, ngram_max=2)
    assert prop.propose([inp([9, 1, 2, 1, 2])], [5])[0].tokens == [1, 2, 1, 2, 1]
    assert prop.propose([inp([3, 3, 3], "r")], [4])[0].tokens == [3, 3, 3, 3]


def test_a_batch_proposes_per_sequence_and_follows_tokens_appended_in_place() -> None:
    prop = NgramProposer(ngram_min=2, ngram_max=2)
    a = [1, 2, 3, 4, 1, 2]
    b = [7, 8, 9, 7]
    outs = prop.propose([inp(a, "a"), inp(b, "b")], [2, 2])
    assert [o.tokens for o in outs] == [[3, 4], []]
    b += [8]  # the engine appends accepted tokens to the same list
    a += [3, 9, 9]
    outs = prop.propose([inp(a, "a"), inp(b, "b")], [2, 2])
    assert [o.tokens for o in outs] == [[], [9, 7]]


def test_rollback_forgets_rolled_back_tokens_and_a_released_id_starts_afresh() -> None:
    prop = NgramProposer(ngram_min=1, ngram_max=2)
    tokens = [1, 2, 3, 1, 2, 5, 1]
    assert prop.propose([inp(tokens)], [2])[0].tokens == [2, 5]
    prop.rollback("s", 4)  # now [1, 2, 3, 1]: the "1 2 5" occurrence is gone
    assert prop.propose([inp(tokens[:4])], [2])[0].tokens == [2, 3]
    prop.release("s")
    # A released id starts afresh (and a changed history is detected even without rollback).
    assert prop.propose([inp([4, 4, 8, 4])], [1])[0].tokens == [8]
    assert prop.propose([inp([5, 6, 5])], [1])[0].tokens == [6]


def test_indexing_is_incremental(monkeypatch: pytest.MonkeyPatch) -> None:
    prop = NgramProposer()
    appended = 0
    original = NgramProposer._append

    def counting(self: NgramProposer, state, tok: int) -> None:  # type: ignore[no-untyped-def]
        nonlocal appended
        appended += 1
        original(self, state, tok)

    monkeypatch.setattr(NgramProposer, "_append", counting)
    tokens = [random.Random(0).randrange(50) for _ in range(4096)]
    prop.propose([inp(tokens)], [4])
    assert appended == 4096
    for t in range(100):
        tokens.append(t % 7)
        prop.propose([inp(tokens)], [4])
    assert appended == 4096 + 100  # one index update per new token, no rescans


def naive_lookup(tokens: list[int], k: int, nmin: int, nmax: int) -> list[int]:
    """O(L) reference: scan backwards for the most recent earlier occurrence."""
    length = len(tokens)
    for n in range(min(nmax, length), nmin - 1, -1):
        suffix = tokens[length - n :]
        for end in range(length - 1, n - 1, -1):
            if tokens[end - n : end] == suffix:
                out: list[int] = []
                for i in range(k):
                    src = end + i
                    out.append(tokens[src] if src < length else out[src - length])
                return out
    return []


def test_proposals_match_a_naive_rescan_of_the_whole_history() -> None:
    rnd = random.Random(3)
    prop = NgramProposer(ngram_min=1, ngram_max=4)
    tokens: list[int] = []
    for _ in range(600):
        tokens.append(rnd.randrange(12))
        k = rnd.randrange(0, 6)
        got = prop.propose([inp(tokens)], [k])[0].tokens
        assert got == (naive_lookup(tokens, k, 1, 4) if k else [])


def test_a_step_on_a_4k_token_context_takes_under_a_millisecond_and_beats_a_rescan() -> None:
    """Per-step cost on a 4k-token sequence (prompt + growing output)."""
    rnd = random.Random(1)
    tokens = [rnd.randrange(2000) for _ in range(4096)]
    prop = NgramProposer(ngram_min=1, ngram_max=4)
    t0 = time.perf_counter()
    prop.propose([inp(tokens)], [5])  # first use indexes the whole prompt
    prefill_s = time.perf_counter() - t0
    steps = 1000
    t0 = time.perf_counter()
    for _ in range(steps):
        tokens.append(rnd.randrange(2000))
        prop.propose([inp(tokens)], [5])
    per_step_s = (time.perf_counter() - t0) / steps
    t0 = time.perf_counter()
    for _ in range(20):
        naive_lookup(tokens, 5, 1, 4)
    naive_s = (time.perf_counter() - t0) / 20
    print(
        f"ngram 4k: index {prefill_s * 1e3:.1f} ms once, {per_step_s * 1e6:.1f} us/step; "
        f"naive rescan {naive_s * 1e3:.2f} ms/step"
    )
    # Generous bound for 2 shared cores; typically ~10 us.
    assert per_step_s < 1e-3
    assert per_step_s < naive_s
