"""Embedding requests of concurrent indexer parts coalesced into one embedder call.

The indexer handles many DocumentChunks at once (one per in-flight message); each used to embed its own few
chunks, so a small document paid a forward pass of a handful of texts and the model's lock serialised them anyway.
Here the texts of every part waiting are embedded together (up to `max_texts` per call), so forwards run full
batches and windows of similar length share one (streams.rag.embedding sorts them).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

Vectors = list[list[float]]


@dataclass
class _Waiting:
    texts: Sequence[str]
    done: asyncio.Future[Vectors] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class CoalescingEmbedder:
    def __init__(self, embed: Callable[[Sequence[str]], Vectors], *, max_texts: int = 512) -> None:
        self._embed = embed
        self.max_texts = max_texts
        self._waiting: list[_Waiting] = []
        self._worker: asyncio.Task[None] | None = None
        self.calls = 0  # embedder calls made (tests, metrics)

    async def embed(self, texts: Sequence[str]) -> Vectors:
        waiting = _Waiting(texts)
        self._waiting.append(waiting)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await waiting.done

    async def _drain(self) -> None:
        await asyncio.sleep(0)  # let the parts delivered together queue up first
        while self._waiting:
            taken = self._take()
            texts = [t for w in taken for t in w.texts]
            self.calls += 1
            try:
                vectors = await asyncio.to_thread(self._embed, texts)
            except Exception as error:  # noqa: BLE001 - each part fails its own document
                for w in taken:
                    w.done.set_exception(error)
                continue
            start = 0
            for w in taken:
                if not w.done.cancelled():
                    w.done.set_result(vectors[start:start + len(w.texts)])
                start += len(w.texts)

    def _take(self) -> list[_Waiting]:
        """The oldest waiting parts, as many as fit in max_texts (always at least one)."""
        taken, count = [], 0
        while self._waiting and (not taken or count + len(self._waiting[0].texts) <= self.max_texts):
            count += len(self._waiting[0].texts)
            taken.append(self._waiting.pop(0))
        return taken
