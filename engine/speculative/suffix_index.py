"""A bounded suffix index over token sequences: where the recent tokens occurred before, and what followed, by count.

SuffixDecoding (Oliaro et al., NeurIPS 2025) drafts from suffix trees: the node reached by the longest suffix of
the context counts how often that pattern occurred, its children how often each token followed, so the most
frequent path below it is a draft whose per-token frequency estimates its acceptance. This index answers the same
questions without materialising the tree, whose nodes cost hundreds of bytes each in Python:

- every sequence is kept once, as its token list;
- for each key length n (KEY_LENGTHS), the n tokens before every position are hashed to a posting list of
  that position (a "continuation start"), most recent last, the newest max_postings kept per key (a key seen
  once, as most long ones are, keeps its posting as a bare int: a list costs 60 bytes more);
- a lookup takes the postings of the longest key the context's tail hits and extends each occurrence backwards
  (up to max_depth tokens) to its real match length. The occurrences matching at least d tokens are the tree's
  node at depth d; walking them forward token by token, grouped by next token, is walking its most frequent path.
  A hash collision shows up as a match shorter than the key and is dropped: hashing only saves memory.

Bounded: at most max_sequences sequences and max_tokens tokens, the oldest evicted first (FIFO); an evicted
sequence's postings go with it.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

KEY_LENGTHS = (1, 2, 4)  # the patterns hashed; a lookup extends its matches past the longest up to max_depth
_SHIFT = 32  # a posting is serial << _SHIFT | continuation start


@dataclass(frozen=True)
class SuffixMatchParams:
    """How a draft follows a match (the paper's knobs): at most ceil(max_spec_factor * match length) tokens, while
    the product of the per-token frequencies stays at least min_token_prob."""

    max_depth: int = 24
    max_spec_factor: float = 1.0
    min_token_prob: float = 0.1

    def __post_init__(self) -> None:
        if self.max_depth < max(KEY_LENGTHS):
            raise ValueError(f"max_depth must be at least {max(KEY_LENGTHS)}, got {self.max_depth}")
        if self.max_spec_factor <= 0 or not 0.0 <= self.min_token_prob <= 1.0:
            raise ValueError("need max_spec_factor > 0 and min_token_prob in [0, 1]")


@dataclass
class SuffixDraft:
    """A candidate draft: its tokens, the match length it followed, and its score (the sum of the tokens'
    cumulative frequencies: the expected number of them accepted, if frequency were acceptance)."""

    tokens: list[int] = field(default_factory=list)
    match_length: int = 0
    score: float = 0.0


NO_DRAFT = SuffixDraft()


@dataclass
class _Occurrence:
    tokens: list[int]  # the sequence it is in
    pos: int  # where its continuation starts (advanced as the walk goes)
    length: int  # how many tokens before pos match the context's tail


class SuffixIndex:
    def __init__(self, max_postings: int = 64, max_sequences: int | None = None, max_tokens: int | None = None) -> None:
        if max_postings < 1:
            raise ValueError("max_postings must be >= 1")
        self.max_postings = max_postings
        self.max_sequences = max_sequences
        self.max_tokens = max_tokens
        self._seqs: dict[int, list[int]] = {}  # serial -> tokens, oldest first (insertion order)
        # Per key length: key -> its postings, oldest first (one posting: the int itself).
        self._index: list[dict[int, int | list[int]]] = [{} for _ in KEY_LENGTHS]
        self._next_serial = 0
        self.num_tokens = 0

    @property
    def num_sequences(self) -> int:
        return len(self._seqs)

    # ------------------------------------------------------------ building

    def add(self, tokens: Sequence[int]) -> int:
        """Index a whole sequence (a finished output); returns its serial. Evicts the oldest past the bounds."""
        serial = self.open()
        self.extend(serial, tokens)
        self._evict()
        return serial

    def open(self) -> int:
        """A new, empty sequence to extend token by token (a request's own text)."""
        serial = self._next_serial
        self._next_serial += 1
        self._seqs[serial] = []
        return serial

    def extend(self, serial: int, tokens: Sequence[int]) -> None:
        """Append tokens to a sequence. The key ending just before a token is indexed when that token arrives, so
        the sequence's current tail never matches itself."""
        seq = self._seqs[serial]
        base = serial << _SHIFT
        start = len(seq)
        seq.extend(tokens)
        trim_at, keep = 2 * self.max_postings, self.max_postings
        for n, index in zip(KEY_LENGTHS, self._index):
            for pos in range(max(start, n), len(seq)):
                key = _key(seq, pos, n)
                postings = index.get(key)
                if postings is None:
                    index[key] = base | pos  # most keys occur once: an int, not a list
                elif isinstance(postings, int):
                    index[key] = [postings, base | pos]
                else:
                    postings.append(base | pos)
                    if len(postings) > trim_at:  # amortised trim to the newest
                        del postings[:-keep]
        self.num_tokens += len(tokens)

    def tokens_of(self, serial: int) -> list[int]:
        return self._seqs[serial]

    def remove(self, serial: int) -> None:
        """Drop a sequence and its postings. The oldest sequence's postings lead every list they are in (postings
        are appended in serial order), so evicting it only cuts list heads."""
        oldest = next(iter(self._seqs), None) == serial
        seq = self._seqs.pop(serial, None)
        if seq is None:
            return
        self.num_tokens -= len(seq)
        for n, index in zip(KEY_LENGTHS, self._index):
            for pos in range(n, len(seq)):
                key = _key(seq, pos, n)
                postings = index.get(key)
                if postings is None:
                    continue
                if isinstance(postings, int):
                    if postings >> _SHIFT == serial:
                        del index[key]
                    continue
                if oldest:
                    cut = 0
                    while cut < len(postings) and postings[cut] >> _SHIFT == serial:
                        cut += 1
                    kept = postings[cut:]
                else:
                    kept = [p for p in postings if p >> _SHIFT != serial]
                if not kept:
                    del index[key]
                elif len(kept) == 1:
                    index[key] = kept[0]
                else:
                    index[key] = kept

    def _evict(self) -> None:
        while self._seqs and (
            (self.max_sequences is not None and len(self._seqs) > self.max_sequences)
            or (self.max_tokens is not None and self.num_tokens > self.max_tokens)
        ):
            self.remove(next(iter(self._seqs)))

    # ------------------------------------------------------------ lookup

    def occurrences(self, context: Sequence[int], max_depth: int) -> list[_Occurrence]:
        """Earlier occurrences of the context's tail (of the longest key length that has any), oldest first, each
        with its match length (at most max_depth)."""
        length = len(context)
        for n, index in zip(reversed(KEY_LENGTHS), reversed(self._index)):
            if n > length:
                continue
            postings = index.get(_key(context, length, n))
            if postings is None:
                continue
            recent = [postings] if isinstance(postings, int) else postings[-self.max_postings :]
            found = [occ for p in recent if (occ := self._occurrence(p, context, max_depth))]
            if found:
                return found
        return []

    def _occurrence(self, posting: int, context: Sequence[int], max_depth: int) -> _Occurrence | None:
        seq = self._seqs.get(posting >> _SHIFT)
        if seq is None:
            return None
        pos = posting & ((1 << _SHIFT) - 1)
        top = min(max_depth, pos, len(context))
        m = 0
        while m < top and seq[pos - 1 - m] == context[-1 - m]:
            m += 1
        return _Occurrence(seq, pos, m) if m else None

    def speculate(self, context: list[int], max_tokens: int, params: SuffixMatchParams) -> SuffixDraft:
        """The best-scoring draft of at most max_tokens over the depths the context's tail matches at.

        When the context is itself a sequence of this index (a request's own text), a continuation that runs
        into the context's end continues from the draft, as a repetition would."""
        if max_tokens <= 0:
            return NO_DRAFT
        occs = self.occurrences(context, params.max_depth)
        best = NO_DRAFT
        for depth in sorted({o.length for o in occs}, reverse=True)[:4]:  # the deepest few nodes
            budget = min(max_tokens, math.ceil(params.max_spec_factor * depth))
            draft = _walk([o for o in occs if o.length >= depth], context, budget, params.min_token_prob)
            draft.match_length = depth
            if draft.score > best.score:
                best = draft
        return best


def _walk(occs: list[_Occurrence], context: list[int], budget: int, min_prob: float) -> SuffixDraft:
    """Follow the most frequent next token from a node (the occurrences), while the cumulative frequency holds."""
    draft = SuffixDraft()
    positions = [(o.tokens, o.pos) for o in occs]
    prob = 1.0
    while positions and len(draft.tokens) < budget:
        nexts = [_token_at(seq, pos, context, draft.tokens) for seq, pos in positions]
        counts: dict[int, int] = {}
        for tok in reversed(nexts):  # newest first: a tie goes to the token that followed most recently
            if tok is not None:
                counts[tok] = counts.get(tok, 0) + 1
        if not counts:
            break
        best = max(counts, key=counts.__getitem__)
        prob *= counts[best] / len(positions)
        if prob < min_prob:
            break
        draft.tokens.append(best)
        draft.score += prob
        positions = [(seq, pos + 1) for (seq, pos), tok in zip(positions, nexts) if tok == best]
    return draft


def _key(tokens: Sequence[int], pos: int, n: int) -> int:
    """The key of the n tokens before pos: a one-token pattern is its token, a longer one its tuple's hash."""
    return tokens[pos - 1] if n == 1 else hash(tuple(tokens[pos - n : pos]))


def _token_at(seq: list[int], pos: int, context: list[int], draft: list[int]) -> int | None:
    if pos < len(seq):
        return seq[pos]
    if seq is context and pos - len(seq) < len(draft):  # the request's own text runs on into its draft
        return draft[pos - len(seq)]
    return None
