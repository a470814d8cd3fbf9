"""OpenAI's vector store objects, typed: a store, a file in it, a file batch, a search's results page, their
cursor lists and deletions. The edge's builders (:mod:`streams.edge.vector_store_bodies`) make them and the routes
(:mod:`streams.edge.vector_stores`) declare them as their ``response_model``. Fields are in the JSON's order; the
``specstream`` fields are ours (which index version answered), which OpenAI's clients ignore.
"""
from __future__ import annotations

from typing import Generic, Literal, TypeVar

from pydantic import BaseModel, Field

from schemas.documents import Attributes, IngestError, StaticChunking

T = TypeVar("T")
FileStatus = Literal["in_progress", "completed", "cancelled", "failed"]


class FileCounts(BaseModel):
    in_progress: int
    completed: int
    failed: int
    cancelled: int
    total: int


class StoreExtras(BaseModel):
    index_version: int = Field(description="The version of the store's index that answers its searches.")


class VectorStore(BaseModel):
    id: str
    object: Literal["vector_store"]
    created_at: int
    name: str
    usage_bytes: int = Field(description="Bytes of its completed files.")
    file_counts: FileCounts
    status: Literal["in_progress", "completed"]
    last_active_at: int
    metadata: dict[str, str]
    expires_after: None
    expires_at: None
    specstream: StoreExtras


class StaticStrategyView(BaseModel):
    type: Literal["static"]
    static: StaticChunking


class VectorStoreFile(BaseModel):
    id: str
    object: Literal["vector_store.file"]
    created_at: int
    vector_store_id: str
    status: FileStatus
    last_error: IngestError | None
    usage_bytes: int
    attributes: Attributes
    chunking_strategy: StaticStrategyView


class VectorStoreFileBatch(BaseModel):
    id: str
    object: Literal["vector_store.files_batch"]
    created_at: int
    vector_store_id: str
    status: Literal["in_progress", "completed"]
    file_counts: FileCounts


class SearchContent(BaseModel):
    type: Literal["text"]
    text: str


class SearchResult(BaseModel):
    file_id: str
    filename: str
    score: float
    attributes: Attributes
    content: list[SearchContent]


class SearchExtras(BaseModel):
    index_versions: dict[str, int] = Field(description="Store id -> the version of its index that answered.")


class SearchResultsPage(BaseModel):
    object: Literal["vector_store.search_results.page"]
    search_query: list[str]
    data: list[SearchResult]
    has_more: bool
    next_page: None
    specstream: SearchExtras


class CursorPage(BaseModel, Generic[T]):
    """OpenAI's cursor list: ``after``/``before`` an id of the previous page."""

    object: Literal["list"]
    data: list[T]
    first_id: str | None
    last_id: str | None
    has_more: bool


class VectorStoreDeleted(BaseModel):
    id: str
    object: Literal["vector_store.deleted"]
    deleted: bool


class VectorStoreFileDeleted(BaseModel):
    id: str
    object: Literal["vector_store.file.deleted"]
    deleted: bool
