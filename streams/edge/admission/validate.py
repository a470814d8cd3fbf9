"""Stage 4, validate: the built request against what is served, before anything is charged or published.

* the model must be served: 404 ``model_not_found`` naming ``model``;
* the prompt is tokenized with the model's own tokenizer and chat template,
  exactly as the worker does (``streams.wire.chat_template.prompt_token_ids``), and
  prompt + ``max_tokens`` must fit the context (``engine.max_model_len``, or
  the model's own context at most 2048, as the engine computes it): 400
  ``context_length_exceeded`` naming ``messages``/``prompt`` when the prompt
  alone does not fit, ``max_tokens`` otherwise. A request that gave no
  ``max_tokens`` gets the default capped to what the context leaves instead.
  An empty prompt, or one the chat template refuses, is 400 ``invalid_value``.
* a prompt given as token ids must hold ids of the vocabulary (400
  ``invalid_value`` naming ``prompt``); its decoded text becomes the wire
  request's ``prompt`` (what an echo answers with; the worker reads the ids).

Without a tokenizer (:mod:`streams.edge.tokenizers` could not load it) the
prompt's length is unknown here and the worker checks it (and the token ids'
range); an echo of token ids, which has no text then, is refused.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from schemas.events import GenerateRequest
from streams.edge.access import prompt_chars
from streams.edge.tokenizers import Tokenizers
from streams.wire import errors

# Tokenizing in a thread keeps the event loop responsive for long prompts; short ones are faster inline.
_THREAD_TOKENIZE_CHARS = 4096


@dataclass(frozen=True)
class Validated:
    request: GenerateRequest  # with a default max_tokens capped to the context
    prompt_tokens: int | None  # None: unknown (no tokenizer)


def check_model(request: GenerateRequest, served: tuple[str, ...]) -> None:
    if request.model not in served:
        raise errors.model_not_found(request.model, served)


async def validate(request: GenerateRequest, served: tuple[str, ...], tokenizers: Tokenizers, *, input_param: str,
                   max_tokens_given: bool, base: str | None = None) -> Validated:
    """The served model, then the context; ``input_param``: the prompt's field in the client's API;
    ``base``: the base model of a LoRA adapter (its tokenizer and context are the base's)."""
    check_model(request, served)
    return await fit_context(request, tokenizers, input_param=input_param, max_tokens_given=max_tokens_given,
                             base=base)


async def fit_context(request: GenerateRequest, tokenizers: Tokenizers, *, input_param: str,
                      max_tokens_given: bool, base: str | None = None) -> Validated:
    entry = await tokenizers.get(base or request.model)
    if entry is None:
        if request.prompt_token_ids is not None and request.echo:
            raise errors.EdgeError(400, "echo of a prompt given as token ids needs the model's tokenizer, which this "
                                   "edge could not load.", param="echo", code="unsupported_value")
        return Validated(request, None)
    if request.prompt_token_ids is not None:
        request = with_prompt_text(request, entry.tokenizer, input_param)
    n = await _prompt_tokens(request, entry.tokenizer, input_param)
    return fitted(request, n, entry.context, input_param=input_param, max_tokens_given=max_tokens_given)


def fitted(request: GenerateRequest, n: int, context: int, *, input_param: str, max_tokens_given: bool) -> Validated:
    """The request with ``n`` prompt tokens in a ``context``: as it is, its default max_tokens capped, or a 400."""
    m = request.sampling.max_tokens
    if n + m <= context:
        return Validated(request, n)
    if n < context and not max_tokens_given:
        sampling = request.sampling.model_copy(update={"max_tokens": context - n})
        return Validated(request.model_copy(update={"sampling": sampling}), n)
    raise errors.EdgeError(
        400, f"This model's maximum context length is {context} tokens. However, you requested {n + m} tokens "
        f"({n} in the {input_param}, {m} in the completion). Please reduce the length of the {input_param} or "
        "max_tokens.",
        param=input_param if n >= context else "max_tokens", code="context_length_exceeded",
    )


def with_prompt_text(request: GenerateRequest, tokenizer: Any, input_param: str) -> GenerateRequest:
    """A prompt given as token ids, checked against the vocabulary (400 naming ``input_param``) and with its decoded
    text as ``prompt``: what an echo answers with, and what the logs hash."""
    ids = request.prompt_token_ids or []
    vocabulary = len(tokenizer)
    outside = next((t for t in ids if not 0 <= t < vocabulary), None)
    if outside is not None:
        raise errors.EdgeError(400, f"The {input_param} holds token id {outside}, outside the model's vocabulary "
                               f"(0..{vocabulary - 1}).", param=input_param, code="invalid_value")
    return request.model_copy(update={"prompt": tokenizer.decode(ids)})


async def _prompt_tokens(request: GenerateRequest, tokenizer: object, input_param: str) -> int:
    if prompt_chars(request) > _THREAD_TOKENIZE_CHARS:
        return await asyncio.to_thread(prompt_tokens, request, tokenizer, input_param)
    return prompt_tokens(request, tokenizer, input_param)


def prompt_tokens(request: GenerateRequest, tokenizer: object, input_param: str) -> int:
    """The prompt's tokens as the worker renders them; a 400 naming ``input_param`` when it cannot be, or is empty."""
    # The worker renders with it too: same template, same count.
    from streams.wire.chat_template import prompt_token_ids

    try:
        ids = prompt_token_ids(request, tokenizer)
    except Exception as error:  # noqa: BLE001 - e.g. a chat template that refuses this sequence of roles
        raise errors.EdgeError(400, f"The {input_param} cannot be rendered for this model: {type(error).__name__}: "
                               f"{str(error)[:200]}", param=input_param, code="invalid_value") from None
    if not ids:
        raise errors.EdgeError(400, f"The {input_param} is empty: it has no tokens.", param=input_param,
                               code="invalid_value")
    return len(ids)
