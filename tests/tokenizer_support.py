"""The edge's tokenizers, loaded for a test module (seconds on two cores, so once per module)."""
from __future__ import annotations

import asyncio

from streams.edge.tokenizers import Tokenizers


def loaded_tokenizers(model: str, max_model_len: int) -> Tokenizers:
    """``Tokenizers`` for ``model``, its tokenizer loaded before this returns."""
    async def load() -> Tokenizers:
        loaded = Tokenizers((model,), max_model_len=max_model_len)
        loaded.start()
        assert await loaded.get(model) is not None
        return loaded

    return asyncio.run(load())
