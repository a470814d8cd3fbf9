"""The vector store API's request bodies (OpenAI's parameters, unknown fields refused) and its response objects."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, model_validator

from schemas.documents import DocumentState, StaticChunking
from schemas.retrieval import MAX_RESULTS, Passage, VectorStoreRecord
from streams.wire.vector_store_models import (
    FileCounts,
    SearchContent,
    SearchResult,
    StaticStrategyView,
    StoreExtras,
    VectorStore,
    VectorStoreFile,
)

AttributeValue = Annotated[str, Field(max_length=512)] | float | bool


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _StaticParams(_Strict):
    max_chunk_size_tokens: int
    chunk_overlap_tokens: int


class StaticStrategy(_Strict):
    type: Literal["static"]
    static: _StaticParams


class AutoStrategy(_Strict):
    type: Literal["auto"]


ChunkingStrategy = Annotated[AutoStrategy | StaticStrategy, Field(discriminator="type")]


def chunking_of(strategy: AutoStrategy | StaticStrategy | None) -> StaticChunking | None:
    """None: the store's (or OpenAI's default, 800/400). Bounds are StaticChunking's (a 400 names them)."""
    if isinstance(strategy, StaticStrategy):
        return StaticChunking(**strategy.static.model_dump())
    return None


class ExpiresAfter(_Strict):
    anchor: Literal["last_active_at"]
    days: int = Field(ge=1, le=365)


class CreateStore(_Strict):
    name: str = Field(default="", max_length=256)
    file_ids: list[str] = Field(default_factory=list, max_length=500)
    chunking_strategy: ChunkingStrategy | None = None
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(default=None, max_length=16)
    description: str | None = Field(default=None, max_length=512)
    expires_after: ExpiresAfter | None = None  # accepted; stores do not expire here


class AddFile(_Strict):
    file_id: str
    attributes: dict[str, AttributeValue] | None = Field(default=None, max_length=16)
    chunking_strategy: ChunkingStrategy | None = None


class BatchFile(_Strict):
    file_id: str
    attributes: dict[str, AttributeValue] | None = Field(default=None, max_length=16)
    chunking_strategy: ChunkingStrategy | None = None


class AddBatch(_Strict):
    file_ids: list[str] | None = Field(default=None, min_length=1, max_length=2000)
    files: list[BatchFile] | None = Field(default=None, min_length=1, max_length=2000)
    attributes: dict[str, AttributeValue] | None = Field(default=None, max_length=16)
    chunking_strategy: ChunkingStrategy | None = None

    @model_validator(mode="after")
    def _one_of(self) -> AddBatch:
        if (self.file_ids is None) == (self.files is None):
            raise ValueError("give exactly one of 'file_ids' and 'files'")
        return self

    def entries(self) -> list[BatchFile]:
        if self.files is not None:
            return self.files
        return [BatchFile(file_id=f, attributes=self.attributes, chunking_strategy=self.chunking_strategy)
                for f in self.file_ids or []]


class RankingOptions(_Strict):
    ranker: Literal["none", "auto", "default-2024-11-15"] | None = None
    score_threshold: float | None = Field(default=None, ge=0, le=1)


class Search(_Strict):
    query: str | list[str] = Field(min_length=1)
    max_num_results: int = Field(default=10, ge=1, le=MAX_RESULTS)
    filters: dict[str, Any] | None = None
    ranking_options: RankingOptions | None = None
    rewrite_query: StrictBool | None = None  # accepted; queries are searched as written

    def text(self) -> str:
        return self.query if isinstance(self.query, str) else " ".join(self.query)


# --- OpenAI's objects ------------------------------------------------------------------------------------------


def store_object(record: VectorStoreRecord, documents: list[DocumentState]) -> VectorStore:
    counts = {s: sum(1 for d in documents if d.status == s) for s in ("in_progress", "completed", "failed", "cancelled")}
    return VectorStore(
        id=record.id, object="vector_store", created_at=record.created_at, name=record.name,
        usage_bytes=sum(d.usage_bytes for d in documents if d.status == "completed"),
        file_counts=FileCounts(**counts, total=len(documents)),
        status="in_progress" if counts["in_progress"] else "completed",
        last_active_at=int(max([record.updated_at, *(d.updated_at for d in documents)])),
        metadata=record.metadata, expires_after=None, expires_at=None,
        specstream=StoreExtras(index_version=record.index_version),
    )


def file_object(document: DocumentState) -> VectorStoreFile:
    return VectorStoreFile(
        id=document.file_id, object="vector_store.file", created_at=int(document.job.created_at),
        vector_store_id=document.vector_store_id, status=document.status, last_error=document.last_error,
        usage_bytes=document.usage_bytes if document.status == "completed" else 0,
        attributes=dict(document.job.attributes),
        chunking_strategy=StaticStrategyView(type="static", static=document.job.chunking),
    )


def search_result(passage: Passage) -> SearchResult:
    return SearchResult(file_id=passage.file_id, filename=passage.filename, score=passage.score,
                        attributes=dict(passage.attributes), content=[SearchContent(type="text", text=passage.text)])


def page(data: list[dict[str, Any]], *, limit: int, order: str, after: str | None, before: str | None) -> dict[str, Any]:
    """OpenAI's cursor list: sorted by created_at, `after`/`before` an id of the previous page."""
    items = sorted(data, key=lambda o: (o["created_at"], o["id"]), reverse=order == "desc")
    ids = [o["id"] for o in items]
    if after in ids:
        items = items[ids.index(after) + 1:]
    elif before in ids:
        items = items[:ids.index(before)]
    shown = items[:limit]
    return {"object": "list", "data": shown, "first_id": shown[0]["id"] if shown else None,
            "last_id": shown[-1]["id"] if shown else None, "has_more": len(items) > limit}
