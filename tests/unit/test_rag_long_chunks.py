"""Chunks longer than the embedding model's 256-token window are embedded whole (all windows mean-pooled), and a
chunk within the window keeps the vector sentence-transformers' truncating recipe gives."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from schemas.retrieval import FileSearch
from streams.rag.embedding import MAX_TOKENS, Embedder, batches, model_dir
from streams.rag.index import ChunkPoint, VectorIndex, open_client
from streams.rag.search import Searcher
from tests.rag_support import shared_embedder

FILLER = "The committee reviewed the quarterly minutes and agreed to meet again next month. "
FACT = "The spare turbine for the Oskarsund dam is stored in warehouse nineteen."


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return shared_embedder()


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(model_dir(), local_files_only=True)


def truncating_vector(embedder: Embedder, hf_tokenizer: Any, text: str) -> np.ndarray:
    """sentence-transformers' recipe (transformers' tokenizer): one truncated forward, masked mean, L2 norm."""
    encoded = hf_tokenizer([text], truncation=True, max_length=MAX_TOKENS, return_tensors="pt")
    with torch.inference_mode():
        hidden = embedder.model(encoded["input_ids"], encoded["attention_mask"])
    mask = encoded["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
    return torch.nn.functional.normalize(pooled, dim=1)[0].numpy()


def test_a_chunk_within_the_window_keeps_its_vector(embedder: Embedder, hf_tokenizer: Any) -> None:
    text = "The Vellmar lighthouse was built in 1887 from local granite."
    assert np.allclose(embedder.embed([text, FILLER * 2])[0], truncating_vector(embedder, hf_tokenizer, text),
                       atol=1e-5)


def test_a_fact_past_token_256_is_found_by_search(embedder: Embedder, hf_tokenizer: Any, tmp_path: Path) -> None:
    long_chunk = FILLER * 40 + FACT  # ~650 tokens: the fact lies in the third window
    assert len(embedder.tokenizer.encode(long_chunk).ids) > 2 * MAX_TOKENS
    others = [FILLER * 3 + "Lunch is served at noon in the main hall.",
              FILLER * 3 + "The parking garage closes at midnight."]
    texts = [long_chunk, *others]
    vectors = embedder.embed(texts)
    assert not np.allclose(vectors[0], truncating_vector(embedder, hf_tokenizer, long_chunk), atol=1e-3)
    index = VectorIndex(open_client(path=tmp_path / "qdrant"))
    index.upsert("vs_long", [ChunkPoint(file_id="file-long" if i == 0 else f"file-{i}", filename="a.txt", index=0,
                                        text=t, char_start=0, char_end=len(t), vector=v)
                             for i, (t, v) in enumerate(zip(texts, vectors))])
    query = "Where is the spare turbine for the Oskarsund dam stored?"
    found = Searcher(index).search(FileSearch(vector_store_ids=["vs_long"], query=query, max_num_results=1),
                                   embedder.embed_one(query))
    assert found.passages[0].file_id == "file-long"


def test_windows_are_weighted_by_their_token_count(embedder: Embedder) -> None:
    windows, owners = embedder._windows([FILLER * 40, "short"])
    assert owners.count(0) == 3 and owners.count(1) == 1
    assert all(len(w) <= MAX_TOKENS for w in windows)
    assert all(w[0] == embedder.cls_id and w[-1] == embedder.sep_id for w in windows)


def test_batches_never_pad_a_short_window_up_to_a_long_ones_length_and_hold_at_most_the_batch_size() -> None:
    lengths = [12, 200, 14, 210, 60, 256, 13, 220]
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    got = batches(order, lengths, size=3)
    assert [[lengths[i] for i in b] for b in got] == [[12, 13, 14], [60], [200, 210, 220], [256]]
    assert sorted(i for b in got for i in b) == list(range(len(lengths)))  # every window once


def test_a_mixed_call_gives_each_text_the_vector_it_gets_alone(embedder: Embedder) -> None:
    texts = ["Short note.", FILLER * 8, FACT, FILLER * 3 + FACT]
    together = np.array(embedder.embed(texts))
    alone = np.array([embedder.embed_one(t) for t in texts])
    assert np.allclose(together, alone, atol=1e-5)
