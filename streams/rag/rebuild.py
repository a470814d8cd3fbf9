"""`specstream index rebuild --store NAME`: a store's index built again as version N+1, checked, then swapped in.

1. The documents table is read up to the end offsets it had at the start: the store's documents then (those
   neither failed nor still being ingested) are what v<N+1> must hold; the rag service prepares an empty
   `<store>_v<N+1>`.
2. Each document's ingest job is published again with `index_version` N+1 (and the new chunking, if one is given);
   the parser and the indexer fill v<N+1> while the alias still answers every query from v<N>.
3. Check: every document `completed` at N+1, the points of v<N+1> equal the sum of their chunks, and a canary query
   of v<N+1> finds something. A check that fails leaves v<N> answering, restores the documents' states and stops.
4. Swap: the alias moves to v<N+1> in one operation and v<N> is dropped; the store's record names N+1, so files
   added from now on go into it. Documents added during the rebuild (still at N) are queued again at N+1.

A document still being ingested at the start (status `in_progress`) is left out, as if added during the rebuild:
its own job goes on at N and publishes its states at N whenever it finishes, so waiting for it at N+1 could wait
until the timeout (its last state names N, whichever job finished last). After the swap it is queued again at
N+1 with the other latecomers, so it lands in the version that answers.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from schemas.documents import DocumentState, StaticChunking
from schemas.retrieval import IndexState, SearchResults
from streams.rag.client import RagClient, RagError

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Rebuilt:
    store_id: str
    old_version: int
    new_version: int
    documents: int
    points: int
    seconds: float


async def rebuild(client: RagClient, store_ref: str, *, chunking: StaticChunking | None = None,
                  canary: str | None = None, timeout_s: float = 1800.0, progress: Progress = print) -> Rebuilt:
    started = time.monotonic()
    await client.documents.caught_up()  # a client that has been open a while: the states as they are now
    record = client.store(store_ref)
    documents = [d for d in client.documents_of(record.id) if d.status not in ("failed", "in_progress")]
    state = await client.command("count", record.id, version=record.index_version)
    assert isinstance(state, IndexState)
    old = state.version or record.index_version
    new = max([old, record.index_version, *state.versions]) + 1
    progress(f"{record.id}: rebuilding v{old} -> v{new} from {len(documents)} document(s); queries stay on v{old}")
    await client.command("prepare", record.id, version=new)
    for document in documents:
        await _requeue(client, document, new, chunking)
    try:
        points = await _wait_indexed(client, record.id, [d.file_id for d in documents], new, timeout_s, progress)
        await _check(client, record.id, new, points, canary or _canary_of(documents))
    except (RagError, TimeoutError):
        for document in documents:  # v<old> still answers: its documents are as they were
            await client.publish(client.catalog.documents.name, _key(document),
                                 document.model_copy(update={"updated_at": time.time()}))
        raise
    swapped = await client.command("swap", record.id, version=new)
    assert isinstance(swapped, IndexState) and swapped.version == new
    await client.publish(client.catalog.vector_stores.name, record.id,
                         client.stores.get(record.id).model_copy(update={"index_version": new,  # type: ignore[union-attr]
                                                                         "updated_at": time.time()}))
    await _catch_up_latecomers(client, record.id, new, chunking)
    progress(f"{record.id}: v{new} answers now ({points} points); v{old} dropped")
    return Rebuilt(record.id, old, new, len(documents), points, time.monotonic() - started)


def _key(document: DocumentState) -> str:
    return f"{document.vector_store_id}/{document.file_id}"


def _canary_of(documents: list[DocumentState]) -> str:
    return documents[0].job.filename.rsplit(".", 1)[0].replace("_", " ") if documents else "document"


async def _requeue(client: RagClient, document: DocumentState, version: int, chunking: StaticChunking | None,
                   *, rebuild: bool = True) -> None:
    job = document.job.model_copy(update={"job_id": f"rebuild-{uuid.uuid4().hex[:12]}", "index_version": version,
                                          "created_at": time.time(), "attempt": 1, "rebuild": rebuild,
                                          **({"chunking": chunking} if chunking is not None else {})})
    await client.publish(client.catalog.ingest_jobs.name, _key(document), job)


async def _wait_indexed(client: RagClient, store_id: str, file_ids: list[str], version: int, timeout_s: float,
                        progress: Progress) -> int:
    deadline = time.monotonic() + timeout_s
    shown = -1
    while True:
        await client.documents.caught_up()
        states = [client.documents.get(f"{store_id}/{f}") for f in file_ids]
        at_new = [s for s in states if s is not None and s.job.index_version == version]
        failed = [s for s in at_new if s.status == "failed"]
        if failed:
            raise RagError(f"{failed[0].file_id} failed at v{version}: {failed[0].last_error}; not swapped")
        done = [s for s in at_new if s.stage == "indexed"]  # a rebuild's job keeps the visible status
        if len(done) != shown:
            shown = len(done)
            progress(f"{store_id}: v{version} {len(done)}/{len(file_ids)} document(s) indexed")
        if len(done) == len([s for s in states if s is not None]):
            return sum(s.chunks or 0 for s in done)
        if time.monotonic() > deadline:
            raise TimeoutError(f"v{version} not built within {timeout_s:.0f} s; not swapped")
        await asyncio.sleep(0.5)


async def _check(client: RagClient, store_id: str, version: int, points: int, canary: str) -> None:
    counted = await client.command("count", store_id, version=version)
    assert isinstance(counted, IndexState)
    if counted.points != points:
        raise RagError(f"v{version} holds {counted.points} points, its documents have {points} chunks; not swapped")
    if points:
        found = await client.command("canary", store_id, version=version, query=canary)
        if not isinstance(found, SearchResults) or not found.passages:
            raise RagError(f"the canary query {canary!r} found nothing in v{version}; not swapped")


async def _catch_up_latecomers(client: RagClient, store_id: str, version: int, chunking: StaticChunking | None) -> None:
    await client.documents.caught_up()
    for document in client.documents_of(store_id):
        if document.job.index_version < version and document.status != "failed":
            # After the swap `version` answers queries: an ordinary job, whose status users follow.
            await _requeue(client, document, version, chunking, rebuild=False)
