"""Events of vector stores and retrieval: the stores' records, users' searches, index administration, the answers.

A vector store is a record on the compacted vector-stores topic (a tombstone deletes it), so every edge, a
restarted one too, sees the same stores. The rag service (the only process that opens the index) reads two topics:

* the retrieval topic carries users' operations, :class:`RetrievalRequest`: searches and chat requests with the
  `file_search` tool, each on behalf of a tenant (the retriever refuses a store of another tenant). It answers on the
  caller's reply route: :class:`SearchResults` for a search, or for a chat request :class:`Retrieved` (the passages
  given to the model, before the engine's events) after which it publishes the grounded ``GenerateRequest``;
* the index-commands topic carries the operator's index administration, :class:`IndexCommand` (a rebuild's steps),
  answered with :class:`IndexState` (or :class:`SearchResults` for a canary search of one version). Apart so that
  on a secured cluster only operators may write it (the edge and the tool runner may not).

An op published on the other topic is refused by validation, naming the topic it belongs on (the consumer
foundation dead-letters it with that reason and tells the sender).
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


USER_OPS = ("search", "chat")
INDEX_OPS = ("prepare", "swap", "count", "canary")


def _refuse_op_of_other_topic(data: Any, foreign: tuple[str, ...], why: str) -> Any:
    """Checked before the fields, so a message of the other topic gets this one reason, not a list of field errors."""
    op = data.get("op") if isinstance(data, dict) else None
    if isinstance(op, str) and op in foreign:
        raise ValueError(f"op {op!r} {why}")
    return data


class RetrievalRequest(Event):
    """A user's search or chat request to ground, keyed by request id on the retrieval topic."""

    type: Literal["retrieval_request"] = "retrieval_request"
    request_id: str = Field(min_length=1, max_length=128, description="Client-unique id; the answer carries it.")
    reply_to: ReplyRoute = Field(description="Where the answer goes.")
    tenant: str = Field(default="default", min_length=1, max_length=64,
                        description="Tenant asking; every store searched must be its own, or the request is refused.")
    op: Literal["search", "chat"] = Field(
        description="search: SearchResults of the version answering queries; chat: Retrieved, then the grounded "
        "request to the engine."
    )
    search: FileSearch = Field(description="What to search.")
    generate: GenerateRequest | None = Field(default=None, description="op chat: the request to ground.")

    @model_validator(mode="before")
    @classmethod
    def _user_ops_only(cls, data: Any) -> Any:
        return _refuse_op_of_other_topic(
            data, INDEX_OPS, "is index administration: publish an IndexCommand to the index-commands topic; the "
            "retrieval topic carries users' searches (search, chat)")

    @model_validator(mode="after")
    def _fields_of_op(self) -> RetrievalRequest:
        if (self.op == "chat") != (self.generate is not None):
            raise ValueError("generate is set exactly when op is chat")
        return self


class IndexCommand(Event):
    """An operator's operation on one store's index (a rebuild's steps), keyed by request id on the index-commands
    topic. Not on behalf of a tenant: who may write this topic is the cluster's ACLs' to say."""

    type: Literal["index_command"] = "index_command"
    request_id: str = Field(min_length=1, max_length=128, description="Client-unique id; the answer carries it.")
    reply_to: ReplyRoute = Field(description="Where the answer goes.")
    op: Literal["prepare", "swap", "count", "canary"] = Field(
        description="prepare: an empty collection for `version` (a rebuild's start); swap: point the store's alias at "
        "`version` and drop the others; count: points in `version`; canary: SearchResults of `query` in `version` "
        "(a rebuild's check before the swap). Each answers IndexState, canary SearchResults."
    )
    vector_store_id: str = Field(min_length=1, max_length=128, description="The store.")
    version: int = Field(ge=1, description="The index version operated on.")
    query: str = Field(default="", max_length=8192, description="op canary: what to search.")

    @model_validator(mode="before")
    @classmethod
    def _index_ops_only(cls, data: Any) -> Any:
        return _refuse_op_of_other_topic(
            data, USER_OPS, "is a user's operation: publish a RetrievalRequest to the retrieval topic, where the "
            "retriever checks its tenant; the index-commands topic carries index administration "
            f"({', '.join(INDEX_OPS)})")

    @model_validator(mode="after")
    def _query_of_canary(self) -> IndexCommand:
        if (self.op == "canary") != bool(self.query):
            raise ValueError("query is set exactly when op is canary")
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
