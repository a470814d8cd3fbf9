"""A batch's lines fitted to the context as interactive requests are, and what they cost in tokens.

Each line's prompt is counted with the model's tokenizer (the validate stage's own counting,
:mod:`streams.edge.admission.validate`). A line that gives no ``max_tokens`` gets the edge default capped to what
the context leaves, exactly like an interactive request; a line that does not fit even so (or names a model not
served, or has no tokenizer here) goes on unchanged, and the worker fails it with the same error the endpoint
would have answered, into the error file. A batch's cost is the sum of its lines' prompt + max_tokens (prompt
estimated at 2 characters a token where there is no tokenizer), what the tenant's ``batch_tokens_per_day`` counts.

The counting runs in a thread: a 50 000-line batch must not hold the edge's event loop for seconds.
"""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

from schemas.events import GenerateRequest
from streams.edge.access import prompt_chars
from streams.edge.admission.validate import fitted, prompt_tokens
from streams.edge.tokenizers import ModelText, Tokenizers
from streams.wire.errors import EdgeError


async def fit_lines(requests: Sequence[GenerateRequest], max_tokens_given: Sequence[bool],
                    tokenizers: Tokenizers) -> tuple[list[GenerateRequest], int]:
    """(the lines as they go on the bus, their tokens in all)."""
    texts = {model: await tokenizers.get(model) for model in {r.model for r in requests}}
    return await asyncio.to_thread(_fit_all, requests, max_tokens_given, texts)


def _fit_all(requests: Sequence[GenerateRequest], max_tokens_given: Sequence[bool],
             texts: dict[str, ModelText | None]) -> tuple[list[GenerateRequest], int]:
    fitted_lines, total = [], 0
    for request, given in zip(requests, max_tokens_given, strict=True):
        line, tokens = _fit(request, texts.get(request.model), given)
        fitted_lines.append(line)
        total += tokens
    return fitted_lines, total


def _fit(request: GenerateRequest, text: ModelText | None, max_tokens_given: bool) -> tuple[GenerateRequest, int]:
    estimate = prompt_chars(request) // 2 + 1 + request.sampling.max_tokens
    if text is None:
        return request, estimate
    input_param = "messages" if request.messages is not None else "prompt"
    try:
        n = prompt_tokens(request, text.tokenizer, input_param)
        validated = fitted(request, n, text.context, input_param=input_param, max_tokens_given=max_tokens_given)
    except EdgeError:
        return request, estimate  # fails at run time with this very error, into the error file
    return validated.request, n + validated.request.sampling.max_tokens
