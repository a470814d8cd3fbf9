"""A proposer of several sources (prompt lookup and a draft head): the controller keeps an acceptance estimate
per source, so a source that keeps missing neither shortens nor switches off the drafts of one that hits, and
the output stays plain decoding's."""
from __future__ import annotations

from typing import Any

import pytest

from engine.config import SpeculationConfig
from engine.speculative.controller import FixedCostModel, SpeculationController
from engine.speculative.proposer import DraftProposal, ProposalInput
from tests.unit.engine._engine_factories import VOCAB, greedy_request, make_engine, random_prompts, tiny_hf_model

MAX_NEW = 120
K = 4


class _HitOrMiss:
    """Drafts plain decoding's own continuation ("hit") when the committed length is a multiple of 4, wrong
    tokens ("miss") otherwise; records the draft lengths the engine asked of each source."""

    def __init__(self, reference: list[int]) -> None:
        self.reference = reference
        self.asked: dict[str, list[int]] = {"hit": [], "miss": []}

    def _source(self, inp: ProposalInput) -> str:
        return "hit" if len(inp.token_ids) % 4 == 0 else "miss"

    def propose(self, inputs: list[ProposalInput], num_tokens: list[int]) -> list[DraftProposal]:
        out = []
        for inp, k in zip(inputs, num_tokens):
            source, at = self._source(inp), len(inp.token_ids)
            self.asked[source].append(k)
            truth = self.reference[at : at + k]
            out.append(DraftProposal(truth if source == "hit" else [(t + 1) % VOCAB for t in truth], None))
        return out

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        pass

    def release(self, seq_id: str) -> None:
        pass


class _TwoSources(_HitOrMiss):
    def source(self, inp: ProposalInput, skip: frozenset[str] = frozenset()) -> str:  # DraftSources
        return self._source(inp)


@pytest.fixture(scope="module")
def target() -> Any:
    return tiny_hf_model()


def _run(target: Any, proposer: _HitOrMiss, prompt: list[int]) -> list[int]:
    spec = SpeculationConfig(enabled=True, method="ngram", max_draft_tokens=K)
    # Drafting pays (a fed token costs a tenth of a step), so only acceptance decides each source's k.
    controller = SpeculationController(spec, FixedCostModel(fixed_s=1.0, per_token_s=0.1))
    engine = make_engine(target, speculation=spec, proposer=proposer, controller=controller)
    return engine.generate([greedy_request("r", prompt, MAX_NEW)])["r"].token_ids


def test_a_missing_source_does_not_shorten_the_drafts_of_a_hitting_one(target: Any) -> None:
    prompt = random_prompts([9], seed=5)[0]
    plain = make_engine(target).generate([greedy_request("r", prompt, MAX_NEW)])["r"].token_ids
    reference = prompt + plain

    shared, split = _HitOrMiss(reference), _TwoSources(reference)
    assert _run(target, shared, prompt) == plain
    assert _run(target, split, prompt) == plain

    # After its first step (the prior's estimate) the hitting source drafts all K every time ...
    assert len(split.asked["hit"]) > 5 and split.asked["hit"][1:] == [K] * (len(split.asked["hit"]) - 1), split.asked
    # ... and the missing one is switched off: it drafts in far fewer steps (only its probes after the switch).
    assert len(split.asked["miss"]) < len(shared.asked["miss"]) / 1.5, (split.asked, shared.asked)
    # With one estimate for both, the misses pull the hitting source's drafts down.
    assert max(shared.asked["hit"]) < K, shared.asked


class _AlwaysWrong:
    """A source that matches everywhere and is always wrong (suffix decoding on text unlike anything seen)."""

    def __init__(self) -> None:
        self.steps = 0

    def matches(self, inp: ProposalInput) -> bool:
        return True

    def propose(self, inputs: list[ProposalInput], num_tokens: list[int]) -> list[DraftProposal]:
        self.steps += 1
        return [DraftProposal([(inp.token_ids[-1] + 1) % VOCAB] * k, None) for inp, k in zip(inputs, num_tokens)]

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        pass

    def release(self, seq_id: str) -> None:
        pass

    def observe_finished(self, seq_id: str, output_ids: list[int], scope: str = "") -> None:
        pass


class _RightHead(_HitOrMiss):
    """Stands for the draft head: always drafts plain decoding's continuation."""

    def _source(self, inp: ProposalInput) -> str:
        return "hit"

    def follow_weight_format(self, fmt: str, kernel: str) -> None:
        pass

    def observe_hidden(self, seq_id: str, first_position: int, hidden: Any) -> None:
        pass


def test_a_source_switched_off_for_a_sequence_leaves_its_steps_to_the_next_source(target: Any) -> None:
    from engine.speculative.combined import LookupThenEagle

    prompt = random_prompts([9], seed=6)[0]
    plain = make_engine(target).generate([greedy_request("r", prompt, MAX_NEW)])["r"].token_ids
    head, wrong = _RightHead(prompt + plain), _AlwaysWrong()
    combined = LookupThenEagle(head, None, wrong)  # type: ignore[arg-type]
    spec = SpeculationConfig(enabled=True, method="eagle", draft_head="/unused", max_draft_tokens=K)
    controller = SpeculationController(spec, FixedCostModel(fixed_s=1.0, per_token_s=0.1))
    engine = make_engine(target, speculation=spec, proposer=combined, controller=controller)
    result = engine.generate([greedy_request("r", prompt, MAX_NEW)])["r"]
    assert result.token_ids == plain
    by_source = result.stats.spec.by_source  # the request's drafts, counted by the source that drafted them
    assert by_source["suffix"].accepted == 0 < by_source["suffix"].drafted
    assert by_source["head"].accepted == by_source["head"].drafted > MAX_NEW // 2
    assert sum(c.drafted for c in by_source.values()) == result.spec.drafted
    # The wrong source matches everywhere, so without the controller's choice the head would never draft: it
    # drafts until the controller switches it off (and again after a probe), the head takes the steps between.
    assert len(head.asked["hit"]) > 10 and head.asked["hit"][1:-1] == [K] * (len(head.asked["hit"]) - 2)
    assert wrong.steps < MAX_NEW // 3, (wrong.steps, head.asked)
