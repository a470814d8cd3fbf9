"""Events of vector stores and retrieval: the stores' records, search and file_search requests, their answers.

A vector store is a record on the compacted vector-stores topic (a tombstone deletes it), so every edge, a
restarted one too, sees the same stores. Searches and chat requests with the `file_search` tool go to the rag
service (the only process that opens the index) as :class:`RetrievalRequest` on the retrieval topic; it answers
on the caller's reply route: :class:`SearchResults` for a search, or for a chat request :class:`Retrieved` (the
passages given to the model, before the engine's events) after which it publishes the grounded
``GenerateRequest`` to the request topic. Index maintenance (a rebuild's swap) uses the same topic.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.documents import Attributes, StaticChunking
from schemas.events import (
    Completion,
    ErrorEvent,
    Event,
    GenerateRequest,
    ReplyRoute,
    TokenChunk,
)

MAX_RESULTS = 50  # OpenAI's bound of max_num_results


class VectorStoreRecord(Event):
    """One vector store, keyed by its id on the compacted vector-stores topic; a tombstone deletes it."""

    type: Literal["vector_store"] = "vector_store"
    id: str = Field(pattern=r"^vs_[A-Za-z0-9_-]{1,64}$", description="The store's id, `vs_` and a random suffix.")
    name: str = Field(default="", max_length=256, description="Its name.")
    tenant: str = Field(min_length=1, max_length=64, description="Tenant that owns it; only it sees the store.")
    created_at: int = Field(ge=0, description="Unix time (seconds) it was created.")
    metadata: dict[str, str] = Field(default_factory=dict, max_length=16, description="OpenAI's metadata.")
    chunking: StaticChunking = Field(default_factory=StaticChunking, description="Chunking of files added to it.")
    index_version: int = Field(default=1, ge=1, description="Version of its index that answers queries.")
    updated_at: float = Field(description="Unix time of this record.")


class FileSearch(BaseModel):
    """What to search: OpenAI's file_search tool (and the search endpoint's parameters)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vector_store_ids: list[str] = Field(min_length=1, max_length=8, description="Stores to search.")
    query: str = Field(default="", max_length=8192, description="The question; empty in a chat: its last user message.")
    max_num_results: int = Field(default=4, ge=1, le=MAX_RESULTS, description="Passages to return.")
    filters: dict[str, Any] | None = Field(default=None, description="OpenAI's attribute filter (comparison/compound).")
    hybrid: bool | None = Field(default=None, description="Fuse BM25 with the vector score; None: the service's rag.hybrid.")
    score_threshold: float | None = Field(default=None, description="Drop results scoring below it.")


class RetrievalRequest(Event):
    """A search, a chat request to ground, or an index operation, keyed by request id on the retrieval topic."""

    type: Literal["retrieval_request"] = "retrieval_request"
    request_id: str = Field(min_length=1, max_length=128, description="Client-unique id; the answer carries it.")
    reply_to: ReplyRoute = Field(description="Where the answer goes.")
    tenant: str = Field(default="default", min_length=1, max_length=64, description="Tenant asking.")
    op: Literal["search", "chat", "prepare", "swap", "count"] = Field(
        description="search: SearchResults (of `version` when set, else of the version answering queries); chat: "
        "Retrieved, then the grounded request to the engine; prepare: an empty collection for `version` (a rebuild's "
        "start); swap: point a store's alias at `version` and drop the others; count: points in `version`."
    )
    search: FileSearch = Field(description="What to search (search, chat), or the store (swap, count: the first id).")
    generate: GenerateRequest | None = Field(default=None, description="op chat: the request to ground.")
    version: int | None = Field(default=None, ge=1, description="op swap, count: the index version.")

    @model_validator(mode="after")
    def _fields_of_op(self) -> RetrievalRequest:
        if (self.op == "chat") != (self.generate is not None):
            raise ValueError("generate is set exactly when op is chat")
        if self.op in ("prepare", "swap", "count") and self.version is None:
            raise ValueError(f"op {self.op} needs version")
        return self


class Passage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    vector_store_id: str
    file_id: str
    filename: str
    score: float
    text: str
    chunk_index: int = Field(ge=0)
    char_start: int = Field(ge=0, description="Span of the chunk in the file's extracted text.")
    char_end: int = Field(ge=0)
    page: int | None = None
    attributes: Attributes = Field(default_factory=dict)


class SearchResults(Event):
    """The answer to a search: passages best first, and the index version of each store that answered."""

    type: Literal["search_results"] = "search_results"
    request_id: str
    query: str
    passages: list[Passage]
    index_versions: dict[str, int] = Field(default_factory=dict, description="Store id -> version that answered.")


class Retrieved(Event):
    """The passages a grounded chat request was given (numbered 1, 2, ... in the prompt), sent to the edge before
    the engine's events, so it can annotate the answer with file citations."""

    type: Literal["retrieved"] = "retrieved"
    request_id: str
    passages: list[Passage]
    index_versions: dict[str, int] = Field(default_factory=dict)


class IndexState(Event):
    """The answer to an index operation: the store's version answering queries, and the points counted."""

    type: Literal["index_state"] = "index_state"
    request_id: str
    vector_store_id: str
    version: int | None = Field(description="Version the alias points at; None: no index yet.")
    versions: list[int] = Field(default_factory=list, description="Versions that exist.")
    points: int = Field(default=0, ge=0, description="op count: points in the version asked about.")


# Everything that arrives on a reply topic: the engine's events and the rag service's answers.
AnyReply = Annotated[TokenChunk | Completion | ErrorEvent | SearchResults | Retrieved | IndexState,
                     Field(discriminator="type")]
