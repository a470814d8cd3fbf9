"""Suffix decoding (method suffix): the proposer over a request's own text and past outputs, and through the whole
LLMEngine, where greedy and seeded outputs stay plain decoding's (batched, prefix cache on, a warm index of past
outputs drafting) while the drafts from past outputs are accepted."""
from __future__ import annotations

from typing import Any

import pytest
from _engine_factories import make_engine, random_prompts, single_thread, tiny_hf_model  # noqa: F401

from engine.config import SpeculationConfig
from engine.request import EngineRequest, SamplingOptions
from engine.speculative.combined import LookupThenEagle
from engine.speculative.ngram import NgramProposer
from engine.speculative.proposer import (
    DraftProposal,
    LearnsFromOutputs,
    ProposalInput,
    Proposer,
)
from engine.speculative.suffix import SuffixProposer
from engine.speculative.suffix_index import SuffixMatchParams
from engine.speculative.suffix_outputs import ScopedOutputs

pytestmark = pytest.mark.usefixtures("single_thread")
P = SamplingOptions()
LONG = SuffixMatchParams(max_depth=24, max_spec_factor=4.0, min_token_prob=0.1)


def inp(tokens: list[int], seq_id: str = "s", prompt: int = 0) -> ProposalInput:
    return ProposalInput(seq_id=seq_id, token_ids=tokens, params=P, num_prompt_tokens=prompt)


# ---------------------------------------------------------------- the proposer


def test_the_suffix_proposer_is_a_proposer_that_learns_from_outputs() -> None:
    prop = SuffixProposer()
    assert isinstance(prop, Proposer) and isinstance(prop, LearnsFromOutputs)


def test_it_drafts_from_the_requests_own_text_like_prompt_lookup() -> None:
    prop = SuffixProposer(LONG)
    [out] = prop.propose([inp([10, 11, 12, 13, 14, 15, 16, 99, 50, 11, 12, 13])], [3])
    assert out.tokens == [14, 15, 16] and out.probs is None


def test_it_drafts_from_a_finished_requests_output_for_another_request() -> None:
    prop = SuffixProposer(LONG)
    prop.observe_finished("earlier", [5, 6, 7, 8, 9, 10, 11, 12])
    [out] = prop.propose([inp([1, 2, 3, 5, 6, 7], seq_id="now")], [4])
    assert out.tokens == [8, 9, 10, 11]


def test_the_index_with_the_higher_score_wins() -> None:
    prop = SuffixProposer(LONG)
    for _ in range(3):
        prop.learn([1, 2, 3, 40, 41, 42])
    # Its own text followed [1, 2, 3] by 30 once and by 31 once; three past outputs agree on 40, 41, 42.
    [out] = prop.propose([inp([5, 1, 2, 3, 30, 6, 1, 2, 3, 31, 7, 1, 2, 3])], [3])
    assert out.tokens == [40, 41, 42]
    prop.release("s")
    # A tie (its own text's one occurrence is as sure as the three agreeing ones) goes to the request's own text.
    [out] = prop.propose([inp([1, 2, 3, 30, 9, 1, 2, 3])], [3])
    assert out.tokens == [30, 9, 1]


def test_a_draft_is_never_longer_than_asked_and_empty_when_nothing_matches() -> None:
    prop = SuffixProposer(LONG)
    prop.learn(list(range(100, 130)))
    assert prop.propose([inp(list(range(100, 110)))], [2])[0].tokens == [110, 111]
    assert prop.propose([inp([1, 2, 3], seq_id="t")], [4])[0].tokens == []
    assert prop.propose([inp(list(range(100, 110)), seq_id="u")], [0])[0].tokens == []


def test_matches_agrees_with_propose() -> None:
    prop = SuffixProposer(LONG, max_draft_tokens=4)
    prop.learn([1, 2, 3, 4, 5])
    assert prop.matches(inp([9, 2, 3]))
    assert prop.propose([inp([9, 2, 3])], [4])[0].tokens == [4, 5]
    assert not prop.matches(inp([7, 8], seq_id="t"))


def test_rollback_and_reuse_of_an_id_rebuild_the_requests_index() -> None:
    prop = SuffixProposer(LONG)
    assert prop.propose([inp([1, 2, 3, 1, 2])], [1])[0].tokens == [3]
    prop.rollback("s", 3)  # the committed tokens are [1, 2, 3] again: no earlier [3]
    assert prop.propose([inp([1, 2, 3])], [2])[0].tokens == []
    prop.release("s")
    assert prop.propose([inp([4, 5, 6, 4])], [2])[0].tokens == [5, 6]


def test_the_global_index_is_bounded_by_the_settings() -> None:
    prop = SuffixProposer(LONG, max_sequences=3, max_tokens=100)
    for i in range(10):
        prop.learn([i] * 20)
    assert prop.outputs.num_sequences == 3 and prop.outputs.num_tokens <= 100


def test_past_outputs_draft_only_within_their_scope() -> None:
    prop = SuffixProposer(LONG)
    prop.learn([5, 6, 7, 8, 9], scope="tenant-a")
    mine = ProposalInput("a", [1, 5, 6, 7], P, scope="tenant-a")
    theirs = ProposalInput("b", [1, 5, 6, 7], P, scope="tenant-b")
    shared = ProposalInput("c", [1, 5, 6, 7], P)
    assert prop.propose([mine, theirs, shared], [2, 2, 2])[0].tokens == [8, 9]
    assert [p.tokens for p in prop.propose([theirs, shared], [2, 2])] == [[], []]
    assert prop.outputs.num_sequences_of("tenant-a") == 1 and prop.outputs.num_sequences_of("tenant-b") == 0


def test_the_bounds_hold_for_all_scopes_together_the_oldest_output_anywhere_going_first() -> None:
    outputs = ScopedOutputs(max_sequences=3, max_tokens=None)
    for i, scope in enumerate(["a", "b", "a", "c"]):
        outputs.add(scope, [i] * 5)
    assert outputs.num_sequences == 3 and outputs.num_tokens == 15
    assert (outputs.num_sequences_of("a"), outputs.num_sequences_of("b"), outputs.num_sequences_of("c")) == (1, 1, 1)
    by_tokens = ScopedOutputs(max_sequences=None, max_tokens=12)
    for scope in ["a", "b", "c"]:
        by_tokens.add(scope, [1, 2, 3, 4, 5])
    assert by_tokens.num_tokens == 10 and by_tokens.num_sequences_of("a") == 0
    nothing = ScopedOutputs(max_sequences=0, max_tokens=None)
    nothing.add("a", [1, 2, 3])
    assert nothing.num_sequences == 0


# ---------------------------------------------------------------- a source beside lookup and the head


class _Head:
    """Stands for the draft head: always drafts 299s, counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, inputs: list[ProposalInput], num_tokens: list[int]) -> list[DraftProposal]:
        self.calls += 1
        return [DraftProposal([299] * k, None) for k in num_tokens]

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        pass

    def release(self, seq_id: str) -> None:
        pass


def _combined() -> tuple[LookupThenEagle, _Head]:
    head = _Head()
    suffix = SuffixProposer(SuffixMatchParams(max_depth=24, max_spec_factor=4.0, min_token_prob=0.3))
    return LookupThenEagle(head, NgramProposer(1, 4), suffix), head  # type: ignore[arg-type]


def test_suffix_drafts_first_where_it_matches() -> None:
    combined, head = _combined()
    combined.observe_finished("earlier", [1, 2, 3, 4, 5, 6])
    tokens = [9, 8, 2, 3]
    assert combined.source(inp(tokens)) == "suffix"
    assert combined.propose([inp(tokens)], [3])[0].tokens == [4, 5, 6] and head.calls == 0


def test_lookup_drafts_where_suffix_finds_no_path_frequent_enough() -> None:
    combined, _ = _combined()
    # 7 was followed by four different tokens: a quarter each is below suffix's 0.3, lookup takes the latest.
    tokens = [7, 10, 7, 11, 7, 12, 7, 13, 7]
    assert combined.source(inp(tokens)) == "lookup"
    assert combined.propose([inp(tokens)], [1])[0].tokens == [13]


def test_the_head_drafts_where_neither_matches() -> None:
    combined, head = _combined()
    assert combined.source(inp([1, 2, 3])) == "head"
    assert combined.propose([inp([1, 2, 3])], [2])[0].tokens == [299, 299] and head.calls == 1


def test_a_source_the_controller_switched_off_leaves_the_step_to_the_next_that_matches() -> None:
    combined, head = _combined()
    combined.observe_finished("earlier", [1, 2, 3, 4, 5, 6])
    tokens = [3, 9, 2, 3]  # suffix (past output: 4, 5, 6) and lookup (own text: 9) both match
    assert combined.source(inp(tokens), frozenset({"suffix"})) == "lookup"
    assert combined.propose([inp(tokens)], [2])[0].tokens == [9, 2]
    assert combined.source(inp(tokens), frozenset({"suffix", "lookup"})) == "head"
    assert combined.propose([inp(tokens)], [2])[0].tokens == [299, 299] and head.calls == 1
    # All resting: the first that matches (its state is off: it drafts nothing unless probing).
    assert combined.source(inp(tokens), frozenset({"suffix", "lookup", "head"})) == "suffix"


# ---------------------------------------------------------------- through the engine


@pytest.fixture(scope="module")
def target() -> Any:
    return tiny_hf_model("llama")


SUFFIX = SpeculationConfig(enabled=True, method="suffix", max_draft_tokens=4)
PROMPTS = random_prompts([7, 40, 4, 20, 35], seed=21)  # three fill a prefix-cache block or more
PARAMS = [
    SamplingOptions(max_tokens=32, temperature=0.9, top_p=0.95, seed=100, ignore_eos=True),
    SamplingOptions(max_tokens=32, temperature=0.0, ignore_eos=True),
    SamplingOptions(max_tokens=32, temperature=1.2, top_k=40, seed=102, ignore_eos=True),
    SamplingOptions(max_tokens=32, temperature=0.7, seed=103, ignore_eos=True),
    SamplingOptions(max_tokens=32, temperature=0.0, ignore_eos=True),
]


def _requests(tag: str, ids: range | list[int] = range(5)) -> list[EngineRequest]:
    return [EngineRequest(f"{tag}{i}", PROMPTS[i], PARAMS[i]) for i in ids]


def _tokens(engine: Any, reqs: list[EngineRequest]) -> tuple[dict[str, list[int]], int, int]:
    res = engine.generate(reqs)
    ids = {r.request_id: i for i, r in enumerate(reqs)}
    tokens = {f"r{ids[k]}": r.token_ids for k, r in res.items()}
    return tokens, sum(r.spec.drafted for r in res.values()), sum(r.spec.accepted for r in res.values())


@pytest.fixture(scope="module")
def plain(target: Any) -> dict[str, list[int]]:
    return _tokens(make_engine(target), _requests("r"))[0]


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed-k", "adaptive"])
def test_a_batch_with_method_suffix_keeps_plain_decodings_tokens(target: Any, plain: dict[str, list[int]],
                                                                 adaptive: bool) -> None:
    engine = make_engine(target, speculation=SUFFIX.model_copy(update={"adaptive": adaptive}))
    assert isinstance(engine.proposer, SuffixProposer)
    tokens, drafted, _ = _tokens(engine, _requests("r"))
    assert tokens == plain
    assert drafted > 0


def test_repeated_requests_draft_from_past_outputs_and_keep_plain_decodings_tokens(
    target: Any, plain: dict[str, list[int]]
) -> None:
    """The second round's requests repeat the first's (the prefix cache hits their prompts): the global index
    holds the first round's outputs, and their drafts are accepted, greedy and seeded alike."""
    engine = make_engine(target, speculation=SUFFIX.model_copy(update={"adaptive": False}))
    cold, _, cold_accepted = _tokens(engine, _requests("first-"))
    assert engine.proposer.outputs.num_sequences == len(PROMPTS)
    warm, warm_drafted, warm_accepted = _tokens(engine, _requests("again-"))
    assert cold == warm == plain
    assert engine.prefix_cache_counters().hits > 0
    assert warm_accepted > cold_accepted
    # Every draft from a repeated output is right: the misses left are drafts where the own text scored higher.
    assert warm_accepted >= 0.8 * warm_drafted > 0


def test_a_repeated_request_is_drafted_whole_from_its_first_output(target: Any, plain: dict[str, list[int]]) -> None:
    engine = make_engine(target, speculation=SUFFIX.model_copy(update={"adaptive": False}))
    for round_ in range(2):
        res = engine.generate(_requests(f"x{round_}-", [1]))[f"x{round_}-1"]
        assert res.token_ids == plain["r1"]
    # Drafts are as long as the match (max_spec_factor 1): 1, then 3, then k = 4 tokens a step, all accepted.
    assert res.spec.drafted == res.spec.accepted == 1 + 3 + 4 * 5
    by_source = res.stats.spec.by_source
    assert list(by_source) == ["suffix"] and (by_source["suffix"].drafted, by_source["suffix"].accepted) == (24, 24)


def test_a_request_without_speculation_still_decodes_plainly_beside_suffix(target: Any,
                                                                          plain: dict[str, list[int]]) -> None:
    engine = make_engine(target, speculation=SUFFIX)
    reqs = _requests("r")
    reqs[2].speculation = False
    assert _tokens(engine, reqs)[0] == plain


def test_a_requests_output_warms_its_scope_only_and_an_output_kept_out_warms_none(
    target: Any, plain: dict[str, list[int]]
) -> None:
    engine = make_engine(target, speculation=SUFFIX.model_copy(update={"adaptive": False}))

    def run(rid: str, scope: str, keep: bool = True) -> Any:
        req = EngineRequest(rid, PROMPTS[1], PARAMS[1], draft_scope=scope, keep_output=keep)
        res = engine.generate([req])[rid]
        assert res.token_ids == plain["r1"]
        return res

    run("private", "tenant-a", keep=False)  # e.g. a tenant with log_prompts false
    assert engine.proposer.outputs.num_sequences == 0
    run("first", "tenant-a")
    assert run("other-tenant", "tenant-b").spec.accepted < run("same-tenant", "tenant-a").spec.accepted == 24


def test_outputs_learned_from_elsewhere_draft_for_their_scope(target: Any, plain: dict[str, list[int]]) -> None:
    engine = make_engine(target, speculation=SUFFIX.model_copy(update={"adaptive": False}))
    assert engine.learn_outputs([("tenant-a", plain["r1"]), ("tenant-b", [1, 2, 3])]) == 2
    req = EngineRequest("r", PROMPTS[1], PARAMS[1], draft_scope="tenant-a")
    res = engine.generate([req])["r"]
    assert res.token_ids == plain["r1"] and res.spec.accepted == 24
    assert make_engine(target).learn_outputs([("tenant-a", [1, 2, 3])]) == 0  # no speculation: nothing to learn
