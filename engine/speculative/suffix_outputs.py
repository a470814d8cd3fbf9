"""Past outputs for suffix decoding, kept per scope under one bound.

A scope is whose outputs may draft for whom: a worker puts each tenant's requests in a scope of the tenant's own
(one tenant's text never drafts for another, where it could be read back from the timings), or every request in
the shared scope "" when the operator shares them. Each scope has its own index; the bounds (outputs and tokens)
hold for all scopes together, the oldest output anywhere evicted first, so a busy tenant cannot grow the memory,
only take a larger share of it.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from engine.speculative.suffix_index import (
    NO_DRAFT,
    SuffixDraft,
    SuffixIndex,
    SuffixMatchParams,
)


class ScopedOutputs:
    def __init__(self, max_sequences: int | None, max_tokens: int | None, max_postings: int = 64) -> None:
        self.max_sequences = max_sequences
        self.max_tokens = max_tokens
        self.max_postings = max_postings
        self._scopes: dict[str, SuffixIndex] = {}
        self._order: OrderedDict[tuple[str, int], int] = OrderedDict()  # (scope, serial) -> tokens, oldest first
        self.num_tokens = 0

    @property
    def num_sequences(self) -> int:
        return len(self._order)

    def num_sequences_of(self, scope: str) -> int:
        index = self._scopes.get(scope)
        return 0 if index is None else index.num_sequences

    def add(self, scope: str, tokens: Sequence[int]) -> None:
        if self.max_sequences == 0 or self.max_tokens == 0:
            return
        index = self._scopes.get(scope)
        if index is None:
            index = self._scopes[scope] = SuffixIndex(self.max_postings)
        serial = index.add(tokens)
        self._order[(scope, serial)] = len(tokens)
        self.num_tokens += len(tokens)
        self._evict()

    def speculate(self, scope: str, context: list[int], max_tokens: int, params: SuffixMatchParams) -> SuffixDraft:
        index = self._scopes.get(scope)
        return NO_DRAFT if index is None else index.speculate(context, max_tokens, params)

    def _evict(self) -> None:
        while self._order and (
            (self.max_sequences is not None and len(self._order) > self.max_sequences)
            or (self.max_tokens is not None and self.num_tokens > self.max_tokens)
        ):
            (scope, serial), length = self._order.popitem(last=False)
            self.num_tokens -= length
            index = self._scopes[scope]
            index.remove(serial)
            if not index.num_sequences:
                del self._scopes[scope]
