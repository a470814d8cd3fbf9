"""Prompt lookup where the text repeats itself, the EAGLE head elsewhere (method eagle, eagle_prompt_lookup).

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
"""
from __future__ import annotations

from torch import Tensor

from engine.speculative.eagle import EagleProposer
from engine.speculative.ngram import NgramProposer
from engine.speculative.proposer import DraftProposal, ProposalInput


class LookupThenEagle:
    def __init__(self, eagle: EagleProposer, lookup: NgramProposer) -> None:
        self.eagle = eagle
        self.lookup = lookup

    def follow_weight_format(self, fmt: str, kernel: str) -> None:
        self.eagle.follow_weight_format(fmt, kernel)

    def observe_hidden(self, seq_id: str, first_position: int, hidden: Tensor) -> None:
        # The head must see every committed position, also those lookup drafted.
        self.eagle.observe_hidden(seq_id, first_position, hidden)

    def source(self, inp: ProposalInput) -> str:
        return "lookup" if self.lookup.matches(inp) else "head"

    def propose(self, inputs: list[ProposalInput], num_tokens: list[int]) -> list[DraftProposal]:
        out = self.lookup.propose(inputs, num_tokens)
        rest = [i for i, p in enumerate(out) if p.num_tokens == 0 and num_tokens[i] > 0]
        if rest:
            for i, p in zip(rest, self.eagle.propose([inputs[i] for i in rest], [num_tokens[i] for i in rest])):
                out[i] = p
        return out

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        self.lookup.rollback(seq_id, num_tokens)
        self.eagle.rollback(seq_id, num_tokens)

    def release(self, seq_id: str) -> None:
        self.lookup.release(seq_id)
        self.eagle.release(seq_id)
