"""The served models' tokenizers and contexts, loaded in a thread at start, without the weights.

The validate stage (:mod:`streams.edge.admission.validate`) counts prompt
tokens with them; the websocket relay uses them to tell which characters of a
chunk came from accepted draft tokens (:meth:`Tokenizers.draft_chars`).

Loading takes seconds (``engine.model_text.load_tokenizer`` and
``engine.model_text.model_context``, without torch: a GGUF's tokenizer and config are read
directly, nothing is converted). If it fails (no such model on this machine),
the edge still serves and leaves the context check to the worker, whose
``context_length_exceeded`` reply maps to the same 400.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from streams.wire import errors

log = logging.getLogger(__name__)

_WAIT_S = 120.0
# What the engine uses when engine.max_model_len is null: the model's context, at most this.
ENGINE_DEFAULT_MAX_MODEL_LEN = 2048


@dataclass(frozen=True)
class ModelText:
    tokenizer: Any
    context: int  # the longest prompt + completion, in tokens


class Tokenizers:
    def __init__(self, models: tuple[str, ...], max_model_len: int | None) -> None:
        self.models = models
        self.max_model_len = max_model_len
        self._tasks: dict[str, asyncio.Task[ModelText | None]] = {}
        self._loaded: dict[str, ModelText | None] = {}

    def start(self) -> None:
        for model in self.models:
            self._tasks[model] = asyncio.create_task(asyncio.to_thread(self._load, model), name=f"tokenizer-{model}")

    async def stop(self) -> None:
        for task in self._tasks.values():
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)

    def _load(self, model: str) -> ModelText | None:
        try:
            from engine.model_text import load_tokenizer, model_context

            tokenizer = load_tokenizer(model)
            context = self.max_model_len or min(model_context(model), ENGINE_DEFAULT_MAX_MODEL_LEN)
        except Exception as error:  # noqa: BLE001 - serve anyway; the worker checks the context
            log.warning("edge: cannot load the tokenizer of %s (%s: %s); prompt lengths are checked by the "
                        "worker only", model, type(error).__name__, error)
            return None
        log.info("edge: tokenizer of %s loaded; context %d tokens", model, context)
        return ModelText(tokenizer, context)

    async def get(self, model: str) -> ModelText | None:
        """The model's tokenizer and context, waiting while they load; None when they could not be loaded."""
        if model in self._loaded:
            return self._loaded[model]
        task = self._tasks.get(model)
        if task is None:
            return None
        try:
            result = await asyncio.wait_for(asyncio.shield(task), timeout=_WAIT_S)
        except TimeoutError:
            raise errors.not_ready(f"the tokenizer of {model} is still loading") from None
        self._loaded[model] = result
        return result

    def loaded(self, model: str) -> Any | None:
        entry = self._loaded.get(model)
        return entry.tokenizer if entry else None

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
