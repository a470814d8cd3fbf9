"""Logprobs in OpenAI's shapes: chat's ``logprobs.content`` list, completions' parallel lists.

The values are the model's raw log-probabilities (vLLM's ``raw_logprobs``: log_softmax of the logits before
penalties, bias, temperature or filters), as the worker reports them per token (``schemas.events.TokenLogprob``).

With completions' ``echo`` the answer starts with the prompt, and so do its logprobs: the prompt tokens'
(``schemas.events.PromptLogprob``, the first with a null logprob and null top_logprobs, as OpenAI and vLLM give it),
then the answer's. ``text_offset`` counts the characters of the tokens before each one from the echoed text's start,
as vLLM counts them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from schemas.answer import TopLogprob
from schemas.events import Completion, PromptLogprob, TokenChunk, TokenLogprob


def _entry(e: TopLogprob) -> dict[str, Any]:
    return {"token": e.token, "logprob": e.logprob, "bytes": list(e.token.encode("utf-8"))}


def chat_logprobs(entries: list[TokenLogprob] | None) -> dict[str, Any] | None:
    """A chat choice's ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}], "refusal": None}``."""
    if entries is None:
        return None
    return {"content": [{**_entry(e), "top_logprobs": [_entry(t) for t in e.top]} for e in entries], "refusal": None}


def completion_logprobs(entries: list[TokenLogprob] | None, text_start: int = 0) -> dict[str, Any] | None:
    """A completion choice's ``logprobs``: tokens, token_logprobs, top_logprobs (token -> logprob), text_offset
    (each token's start in the answer, counting from ``text_start``)."""
    if entries is None:
        return None
    offsets, at = [], text_start
    for e in entries:
        offsets.append(at)
        at += len(e.token)
    return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [{t.token: t.logprob for t in e.top} for e in entries], "text_offset": offsets}


def prompt_logprobs(entries: list[PromptLogprob] | None) -> dict[str, Any] | None:
    """An echoed prompt's part of a completion choice's ``logprobs`` (text_offset from 0)."""
    if entries is None:
        return None
    offsets, at = [], 0
    for e in entries:
        offsets.append(at)
        at += len(e.token)
    return {"tokens": [e.token for e in entries], "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [None if e.top is None else {t.token: t.logprob for t in e.top} for e in entries],
            "text_offset": offsets}


def prompt_chars(entries: list[PromptLogprob] | None) -> int:
    """Characters of the prompt's tokens, each decoded alone: where the answer's text_offset starts after an echo."""
    return sum(len(e.token) for e in entries or [])


def joined(first: dict[str, Any] | None, second: dict[str, Any] | None) -> dict[str, Any] | None:
    """Two completions ``logprobs`` objects one after the other (either may be None)."""
    if first is None or second is None:
        return first if second is None else second
    return {key: first[key] + second[key] for key in first}


def text_logprobs(final: Completion, echo: bool) -> dict[str, Any] | None:
    """A finished completion choice's ``logprobs``: the answer's, after the prompt's when echoed."""
    if not echo or final.logprobs is None:
        return completion_logprobs(final.logprobs)
    return joined(prompt_logprobs(final.prompt_logprobs),
                  completion_logprobs(final.logprobs, prompt_chars(final.prompt_logprobs)))


@dataclass
class StreamedEcho:
    """A streamed echo: one chunk with the prompt (and its logprobs, from the first event) before the answer's."""

    prompt: str
    sent: bool = False
    answer_start: int = 0  # where the answer's text_offset starts: the prompt tokens' characters

    def prompt_chunk(self, event: TokenChunk | Completion) -> tuple[str, dict[str, Any] | None] | None:
        """The prompt chunk's text and logprobs at the stream's first event; None after it."""
        if self.sent:
            return None
        self.sent = True
        self.answer_start = prompt_chars(event.prompt_logprobs)
        return self.prompt, prompt_logprobs(event.prompt_logprobs)
