"""Exactly-once output to the client over at-least-once processing.

A request is redelivered when its worker dies (or its partition moves) before
the request's offset was committed; the new worker regenerates it from the
start, with the same seed, so it produces the same tokens. Its chunks then
repeat what the client already has, and continue past it.

Chunk *indexes* cannot tell the repeat from the new: how many tokens land in
one engine step depends on adaptive speculation, which follows measured step
times, so a regeneration cuts the same text into different chunks. Chunks
therefore carry the offset of their start in the whole answer
(``TokenChunk.text_offset`` in characters, ``token_offset`` in tokens), and
:class:`Forwarded` keeps, per in-flight request, the text and tokens already
sent to the client. Each arriving chunk is cut against it:

* the part before what was sent must equal what was sent (else the
  regeneration diverged: the client gets a ``regeneration_diverged`` error,
  never silently different text);
* the part after it is forwarded, renumbered so the client sees indexes
  0, 1, 2, ... without gaps;
* a chunk that starts beyond what was sent (a gap) is held back: a later
  chunk or the Completion, whose ``text`` is the whole answer, fills it.

The Completion is checked the same way: its text must extend what was sent;
a missing tail is forwarded as one last chunk before it, and its
``num_chunks`` becomes the number of chunks the client received.

Chunks without offsets (workers older than the offsets) fall back to
index-based deduplication. A chunk that carries a server-side tool call's result
(and no text) is forwarded once per call id.
"""
from __future__ import annotations

import logging

from schemas.events import Completion, ErrorEvent, TokenChunk

log = logging.getLogger(__name__)


class Diverged(Exception):
    """A redelivered request regenerated text that differs from what the client already received."""

    def __init__(self, request_id: str, message: str) -> None:
        super().__init__(message)
        self.request_id = request_id

    def event(self) -> ErrorEvent:
        return ErrorEvent(request_id=self.request_id, code="regeneration_diverged", message=str(self), retryable=True)


class Forwarded:
    """What one request's client has received; decides which part of each arriving chunk is new."""

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.text = ""
        self.tokens: list[int] = []
        self.chunks = 0  # chunks forwarded: the next forwarded chunk's index
        self.duplicates = 0  # chunks (or parts of chunks) dropped as already forwarded
        self.gaps = 0  # chunks held back because they started beyond what was forwarded
        self._legacy_next = 0  # next worker index, for chunks without offsets
        self.tool_results: set[str] = set()  # call ids whose result was forwarded

    def chunk(self, chunk: TokenChunk) -> TokenChunk | None:
        """The part of ``chunk`` to forward (renumbered), or None when it holds nothing new. Raises Diverged."""
        if chunk.tool_result is not None:
            return self._tool_result(chunk)
        if chunk.text_offset is None:
            return self._legacy(chunk)
        start, sent = chunk.text_offset, len(self.text)
        if start > sent:
            self.gaps += 1
            log.warning("request %s: chunk at character %d arrived, %d forwarded; holding it back",
                        self.request_id, start, sent)
            return None
        overlap = min(sent - start, len(chunk.text))
        if chunk.text[:overlap] != self.text[start:start + overlap]:
            raise Diverged(self.request_id, self._where(start, chunk.text[:overlap]))
        new_text = chunk.text[overlap:]
        new_tokens: list[int]
        if chunk.token_offset is not None:
            tstart, tsent = chunk.token_offset, len(self.tokens)
            if tstart > tsent:
                self.gaps += 1
                return None
            toverlap = min(tsent - tstart, len(chunk.token_ids))
            if chunk.token_ids[:toverlap] != self.tokens[tstart:tstart + toverlap]:
                raise Diverged(self.request_id,
                               f"regenerated tokens differ from the {tsent} token(s) already sent (from token {tstart})")
            new_tokens = chunk.token_ids[toverlap:]
        else:
            new_tokens = list(chunk.token_ids) if new_text else []
        if not new_text and not new_tokens and chunk.finish_reason is None:
            self.duplicates += 1
            return None
        if overlap:
            self.duplicates += 1
        return self._forward(chunk, new_text, new_tokens, cut=overlap)

    def completion(self, final: Completion) -> tuple[TokenChunk | None, Completion]:
        """The Completion to forward, preceded by a chunk with any text the client is still missing. Raises Diverged."""
        if not final.text.startswith(self.text):
            common = _common_prefix(final.text, self.text)
            raise Diverged(self.request_id, self._where(common, ""))
        tail: TokenChunk | None = None
        if len(final.text) > len(self.text):
            missing = final.text[len(self.text):]
            tail = TokenChunk(request_id=final.request_id, index=self.chunks, text=missing, token_ids=[],
                              text_offset=len(self.text), token_offset=len(self.tokens))
            self.text += missing
            self.chunks += 1
        return tail, final.model_copy(update={"num_chunks": self.chunks})

    # --- helpers ---------------------------------------------------------------------------------------------------

    def _tool_result(self, chunk: TokenChunk) -> TokenChunk | None:
        assert chunk.tool_result is not None
        if chunk.tool_result.call_id in self.tool_results:
            self.duplicates += 1
            return None
        self.tool_results.add(chunk.tool_result.call_id)
        self.chunks += 1
        return chunk.model_copy(update={"index": self.chunks - 1, "text_offset": len(self.text),
                                        "token_offset": len(self.tokens)})

    def _legacy(self, chunk: TokenChunk) -> TokenChunk | None:
        if chunk.index < self._legacy_next:
            self.duplicates += 1
            return None
        if chunk.index > self._legacy_next:
            log.warning("request %s: chunk %d arrived, expected %d", self.request_id, chunk.index, self._legacy_next)
        self._legacy_next = chunk.index + 1
        return self._forward(chunk, chunk.text, list(chunk.token_ids), cut=0)

    def _forward(self, chunk: TokenChunk, text: str, tokens: list[int], *, cut: int) -> TokenChunk:
        update: dict[str, object] = {"index": self.chunks}
        if chunk.text_offset is not None:
            update.update(text=text, token_ids=tokens, text_offset=len(self.text), token_offset=len(self.tokens))
            if cut and chunk.draft_chars is not None:
                update["draft_chars"] = max(0, chunk.draft_chars - cut)
        self.text += text
        self.tokens.extend(tokens)
        self.chunks += 1
        return chunk.model_copy(update=update) if update != {"index": chunk.index} else chunk

    def _where(self, start: int, got: str) -> str:
        return (f"the regenerated answer differs from the {len(self.text)} character(s) already sent "
                f"(from character {start}); stopping rather than sending different text")


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
