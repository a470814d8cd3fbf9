"""Index administration: a consumer of the operator's index commands (a rebuild's steps) on a topic of their own.

* prepare / swap / count: on the index (only this process opens it), answered with ``IndexState``;
* canary: a search of one version, not the one answering queries (a rebuild's check before the swap), answered with
  ``SearchResults``.

Commands are not a tenant's: they name any store, and only operators may write the topic on a secured cluster
(users' searches, checked against their tenant, are the retriever's). A store that does not exist is an
``invalid_request`` naming it.
"""
from __future__ import annotations

import asyncio

from pydantic import BaseModel

from schemas.events import ErrorEvent
from schemas.retrieval import FileSearch, IndexCommand, IndexState, SearchResults, VectorStoreRecord
from schemas.topics import TopicCatalog
from streams.kafka.compacted_table import CompactedTable
from streams.rag.embedding import Embedder
from streams.rag.search import Searcher
from streams.rag.stores import records_of
from streams.service import Consumer, Delivery, Output


class IndexAdmin:
    def __init__(self, catalog: TopicCatalog, embedder: Embedder, searcher: Searcher,
                 stores: CompactedTable[VectorStoreRecord]) -> None:
        self.catalog = catalog
        self.embedder = embedder
        self.searcher = searcher
        self.stores = stores

    def consumer(self) -> Consumer[IndexCommand]:
        return Consumer(kind="index-admin", topic=self.catalog.index_commands, input_model=IndexCommand,
                        handle=self.handle,
                        outputs=[Output(self.catalog.replies("<edge-id>"), IndexState | SearchResults | ErrorEvent)])

    async def handle(self, command: IndexCommand, delivery: Delivery) -> BaseModel:
        store = command.vector_store_id
        if (await records_of(self.stores, [store]))[store] is None:
            return ErrorEvent(request_id=command.request_id, code="invalid_request",
                              message=f"No vector store found with id '{store}'.", param="vector_store_id")
        if command.op == "canary":
            return await self._canary(command)
        return await asyncio.to_thread(self._operate, command)

    async def _canary(self, command: IndexCommand) -> SearchResults:
        store = command.vector_store_id
        search = FileSearch(vector_store_ids=[store], query=command.query)
        vector = await asyncio.to_thread(self.embedder.embed_one, command.query)
        found = await asyncio.to_thread(self.searcher.search, search, vector, {store: command.version})
        return SearchResults(request_id=command.request_id, query=command.query, passages=found.passages,
                             index_versions=found.versions)

    def _operate(self, command: IndexCommand) -> IndexState:
        store, version, index = command.vector_store_id, command.version, self.searcher.index
        points = 0
        if command.op == "prepare":
            index.create_version(store, version)
        elif command.op == "swap":
            index.swap(store, version)
        else:
            points = index.count(store, version=version) if version in index.versions(store) else 0
        return IndexState(request_id=command.request_id, vector_store_id=store, version=index.version(store),
                          versions=index.versions(store), points=points)
