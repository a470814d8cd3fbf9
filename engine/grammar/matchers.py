"""The engine's matchers: one llguidance matcher per constrained sequence, and masked logits for a step.

Speculation stays lossless because every row of a sequence's logits is masked with the matcher's
state at that row's position: row 0 after the tokens emitted so far, row i after them plus drafts
d_1..d_i. Drafts the grammar refuses are cut before the forward (the target could never accept
them: masked, their probability is 0). The verifier then runs unchanged on the masked rows, so it
emits exactly what plain constrained decoding emits, token for token; the matcher moves only by
the emitted tokens (the masks of draft rows are computed on a copy of the state that llguidance
rolls back).
"""
from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from llguidance import LLExecutor, LLMatcher, LLTokenizer
from torch import Tensor

from engine.grammar.bitmask import bitmask_words, mask_rows_
from engine.grammar.constraint import Constraint
from engine.request import RequestRejected


@dataclass(frozen=True)
class ConstrainedRows:
    """One constrained sequence's rows in a step's logits: first_row, then one more per draft."""

    matcher: LLMatcher
    first_row: int
    drafts: list[int]


class Matchers:
    """Builds matchers over the engine's vocabulary and masks a step's logits with them."""

    def __init__(self, tokenizer: Any, vocab_size: int, eos_token_ids: Collection[int]) -> None:
        self._hf_tokenizer = tokenizer
        self._eos = sorted(eos_token_ids)
        self.vocab_size = vocab_size
        self._tokenizer: LLTokenizer | None = None  # built on the first constrained request (about 1 s)
        self._executor: LLExecutor | None = None

    def new(self, constraint: Constraint) -> LLMatcher:
        """A matcher at the start of `constraint`'s grammar; RequestRejected if the grammar is bad."""
        matcher = LLMatcher(self._llg_tokenizer(), constraint.grammar, log_level=0)
        if matcher.is_error():
            raise RequestRejected("invalid_request", f"invalid output constraint: {matcher.get_error()}")
        return matcher

    @staticmethod
    def valid_drafts(matcher: LLMatcher, drafts: Sequence[int]) -> int:
        """How many leading drafts the grammar accepts from the matcher's state (which does not move)."""
        return matcher.validate_tokens(list(drafts)) if drafts else 0

    @staticmethod
    def advance(matcher: LLMatcher, tokens: Sequence[int]) -> None:
        """Move the matcher past emitted tokens; they were drawn from masked rows, so it accepts them.

        Tokens after the grammar's end (EOS, possibly an accepted draft) are skipped: the engine's
        finish checks drop them too.
        """
        for token in tokens:
            if matcher.is_stopped():
                return
            if not matcher.consume_token(token):
                raise RuntimeError(f"grammar refused an emitted token: {matcher.get_error()}")

    @torch.inference_mode()  # the runner's logits are inference tensors
    def mask_(self, logits: Tensor, constrained: Sequence[ConstrainedRows]) -> None:
        """In place: each constrained row of logits [R, V] keeps only the tokens its grammar allows there."""
        if not constrained:
            return
        n_rows = sum(1 + len(c.drafts) for c in constrained)
        bitmask = torch.full((n_rows, bitmask_words(self.vocab_size)), -1, dtype=torch.int32)  # [n, W]
        plain: list[tuple[LLMatcher, int]] = []
        drafted: list[tuple[LLMatcher, int, list[int]]] = []  # llguidance takes no empty draft lists
        rows: list[int] = []
        for c in constrained:
            if c.drafts:
                drafted.append((c.matcher, len(rows), c.drafts))
            else:
                plain.append((c.matcher, len(rows)))
            rows.extend(range(c.first_row, c.first_row + 1 + len(c.drafts)))
        # The executor writes rows straight into our contiguous int32 bitmask. Not through llguidance.torch's
        # wrappers of these calls: that module decorates a function with torch.compile at import, which loads
        # torch._dynamo, inductor and triton, 5-8 s of every worker's start on 2 cores, for nothing we call.
        executor, row_bytes = self._llg_executor(), bitmask.shape[1] * bitmask.element_size()
        if plain:
            executor.unsafe_compute_mask_ptr(plain, bitmask.data_ptr(), row_bytes, n_rows)
        if drafted:
            executor.unsafe_compute_mask_ptr_with_draft_token(drafted, bitmask.data_ptr(), row_bytes, n_rows)
        mask_rows_(logits, torch.tensor(rows, device=logits.device), bitmask)

    def _llg_tokenizer(self) -> LLTokenizer:
        if self._tokenizer is None:
            import llguidance.hf

            eos = self._eos or None
            self._tokenizer = llguidance.hf.from_tokenizer(self._hf_tokenizer, n_vocab=self.vocab_size, eos_token=eos)
        return self._tokenizer

    def _llg_executor(self) -> LLExecutor:
        if self._executor is None:
            self._executor = LLExecutor()
        return self._executor
