"""The retriever: a consumer of retrieval requests (searches, chat requests with file_search, index operations).

* search: embed the query, search the stores (vector, or fused with BM25), answer ``SearchResults``;
* chat: search with the conversation's last user message, answer ``Retrieved`` (the passages, numbered as in the
  prompt) and wait for Kafka's acknowledgement, then publish the grounded ``GenerateRequest`` to the request topic;
  the engine answers the edge directly, which annotates the answer with the passages as file citations. The
  acknowledgement first keeps the order on the edge's reply topic: the passages arrive before the engine's events;
* swap / count: a rebuild's steps on the index (only this process opens it), answered with ``IndexState``.

A store that does not exist is an ``invalid_request`` naming it, as is a chat request for another tenant's store (the
edge checks tenants first; the operator's CLI searches any store).
"""
from __future__ import annotations

import asyncio
import logging

from pydantic import BaseModel

from schemas.events import ErrorEvent, GenerateRequest
from schemas.retrieval import (
    IndexState,
    RetrievalRequest,
    Retrieved,
    SearchResults,
    VectorStoreRecord,
)
from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.kafka.compacted_table import CompactedTable
from streams.rag.embedding import Embedder
from streams.rag.grounding import ground, question_of
from streams.rag.search import Found, Searcher
from streams.service import Consumer, Delivery, Output

log = logging.getLogger("specstream.rag")


class Retriever:
    def __init__(self, catalog: TopicCatalog, embedder: Embedder, searcher: Searcher,
                 stores: CompactedTable[VectorStoreRecord], *, max_prompt_chars: int) -> None:
        self.catalog = catalog
        self.embedder = embedder
        self.searcher = searcher
        self.stores = stores
        self.max_prompt_chars = max_prompt_chars

    def consumer(self) -> Consumer[RetrievalRequest]:
        replies = self.catalog.replies("<edge-id>")
        return Consumer(kind="retriever", topic=self.catalog.retrieval, input_model=RetrievalRequest,
                        handle=self.handle,
                        outputs=[Output(replies, SearchResults | Retrieved | IndexState | ErrorEvent),
                                 Output(self.catalog.requests, GenerateRequest)])

    async def unknown_store(self, request: RetrievalRequest) -> ErrorEvent | None:
        # A store not seen yet may have been created a moment ago (the edge published its record before this
        # request): only then is the table caught up, which costs a round trip to the broker.
        if any(self.stores.get(store) is None for store in request.search.vector_store_ids):
            await self.stores.caught_up()
        for store in request.search.vector_store_ids:
            record = self.stores.get(store)
            if record is None or (request.op == "chat" and record.tenant != request.tenant):
                return ErrorEvent(request_id=request.request_id, code="invalid_request",
                                  message=f"No vector store found with id '{store}'.", param="vector_store_ids")
        return None

    async def handle(self, request: RetrievalRequest, delivery: Delivery) -> BaseModel | None:
        unknown = await self.unknown_store(request)
        if unknown is not None:
            return unknown
        if request.op in ("prepare", "swap", "count"):
            return await asyncio.to_thread(self._index_op, request)
        found = await self._search(request)
        if request.op == "search":
            return SearchResults(request_id=request.request_id, query=request.search.query,
                                 passages=found.passages, index_versions=found.versions)
        assert request.generate is not None
        grounded, used = ground(request.generate, found.passages, max_chars=self.max_prompt_chars)
        delivery.reply(Retrieved(request_id=request.request_id, passages=used, index_versions=found.versions))
        await asyncio.gather(*delivery.published)
        delivery.publish(self.catalog.requests.name, clients.request_key(request.request_id), grounded)
        return None

    async def _search(self, request: RetrievalRequest) -> Found:
        query = request.search
        if request.op == "chat" and not query.query:
            assert request.generate is not None
            query = query.model_copy(update={"query": question_of(request.generate)})
        vector = await asyncio.to_thread(self.embedder.embed_one, query.query)
        pinned = {query.vector_store_ids[0]: request.version} if request.version is not None else None
        return await asyncio.to_thread(self.searcher.search, query, vector, pinned)

    def _index_op(self, request: RetrievalRequest) -> IndexState:
        store, version, index = request.search.vector_store_ids[0], request.version, self.searcher.index
        assert version is not None
        points = 0
        if request.op == "prepare":
            index.create_version(store, version)
        elif request.op == "swap":
            index.swap(store, version)
        else:
            points = index.count(store, version=version) if version in index.versions(store) else 0
        return IndexState(request_id=request.request_id, vector_store_id=store, version=index.version(store),
                          versions=index.versions(store), points=points)
