"""The edge's side of documents and retrieval on the bus.

It follows two compacted topics as tables (vector stores, documents; the files are the edge's FileStore), so what the vector store API
answers is the bus's state and a restarted or second edge answers the same; it publishes store records,
document states and ingest jobs; and it asks the rag service (the only process that opens the index) to search
or to ground a chat request, through this edge's reply topic like any generation request.
"""
from __future__ import annotations

import logging
import time
import uuid
from typing import Literal

from pydantic import BaseModel

from schemas.documents import DocumentState, FileObject, StaticChunking, document_key
from schemas.events import GenerateRequest, ReplyRoute
from schemas.retrieval import FileSearch, RetrievalRequest, VectorStoreRecord
from streams.edge.core import Edge
from streams.edge.replies import ReplyStream, ReplyTimeout
from streams.files.store import FilesUnavailable, NoSuchFile
from streams.kafka import clients
from streams.kafka.compacted_table import CompactedTable
from streams.rag.jobs import attach
from streams.wire import errors
from streams.wire.structured import FileSearchTool

log = logging.getLogger(__name__)


class RagEdge:
    def __init__(self, edge: Edge, *, search_timeout_s: float) -> None:
        self.edge = edge
        settings = edge.settings
        catalog = settings.catalog
        self.catalog = catalog
        self.search_timeout_s = search_timeout_s
        self.stores = CompactedTable(settings.kafka, catalog.vector_stores, VectorStoreRecord)
        self.documents = CompactedTable(settings.kafka, catalog.documents, DocumentState)
        self.started = False

    async def start(self) -> None:
        for table in (self.stores, self.documents):
            await table.start()
        self.started = True

    async def stop(self) -> None:
        for table in (self.stores, self.documents):
            await table.stop()
        self.started = False

    async def fresh(self) -> None:
        """Read-your-writes: every table holds what was published before this call."""
        if not self.started:
            raise errors.not_ready("the edge is not following the vector store topics yet")
        for table in (self.stores, self.documents):
            await table.caught_up()

    # --- what the tables hold, for one tenant ------------------------------------------------------------------

    def store(self, store_id: str, tenant: str) -> VectorStoreRecord:
        record = self.stores.get(store_id)
        if record is None or record.tenant != tenant:
            raise errors.EdgeError(404, f"No vector store found with id '{store_id}'.", param="vector_store_id",
                                   code="not_found")
        return record

    async def file(self, file_id: str, tenant: str) -> FileObject:
        try:
            return await self.edge.files.get(tenant, file_id)
        except NoSuchFile:
            raise errors.EdgeError(404, f"No file found with id '{file_id}'.", param="file_id",
                                   code="not_found") from None
        except FilesUnavailable as error:
            raise errors.not_ready(str(error)) from None

    def documents_of(self, store_id: str) -> list[DocumentState]:
        return [d for d in self.documents.values() if d.vector_store_id == store_id]

    def document(self, store_id: str, file_id: str) -> DocumentState:
        found = self.documents.get(document_key(store_id, file_id))
        if found is None:
            raise errors.EdgeError(404, f"No file found with id '{file_id}' in vector store '{store_id}'.",
                                   param="file_id", code="not_found")
        return found

    # --- writes ------------------------------------------------------------------------------------------------

    async def publish(self, topic: str, key: str, event: BaseModel | None) -> None:
        value = None if event is None else clients.encode(event)
        await self.edge.publisher.producer.send_and_wait(topic, value, key=key.encode())

    async def put_store(self, record: VectorStoreRecord) -> None:
        await self.publish(self.catalog.vector_stores.name, record.id, record)

    async def delete_store(self, record: VectorStoreRecord) -> None:
        for document in self.documents_of(record.id):
            await self.publish(self.catalog.documents.name, document_key(record.id, document.file_id), None)
        await self.publish(self.catalog.vector_stores.name, record.id, None)

    async def add_file(self, record: VectorStoreRecord, file: FileObject, *, chunking: StaticChunking | None,
                       attributes: dict[str, str | float | bool], batch_id: str | None = None) -> DocumentState:
        """The document's queued state, then its ingest job (the parser takes it from there)."""
        state, job = attach(record, file, chunking=chunking, attributes=attributes, batch_id=batch_id)
        await self.publish(self.catalog.documents.name, job.document_key, state)
        await self.publish(self.catalog.ingest_jobs.name, job.document_key, job)
        return state

    async def remove_file(self, store_id: str, file_id: str) -> None:
        await self.publish(self.catalog.documents.name, document_key(store_id, file_id), None)

    # --- the rag service -----------------------------------------------------------------------------------------

    def _request(self, op: Literal["search", "chat"], tenant: str, search: FileSearch,
                 generate: GenerateRequest | None = None, request_id: str | None = None) -> RetrievalRequest:
        return RetrievalRequest(request_id=request_id or f"rq-{uuid.uuid4().hex}", tenant=tenant, op=op,
                                reply_to=ReplyRoute(topic=self.edge.reply_topic), search=search, generate=generate)

    async def search(self, tenant: str, search: FileSearch) -> BaseModel:
        """The rag service's answer (SearchResults or ErrorEvent); 504 when none comes in time."""
        request = self._request("search", tenant, search)
        stream = self.edge.router.open(request.request_id, deadline=time.time() + self.search_timeout_s, grace_s=0)
        try:
            await self.publish(self.catalog.retrieval.name, request.request_id, request)
            async for event in stream.events():
                return event
        except ReplyTimeout:
            raise errors.EdgeError(504, "The retriever did not answer in time (is `specstream rag` running?).",
                                   type="server_error", code="retrieval_timeout") from None
        finally:
            stream.close()
        raise RuntimeError("reply stream ended without an answer")  # pragma: no cover

    async def grounding(self, tool: FileSearchTool, tenant: str, default_results: int) -> FileSearch:
        """What a chat request's file_search tool searches; 404 for a store the tenant does not have."""
        await self.fresh()
        for store_id in tool.vector_store_ids:
            self.store(store_id, tenant)
        return FileSearch(vector_store_ids=tool.vector_store_ids, filters=tool.filters,
                          max_num_results=tool.max_num_results or default_results)

    async def submit_grounded(self, request: GenerateRequest, search: FileSearch) -> ReplyStream:
        """Like Edge.submit, through the retriever: it grounds the request and hands it to the engine."""
        if not self.edge.connected.is_set():
            raise errors.not_ready(self.edge.last_error or "not connected to Kafka")
        stream = self.edge.router.open(request.request_id, deadline=request.deadline)
        try:
            wrapped = self._request("chat", request.tenant, search, request, request_id=request.request_id)
            await self.publish(self.catalog.retrieval.name, request.request_id, wrapped)
        except BaseException:
            stream.close()
            raise
        return stream


async def submit(rag: RagEdge | None, edge: Edge, request: GenerateRequest, tool: FileSearchTool | None) -> ReplyStream:
    """To the engine, or with a file_search tool through the retriever, which grounds it first (HTTP and ws)."""
    if tool is None:
        return await edge.submit(request)
    if rag is None:
        raise errors.not_ready("file_search is not available at this edge (vector stores unavailable)")
    search = await rag.grounding(tool, request.tenant, edge.settings.settings.rag.default_max_num_results)
    return await rag.submit_grounded(request, search)
