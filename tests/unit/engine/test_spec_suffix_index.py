"""engine.speculative.suffix_index: matches, frequency-scored paths, match-adaptive lengths, bounds, and proposal
cost on a realistic index."""
from __future__ import annotations

import math
import random
import time

import pytest

from engine.speculative.suffix_index import KEY_LENGTHS, SuffixIndex, SuffixMatchParams

LONG = SuffixMatchParams(max_depth=24, max_spec_factor=8.0, min_token_prob=0.1)  # length not tied to the match


def test_a_match_in_an_indexed_output_drafts_what_followed_it() -> None:
    index = SuffixIndex()
    index.add([1, 2, 3, 4, 5, 6, 7])
    draft = index.speculate([50, 51, 3, 4], 3, LONG)
    assert draft.tokens == [5, 6, 7][:3]
    assert draft.match_length == 2
    assert draft.score == pytest.approx(3.0)  # every occurrence agreed on every token


def test_the_draft_stops_where_the_output_ends() -> None:
    index = SuffixIndex()
    index.add([1, 2, 3, 4, 5])
    assert index.speculate([9, 3, 4], 8, LONG).tokens == [5]


def test_no_occurrence_no_draft() -> None:
    index = SuffixIndex()
    index.add([1, 2, 3, 4, 5])
    draft = index.speculate([7, 8, 9], 4, LONG)
    assert draft.tokens == [] and draft.score == 0.0


def test_the_most_frequent_continuation_wins_and_its_frequency_is_its_score() -> None:
    index = SuffixIndex()
    for tail in ([30, 31], [30, 31], [40, 41]):
        index.add([1, 2, 3, *tail])
    draft = index.speculate([9, 2, 3], 2, LONG)
    assert draft.tokens == [30, 31]
    assert draft.score == pytest.approx(2 / 3 + 2 / 3)  # 2 of 3 occurrences, then both of those agree


def test_a_tie_goes_to_the_most_recent_continuation() -> None:
    index = SuffixIndex()
    index.add([1, 2, 30])
    index.add([1, 2, 40])
    assert index.speculate([1, 2], 1, LONG).tokens == [40]


def test_the_draft_stops_where_its_cumulative_frequency_falls_below_min_token_prob() -> None:
    index = SuffixIndex()
    for t in range(5):  # after [1, 2]: 5 different tokens, each a fifth
        index.add([1, 2, 100 + t, 7])
    assert index.speculate([1, 2], 4, SuffixMatchParams(4, 8.0, min_token_prob=0.3)).tokens == []
    assert index.speculate([1, 2], 4, SuffixMatchParams(4, 8.0, min_token_prob=0.2)).tokens == [104, 7]


def test_the_draft_is_as_long_as_the_match_supports() -> None:
    index = SuffixIndex()
    index.add(list(range(100, 140)))
    params = SuffixMatchParams(max_depth=24, max_spec_factor=0.5, min_token_prob=0.1)
    short = index.speculate([1, 2, 110, 111], 16, params)  # matched 2 tokens: ceil(0.5 * 2) = 1 token
    long = index.speculate(list(range(100, 112)), 16, params)  # matched 12: 6 tokens
    assert short.tokens == [112] and short.match_length == 2
    assert long.tokens == list(range(112, 118)) and long.match_length == 12
    assert index.speculate(list(range(100, 140))[:30], 16, params).match_length == 24  # capped at max_depth


def test_a_deeper_rarer_match_beats_a_shallow_frequent_one_when_it_scores_higher() -> None:
    index = SuffixIndex()
    index.add([5, 6, 7, 8, 1, 2, 3, 4, 20, 21, 22, 23])  # the long match, followed by 20..23
    for _ in range(3):
        index.add([9, 4, 50])  # [4] alone is mostly followed by 50, one token long
    draft = index.speculate([5, 6, 7, 8, 1, 2, 3, 4], 4, LONG)
    assert draft.tokens == [20, 21, 22, 23]


def test_a_sequence_repeating_itself_drafts_past_its_end_from_the_draft() -> None:
    index = SuffixIndex()
    serial = index.open()
    index.extend(serial, [7, 1, 2, 1, 2, 1, 2])
    own = index.tokens_of(serial)
    assert index.speculate(own, 6, LONG).tokens == [1, 2, 1, 2, 1, 2]


def test_a_sequence_being_extended_never_matches_its_own_tail() -> None:
    index = SuffixIndex()
    serial = index.open()
    index.extend(serial, [1, 2, 3])
    assert index.speculate(index.tokens_of(serial), 4, LONG).tokens == []
    index.extend(serial, [1, 2])
    assert index.speculate(index.tokens_of(serial), 1, LONG).tokens == [3]


def test_beyond_max_sequences_the_oldest_output_is_evicted_with_its_postings() -> None:
    index = SuffixIndex(max_sequences=2)
    index.add([1, 2, 3, 4])
    index.add([5, 6, 7, 8])
    index.add([9, 10, 11, 12])
    assert index.num_sequences == 2 and index.num_tokens == 8
    assert index.speculate([1, 2], 2, LONG).tokens == []  # the first output is gone
    assert index.speculate([5, 6], 2, LONG).tokens == [7, 8]
    keys = sum(len(d) for d in index._index)
    index.add([9, 10, 11, 12])  # evicts [5..8]: its keys leave the index, the repeated output's are shared
    assert sum(len(d) for d in index._index) < keys


def test_beyond_max_tokens_the_oldest_outputs_are_evicted() -> None:
    index = SuffixIndex(max_tokens=10)
    for start in range(0, 40, 4):
        index.add(list(range(start, start + 4)))
        assert index.num_tokens <= 10
    assert index.num_sequences == 2
    assert index.speculate([36, 37], 2, LONG).tokens == [38, 39]


def test_removing_every_output_empties_the_index() -> None:
    index = SuffixIndex()
    serials = [index.add([random.Random(s).randrange(20) for _ in range(50)]) for s in range(10)]
    for s in serials:
        index.remove(s)
    assert index.num_tokens == 0 and all(not d for d in index._index)


def _naive(outputs: list[list[int]], context: list[int], k: int, params: SuffixMatchParams) -> list[int]:
    """Reference by scanning every position of every output: the occurrences of the context's tail at the longest
    key length that has any, the deepest four match lengths walked by majority vote, the best score kept."""
    occs = []
    for seq in outputs:
        for pos in range(1, len(seq)):
            m = 0
            while m < min(params.max_depth, pos, len(context)) and seq[pos - 1 - m] == context[-1 - m]:
                m += 1
            if m:
                occs.append((seq, pos, m))
    if not occs:
        return []
    key = max(n for n in KEY_LENGTHS if n <= max(m for _, _, m in occs))
    occs = [o for o in occs if o[2] >= key]
    best, best_score = [], 0.0
    for depth in sorted({m for _, _, m in occs}, reverse=True)[:4]:
        live = [(s, p) for s, p, m in occs if m >= depth]
        draft, prob, score = [], 1.0, 0.0
        while live and len(draft) < min(k, math.ceil(params.max_spec_factor * depth)):
            nexts = [s[p] if p < len(s) else None for s, p in live]
            votes = [t for t in reversed(nexts) if t is not None]
            if not votes:
                break
            tok = max(dict.fromkeys(votes), key=votes.count)
            prob *= votes.count(tok) / len(live)
            if prob < params.min_token_prob:
                break
            draft.append(tok)
            score += prob
            live = [(s, p + 1) for (s, p), t in zip(live, nexts) if t == tok]
        if score > best_score:
            best, best_score = draft, score
    return best


def test_drafts_equal_a_naive_scan_of_every_output_kept() -> None:
    rnd = random.Random(5)
    index = SuffixIndex(max_postings=10_000, max_sequences=30)
    outputs: list[list[int]] = []
    params = SuffixMatchParams(max_depth=8, max_spec_factor=1.5, min_token_prob=0.05)
    for _ in range(60):
        seq = [rnd.randrange(6) for _ in range(rnd.randrange(2, 40))]
        index.add(seq)
        outputs = (outputs + [seq])[-30:]
        context = [rnd.randrange(6) for _ in range(rnd.randrange(1, 12))]
        k = rnd.randrange(1, 8)
        assert index.speculate(context, k, params).tokens == _naive(outputs, context, k, params)


def test_a_proposal_over_a_million_indexed_tokens_costs_well_under_a_millisecond() -> None:
    """5,000 outputs of 200 tokens, written from 400 recurring phrases of 20 tokens over a 32k vocabulary:
    repetitive like structured output, not a toy alphabet."""
    rnd = random.Random(0)
    phrases = [[rnd.randrange(32_000) for _ in range(20)] for _ in range(400)]
    index = SuffixIndex(max_tokens=1_000_000)
    t0 = time.perf_counter()
    for _ in range(5_000):
        index.add([t for _ in range(10) for t in rnd.choice(phrases)])
    insert_s = (time.perf_counter() - t0) / index.num_tokens
    contexts = [[t for _ in range(3) for t in rnd.choice(phrases)][: rnd.randrange(25, 60)] for _ in range(500)]
    t0 = time.thread_time()  # this thread's CPU time: what a proposal costs, whatever else the machine runs
    drafted = sum(len(index.speculate(c, 8, SuffixMatchParams()).tokens) for c in contexts)
    per_proposal_s = (time.thread_time() - t0) / len(contexts)
    print(f"suffix index: {insert_s * 1e6:.2f} us per inserted token, {per_proposal_s * 1e6:.0f} us per proposal")
    assert drafted > 0
    assert per_proposal_s < 1e-3
