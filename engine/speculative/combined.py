"""Prompt lookup where the text repeats itself, the EAGLE head elsewhere (method eagle, eagle_prompt_lookup), and
suffix decoding before both (eagle_suffix).

A code edit or a RAG answer copies long runs of its prompt: there prompt
lookup drafts whole runs the target accepts, at no cost, where a head trained
on chat drafts a few tokens. On open text lookup mostly finds nothing and the
head drafts. The switch is per sequence and per step: any match of the lookup
that `method: ngram` would run (engine.speculation.ngram_min..ngram_max) takes
the step; the head drafts where it finds none.

Measured (54e26a1:docs/benchmarks.md, 2026-12-02), in target steps for 128 tokens:
keeping 1- and 2-token matches for lookup took 103 on the open question and
42-44 on RAG, where rules that gave them to whichever source had hit more often
lately took 108-118 and 48-49; code edit was 29-31 under every rule.

The two sources are `DraftSources` to the engine: the controller keeps an
acceptance estimate per source and sequence. With one estimate for both, a
head that missed on a code edit (acceptance 0.04) shortened lookup's drafts
there: 32-33 target steps where lookup alone took 28 (2026-12-05).

Suffix decoding (engine.speculative.suffix), when on, comes first: its request index finds what prompt lookup
finds, scored by frequency and with a length that follows the match, and its index of past outputs finds what
neither lookup nor a head trained on chat knows (the JSON shapes, SQL and agent steps a deployment repeats). It is
a third source with an acceptance estimate of its own. The controller chooses per sequence: a source it switched
off there (poor acceptance, its probe not yet due) leaves the step to the next source that would draft, so a
sequence suffix or lookup keep missing on drafts by the head until their probe.
"""
from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from engine.speculative.eagle import EagleProposer
from engine.speculative.ngram import NgramProposer
from engine.speculative.proposer import DraftProposal, ProposalInput
from engine.speculative.suffix import SuffixProposer


class LookupThenEagle:
    def __init__(self, eagle: EagleProposer, lookup: NgramProposer | None, suffix: SuffixProposer | None = None) -> None:
        self.eagle = eagle
        self.lookup = lookup
        self.suffix = suffix
        # The sources that draft only where they match, in the order they are asked; the head drafts elsewhere.
        self.matchers: list[tuple[str, NgramProposer | SuffixProposer]] = [
            (name, p) for name, p in (("suffix", suffix), ("lookup", lookup)) if p is not None
        ]
        self._picked: dict[str, tuple[int, str]] = {}  # seq_id -> (committed tokens, source) of the last pick

    def follow_weight_format(self, fmt: str, kernel: str) -> None:
        self.eagle.follow_weight_format(fmt, kernel)

    def observe_hidden(self, seq_id: str, first_position: int, hidden: Tensor) -> None:
        # The head must see every committed position, also those lookup drafted.
        self.eagle.observe_hidden(seq_id, first_position, hidden)

    def observe_finished(self, seq_id: str, output_ids: Sequence[int], scope: str = "") -> None:
        if self.suffix is not None:
            self.suffix.observe_finished(seq_id, output_ids, scope)

    def source(self, inp: ProposalInput, skip: frozenset[str] = frozenset()) -> str:
        name = next((n for n, p in self.matchers if n not in skip and p.matches(inp)), None)
        if name is None:  # nothing awake matches: the head, or (the head resting too) whichever would draft
            awake_head = "head" not in skip
            name = "head" if awake_head else next((n for n, p in self.matchers if p.matches(inp)), "head")
        self._picked[inp.seq_id] = (len(inp.token_ids), name)
        return name

    def propose(self, inputs: list[ProposalInput], num_tokens: list[int]) -> list[DraftProposal]:
        """Each sequence from the source `source` picked for it (the first that matches, without a pick), the
        sources after it where that one finds nothing after all."""
        order = [n for n, _ in self.matchers] + ["head"]
        first = [self._first_source(order, inp) for inp in inputs]
        out: list[DraftProposal | None] = [None] * len(inputs)
        for at, (_, proposer) in enumerate([*self.matchers, ("head", self.eagle)]):
            todo = [i for i, k in enumerate(num_tokens) if k > 0 and out[i] is None and first[i] <= at]
            if not todo:
                continue
            for i, p in zip(todo, proposer.propose([inputs[i] for i in todo], [num_tokens[i] for i in todo])):
                if p.num_tokens or proposer is self.eagle:
                    out[i] = p
        return [p if p is not None else DraftProposal([], None) for p in out]

    def _first_source(self, order: list[str], inp: ProposalInput) -> int:
        picked = self._picked.get(inp.seq_id)
        return order.index(picked[1]) if picked is not None and picked[0] == len(inp.token_ids) else 0

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        for _, proposer in self.matchers:
            proposer.rollback(seq_id, num_tokens)
        self.eagle.rollback(seq_id, num_tokens)

    def release(self, seq_id: str) -> None:
        self._picked.pop(seq_id, None)
        for _, proposer in self.matchers:
            proposer.release(seq_id)
        self.eagle.release(seq_id)
