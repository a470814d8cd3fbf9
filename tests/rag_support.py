"""Helpers for the rag tests: a deployment's settings with a unique prefix, and the events the parser and the
vector store API would publish (so the rag service can be tested before and without them)."""
from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from pathlib import Path
from typing import TypeVar

from aiokafka import TopicPartition
from pydantic import BaseModel

from schemas.documents import (
    Chunk,
    DocumentChunks,
    DocumentState,
    IngestJob,
    document_key,
)
from schemas.retrieval import VectorStoreRecord
from schemas.topics import Topic, TopicCatalog
from streams.kafka import clients
from streams.config import Settings
from streams.rag.embedding import Embedder

EventT = TypeVar("EventT", bound=BaseModel)
_EMBEDDER: Embedder | None = None


def shared_embedder() -> Embedder:
    """One real model per test session (loading it takes seconds)."""
    global _EMBEDDER
    if _EMBEDDER is None:
        _EMBEDDER = Embedder()
    return _EMBEDDER


def rag_settings(bootstrap: str, state_dir: Path, prefix: str | None = None, **rag: object) -> Settings:
    prefix = prefix or f"t-rag-{uuid.uuid4().hex[:8]}"
    return Settings(kafka={"bootstrap_servers": bootstrap, "topic_prefix": prefix},
                    rag={"state_dir": str(state_dir), "heartbeat_s": 1.0, "drain_timeout_s": 5.0, **rag})


def store_record(store: str, tenant: str = "default") -> VectorStoreRecord:
    return VectorStoreRecord(id=store, name=store, tenant=tenant, created_at=int(time.time()), updated_at=time.time())


def job(store: str, file_id: str, filename: str, *, version: int = 1, tenant: str = "default") -> IngestJob:
    return IngestJob(job_id=f"job-{uuid.uuid4().hex[:8]}", vector_store_id=store, file_id=file_id, tenant=tenant,
                     filename=filename, blob_key=f"blobs/{file_id}", sha256=hashlib.sha256(b"x").hexdigest(),
                     bytes=1, index_version=version, created_at=time.time())


def queued(ingest: IngestJob) -> DocumentState:
    return DocumentState(vector_store_id=ingest.vector_store_id, file_id=ingest.file_id, tenant=ingest.tenant,
                         status="in_progress", job=ingest, stage="queued", updated_at=time.time())


def chunks_of(ingest: IngestJob, texts: list[str], *, parts: int = 1) -> list[DocumentChunks]:
    """The document's chunks as the parser cuts them: consecutive spans of the texts joined by a blank line."""
    chunks, at = [], 0
    for i, text in enumerate(texts):
        chunks.append(Chunk(index=i, text=text, char_start=at, char_end=at + len(text), tokens=len(text.split())))
        at += len(text) + 2
    per = -(-len(chunks) // parts)
    return [DocumentChunks(job_id=ingest.job_id, vector_store_id=ingest.vector_store_id, file_id=ingest.file_id,
                           tenant=ingest.tenant, filename=ingest.filename, index_version=ingest.index_version,
                           attributes=dict(ingest.attributes),
                           part=p, parts=parts, total_chunks=len(chunks), chunks=chunks[p * per:(p + 1) * per])
            for p in range(parts)]


async def publish(producer, topic: str, key: str, event: BaseModel | None) -> None:  # type: ignore[no-untyped-def]
    await producer.send_and_wait(topic, None if event is None else clients.encode(event), key=key.encode())


async def publish_store(kafka: str, catalog: TopicCatalog, store: str, tenant: str, texts: list[str] | None = None,
                        *, file_id: str = "file-facts", filename: str = "facts.md") -> None:
    """A store's record and, given texts, one document of them as the parser would publish it (its chunks); the
    rag service indexes it (wait for it with :func:`wait_status`)."""
    producer = clients.make_producer(kafka, client_id="pytest-rag-store")
    await producer.start()
    try:
        await publish(producer, catalog.vector_stores.name, store, store_record(store, tenant))
        if texts is None:
            return
        ingest = job(store, file_id, filename, tenant=tenant)
        await publish(producer, catalog.documents.name, ingest.document_key, queued(ingest))
        for message in chunks_of(ingest, texts):
            await publish(producer, catalog.document_chunks.name, ingest.document_key, message)
    finally:
        await producer.stop()


async def document_states(bootstrap: str, topic: str, key: str) -> list[DocumentState]:
    return [clients.decode(r.value, DocumentState) for r in await clients.read_partition(bootstrap, topic, timeout_s=5)
            if r.value and r.key and r.key.decode() == key]


async def wait_status(bootstrap: str, topic: str, store: str, file_id: str, status: str,
                      timeout_s: float = 60.0) -> DocumentState:
    key = document_key(store, file_id)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for state in reversed(await document_states(bootstrap, topic, key)):
            if state.status == status:
                return state
        await asyncio.sleep(0.3)
    raise AssertionError(f"{key} never reached {status} within {timeout_s:.0f} s")


async def read_topic(bootstrap: str, topic: Topic, model: type[EventT]) -> list[EventT]:
    """Every record of every partition of the topic, up to its end when called."""
    consumer = clients.make_consumer(bootstrap, enable_auto_commit=False, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tps = [TopicPartition(topic.name, p) for p in range(topic.partitions)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        out: list[EventT] = []
        for tp in tps:
            while await consumer.position(tp) < ends[tp]:
                for record in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                    if record.value:
                        out.append(clients.decode(record.value, model))
        return out
    finally:
        await consumer.stop()
