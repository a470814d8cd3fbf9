"""Concurrent indexer parts share embedder calls; each gets its own vectors back, and a failure reaches each."""
from __future__ import annotations

import asyncio
from collections.abc import Sequence

from streams.rag.batching import CoalescingEmbedder


def fake_embed(texts: Sequence[str]) -> list[list[float]]:
    return [[float(len(t))] for t in texts]


async def test_parts_waiting_together_share_one_call_and_get_their_own_vectors() -> None:
    batcher = CoalescingEmbedder(fake_embed)
    got = await asyncio.gather(batcher.embed(["a", "bb"]), batcher.embed(["ccc"]), batcher.embed(["dddd", "e"]))
    assert got == [[[1.0], [2.0]], [[3.0]], [[4.0], [1.0]]]
    assert batcher.calls == 1


async def test_a_call_holds_at_most_max_texts_but_never_splits_a_part() -> None:
    batcher = CoalescingEmbedder(fake_embed, max_texts=3)
    got = await asyncio.gather(batcher.embed(["a", "b"]), batcher.embed(["c", "d"]), batcher.embed(["e" * 5] * 4))
    assert [len(v) for v in got] == [2, 2, 4] and batcher.calls == 3


async def test_an_embedding_error_reaches_every_part_of_the_call_and_the_next_call_works() -> None:
    def broken(texts: Sequence[str]) -> list[list[float]]:
        raise RuntimeError("model gone")

    batcher = CoalescingEmbedder(broken)
    results = await asyncio.gather(batcher.embed(["a"]), batcher.embed(["b"]), return_exceptions=True)
    assert all(isinstance(r, RuntimeError) for r in results)
    batcher._embed = fake_embed
    assert await batcher.embed(["xy"]) == [[2.0]]
