"""Prompt-lookup (n-gram) proposer: model-free drafts copied from the context.

If the last n tokens of a sequence occurred earlier in its prompt + output,
the tokens that followed that occurrence are a good guess for what follows now
(code edits, RAG answers quoting the context, repetitive structure). The most
recent occurrence of the longest matching n-gram wins (n from ngram_max down
to ngram_min).

Cost: each sequence keeps, per n, a dict from n-gram to the position just
after its most recent occurrence, updated incrementally as tokens arrive:
O(ngram_max - ngram_min + 1) dict operations per new token and per proposal,
independent of the context length (no O(L) rescan per step).

The proposal is deterministic given the prefix, so `probs` is None.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.speculative.proposer import EMPTY_PROPOSAL, DraftProposal, ProposalInput


@dataclass
class _SeqIndex:
    tokens: list[int] = field(default_factory=list)  # our copy of the committed tokens
    # index[n - ngram_min]: n-gram -> position right after its most recent
    # occurrence (where its continuation starts). Only occurrences that have a
    # continuation are indexed, so the current suffix never matches itself.
    index: list[dict[tuple[int, ...], int]] = field(default_factory=list)
    stale: bool = False  # rolled back below what is indexed: rebuild at the next propose


class NgramProposer:
    def __init__(self, ngram_min: int = 1, ngram_max: int = 4) -> None:
        if not 1 <= ngram_min <= ngram_max:
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {ngram_min}, {ngram_max}")
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self._seqs: dict[str, _SeqIndex] = {}

    # ------------------------------------------------------------ Proposer API

    def propose(self, inputs: list[ProposalInput], num_tokens: list[int]) -> list[DraftProposal]:
        if len(inputs) != len(num_tokens):
            raise ValueError(f"got {len(inputs)} inputs but {len(num_tokens)} draft lengths")
        out: list[DraftProposal] = []
        for inp, k in zip(inputs, num_tokens):
            if k <= 0:
                out.append(EMPTY_PROPOSAL)
                continue
            state = self._sync(inp.seq_id, inp.token_ids)
            out.append(DraftProposal(tokens=self._lookup(state, k), probs=None))
        return out

    def matches(self, inp: ProposalInput) -> bool:
        """Whether propose would draft for this sequence now (some n-gram of its suffix occurred before)."""
        return bool(self._lookup(self._sync(inp.seq_id, inp.token_ids), 1))

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        state = self._seqs.get(seq_id)
        if state is not None and num_tokens < len(state.tokens):
            # Undoing dict updates would need their old values; a rollback below
            # committed tokens is rare (the engine feeds only committed tokens),
            # so rebuild once instead.
            del state.tokens[num_tokens:]
            state.stale = True

    def release(self, seq_id: str) -> None:
        self._seqs.pop(seq_id, None)

    # ------------------------------------------------------------ internals

    def _sync(self, seq_id: str, token_ids: list[int]) -> _SeqIndex:
        """Bring the sequence's index up to date with token_ids (append-only between calls)."""
        state = self._seqs.get(seq_id)
        if state is None:
            state = _SeqIndex(index=[{} for _ in range(self.ngram_max - self.ngram_min + 1)])
            self._seqs[seq_id] = state
        seen = len(state.tokens)
        # O(1) consistency check: the caller's list must extend ours. Anything
        # else (a rollback we were not told about, a reused seq_id) rebuilds.
        if state.stale or seen > len(token_ids) or (seen and token_ids[seen - 1] != state.tokens[seen - 1]):
            state.tokens = []
            state.index = [{} for _ in range(self.ngram_max - self.ngram_min + 1)]
            state.stale = False
            seen = 0
        for tok in token_ids[seen:]:
            self._append(state, tok)
        return state

    def _append(self, state: _SeqIndex, tok: int) -> None:
        tokens = state.tokens
        pos = len(tokens)  # position of tok: the continuation of the n-grams ending just before it
        tokens.append(tok)
        for n in range(self.ngram_min, min(self.ngram_max, pos) + 1):
            state.index[n - self.ngram_min][tuple(tokens[pos - n : pos])] = pos

    def _lookup(self, state: _SeqIndex, k: int) -> list[int]:
        tokens = state.tokens
        length = len(tokens)
        for n in range(min(self.ngram_max, length), self.ngram_min - 1, -1):
            start = state.index[n - self.ngram_min].get(tuple(tokens[length - n :]))
            if start is None:
                continue
            # Copy what followed the match. When the match overlaps the suffix
            # (a period-(length - start) repetition) the copy runs past the end
            # of the context; continue it from the draft itself, i.e. keep
            # repeating the period, as copying would.
            draft: list[int] = []
            for i in range(k):
                src = start + i
                draft.append(tokens[src] if src < length else draft[src - length])
            return draft
        return []
