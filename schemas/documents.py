"""Events of documents and retrieval: uploaded files, ingest jobs, parsed chunks and each document's state.

The flow (docs/retrieval.md): the edge stores an upload's bytes in the blob store and publishes its
:class:`FileObject` on the compacted files topic; attaching a file to a vector store publishes an
:class:`IngestJob`; the parser reads the blob, extracts and chunks the text, publishes the document's
:class:`DocumentState` (``in_progress``, with its chunk count) and then :class:`DocumentChunks`; the indexer
embeds the chunks and publishes ``completed``. A failure ends the job with ``failed`` and an
:class:`IngestError`. Bytes never travel on the bus: messages carry the blob key and its SHA-256.
"""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.events import Event

# The document parser's kind in service announcements.
PARSER_KIND = "parser"

FILE_ID_PATTERN = r"^file-[A-Za-z0-9_-]{1,64}$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"

# The constrained strings every event of a document repeats (each field adds its own description).
FileId = Annotated[str, Field(pattern=FILE_ID_PATTERN)]
VectorStoreId = Annotated[str, Field(min_length=1, max_length=128)]
Tenant = Annotated[str, Field(min_length=1, max_length=64)]
FileName = Annotated[str, Field(min_length=1, max_length=512)]
Sha256 = Annotated[str, Field(pattern=SHA256_PATTERN)]
BlobKey = Annotated[str, Field(min_length=1, max_length=256)]
JobId = Annotated[str, Field(min_length=1, max_length=128)]

# OpenAI's file purposes. Clients upload the first six; *_output files are written by the system (batch results).
FilePurpose = Literal["assistants", "batch", "fine-tune", "vision", "user_data", "evals",
                      "assistants_output", "batch_output", "fine-tune-results"]
UPLOAD_PURPOSES: tuple[str, ...] = ("assistants", "batch", "fine-tune", "vision", "user_data", "evals")

# OpenAI's chunking defaults and limits (vector_stores.files.create, chunking_strategy.static).
DEFAULT_MAX_CHUNK_TOKENS = 800
DEFAULT_CHUNK_OVERLAP_TOKENS = 400
MIN_CHUNK_TOKENS = 100
MAX_CHUNK_TOKENS = 4096

# OpenAI's last_error codes of a vector store file, plus server_error for what is ours.
IngestErrorCode = Literal["server_error", "unsupported_file", "invalid_file"]


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileObject(Event):
    """One uploaded file, keyed by its id on the compacted files topic; a tombstone (null value) deletes it.

    ``openai()`` is OpenAI's file object; ``tenant``, ``blob_key`` and ``sha256`` are ours."""

    type: Literal["file"] = "file"
    id: FileId = Field(description="The file's id, `file-` and a random suffix.")
    bytes: int = Field(ge=0, description="Size of the file in bytes.")
    created_at: int = Field(ge=0, description="Unix time (seconds) the file was created.")
    filename: FileName = Field(description="Name of the file as uploaded.")
    purpose: FilePurpose = Field(description="What the file is for (OpenAI's purposes).")
    status: Literal["uploaded", "processed", "error"] = Field(
        default="processed", description="OpenAI's (deprecated) status: processed once stored."
    )
    status_details: str | None = Field(default=None, description="Why the status is error, when it is.")
    expires_at: int | None = Field(default=None, description="Unix time the file expires; None: never.")
    tenant: Tenant = Field(description="Tenant that owns the file; only it sees the file.")
    blob_key: BlobKey = Field(description="Where the bytes are in the blob store.")
    sha256: Sha256 = Field(description="SHA-256 of the bytes, hex; checked on every read.")

    def openai(self) -> dict[str, object]:
        """OpenAI's file object, as `GET /v1/files/{id}` returns it."""
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "filename": self.filename, "purpose": self.purpose, "status": self.status,
                "status_details": self.status_details, "expires_at": self.expires_at}


class StaticChunking(_Part):
    """OpenAI's static chunking strategy: windows of at most ``max_chunk_size_tokens`` tokens of the embedding
    model's tokenizer, consecutive windows sharing ``chunk_overlap_tokens``."""

    max_chunk_size_tokens: int = Field(
        default=DEFAULT_MAX_CHUNK_TOKENS, ge=MIN_CHUNK_TOKENS, le=MAX_CHUNK_TOKENS,
        description="Most tokens in one chunk (100 to 4096; OpenAI's default 800).",
    )
    chunk_overlap_tokens: int = Field(
        default=DEFAULT_CHUNK_OVERLAP_TOKENS, ge=0,
        description="Tokens shared by consecutive chunks; at most half of max_chunk_size_tokens (default 400).",
    )

    @model_validator(mode="after")
    def _overlap_at_most_half(self) -> "StaticChunking":
        if self.chunk_overlap_tokens > self.max_chunk_size_tokens // 2:
            raise ValueError(f"chunk_overlap_tokens ({self.chunk_overlap_tokens}) must not exceed half of "
                             f"max_chunk_size_tokens ({self.max_chunk_size_tokens})")
        return self


Attributes = dict[str, str | float | bool]


class IngestJob(Event):
    """Parse one file into a vector store's index (version ``index_version``), keyed ``<store id>/<file id>`` on
    the ingest-jobs topic; the parsers consume it as one group. Redelivered or repeated, it produces the same
    chunks (same indices, same text), so readers may upsert by (store, file, version, chunk index)."""

    type: Literal["ingest_job"] = "ingest_job"
    job_id: JobId = Field(description="Id of this job (logs, dead letters).")
    vector_store_id: VectorStoreId = Field(description="The vector store the file is added to.")
    file_id: FileId = Field(description="The file to parse.")
    tenant: Tenant = Field(description="Tenant that owns the store and the file.")
    filename: FileName = Field(description="The file's name; its extension picks the parser.")
    blob_key: BlobKey = Field(description="Where the bytes are in the blob store.")
    sha256: Sha256 = Field(description="SHA-256 the bytes must have; a mismatch fails the job.")
    bytes: int = Field(ge=0, description="Size of the file in bytes.")
    chunking: StaticChunking = Field(default_factory=StaticChunking, description="How to cut the text into chunks.")
    attributes: Attributes = Field(
        default_factory=dict, max_length=16, description="The vector store file's attributes, copied to its chunks."
    )
    index_version: int = Field(default=1, ge=1, description="Version of the store's index the chunks go into.")
    attempt: int = Field(default=1, ge=1, description="1 for the first try; the rag side bumps it on a retry.")
    batch_id: str | None = Field(
        default=None, max_length=128, description="The vector store file batch (vsfb_...) that added the file, if "
        "any: a batch's state is its documents' states, so any edge answers for it, restarted or not."
    )
    rebuild: bool = Field(
        default=False, description="An index rebuild's job: the file's visible status stays as it is (the old "
        "version keeps answering); the parser and the indexer only report the new version's progress."
    )
    created_at: float = Field(description="Unix time the job was published.")

    @property
    def document_key(self) -> str:
        return document_key(self.vector_store_id, self.file_id)


def document_key(vector_store_id: str, file_id: str) -> str:
    """Key of a document's messages (ingest-jobs, document-chunks, documents): one partition, in order."""
    return f"{vector_store_id}/{file_id}"


class Chunk(_Part):
    index: int = Field(ge=0, description="Position of the chunk in the document: 0, 1, 2, ... without gaps.")
    text: str = Field(description="The chunk's text: exactly the extracted text between char_start and char_end.")
    char_start: int = Field(ge=0, description="Offset of its first character in the document's extracted text.")
    char_end: int = Field(ge=0, description="Offset just past its last character in the extracted text.")
    page: int | None = Field(default=None, ge=1, description="Page (1-based) its first character is on; None: no pages.")
    tokens: int = Field(ge=0, description="Its length in tokens of the embedding model's tokenizer.")


class DocumentChunks(Event):
    """Part of a parsed document's chunks, keyed ``<store id>/<file id>`` on the document-chunks topic.

    A document's chunks are split into several messages (``part`` of ``parts``, each under a size bound);
    ``total_chunks`` tells the indexer when it has them all. A redelivered job publishes the same messages again."""

    type: Literal["document_chunks"] = "document_chunks"
    job_id: JobId = Field(description="The job that produced them.")
    vector_store_id: VectorStoreId = Field(description="The vector store they belong to.")
    file_id: FileId = Field(description="The file they were cut from.")
    tenant: Tenant = Field(description="Tenant that owns the store and the file.")
    filename: FileName = Field(description="The file's name (file_search results show it).")
    attributes: Attributes = Field(default_factory=dict, description="The vector store file's attributes.")
    index_version: int = Field(ge=1, description="Version of the store's index they go into.")
    rebuild: bool = Field(default=False, description="Chunks of an index rebuild's job (see IngestJob.rebuild).")
    part: int = Field(ge=0, description="Which message of the document's chunks this is: 0, 1, ... parts-1.")
    parts: int = Field(ge=1, description="How many messages carry this document's chunks.")
    total_chunks: int = Field(ge=1, description="How many chunks the document has in all (across the parts).")
    chunks: list[Chunk] = Field(min_length=1, description="This part's chunks, in index order.")


class IngestError(_Part):
    """OpenAI's ``last_error`` of a vector store file."""

    code: IngestErrorCode = Field(description="unsupported_file, invalid_file or server_error (OpenAI's codes).")
    message: str = Field(min_length=1, description="What is wrong, precisely (e.g. 'the PDF is encrypted').")


class DocumentState(Event):
    """A document's current state in a vector store, keyed ``<store id>/<file id>`` on the compacted documents
    topic; a tombstone removes the file from the store. What an index rebuild replays (it re-runs each
    document's job into a new version). Several writers: the vector store API (``in_progress`` on attach), the
    parser (``in_progress`` with the chunk count once parsed, before it publishes the chunks; ``failed``), the
    indexer (``completed``). Readers keep the newest by ``updated_at`` within a key."""

    type: Literal["document_state"] = "document_state"
    vector_store_id: VectorStoreId = Field(description="The vector store.")
    file_id: FileId = Field(description="The file.")
    tenant: Tenant = Field(description="Tenant that owns the store and the file.")
    status: Literal["in_progress", "completed", "cancelled", "failed"] = Field(
        description="OpenAI's vector store file status."
    )
    job: IngestJob = Field(description="The job that makes (or made) this state: file ref, chunking, version.")
    chunks: int | None = Field(default=None, ge=0, description="How many chunks it was cut into, once parsed.")
    characters: int | None = Field(default=None, ge=0, description="Length of its extracted text, once parsed.")
    pages: int | None = Field(default=None, ge=0, description="Pages of a paged format (PDF), once parsed.")
    usage_bytes: int = Field(default=0, ge=0, description="Bytes it uses in the store (OpenAI's usage_bytes).")
    last_error: IngestError | None = Field(default=None, description="Why it failed; set when status is failed.")
    stage: Literal["queued", "parsed", "indexed", "failed", "cancelled"] = Field(
        description="Who wrote it last: queued (API), parsed (parser), indexed (indexer), failed, cancelled."
    )
    updated_at: float = Field(description="Unix time of this state.")

    @model_validator(mode="after")
    def _error_iff_failed(self) -> "DocumentState":
        if (self.status == "failed") != (self.last_error is not None):
            raise ValueError("last_error is set exactly when status is failed")
        return self
