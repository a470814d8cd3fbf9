"""The document parser: a consumer of ``<prefix>.ingest-jobs`` on the foundation (``specstream parser``).

For each :class:`IngestJob`: read the file's blob (its SHA-256 checked), extract the text by type
(:mod:`streams.rag.parsing`), cut it into token windows of the embedding model's tokenizer, then publish the
document's ``DocumentState`` (``in_progress``, stage ``parsed``, with the chunk count) and, once Kafka holds
it, the ``DocumentChunks`` parts. A job that cannot be parsed ends with ``DocumentState`` ``failed`` and a
precise ``last_error``, and the parser goes on with the next. The job's offset is committed only after all of
it is acknowledged, so a parser killed mid-job leaves the job to be redone, with identical chunks
(docs/retrieval.md). Parsing runs in a thread: the event loop keeps heartbeats and other jobs going.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any

from schemas.documents import (
    PARSER_KIND,
    Chunk,
    DocumentChunks,
    DocumentState,
    IngestError,
    IngestJob,
)
from schemas.topics import TopicCatalog
from streams.files.blobs import BlobMissing, BlobStore, ChecksumMismatch
from streams.rag.parsing import Extracted, ParseError, extract
from streams.rag.parsing.chunking import Chunker
from streams.service import Consumer, Delivery, Output, ServiceOptions

log = logging.getLogger(__name__)

# A DocumentChunks message stays under this many bytes of JSON (the topic's limit is the broker's 1 MiB).
PART_BYTES = 256 * 1024


@dataclass(frozen=True)
class Parsed:
    extracted: Extracted
    chunks: list[Chunk]
    pages: int | None


class DocumentParser:
    def __init__(self, catalog: TopicCatalog, blobs: BlobStore, *, max_text_chars: int,
                 chunker: Chunker | None = None) -> None:
        self.catalog = catalog
        self.blobs = blobs
        self.max_text_chars = max_text_chars
        self.chunker = chunker

    def consumer(self) -> Consumer[IngestJob]:
        catalog = self.catalog
        return Consumer(
            kind=PARSER_KIND, topic=catalog.ingest_jobs, input_model=IngestJob, handle=self.handle,
            outputs=[Output(catalog.documents, DocumentState), Output(catalog.document_chunks, DocumentChunks)],
            # Redeliveries held at once join by document and version; there is no reply route.
            key_of=lambda job: f"{job.document_key}@{job.index_version}", route_of=lambda job: None,
            prepare=self.prepare,
        )

    async def prepare(self) -> None:
        if self.chunker is None:
            self.chunker = await asyncio.to_thread(Chunker.load)

    async def handle(self, job: IngestJob, delivery: Delivery) -> None:
        handed_back = asyncio.Event()
        delivery.on_handback(handed_back.set)
        try:
            parsed = await asyncio.to_thread(self.parse, job)
        except ParseError as error:
            log.info("job %s (%s): %s: %s", job.job_id, job.filename, error.code, error.message)
            self._publish_state(delivery, job, status="failed", last_error=IngestError(code=error.code,
                                                                                       message=error.message))
            return
        except Exception as error:  # noqa: BLE001 - a parser bug fails this job, not the service
            log.exception("job %s (%s) failed", job.job_id, job.filename)
            self._publish_state(delivery, job, status="failed", last_error=IngestError(
                code="server_error", message=f"the parser failed: {type(error).__name__}: {error}"))
            return
        if handed_back.is_set():  # its partition moved on (or the drain ran out): another parser redoes it
            return
        if not job.rebuild:  # a rebuild leaves the file's visible status alone: the old version still answers
            self._publish_state(delivery, job, status="in_progress", parsed=parsed)
            # The state first, acknowledged, then the chunks: the indexer's `completed` always comes after it.
            await delivery.published[-1]
        for part in chunk_parts(job, parsed.chunks):
            delivery.publish(self.catalog.document_chunks.name, job.document_key.encode(), part)
        log.info("job %s (%s): %d chunks from %d characters", job.job_id, job.filename, len(parsed.chunks),
                 len(parsed.extracted.text))

    def parse(self, job: IngestJob) -> Parsed:
        """Blob -> text -> chunks; ParseError names what is wrong with the file."""
        assert self.chunker is not None, "prepare() loads the tokenizer"
        try:
            data = self.blobs.read(job.blob_key, job.sha256)
        except ChecksumMismatch as error:
            raise ParseError("invalid_file", f"checksum mismatch: {error}") from None
        except BlobMissing as error:
            raise ParseError("invalid_file", f"the file's bytes are gone (was it deleted?): {error}") from None
        extracted = extract(data, job.filename)
        if len(extracted.text) > self.max_text_chars:
            raise ParseError("invalid_file", f"{job.filename} has {len(extracted.text)} characters of text, more "
                             f"than the {self.max_text_chars} a file may have (parser.max_text_chars)")
        chunks = self.chunker.chunks(extracted, job.chunking)
        if not chunks:
            raise ParseError("invalid_file", f"{job.filename} has no extractable text")
        return Parsed(extracted, chunks, len(extracted.page_starts) or None)

    def _publish_state(self, delivery: Delivery, job: IngestJob, *, status: Any, parsed: Parsed | None = None,
                       last_error: IngestError | None = None) -> None:
        state = DocumentState(
            vector_store_id=job.vector_store_id, file_id=job.file_id, tenant=job.tenant, status=status, job=job,
            chunks=len(parsed.chunks) if parsed else None,
            characters=len(parsed.extracted.text) if parsed else None,
            pages=parsed.pages if parsed else None, last_error=last_error,
            stage="failed" if last_error is not None else "parsed", updated_at=time.time(),
        )
        delivery.publish(self.catalog.documents.name, job.document_key.encode(), state)


def chunk_parts(job: IngestJob, chunks: list[Chunk], part_bytes: int = PART_BYTES) -> list[DocumentChunks]:
    """The chunks in messages of at most ``part_bytes`` of chunk JSON each (a chunk never splits); deterministic."""
    groups: list[list[Chunk]] = [[]]
    size = 0
    for chunk in chunks:
        chunk_size = len(chunk.model_dump_json())
        if groups[-1] and size + chunk_size > part_bytes:
            groups.append([])
            size = 0
        groups[-1].append(chunk)
        size += chunk_size
    return [DocumentChunks(job_id=job.job_id, vector_store_id=job.vector_store_id, file_id=job.file_id,
                           tenant=job.tenant, filename=job.filename, attributes=job.attributes,
                           index_version=job.index_version, rebuild=job.rebuild, part=i, parts=len(groups),
                           total_chunks=len(chunks), chunks=group)
            for i, group in enumerate(groups)]


def build(settings: Any, *, chunker: Chunker | None = None) -> tuple[ServiceOptions, Consumer[IngestJob]]:
    """The parser's service options and consumer from ``streams.config.Settings``."""
    parser = DocumentParser(settings.catalog, BlobStore(settings.files.dir),
                            max_text_chars=settings.parser.max_text_chars, chunker=chunker)
    return ServiceOptions.from_settings(settings, settings.parser), parser.consumer()


def run_parser(settings: Any) -> None:
    """Serve until SIGINT/SIGTERM, then drain and exit 0 (``specstream parser``)."""
    from streams.service.app import serve
    from streams.service.runner import ConsumerService

    options, consumer = build(settings)
    asyncio.run(serve(ConsumerService(options, consumer)))
