"""The indexer: a consumer of parsed chunks that embeds them and upserts them into the store's index.

For each DocumentChunks message (a part of one document's chunks, keyed ``<store>/<file>``):

1. the document must still be there: the documents table (caught up) holds its key and the store exists; a
   document deleted or a store dropped meanwhile is skipped;
2. embed the part's chunks together with those of the other parts in flight (streams.rag.batching), upsert
   them into ``<store>_v<index_version>`` with deterministic point ids (a redelivered part overwrites them);
3. check again: deleted during the upsert? then remove the file's points (nothing of it stays);
4. when the version holds ``total_chunks`` points of the file, publish its DocumentState ``completed`` (a
   rebuild's part: stage ``indexed`` at the new version, the visible status left as it was).

Any failure of the embedding or the index ends the document ``failed`` with ``server_error`` (and the message is
answered, so the consumer moves on); a crash before step 4 leaves the offset uncommitted and Kafka redelivers.
"""
from __future__ import annotations

import asyncio
import logging
import time

from schemas.documents import DocumentChunks, DocumentState, IngestError, document_key
from schemas.retrieval import VectorStoreRecord
from schemas.topics import TopicCatalog
from streams.kafka.compacted_table import CompactedTable
from streams.rag.batching import CoalescingEmbedder
from streams.rag.embedding import Embedder
from streams.rag.index import ChunkPoint, VectorIndex
from streams.service import Consumer, Delivery, Output

log = logging.getLogger("specstream.rag")
PIPELINE_BATCHES = 2


class Indexer:
    def __init__(self, catalog: TopicCatalog, embedder: Embedder, index: VectorIndex,
                 documents: CompactedTable[DocumentState], stores: CompactedTable[VectorStoreRecord]) -> None:
        self.catalog = catalog
        self.embedder = embedder
        # A few forward batches per embedder call, not hundreds: the parts of one call upsert (local Qdrant commits
        # every point) while the next call embeds, instead of all upserting after the last forward.
        self.batcher = CoalescingEmbedder(embedder.embed, max_texts=PIPELINE_BATCHES * embedder.options.batch_size)
        self.index = index
        self.documents = documents
        self.stores = stores
        self._tasks: set[asyncio.Task[None]] = set()

    def consumer(self) -> Consumer[DocumentChunks]:
        return Consumer(kind="indexer", topic=self.catalog.document_chunks, input_model=DocumentChunks,
                        handle=self.handle, outputs=[Output(self.catalog.documents, DocumentState)],
                        key_of=lambda m: f"{m.vector_store_id}/{m.file_id}/{m.index_version}/{m.part}",
                        route_of=lambda m: None)

    async def handle(self, part: DocumentChunks, delivery: Delivery) -> None:
        """Deferred: the foundation awaits handlers one at a time, so the part is indexed in a task and the next
        message is read meanwhile; parts in flight then share embedder calls (streams.rag.batching)."""
        delivery.defer()
        task = asyncio.create_task(self._index_and_finish(part, delivery))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _index_and_finish(self, part: DocumentChunks, delivery: Delivery) -> None:
        try:
            await self.index_part(part, delivery)
        except Exception as error:  # noqa: BLE001 - as the foundation answers a handler's error
            log.exception("indexer: part %d of %s/%s failed", part.part, part.vector_store_id, part.file_id)
            delivery.fail("internal_error", f"could not index the part: {type(error).__name__}: {error}")
            return
        delivery.finish()

    async def index_part(self, part: DocumentChunks, delivery: Delivery) -> None:
        key = document_key(part.vector_store_id, part.file_id)
        if await self._gone(key, part.vector_store_id):
            log.info("indexer: %s is deleted; its chunks (part %d) are dropped", key, part.part)
            return
        try:
            points = await self._embed(part)
            await asyncio.to_thread(self._upsert, part, points)
            if await self._gone(key, part.vector_store_id):
                await asyncio.to_thread(self.index.delete_file, part.vector_store_id, part.file_id,
                                        version=part.index_version)
                log.info("indexer: %s was deleted while indexing; its points are removed", key)
                return
            # A single part just wrote all the file's points; only a file in several parts needs counting.
            held = part.total_chunks if part.parts == 1 else await asyncio.to_thread(
                self.index.count, part.vector_store_id, file_id=part.file_id, version=part.index_version)
        except Exception as error:  # the document fails, the consumer keeps serving
            log.exception("indexer: %s failed", key)
            self._publish(delivery, part, "failed", IngestError(code="server_error",
                                                                message=f"indexing failed: {error!r}"[:500]))
            return
        if held >= part.total_chunks:
            self._publish(delivery, part, "completed", None)

    async def _gone(self, key: str, store: str) -> bool:
        await asyncio.gather(self.documents.caught_up(), self.stores.caught_up())
        return self.documents.get(key) is None or self.stores.get(store) is None

    async def _embed(self, part: DocumentChunks) -> list[ChunkPoint]:
        vectors = await self.batcher.embed([c.text for c in part.chunks])
        return [ChunkPoint(file_id=part.file_id, filename=part.filename, index=c.index, text=c.text,
                           char_start=c.char_start, char_end=c.char_end, page=c.page, vector=v,
                           attributes=dict(part.attributes))
                for c, v in zip(part.chunks, vectors, strict=True)]

    def _upsert(self, part: DocumentChunks, points: list[ChunkPoint]) -> None:
        self.index.ensure_version(part.vector_store_id, part.index_version)
        self.index.upsert(part.vector_store_id, points, version=part.index_version)

    def _publish(self, delivery: Delivery, part: DocumentChunks, status: str, error: IngestError | None) -> None:
        key = document_key(part.vector_store_id, part.file_id)
        held = self.documents.get(key)
        if held is None:
            return
        job = held.job if held.job.index_version == part.index_version else held.job.model_copy(
            update={"index_version": part.index_version, "rebuild": part.rebuild})
        if part.rebuild and error is None:
            # The rebuild reads stage `indexed` at the new version; users keep seeing the status they saw.
            status = held.status if held.status != "failed" else "completed"
        state = held.model_copy(update={
            "status": status, "stage": "indexed" if error is None else "failed", "last_error": error, "job": job,
            "chunks": part.total_chunks, "updated_at": time.time(),
        })
        # model_copy skips validation: check the record as a reader will.
        state = DocumentState.model_validate(state.model_dump())
        delivery.publish(self.catalog.documents.name, key.encode(), state)
