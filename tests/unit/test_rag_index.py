"""The rag parts without the bus: the real embedding model, a real local Qdrant (on disk), the attribute filters,
hybrid search and the citation rule."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from schemas.events import ChatMessage, GenerateRequest, ReplyRoute
from schemas.retrieval import FileSearch, Passage
from streams.rag.embedding import DIMENSION, Embedder
from streams.rag.filters import to_qdrant
from streams.rag.grounding import citations, ground
from streams.rag.index import ChunkPoint, VectorIndex, open_client
from streams.rag.search import Searcher
from tests.rag_support import shared_embedder

TEXTS = ["The Vellmar lighthouse was built in 1887 from local granite.",
         "Quarterly revenue grew by twelve percent, led by subscriptions.",
         "Serial number XK-4471 belongs to the spare harbour crane motor."]


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return shared_embedder()


@pytest.fixture
def index(tmp_path: Path) -> VectorIndex:
    return VectorIndex(open_client(path=tmp_path / "qdrant"))


def points(embedder: Embedder, file_id: str = "file-a", texts: list[str] = TEXTS, **attributes: object) -> list[ChunkPoint]:
    vectors = embedder.embed(texts)
    return [ChunkPoint(file_id=file_id, filename=f"{file_id}.md", index=i, text=t, char_start=i * 100,
                       char_end=i * 100 + len(t), vector=v, attributes=dict(attributes)) for i, (t, v) in
            enumerate(zip(texts, vectors))]


def test_embeddings_are_unit_vectors_and_paraphrases_score_above_unrelated_text(embedder: Embedder) -> None:
    cat, kitten, revenue = np.array(embedder.embed(["A cat sits on the mat.", "A kitten is sitting on a rug.",
                                                    "Revenue rose by ten percent."]))
    assert cat.shape == (DIMENSION,)
    assert np.allclose([np.linalg.norm(v) for v in (cat, kitten, revenue)], 1.0, atol=1e-5)
    assert cat @ kitten > 0.5 > cat @ revenue
    # Batching does not change a text's vector (padding is masked out of the mean).
    assert np.allclose(embedder.embed_one(TEXTS[0]), embedder.embed(TEXTS)[0], atol=1e-5)


def test_upserting_the_same_chunks_again_changes_nothing(embedder: Embedder, index: VectorIndex) -> None:
    chunks = points(embedder)
    assert index.upsert("vs_a", chunks) == 1
    index.upsert("vs_a", chunks)
    assert index.count("vs_a") == len(TEXTS)
    assert index.search("vs_a", embedder.embed_one("When was the lighthouse built?"), 1)[0].index == 0


def test_a_swap_moves_the_alias_and_drops_the_old_version(embedder: Embedder, index: VectorIndex) -> None:
    index.upsert("vs_b", points(embedder))
    index.ensure_version("vs_b", 2)
    index.upsert("vs_b", points(embedder)[:1], version=2)
    assert index.version("vs_b") == 1 and index.count("vs_b") == 3  # queries still read v1
    index.swap("vs_b", 2)
    assert (index.version("vs_b"), index.versions("vs_b"), index.count("vs_b")) == (2, [2], 1)


def test_deleting_a_file_removes_only_its_points(embedder: Embedder, index: VectorIndex) -> None:
    index.upsert("vs_c", points(embedder, "file-a") + points(embedder, "file-b"))
    index.delete_file("vs_c", "file-a")
    assert index.count("vs_c") == len(TEXTS) == index.count("vs_c", file_id="file-b")


def test_attribute_filters_select_points_and_bad_filters_name_their_part(embedder: Embedder,
                                                                        index: VectorIndex) -> None:
    index.upsert("vs_d", points(embedder, "file-a", topic="history", year=1887)
                 + points(embedder, "file-b", topic="finance", year=2024))
    question = embedder.embed_one("lighthouse")
    old = to_qdrant({"type": "and", "filters": [{"key": "year", "type": "lt", "value": 2000},
                                                {"key": "topic", "type": "in", "value": ["history", "art"]}]})
    assert {h.file_id for h in index.search("vs_d", question, 10, where=old)} == {"file-a"}
    not_history = to_qdrant({"key": "topic", "type": "ne", "value": "history"})
    assert {h.file_id for h in index.search("vs_d", question, 10, where=not_history)} == {"file-b"}
    with pytest.raises(ValueError, match=r"filters.filters\[1\].value: a number is required for 'gt'"):
        to_qdrant({"type": "or", "filters": [{"key": "a", "type": "eq", "value": 1},
                                             {"key": "b", "type": "gt", "value": "x"}]})
    with pytest.raises(ValueError, match="'near' is not one of"):
        to_qdrant({"key": "a", "type": "near", "value": 1})


def test_hybrid_search_lifts_an_exact_keyword_match(embedder: Embedder, index: VectorIndex) -> None:
    filler = [f"Harbour crane maintenance note {i}: grease the bearings and check the cables." for i in range(20)]
    index.upsert("vs_e", points(embedder, "file-a", TEXTS + filler))
    query = FileSearch(vector_store_ids=["vs_e"], query="XK-4471", max_num_results=1)
    fused = Searcher(index, hybrid=True, bm25_weight=0.5).search(query, embedder.embed_one(query.query))
    assert "XK-4471" in fused.passages[0].text and fused.versions == {"vs_e": 1}


def _passage(number: int, text: str) -> Passage:
    return Passage(vector_store_id="vs_x", file_id=f"file-{number}", filename=f"f{number}.md", score=0.5, text=text,
                   chunk_index=0, char_start=10 * number, char_end=10 * number + len(text))


def test_every_passage_given_is_cited_at_its_marker_or_at_the_end() -> None:
    passages = [_passage(1, "Granite tower."), _passage(2, "Built in 1887.")]
    answer = "It was built in 1887 [2]."
    cited = citations(answer, passages)
    assert [c["file_id"] for c in cited] == ["file-1", "file-2"]
    assert cited[0]["index"] == len(answer) and cited[1]["index"] == answer.index("[2]") + 3
    assert (cited[1]["char_start"], cited[1]["char_end"], cited[1]["quote"]) == (20, 34, "Built in 1887.")


def test_the_grounded_prompt_numbers_the_passages_within_the_budget() -> None:
    request = GenerateRequest(request_id="r", model="m", reply_to=ReplyRoute(topic="t"),
                              messages=[ChatMessage(role="user", content="When?")])
    grounded, used = ground(request, [_passage(1, "A" * 50), _passage(2, "B" * 500)], max_chars=200)
    assert used == [_passage(1, "A" * 50)]
    system, user = grounded.messages
    assert system.role == "system" and "[1] (f1.md) " + "A" * 50 in system.content and "B" not in system.content
    assert user.content == "When?"
