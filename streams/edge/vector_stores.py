"""OpenAI's vector store API: stores, their files, file batches and search (the `openai` client's
`client.vector_stores.*` works unchanged).

State is on the bus (:mod:`streams.edge.rag_client`): a store is a record on the compacted vector-stores topic, a
file in a store is its document state on the compacted documents topic (in_progress -> completed | failed with
last_error, written by the parser and the indexer). Every read first catches up with those topics, so a client
sees its own writes. Search goes to the rag service over the bus. Unknown ids are 404 in OpenAI's shape; a store
or file of another tenant is unknown too. A file batch is no record of its own: each of its files' ingest jobs
carries its id, so its state is derived from the documents topic by any edge (restarted, or another one); a file
removed from the store, or added again since, leaves the batch.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal, TypeVar

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ValidationError

from schemas.events import ErrorEvent
from schemas.retrieval import FileSearch, SearchResults
from streams.edge.keys import Principal
from streams.edge.openai_api import principal
from streams.edge.openapi import error_responses
from streams.edge.rag_client import RagEdge
from streams.edge.vector_store_bodies import (
    AddBatch,
    AddFile,
    CreateStore,
    Search,
    chunking_of,
    file_object,
    page,
    search_result,
    store_object,
)
from streams.rag.filters import check_filter
from streams.rag.jobs import new_id, new_store
from streams.wire import errors
from streams.wire.vector_store_models import (
    CursorPage,
    FileCounts,
    SearchExtras,
    SearchResultsPage,
    VectorStore,
    VectorStoreDeleted,
    VectorStoreFile,
    VectorStoreFileBatch,
    VectorStoreFileDeleted,
)

# Bodies are read by hand (OpenAI-shaped errors naming the parameter); the errors every route may answer:
ERRORS = error_responses({
    400: "Invalid input, naming the parameter (invalid_json, unknown_parameter, invalid_value, "
         "missing_required_parameter).",
    404: "No such vector store, file or batch for this tenant (not_found).",
    503: "Kafka or the vector store topics are not available yet.",
    504: "Search: the retriever (`specstream rag`) did not answer in time.",
})
router = APIRouter(prefix="/v1/vector_stores", tags=["vector stores"], responses=ERRORS)
BodyT = TypeVar("BodyT", bound=BaseModel)
M = TypeVar("M", VectorStore, VectorStoreFile)
Order = Literal["asc", "desc"]


@dataclass(frozen=True)
class Batch:
    id: str
    vector_store_id: str
    file_ids: tuple[str, ...]
    created_at: int


async def _rag(request: Request) -> RagEdge:
    rag: RagEdge | None = getattr(request.app.state, "rag", None)
    if rag is None:
        raise errors.not_ready("vector stores are not available at this edge")
    await rag.fresh()
    return rag


async def _body(request: Request, model: type[BodyT]) -> BodyT:
    try:
        data = json.loads(await request.body() or b"{}")
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise errors.invalid_json(str(error)) from None
    try:
        return model.model_validate(data)
    except ValidationError as error:
        raise errors.from_validation_error(error) from None


def _invalid(message: str, param: str) -> errors.EdgeError:
    return errors.EdgeError(400, message, param=param, code="invalid_value")


# --- stores --------------------------------------------------------------------------------------------------------


@router.post("", response_model=VectorStore)
async def create_store(request: Request, caller: Principal = Depends(principal)) -> VectorStore:
    """Create a vector store (OpenAI's `name`, `file_ids`, `chunking_strategy`, `metadata`)."""
    body = await _body(request, CreateStore)
    rag = await _rag(request)
    files = [await rag.file(f, caller.tenant) for f in body.file_ids]  # all known, or nothing is created
    record = new_store(body.name, caller.tenant, chunking=chunking_of(body.chunking_strategy), metadata=body.metadata)
    await rag.put_store(record)
    documents = [await rag.add_file(record, f, chunking=None, attributes={}) for f in files]
    return store_object(record, documents)


@dataclass(frozen=True)
class Paging:
    """OpenAI's list parameters."""

    limit: int
    order: Order
    after: str | None
    before: str | None

    def page(self, item: type[M], data: list[M]) -> CursorPage[M]:
        shown = page([o.model_dump() for o in data], limit=self.limit, order=self.order, after=self.after,
                     before=self.before)
        return CursorPage[item].model_validate(shown)  # type: ignore[valid-type]


def paging(request: Request, limit: int = Query(20, ge=1, le=100), order: Order = "desc", after: str | None = None,
           before: str | None = None) -> Paging:
    for name in request.query_params:
        if len(request.query_params.getlist(name)) > 1:
            raise _invalid(f"'{name}' is given more than once.", name)
    return Paging(limit, order, after, before)


@router.get("", response_model=CursorPage[VectorStore])
async def list_stores(request: Request, caller: Principal = Depends(principal),
                      paging: Paging = Depends(paging)) -> CursorPage[VectorStore]:
    """The caller's vector stores (OpenAI's cursor page)."""
    rag = await _rag(request)
    return paging.page(VectorStore, [store_object(s, rag.documents_of(s.id)) for s in rag.stores.values()
                        if s.tenant == caller.tenant])


@router.get("/{store_id}", response_model=VectorStore)
async def get_store(store_id: str, request: Request, caller: Principal = Depends(principal)) -> VectorStore:
    """One vector store, with its file counts."""
    rag = await _rag(request)
    return store_object(rag.store(store_id, caller.tenant), rag.documents_of(store_id))


@router.delete("/{store_id}", response_model=VectorStoreDeleted)
async def delete_store(store_id: str, request: Request, caller: Principal = Depends(principal)) -> VectorStoreDeleted:
    """Delete a vector store: its files leave it and its index is dropped."""
    rag = await _rag(request)
    await rag.delete_store(rag.store(store_id, caller.tenant))
    return VectorStoreDeleted(id=store_id, object="vector_store.deleted", deleted=True)


# --- files in a store ------------------------------------------------------------------------------------------------


@router.post("/{store_id}/files", response_model=VectorStoreFile)
async def add_file(store_id: str, request: Request, caller: Principal = Depends(principal)) -> VectorStoreFile:
    """Add a file to a vector store; its status goes in_progress -> completed | failed."""
    body = await _body(request, AddFile)
    rag = await _rag(request)
    record = rag.store(store_id, caller.tenant)
    document = await rag.add_file(record, await rag.file(body.file_id, caller.tenant),
                                  chunking=chunking_of(body.chunking_strategy), attributes=body.attributes or {})
    return file_object(document)


@router.get("/{store_id}/files", response_model=CursorPage[VectorStoreFile])
async def list_files(store_id: str, request: Request, caller: Principal = Depends(principal),
                     paging: Paging = Depends(paging),
                     filter: Literal["in_progress", "completed", "failed", "cancelled"] | None = None,
                     ) -> CursorPage[VectorStoreFile]:
    """The store's files (`filter` by status; OpenAI's cursor page)."""
    rag = await _rag(request)
    rag.store(store_id, caller.tenant)
    return paging.page(VectorStoreFile, [file_object(d) for d in rag.documents_of(store_id) if filter is None or d.status == filter])


@router.get("/{store_id}/files/{file_id}", response_model=VectorStoreFile)
async def get_file(store_id: str, file_id: str, request: Request,
                   caller: Principal = Depends(principal)) -> VectorStoreFile:
    """One file of the store, with its status and last_error."""
    rag = await _rag(request)
    rag.store(store_id, caller.tenant)
    return file_object(rag.document(store_id, file_id))


@router.delete("/{store_id}/files/{file_id}", response_model=VectorStoreFileDeleted)
async def remove_file(store_id: str, file_id: str, request: Request,
                      caller: Principal = Depends(principal)) -> VectorStoreFileDeleted:
    """Remove a file from the store; its chunks leave the index."""
    rag = await _rag(request)
    rag.store(store_id, caller.tenant)
    rag.document(store_id, file_id)
    await rag.remove_file(store_id, file_id)
    return VectorStoreFileDeleted(id=file_id, object="vector_store.file.deleted", deleted=True)


# --- file batches ----------------------------------------------------------------------------------------------------


@router.post("/{store_id}/file_batches", response_model=VectorStoreFileBatch)
async def add_batch(store_id: str, request: Request, caller: Principal = Depends(principal)) -> VectorStoreFileBatch:
    """Add several files to the store at once (`file_ids` or `files`)."""
    body = await _body(request, AddBatch)
    rag = await _rag(request)
    record = rag.store(store_id, caller.tenant)
    entries = [(entry, await rag.file(entry.file_id, caller.tenant)) for entry in body.entries()]
    batch_id = new_id("vsfb_")
    for entry, file in entries:
        await rag.add_file(record, file, chunking=chunking_of(entry.chunking_strategy),
                           attributes=entry.attributes or {}, batch_id=batch_id)
    await rag.fresh()
    return _batch_object(_batch(rag, store_id, batch_id), rag)


@router.get("/{store_id}/file_batches/{batch_id}", response_model=VectorStoreFileBatch)
async def get_batch(store_id: str, batch_id: str, request: Request,
                    caller: Principal = Depends(principal)) -> VectorStoreFileBatch:
    """A file batch's status and file counts."""
    rag = await _rag(request)
    rag.store(store_id, caller.tenant)
    return _batch_object(_batch(rag, store_id, batch_id), rag)


def _batch(rag: RagEdge, store_id: str, batch_id: str) -> Batch:
    """The batch as its documents' jobs record it (any edge can answer)."""
    jobs = [d.job for d in rag.documents_of(store_id) if d.job.batch_id == batch_id]
    if not jobs:
        raise errors.EdgeError(404, f"No file batch found with id '{batch_id}'.", param="batch_id", code="not_found")
    return Batch(batch_id, store_id, tuple(j.file_id for j in jobs), int(min(j.created_at for j in jobs)))


def _batch_object(batch: Batch, rag: RagEdge) -> VectorStoreFileBatch:
    states = [rag.documents.get(f"{batch.vector_store_id}/{f}") for f in batch.file_ids]
    counts = {s: sum(1 for d in states if d is not None and d.status == s)
              for s in ("in_progress", "completed", "failed")}
    counts["cancelled"] = sum(1 for d in states if d is None or d.status == "cancelled")
    return VectorStoreFileBatch(id=batch.id, object="vector_store.files_batch", created_at=batch.created_at,
                                vector_store_id=batch.vector_store_id,
                                status="in_progress" if counts["in_progress"] else "completed",
                                file_counts=FileCounts(**counts, total=len(states)))


# --- search ------------------------------------------------------------------------------------------------------------


@router.post("/{store_id}/search", response_model=SearchResultsPage)
async def search(store_id: str, request: Request, caller: Principal = Depends(principal)) -> SearchResultsPage:
    """The store's best chunks for a query (`max_num_results`, attribute `filters`)."""
    body = await _body(request, Search)
    try:
        check_filter(body.filters)
    except ValueError as error:
        raise _invalid(f"Invalid value for 'filters': {error}", "filters") from None
    rag = await _rag(request)
    rag.store(store_id, caller.tenant)
    threshold = body.ranking_options.score_threshold if body.ranking_options else None
    answer = await rag.search(caller.tenant, FileSearch(vector_store_ids=[store_id], query=body.text(),
                                                        max_num_results=body.max_num_results, filters=body.filters,
                                                        score_threshold=threshold))
    if isinstance(answer, ErrorEvent):
        raise errors.from_worker_error(answer, input_param="query")
    assert isinstance(answer, SearchResults)
    return SearchResultsPage(object="vector_store.search_results.page", search_query=[body.text()],
                             data=[search_result(p) for p in answer.passages], has_more=False, next_page=None,
                             specstream=SearchExtras(index_versions=answer.index_versions))
