"""Prompt lookup where the text repeats itself, the EAGLE head elsewhere (method eagle, eagle_prompt_lookup).

A code edit or a RAG answer copies long runs of its prompt: there prompt
lookup drafts whole runs the target accepts, at no cost, where a head trained
on chat drafts a few tokens. On open text lookup finds nothing worth trying
and the head drafts. The choice is per sequence and per step:

- a match of at least LONG_MATCH tokens takes the step (it is rarely chance);
- a 1- or 2-token match is chance on open text but the start of a copied run
  in an edit, so it takes the step only while, on this sequence, short-match
  drafts have been hitting at least as often as the head's. Both rates are
  first-draft hit rates, averaged over recent steps: whether a draft's first
  token equals the token the target then committed at that position. That
  token does not depend on what was drafted (verification is lossless), so the
  short match's rate is scored at every step it had one, taken or not; the
  head's rate at every step it drafted (it always drafts where lookup does not,
  so its rate never goes stale);
- no match: the head, while its rate on this sequence is at least HEAD_FLOOR;
  below that (a RAG answer or an edit, where the head's chat-trained guesses
  miss) the step drafts nothing, as lookup alone would, and every PROBE_EVERY-th
  such step the head drafts once to be scored again. Drafts that keep missing
  would otherwise cost head forwards and pull down the acceptance the controller
  sizes this sequence's drafts by, lookup's long runs included.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from engine.spec.eagle import EagleProposer
from engine.spec.ngram import NgramProposer
from engine.spec.proposer import DraftProposal, ProposalInput

LONG_MATCH = 3
# Weight of the newest step in a hit rate; both rates start level, so the first short match is tried
# (it is free) and a few misses hand the step to the head.
RATE_STEP = 0.2
RATE_START = 0.5
HEAD_FLOOR = 0.2  # five straight misses from the start
PROBE_EVERY = 8


@dataclass
class _Guess:
    position: int  # index in token_ids of the drafted token
    token: int


@dataclass
class _Rates:
    short: float = RATE_START
    head: float = RATE_START
    short_guess: _Guess | None = None
    head_guess: _Guess | None = None
    head_skipped: int = 0  # no-match steps left undrafted since the head last drafted

    def head_drafts(self) -> bool:
        """Whether the head drafts a step lookup left; counts the steps it sits out."""
        if self.head >= HEAD_FLOOR or self.head_skipped >= PROBE_EVERY - 1:
            self.head_skipped = 0
            return True
        self.head_skipped += 1
        return False

    def score(self, token_ids: list[int]) -> None:
        """Scores the guesses whose position is now committed."""
        if self.short_guess is not None and self.short_guess.position < len(token_ids):
            self.short += RATE_STEP * (float(token_ids[self.short_guess.position] == self.short_guess.token) - self.short)
            self.short_guess = None
        if self.head_guess is not None and self.head_guess.position < len(token_ids):
            self.head += RATE_STEP * (float(token_ids[self.head_guess.position] == self.head_guess.token) - self.head)
            self.head_guess = None


class LookupThenEagle:
    def __init__(self, eagle: EagleProposer, ngram_max: int = 4) -> None:
        self.eagle = eagle
        self.lookup = NgramProposer(1, max(LONG_MATCH, ngram_max))
        self._rates: dict[str, _Rates] = {}

    def observe_hidden(self, seq_id: str, first_position: int, hidden: Tensor) -> None:
        # The head must see every committed position, also those lookup drafted.
        self.eagle.observe_hidden(seq_id, first_position, hidden)

    def propose(self, inputs: list[ProposalInput], num_tokens: list[int]) -> list[DraftProposal]:
        out: list[DraftProposal] = []
        for inp, k in zip(inputs, num_tokens):
            out.append(DraftProposal(tokens=self._lookup_draft(inp, k) if k > 0 else []))
        rest = [i for i, p in enumerate(out)
                if p.num_tokens == 0 and num_tokens[i] > 0 and self._rates[inputs[i].seq_id].head_drafts()]
        if rest:
            for i, p in zip(rest, self.eagle.propose([inputs[i] for i in rest], [num_tokens[i] for i in rest])):
                out[i] = p
                if p.tokens:
                    self._rates[inputs[i].seq_id].head_guess = _Guess(len(inputs[i].token_ids), p.tokens[0])
        return out

    def _lookup_draft(self, inp: ProposalInput, k: int) -> list[int]:
        """Lookup's draft when it takes the step, else []."""
        rates = self._rates.setdefault(inp.seq_id, _Rates())
        rates.score(inp.token_ids)
        draft, matched = self.lookup.match(inp, k)
        if matched >= LONG_MATCH:
            return draft
        if matched == 0:
            return []
        rates.short_guess = _Guess(len(inp.token_ids), draft[0])
        return draft if rates.short >= rates.head else []

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        self.lookup.rollback(seq_id, num_tokens)
        self.eagle.rollback(seq_id, num_tokens)

    def release(self, seq_id: str) -> None:
        self.lookup.release(seq_id)
        self.eagle.release(seq_id)
        self._rates.pop(seq_id, None)
