"""What attaching a file to a vector store publishes, whoever attaches it (the edge's API, `specstream docs add`):
the document's queued state on the documents topic, then its ingest job for the parsers."""
from __future__ import annotations

import secrets
import time

from schemas.documents import (
    Attributes,
    DocumentState,
    FileObject,
    IngestJob,
    StaticChunking,
)
from schemas.retrieval import VectorStoreRecord


def new_id(prefix: str) -> str:
    """OpenAI-like ids: a prefix and 24 URL-safe letters and digits."""
    return f"{prefix}{secrets.token_urlsafe(18).replace('-', 'A').replace('_', 'B')}"


def new_store(name: str, tenant: str, *, chunking: StaticChunking | None = None,
              metadata: dict[str, str] | None = None) -> VectorStoreRecord:
    now = time.time()
    return VectorStoreRecord(id=new_id("vs_"), name=name, tenant=tenant, created_at=int(now), metadata=metadata or {},
                             updated_at=now, **({"chunking": chunking} if chunking is not None else {}))


def attach(record: VectorStoreRecord, file: FileObject, *, chunking: StaticChunking | None = None,
           attributes: Attributes | None = None, batch_id: str | None = None) -> tuple[DocumentState, IngestJob]:
    """The queued state and the job of `file` in `record`'s store, at the version answering its queries."""
    job = IngestJob(job_id=new_id("job_"), vector_store_id=record.id, file_id=file.id, tenant=record.tenant,
                    filename=file.filename, blob_key=file.blob_key, sha256=file.sha256, bytes=file.bytes,
                    chunking=chunking or record.chunking, attributes=attributes or {},
                    index_version=record.index_version, batch_id=batch_id, created_at=time.time())
    state = DocumentState(vector_store_id=record.id, file_id=file.id, tenant=record.tenant, status="in_progress",
                          job=job, stage="queued", usage_bytes=file.bytes, updated_at=time.time())
    return state, job
