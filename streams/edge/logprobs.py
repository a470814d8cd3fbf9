"""Logprobs in OpenAI's shapes: chat's ``logprobs.content`` list, completions' parallel lists.

The values are the model's raw log-probabilities (vLLM's ``raw_logprobs``: log_softmax of the logits before
penalties, bias, temperature or filters), as the worker reports them per token (``schemas.events.TokenLogprob``).
"""
from __future__ import annotations

from typing import Any

from schemas.events import TokenLogprob, TopLogprob


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
