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
a third source with an acceptance estimate of its own, so a sequence it keeps missing on still drafts by lookup or
head at their own lengths.
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

    def follow_weight_format(self, fmt: str, kernel: str) -> None:
        self.eagle.follow_weight_format(fmt, kernel)

    def observe_hidden(self, seq_id: str, first_position: int, hidden: Tensor) -> None:
        # The head must see every committed position, also those lookup drafted.
        self.eagle.observe_hidden(seq_id, first_position, hidden)

    def observe_finished(self, seq_id: str, output_ids: Sequence[int]) -> None:
        if self.suffix is not None:
            self.suffix.observe_finished(seq_id, output_ids)

    def source(self, inp: ProposalInput) -> str:
        return next((name for name, p in self.matchers if p.matches(inp)), "head")

    def propose(self, inputs: list[ProposalInput], num_tokens: list[int]) -> list[DraftProposal]:
        out: list[DraftProposal | None] = [None] * len(inputs)
        rest = [i for i, k in enumerate(num_tokens) if k > 0]
        for _, proposer in self.matchers:
            if not rest:
                break
            for i, p in zip(rest, proposer.propose([inputs[i] for i in rest], [num_tokens[i] for i in rest])):
                if p.num_tokens:
                    out[i] = p
            rest = [i for i in rest if out[i] is None]
        if rest:
            for i, p in zip(rest, self.eagle.propose([inputs[i] for i in rest], [num_tokens[i] for i in rest])):
                out[i] = p
        return [p if p is not None else DraftProposal([], None) for p in out]

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        for _, proposer in self.matchers:
            proposer.rollback(seq_id, num_tokens)
        self.eagle.rollback(seq_id, num_tokens)

    def release(self, seq_id: str) -> None:
        for _, proposer in self.matchers:
            proposer.release(seq_id)
        self.eagle.release(seq_id)
