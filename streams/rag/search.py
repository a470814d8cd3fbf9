"""Searching the stores: the question's vector against each store's current version, optionally fused with BM25.

Vector search asks Qdrant for the nearest chunks (cosine). Hybrid search scores every chunk of the store (those
passing the filter) both ways, exhaustively: cosine from the stored vectors, BM25 (bm25s) from the texts, then
fused. ``rag.fusion: weighted`` (the default) scores ``(1 - w) * cosine + w * bm25 / max(bm25)`` with w =
``rag.bm25_weight`` (0.3); ``rag.fusion: rrf`` is reciprocal rank fusion, ``1/(k + cosine rank) + 1/(k + BM25
rank)`` with k = ``rag.rrf_k`` (60), a chunk with no query term getting no BM25 share. On bench/rag_bench.py's
questions, whose answer hinges on one rare term (a locker's label), recall@4 was vector 0.20, RRF 0.62, weighted
1.00 (40 questions): RRF flattens the exact match's BM25 lead into one rank among chunks that all share the
question's common words, the weighted sum keeps it. Fused scores are what ``score_threshold`` compares against.
The corpus and its BM25 index are
cached per store version and point count, so they are rebuilt only after the store changed. Exhaustive scoring
suits stores of up to some hundred thousand chunks; beyond that, keep hybrid off (or use a server with sparse
vectors).
"""
from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import bm25s
import numpy as np
from qdrant_client import models as qm

from schemas.retrieval import FileSearch, Passage
from streams.rag.filters import to_qdrant
from streams.rag.index import Hit, VectorIndex, collection_name

Fusion = Literal["rrf", "weighted"]


@dataclass(frozen=True)
class Found:
    passages: list[Passage]
    versions: dict[str, int]  # store -> the version that answered


@dataclass
class _Corpus:
    hits: list[Hit]
    vectors: np.ndarray
    bm25: bm25s.BM25 | None


def _tokens(text: str) -> list[str]:
    tokenized = bm25s.tokenize([text], stopwords="en", return_ids=False, show_progress=False)
    return list(tokenized[0]) if tokenized else []


class Searcher:
    def __init__(self, index: VectorIndex, *, hybrid: bool = False, bm25_weight: float = 0.3,
                 fusion: Fusion = "weighted", rrf_k: int = 60) -> None:
        self.index = index
        self.hybrid = hybrid
        self.bm25_weight = bm25_weight
        self.fusion = fusion
        self.rrf_k = rrf_k
        self._corpora: dict[tuple[str, int, int, str], _Corpus] = {}
        self._lock = threading.Lock()

    def search(self, query: FileSearch, vector: list[float], pinned: dict[str, int] | None = None) -> Found:
        """Best passages over all the query's stores, best first (blocking: run it in a thread). ``pinned``: the
        version to search of some stores (a rebuild's canary), instead of the one answering queries."""
        where = to_qdrant(query.filters)
        hybrid = self.hybrid if query.hybrid is None else query.hybrid
        passages: list[Passage] = []
        versions: dict[str, int] = {}
        for store in query.vector_store_ids:
            version = (pinned or {}).get(store) or self.index.version(store)
            if version is None or version not in self.index.versions(store):
                continue  # a store with no file indexed yet: nothing to find
            versions[store] = version
            hits = (self._hybrid(store, version, query, vector, where) if hybrid
                    else self.index.search(store, vector, query.max_num_results, where=where, version=version))
            passages += [_passage(store, hit) for hit in hits]
        passages.sort(key=lambda p: p.score, reverse=True)
        if query.score_threshold is not None:
            passages = [p for p in passages if p.score >= query.score_threshold]
        return Found(passages[:query.max_num_results], versions)

    def _hybrid(self, store: str, version: int, query: FileSearch, vector: list[float],
                where: qm.Filter | None) -> list[Hit]:
        corpus = self._corpus(store, version, query.filters, where)
        if not corpus.hits:
            return []
        cosine = corpus.vectors @ np.asarray(vector, dtype=np.float32)
        keyword = np.zeros(len(corpus.hits), dtype=np.float32)
        terms = _tokens(query.query)
        if corpus.bm25 is not None and terms:
            keyword = np.asarray(corpus.bm25.get_scores(terms), dtype=np.float32)
        fused = (rrf(cosine, keyword, self.rrf_k) if self.fusion == "rrf"
                 else weighted(cosine, keyword, self.bm25_weight))
        best = np.argsort(-fused)[:query.max_num_results]
        return [dataclasses.replace(corpus.hits[i], score=float(fused[i])) for i in best]

    def _corpus(self, store: str, version: int, filters: dict[str, Any] | None, where: qm.Filter | None) -> _Corpus:
        points = self.index.count(store, version=version)
        key = (store, version, points, json.dumps(filters, sort_keys=True))
        with self._lock:
            cached = self._corpora.get(key)
            if cached is not None:
                return cached
            hits, vectors = self._scroll(store, version, where)
            bm25 = None
            if hits:
                bm25 = bm25s.BM25()
                bm25.index(bm25s.tokenize([h.text for h in hits], stopwords="en", show_progress=False),
                           show_progress=False)
            corpus = _Corpus(hits, vectors, bm25)
            self._corpora = {k: v for k, v in self._corpora.items() if k[0] != store or k[3] != key[3]}
            self._corpora[key] = corpus
            return corpus

    def _scroll(self, store: str, version: int, where: qm.Filter | None) -> tuple[list[Hit], np.ndarray]:
        hits: list[Hit] = []
        vectors: list[Sequence[float]] = []
        offset: Any = None
        with self.index.lock:
            while True:
                points, offset = self.index.client.scroll(collection_name(store, version), scroll_filter=where,
                                                          limit=512, offset=offset, with_payload=True,
                                                          with_vectors=True)
                for point in points:
                    hits.append(Hit.of(0.0, point.payload or {}))
                    vectors.append(point.vector)  # type: ignore[arg-type]
                if offset is None:
                    break
        return hits, np.asarray(vectors, dtype=np.float32).reshape(len(vectors), -1)


def rrf(cosine: np.ndarray, keyword: np.ndarray, k: int) -> np.ndarray:
    """Reciprocal rank fusion (ranks from 1); chunks with a zero BM25 score get no keyword share."""
    fused = 1.0 / (k + _ranks(cosine))
    return fused + np.where(keyword > 0, 1.0 / (k + _ranks(keyword)), 0.0)


def weighted(cosine: np.ndarray, keyword: np.ndarray, weight: float) -> np.ndarray:
    top = float(keyword.max()) if len(keyword) else 0.0
    return (1.0 - weight) * cosine + weight * (keyword / top if top > 0 else keyword)


def _ranks(scores: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(scores), dtype=np.float64)
    ranks[np.argsort(-scores, kind="stable")] = np.arange(1, len(scores) + 1)
    return ranks


def _passage(store: str, hit: Hit) -> Passage:
    return Passage(vector_store_id=store, file_id=hit.file_id, filename=hit.filename, score=hit.score, text=hit.text,
                   chunk_index=hit.index, char_start=hit.char_start, char_end=hit.char_end, page=hit.page,
                   attributes=hit.attributes)
