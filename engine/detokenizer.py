"""Incremental detokenization with stop strings.

Two things make streaming text harder than decoding token by token:

* Byte-level BPE splits one character (emoji, CJK) across tokens; decoding the
  first token alone yields U+FFFD. We decode a short window of tokens and only
  advance once the window's text no longer ends with U+FFFD, so a text delta
  never ends inside a character (the vLLM prefix/read offset scheme).
* A stop string may straddle two steps ("Obs" + "ervation:"). Text that could
  be the start of a stop string is held back until it either completes the
  stop string (then the text is cut before it and the stop is never emitted)
  or turns out to be ordinary text.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

# Prompt tokens kept as left context: some tokenizers (SentencePiece) render a
# token's leading space only when something precedes it.
_CONTEXT_TOKENS = 5
_REPLACEMENT = "\ufffd"


class Decodes(Protocol):
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ..., **kwargs: object) -> str: ...


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Decodes,
        prompt_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._ids: list[int] = list(prompt_ids[-_CONTEXT_TOKENS:])
        # ids[prefix_offset:read_offset] is already turned into text; it is decoded
        # again as left context for the tokens after read_offset.
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._stops = tuple(s for s in stop if s)
        self._max_stop = max((len(s) for s in self._stops), default=0)
        self.text = ""  # all complete text so far (cut before a stop string once one appears)
        self._sent = 0  # chars of `text` already handed out
        self.stopped = False  # a stop string appeared
        self.stop_string: str | None = None

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(
            ids, skip_special_tokens=self._skip_special, clean_up_tokenization_spaces=False
        )

    def add_token(self, token_id: int) -> bool:
        """Add one generated token; True when a stop string now ends the text."""
        if self.stopped:
            return True
        self._ids.append(token_id)
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) <= len(prefix) or full.endswith(_REPLACEMENT):
            # Nothing new, or a character still incomplete: wait for more tokens.
            return False
        old_len = len(self.text)
        self.text += full[len(prefix) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        if self._stops:
            # Earlier text was already searched, so a new match must end in the new text.
            frm = max(0, old_len - self._max_stop + 1)
            hits = [(i, s) for s in self._stops if (i := self.text.find(s, frm)) >= 0]
            if hits:
                i, s = min(hits)
                self.text = self.text[:i]
                self._sent = min(self._sent, i)
                self.stopped = True
                self.stop_string = s
        return self.stopped

    def _held_back(self) -> int:
        """Length of the longest suffix of the unsent text that starts some stop string."""
        unsent = len(self.text) - self._sent
        for k in range(min(unsent, self._max_stop - 1), 0, -1):
            tail = self.text[-k:]
            if any(s.startswith(tail) for s in self._stops):
                return k
        return 0

    def take_delta(self, final: bool = False) -> str:
        """Text that is safe to hand out now. final: the request is over, flush held-back text."""
        end = len(self.text)
        if not final and not self.stopped and self._stops:
            end -= self._held_back()
        delta = self.text[self._sent : end]
        self._sent = end
        return delta
