"""Input checks the edge makes before anything reaches Kafka, each a precise 4xx naming the field.

In order:

1. body size: ``Content-Length`` over ``edge.max_body_bytes``, or a body that
   grows past it while read, is 413 ``request_too_large`` (websocket frames
   over ``edge.max_ws_frame_bytes`` close the socket with 1009);
2. encoding: the body must be UTF-8 (400 ``invalid_encoding``), and no string
   in it may hold an unpaired surrogate escape (``"\\ud800"``), which could
   not be re-encoded for Kafka (400 ``invalid_encoding`` naming the field);
3. JSON: an object, no ``NaN``/``Infinity``, not nested absurdly deep
   (400 ``invalid_json``);
4. OpenAI parameters the engine does not implement (``tools``,
   ``response_format``, ``logit_bias``, ...) are 400 ``unsupported_parameter``
   naming them, unless they carry their neutral value (``tools: []``,
   ``response_format: {"type": "text"}``, ...), which is dropped; anything
   else unknown is 400 ``unknown_parameter`` (:mod:`streams.edge.intake`);
5. ranges (``max_tokens``, ``temperature``, ``top_p``, ...) and the model
   (:mod:`streams.edge.intake`);
6. context: the prompt is tokenized with the model's own tokenizer and chat
   template (exactly as the worker does) and prompt + ``max_tokens`` must fit
   ``engine.max_model_len`` (default: the model's context, at most 2048, as
   the engine computes it): 400 ``context_length_exceeded`` naming
   ``messages``/``prompt`` when the prompt alone does not fit, ``max_tokens``
   otherwise. A request that gives no ``max_tokens`` gets the default capped to
   what is left of the context instead of an error.

The edge loads only the tokenizer (``engine.loader.load_tokenizer``, seconds,
in a thread at start) and the model's config, never the weights. If that
fails (no such model here), the edge still serves and leaves the context check
to the worker, whose ``context_length_exceeded`` reply maps to the same 400.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from typing import Any

from fastapi import Request

from schemas.events import GenerateRequest
from streams.edge import errors

log = logging.getLogger(__name__)

MAX_JSON_DEPTH = 64
# Tokenizing in a thread keeps the event loop responsive for long prompts; short ones are faster inline.
_THREAD_TOKENIZE_CHARS = 4096
_TOKENIZER_WAIT_S = 120.0


# --- size and encoding -----------------------------------------------------------------------------------------------


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (413) one larger than ``limit`` bytes without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise errors.body_too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise errors.body_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def invalid_encoding(message: str, param: str | None = None) -> errors.EdgeError:
    return errors.EdgeError(400, message, param=param, code="invalid_encoding")


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(raw: bytes | str, *, what: str = "body") -> dict[str, Any]:
    """Strict UTF-8 JSON object (400 invalid_encoding / invalid_json otherwise)."""
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise invalid_encoding(f"The request {what} is not valid UTF-8 ({error.reason} at byte {error.start}).") from None
    else:
        text = raw
    if not text.strip():
        raise errors.invalid_json(f"the {what} is empty")
    try:
        data = json.loads(text, parse_constant=_no_constants)
    except json.JSONDecodeError as error:
        raise errors.invalid_json(f"{error.msg} at line {error.lineno} column {error.colno}") from None
    except ValueError as error:
        raise errors.invalid_json(str(error)) from None
    except RecursionError:
        raise errors.invalid_json("nested too deeply") from None
    if not isinstance(data, dict):
        raise errors.invalid_json(f"expected an object, got {type(data).__name__}")
    check_strings(data)
    return data


def check_strings(data: Any) -> None:
    """Every string (and key) must be encodable as UTF-8; the JSON must not nest beyond MAX_JSON_DEPTH."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise errors.invalid_json(f"nested deeper than {MAX_JSON_DEPTH} levels")
        if isinstance(value, str):
            _encodable(value, path)
        elif isinstance(value, dict):
            for key, item in value.items():
                _encodable(key, path or None)
                stack.append((item, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))


def _encodable(text: str, path: str | None) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        where = f"'{path}'" if path else "a parameter name"
        raise invalid_encoding(
            f"Invalid string in {where}: an unpaired surrogate escape at character {error.start} is not valid "
            "Unicode text.", param=path or None,
        ) from None


# --- unsupported OpenAI parameters -----------------------------------------------------------------------------------


def _empty(value: Any) -> bool:
    return value in (None, [], {}, "")


# name -> (what it is, is its value neutral?)
_UNSUPPORTED: dict[str, tuple[str, Any]] = {
    "tools": ("tool calling", _empty),
    "tool_choice": ("tool calling", lambda v: v in (None, "none")),
    "functions": ("function calling", _empty),
    "function_call": ("function calling", lambda v: v in (None, "none")),
    "parallel_tool_calls": ("tool calling", lambda v: v in (None, False)),
    "response_format": ("structured output", lambda v: v is None or v == {"type": "text"}),
    "logit_bias": ("logit bias", _empty),
    "top_logprobs": ("log probabilities", lambda v: v in (None, 0)),
    "audio": ("audio output", _empty),
    "modalities": ("other output modalities", lambda v: v is None or v == ["text"]),
    "prediction": ("predicted outputs", _empty),
    "reasoning_effort": ("reasoning models", lambda v: v is None),
    "web_search_options": ("web search", _empty),
    "store": ("stored completions", lambda v: v in (None, False)),
    "metadata": ("stored completions", _empty),
    "service_tier": ("service tiers", lambda v: v in (None, "auto", "default")),
    "verbosity": ("verbosity control", lambda v: v is None),
    "moderation": ("moderation", lambda v: v is None),
    # Hints that change nothing about the answer: accepted with any value and ignored.
    "safety_identifier": ("end-user identification", lambda v: True),
    "prompt_cache_key": ("prompt caching hints", lambda v: True),
    "prompt_cache_retention": ("prompt caching hints", lambda v: True),
    "prompt_cache_options": ("prompt caching hints", lambda v: True),
    "best_of": ("best-of sampling", lambda v: v in (None, 1)),
    "suffix": ("insertion (suffix)", lambda v: v in (None, "")),
}
_CHAT_ONLY = {"tools", "tool_choice", "functions", "function_call", "parallel_tool_calls", "response_format",
              "top_logprobs", "audio", "modalities", "prediction", "reasoning_effort", "web_search_options", "store",
              "metadata", "service_tier", "verbosity", "moderation", "safety_identifier", "prompt_cache_key",
              "prompt_cache_retention", "prompt_cache_options"}
_COMPLETIONS_ONLY = {"best_of", "suffix"}


def strip_unsupported(data: dict[str, Any], api: str) -> dict[str, Any]:
    """Raise 400 unsupported_parameter for an OpenAI parameter we do not implement; drop neutral ones."""
    other_api = _CHAT_ONLY if api == "completions" else _COMPLETIONS_ONLY
    known = set(_UNSUPPORTED) - other_api
    out = dict(data)
    for name in [n for n in data if n in known]:
        what, neutral = _UNSUPPORTED[name]
        if not neutral(data[name]):
            raise errors.EdgeError(
                400, f"'{name}' is not supported by this server ({what}); remove it from the request.",
                param=name, code="unsupported_parameter",
            )
        del out[name]
    return out


# --- prompt tokens and the context -----------------------------------------------------------------------------------


def prompt_hash(request: GenerateRequest) -> str:
    """A short digest of the prompt for logs (which never carry the prompt itself)."""
    if request.messages is not None:
        material = json.dumps([[m.role, m.content] for m in request.messages], ensure_ascii=False)
    else:
        material = request.prompt or ""
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:16]


def prompt_chars(request: GenerateRequest) -> int:
    if request.messages is not None:
        return sum(len(m.content) for m in request.messages)
    return len(request.prompt or "")


def _model_context(model: str) -> int:
    """The model's own context length, from its config (no weights loaded)."""
    from transformers import AutoConfig

    from engine.loader import _gguf_for, _is_model_dir, converted_dir, resolve_model_dir

    gguf = _gguf_for(model)
    if gguf is not None and not _is_model_dir(converted_dir(*gguf)):
        config = AutoConfig.from_pretrained(gguf[0].parent, gguf_file=gguf[0].name)
    else:
        config = AutoConfig.from_pretrained(resolve_model_dir(model))
    context = int(config.max_position_embeddings)
    window = getattr(config, "sliding_window", None)
    if window and getattr(config, "use_sliding_window", True):
        context = min(context, int(window))
    return context


class TokenCounter:
    """The served models' tokenizers (loaded in a thread at start) and their context limits."""

    def __init__(self, models: tuple[str, ...], max_model_len: int | None, *, enabled: bool = True) -> None:
        self.models = models
        self.max_model_len = max_model_len
        self.enabled = enabled
        self._tasks: dict[str, asyncio.Task] = {}
        self._loaded: dict[str, tuple[Any, int] | None] = {}

    def start(self) -> None:
        if not self.enabled:
            return
        for model in self.models:
            self._tasks[model] = asyncio.create_task(asyncio.to_thread(self._load, model), name=f"tokenizer-{model}")

    async def stop(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def _load(self, model: str) -> tuple[Any, int] | None:
        try:
            from engine.loader import load_tokenizer

            tokenizer = load_tokenizer(model)
            context = self.max_model_len or min(_model_context(model), 2048)
        except Exception as error:  # noqa: BLE001 - serve anyway; the worker checks the context
            log.warning("validation: cannot load the tokenizer of %s (%s: %s); prompt lengths are checked by the "
                        "worker only", model, type(error).__name__, error)
            return None
        log.info("validation: tokenizer of %s loaded; context %d tokens", model, context)
        return tokenizer, context

    async def get(self, model: str) -> tuple[Any, int] | None:
        if model in self._loaded:
            return self._loaded[model]
        task = self._tasks.get(model)
        if task is None:
            return None
        try:
            result = await asyncio.wait_for(asyncio.shield(task), timeout=_TOKENIZER_WAIT_S)
        except TimeoutError:
            raise errors.not_ready(f"the tokenizer of {model} is still loading") from None
        self._loaded[model] = result
        return result

    def loaded(self, model: str) -> Any | None:
        entry = self._loaded.get(model)
        return entry[0] if entry else None

    async def check_context(self, request: GenerateRequest, *, input_param: str,
                            max_tokens_given: bool) -> tuple[GenerateRequest, int | None]:
        """(the request, with a default max_tokens capped to the context; its prompt tokens, None if unknown)."""
        entry = await self.get(request.model)
        if entry is None:
            return request, None
        tokenizer, context = entry
        from streams.worker.intake import prompt_token_ids  # the worker's own rendering: same template, same count

        try:
            if prompt_chars(request) > _THREAD_TOKENIZE_CHARS:
                ids = await asyncio.to_thread(prompt_token_ids, request, tokenizer)
            else:
                ids = prompt_token_ids(request, tokenizer)
        except Exception as error:  # noqa: BLE001 - e.g. a chat template that refuses this sequence of roles
            raise errors.EdgeError(400, f"The {input_param} cannot be rendered for this model: {type(error).__name__}: "
                                   f"{str(error)[:200]}", param=input_param, code="invalid_value") from None
        n = len(ids)
        if n == 0:
            raise errors.EdgeError(400, f"The {input_param} is empty: it has no tokens.", param=input_param,
                                   code="invalid_value")
        m = request.sampling.max_tokens
        if n + m <= context:
            return request, n
        if n < context and not max_tokens_given:
            sampling = request.sampling.model_copy(update={"max_tokens": context - n})
            return request.model_copy(update={"sampling": sampling}), n
        where = "messages" if input_param == "messages" else "prompt"
        raise errors.EdgeError(
            400, f"This model's maximum context length is {context} tokens. However, you requested {n + m} tokens "
            f"({n} in the {where}, {m} in the completion). Please reduce the length of the {where} or max_tokens.",
            param=input_param if n >= context else "max_tokens", code="context_length_exceeded",
        )

    def draft_chars(self, model: str, text: str, token_ids: list[int], accepted: int) -> int:
        """How many leading characters of a chunk's text came from its accepted draft tokens (an estimate).

        A speculative step emits its accepted drafts first, then the target's
        own token. When the text of the drafts is a prefix of the chunk's text
        that prefix is the answer; otherwise (a stop-string hold-back moved
        text between chunks) the split is proportional to the token counts.
        """
        if accepted <= 0 or not text or not token_ids:
            return 0
        accepted = min(accepted, len(token_ids))
        if accepted == len(token_ids):
            return len(text)
        tokenizer = self.loaded(model)
        if tokenizer is not None:
            try:
                drafted = tokenizer.decode(token_ids[:accepted])
            except Exception:  # noqa: BLE001 - estimate below
                drafted = None
            if drafted and text.startswith(drafted):
                return len(drafted)
        return round(len(text) * accepted / len(token_ids))
