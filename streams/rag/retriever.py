"""The retriever: a consumer of users' retrieval requests (searches, chat requests with file_search).

* search: embed the query, search the stores (vector, or fused with BM25), answer ``SearchResults``;
* chat: search with the conversation's last user message, answer ``Retrieved`` (the passages, numbered as in the
  prompt) and wait for Kafka's acknowledgement, then publish the grounded ``GenerateRequest`` to the request topic;
  the engine answers the edge directly, which annotates the answer with the passages as file citations. The
  acknowledgement first keeps the order on the edge's reply topic: the passages arrive before the engine's events.

Every request is a tenant's: a store that does not exist or is another tenant's is refused before anything is
searched (``invalid_request`` naming the store and the tenant, the same answer for both, so another tenant's store
is not revealed). The edge and the tool runner check first; this check holds for anyone who can write the topic.
Index administration is not served here: it has a topic of its own (``streams/rag/index_commands.py``).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from pydantic import BaseModel

from schemas.events import ErrorEvent, GenerateRequest
from schemas.retrieval import RetrievalRequest, Retrieved, SearchResults, VectorStoreRecord
from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.kafka.compacted_table import CompactedTable
from streams.rag.embedding import Embedder
from streams.rag.grounding import ground, question_of
from streams.rag.search import Found, Searcher
from streams.rag.stores import records_of
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
                        outputs=[Output(replies, SearchResults | Retrieved | ErrorEvent),
                                 Output(self.catalog.requests, GenerateRequest)])

    async def handle(self, request: RetrievalRequest, delivery: Delivery) -> BaseModel | None:
        refused = refusal(request, await records_of(self.stores, request.search.vector_store_ids))
        if refused is not None:
            return refused
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
        return await asyncio.to_thread(self.searcher.search, query, vector)


def refusal(request: RetrievalRequest, records: Mapping[str, VectorStoreRecord | None]) -> ErrorEvent | None:
    """The error for a request naming a store that is missing or not the tenant's; None when all are its own."""
    for store in request.search.vector_store_ids:
        record = records.get(store)
        if record is None or record.tenant != request.tenant:
            return ErrorEvent(request_id=request.request_id, code="invalid_request",
                              message=f"No vector store found with id '{store}' for tenant '{request.tenant}'.",
                              param="vector_store_ids")
    return None
