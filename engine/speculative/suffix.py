"""Suffix decoding (method suffix): model-free drafts from the request's own text and from past outputs.

Two indexes (engine.speculative.suffix_index), as SuffixDecoding keeps two suffix trees:

- per request, its prompt and output so far, updated token by token as they are committed: what prompt lookup
  finds (a code edit copying its input, an answer quoting its context), scored by frequency;
- one index over the outputs of finished requests per scope (engine.speculative.suffix_outputs: a tenant's, or
  the shared one), fed by the engine when a request finishes and by whoever else calls `learn` (a worker following
  the completions topic), bounded in outputs and tokens with the oldest evicted first: what a deployment
  generates again and again (the same JSON shapes, SQL over one schema, agent steps).

Each step both are matched against the tail of the request's tokens and the draft with the higher score wins (the
expected number of its tokens accepted, if frequency were acceptance). A draft is as long as the match supports:
at most ceil(max_spec_factor * match length) tokens, cut where the cumulative frequency falls below
min_token_prob, and never more than the controller's k.

The proposal is deterministic given the prefix and the indexes, so `probs` is None: the verifier's coupled rule
keeps the text plain decoding's whatever is drafted.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.speculative.proposer import EMPTY_PROPOSAL, DraftProposal, ProposalInput
from engine.speculative.suffix_index import SuffixDraft, SuffixIndex, SuffixMatchParams
from engine.speculative.suffix_outputs import ScopedOutputs


@dataclass
class _Request:
    index: SuffixIndex  # one sequence: the request's committed tokens
    serial: int
    cached: tuple[int, int, SuffixDraft] | None = None  # (tokens seen, k asked, draft) of the last lookup


class SuffixProposer:
    def __init__(
        self,
        params: SuffixMatchParams | None = None,
        max_sequences: int | None = 10_000,
        max_tokens: int | None = 1_000_000,
        max_postings: int = 64,
        max_draft_tokens: int = 8,
    ) -> None:
        self.params = params or SuffixMatchParams()
        self.max_postings = max_postings
        self.max_draft_tokens = max_draft_tokens
        self.outputs = ScopedOutputs(max_sequences, max_tokens, max_postings)
        self._requests: dict[str, _Request] = {}

    # ------------------------------------------------------------ Proposer API

    def propose(self, inputs: list[ProposalInput], num_tokens: list[int]) -> list[DraftProposal]:
        if len(inputs) != len(num_tokens):
            raise ValueError(f"got {len(inputs)} inputs but {len(num_tokens)} draft lengths")
        out: list[DraftProposal] = []
        for inp, k in zip(inputs, num_tokens):
            tokens = self._draft(inp, k).tokens[:k] if k > 0 else []
            out.append(DraftProposal(tokens=tokens, probs=None) if tokens else EMPTY_PROPOSAL)
        return out

    def matches(self, inp: ProposalInput) -> bool:
        """Whether propose would draft for this sequence now (at the longest draft the engine may ask for)."""
        return bool(self._draft(inp, self.max_draft_tokens).tokens)

    def rollback(self, seq_id: str, num_tokens: int) -> None:
        req = self._requests.get(seq_id)
        if req is not None and num_tokens < len(req.index.tokens_of(req.serial)):
            # Postings cannot be un-indexed cheaply; rolling back committed tokens is rare: rebuild.
            kept = req.index.tokens_of(req.serial)[:num_tokens]
            self._requests[seq_id] = self._new_request(kept)

    def release(self, seq_id: str) -> None:
        self._requests.pop(seq_id, None)

    def observe_finished(self, seq_id: str, output_ids: Sequence[int], scope: str = "") -> None:
        """A request finished with these generated tokens: they join its scope's index of past outputs."""
        self.learn(output_ids, scope)

    def learn(self, output_ids: Sequence[int], scope: str = "") -> None:
        """Add an output to a scope's index (a finished request here, or one another worker generated)."""
        if len(output_ids) > 1:  # a single token has no continuation to offer
            self.outputs.add(scope, list(output_ids))

    # ------------------------------------------------------------ internals

    def _draft(self, inp: ProposalInput, k: int) -> SuffixDraft:
        req = self._sync(inp.seq_id, inp.token_ids)
        own = req.index.tokens_of(req.serial)
        if req.cached is not None and req.cached[0] == len(own) and req.cached[1] >= k:
            return req.cached[2]  # matches() then propose() in one step: one lookup
        local = req.index.speculate(own, k, self.params)
        shared = self.outputs.speculate(inp.scope, own, k, self.params)
        best = shared if shared.score > local.score else local
        req.cached = (len(own), k, best)
        return best

    def _new_request(self, tokens: list[int]) -> _Request:
        index = SuffixIndex(self.max_postings)
        serial = index.open()
        index.extend(serial, tokens)
        return _Request(index, serial)

    def _sync(self, seq_id: str, token_ids: list[int]) -> _Request:
        """Bring the request's index up to date with token_ids (append-only between calls)."""
        req = self._requests.get(seq_id)
        if req is None:
            req = self._requests[seq_id] = self._new_request(token_ids)
            return req
        own = req.index.tokens_of(req.serial)
        seen = len(own)
        # O(1) consistency check, as prompt lookup does: anything but an extension rebuilds.
        if seen > len(token_ids) or (seen and token_ids[seen - 1] != own[seen - 1]):
            req = self._requests[seq_id] = self._new_request(token_ids)
        elif seen < len(token_ids):
            req.index.extend(req.serial, token_ids[seen:])
        return req
