"""The rag service: the one process that opens the vector index; it runs the indexer, the retriever and the index
administration.

Three consumers on the foundation (each its own group, input topic and announcements: kinds `indexer`, `retriever`
for users' searches, `index-admin` for the operator's index commands) share the embedding model, the index and two
tables followed from the bus: the documents (a tombstone removes the file's points from every version) and the
vector stores (a tombstone drops the store's collections).
Local Qdrant allows one process per folder, so this is the only process that opens `rag.state_dir`; with
`rag.qdrant_url` the index is a server and this service may run several times.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
from typing import Any

from schemas.documents import DocumentState
from schemas.retrieval import VectorStoreRecord
from schemas.topics import TopicCatalog
from streams.kafka.compacted_table import CompactedTable
from streams.config import Settings
from streams.kafka.acls import Grant
from streams.rag.embedding import Embedder, EmbedderOptions
from streams.rag.index import VectorIndex, open_client
from streams.rag.index_commands import IndexAdmin
from streams.rag.indexer import Indexer
from streams.rag.retriever import Retriever
from streams.rag.search import Searcher
from streams.service import Consumer, ServiceOptions
from streams.service.consumer import grants_of
from streams.service.app import StartTopics, exit_if_clients_hang
from streams.service.runner import ConsumerService

log = logging.getLogger("specstream.rag")


def open_index(settings: Settings) -> VectorIndex:
    rag = settings.rag
    if rag.qdrant_url:
        return VectorIndex(open_client(url=rag.qdrant_url, api_key=rag.qdrant_api_key), server=True)
    return VectorIndex(open_client(path=rag.qdrant_path(settings.kafka.topic_prefix)))


class RagService:
    def __init__(self, settings: Settings, *, index: VectorIndex | None = None,
                 embedder: Embedder | None = None) -> None:
        rag, catalog = settings.rag, settings.catalog
        self.index = index or open_index(settings)
        self.embedder = embedder or Embedder(EmbedderOptions(batch_size=rag.embed_batch_size,
                                                             threads=rag.embed_threads))
        self.documents = CompactedTable(settings.kafka, catalog.documents, DocumentState,
                                        on_change=self._document_changed)
        self.stores = CompactedTable(settings.kafka, catalog.vector_stores, VectorStoreRecord,
                                     on_change=self._store_changed)
        self.searcher = Searcher(self.index, hybrid=rag.hybrid, bm25_weight=rag.bm25_weight,
                                 fusion=rag.fusion, rrf_k=rag.rrf_k)
        self.indexer = Indexer(catalog, self.embedder, self.index, self.documents, self.stores)
        self.retriever = Retriever(catalog, self.embedder, self.searcher, self.stores,
                                   max_prompt_chars=rag.max_prompt_chars)
        self.index_admin = IndexAdmin(catalog, self.embedder, self.searcher, self.stores)
        options = ServiceOptions.from_settings(settings, rag)
        self.services: list[ConsumerService] = []
        for consumer in (self.indexer.consumer(), self.retriever.consumer(), self.index_admin.consumer()):
            # One /metrics and one tracer for the process: the first consumer's, which the others are beside.
            first = self.services[0].telemetry if self.services else None
            telemetry = first.beside(consumer.kind, consumer.group(options.catalog)) if first is not None else None
            self.services.append(ConsumerService(
                dataclasses.replace(options, service_id=f"{options.service_id}-{consumer.kind}"),
                reading_tables(consumer), telemetry=telemetry))
        self._cleanups: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        await self.stores.start()
        await self.documents.start()
        for service in self.services:
            await service.start()
        log.info("rag service ready: index %s", "server" if self.index.server else "local")

    async def stop(self) -> None:
        for service in reversed(self.services):  # the first, which owns the telemetry, last
            try:
                await service.stop()
            except Exception:  # stop the others anyway
                log.exception("stopping %s failed", service.kind)
        await self.documents.stop()
        await self.stores.stop()
        if self._cleanups:
            await asyncio.wait(self._cleanups, timeout=10.0)
        self.index.close()

    def _document_changed(self, key: str, row: DocumentState | None) -> None:
        if row is None:
            store, _, file_id = key.partition("/")
            self._cleanup(self._delete_file, store, file_id)

    def _store_changed(self, key: str, row: VectorStoreRecord | None) -> None:
        if row is None:
            self._cleanup(self.index.drop, key)

    def _delete_file(self, store: str, file_id: str) -> None:
        for version in self.index.versions(store):
            self.index.delete_file(store, file_id, version=version)

    def _cleanup(self, work: Any, *args: Any) -> None:
        task = asyncio.get_running_loop().create_task(asyncio.to_thread(work, *args))
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)


def reading_tables(consumer: Consumer[Any]) -> Consumer[Any]:
    """The consumer's ACLs (derived from its description) plus reading the two tables the service follows."""
    def grants(catalog: TopicCatalog, group_id: str) -> list[Grant]:
        derived = grants_of(dataclasses.replace(consumer, grants=None), catalog, group_id)
        tables = (catalog.documents, catalog.vector_stores)
        return [*derived, *(Grant("READ", "TOPIC", t.name, topic=t) for t in tables)]

    return dataclasses.replace(consumer, grants=grants)


async def run_rag(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM, then drain the consumers and close the index (exit 0, also when the broker is
    gone: the clients then get streams.service.app's grace to stop).

    Raises :class:`TopicsGone`, after the same drain, when topics its start created vanished from the cluster."""
    service = RagService(settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    topics = StartTopics(service.services, stop=stop.set)
    await service.start()
    topics.watch()
    try:
        await stop.wait()
    finally:
        topics.stop_watching()
        # The drains are bounded; stopping the Kafka clients is not when the broker or the topics are gone.
        await asyncio.gather(*(s.drain() for s in service.services))
        watchdog = exit_if_clients_hang(topics_gone=bool(topics.gone))
        try:
            await service.stop()
        finally:
            watchdog.cancel()
    topics.raise_if_gone()
