"""Hybrid search's fusion: reciprocal rank fusion by default, the weighted sum behind `rag.fusion: weighted`."""
from __future__ import annotations

import numpy as np

from streams.rag.search import rrf, weighted


def test_rrf_sums_reciprocal_ranks_with_k() -> None:
    cosine = np.array([0.9, 0.5, 0.1])
    keyword = np.array([0.0, 2.0, 1.0])
    fused = rrf(cosine, keyword, 60)
    assert np.allclose(fused, [1 / 61, 1 / 62 + 1 / 61, 1 / 63 + 1 / 62])


def test_rrf_gives_no_keyword_share_to_chunks_without_a_query_term() -> None:
    fused = rrf(np.array([0.3, 0.2]), np.array([0.0, 0.0]), 60)
    assert np.allclose(fused, [1 / 61, 1 / 62])


def test_rrf_ignores_the_scale_of_the_scores() -> None:
    cosine, keyword = np.array([0.40, 0.38, 0.10]), np.array([0.1, 9.0, 0.0])
    assert np.array_equal(np.argsort(-rrf(cosine, keyword, 60)), np.argsort(-rrf(cosine * 100, keyword / 9, 60)))


def test_weighted_normalises_bm25_by_its_best_score() -> None:
    fused = weighted(np.array([0.5, 0.4]), np.array([4.0, 2.0]), 0.3)
    assert np.allclose(fused, [0.7 * 0.5 + 0.3, 0.7 * 0.4 + 0.15])
    assert np.allclose(weighted(np.array([0.5]), np.array([0.0]), 0.3), [0.35])
