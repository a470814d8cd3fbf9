"""``specstream docs add|status|search`` and ``specstream index rebuild``: documents in vector stores, from the bus.

No edge is involved: ``docs add`` stores the files in the blob store (``files.dir``) and publishes them as the
files API does, creates the store when no store has that name, attaches the files and shows a progress bar per
file until it is indexed (or failed, with its last_error). ``search`` and ``rebuild`` ask the rag service
(``specstream rag``) over the bus.
"""
from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path
from typing import Any

from streams.commands.common import describe, say
from streams.config import Settings

# How far a document is, for its progress bar.
_STAGE = {"queued": 10, "parsed": 50, "indexed": 100, "failed": 100, "cancelled": 100}


def add_commands(commands: Any) -> None:
    docs = commands.add_parser("docs", help="documents in vector stores: add, status, search")
    sub = docs.add_subparsers(dest="docs_command", required=True)
    add = sub.add_parser("add", help="upload files into a store (created if missing) and wait until indexed")
    add.add_argument("files", nargs="+", type=Path)
    add.add_argument("--store", required=True, help="the store's id or name")
    add.add_argument("--tenant", default="default", help="tenant that owns the files and the store")
    add.add_argument("--timeout", type=float, default=1800.0)
    add.set_defaults(handler=cmd_add)
    status = sub.add_parser("status", help="every store (or one) and its files' states")
    status.add_argument("--store", help="the store's id or name")
    status.set_defaults(handler=cmd_status)
    search = sub.add_parser("search", help="the best passages of a store for a query")
    search.add_argument("query")
    search.add_argument("--store", required=True, help="the store's id or name")
    search.add_argument("-n", "--max-results", type=int, default=4)
    search.add_argument("--hybrid", action=argparse.BooleanOptionalAction, default=None, help="fuse BM25 (default: rag.hybrid)")
    search.set_defaults(handler=cmd_search)

    index = commands.add_parser("index", help="the vector index: rebuild a store as a new version")
    isub = index.add_subparsers(dest="index_command", required=True)
    rebuild = isub.add_parser("rebuild", help="build the store's index again as v<N+1>, check it, swap it in")
    rebuild.add_argument("--store", required=True, help="the store's id or name")
    rebuild.add_argument("--max-chunk-tokens", type=int, help="new chunking: tokens per chunk (100-4096)")
    rebuild.add_argument("--overlap-tokens", type=int, help="new chunking: overlap (at most half the chunk)")
    rebuild.add_argument("--canary", help="query the new version must answer (default: a document's name)")
    rebuild.add_argument("--timeout", type=float, default=1800.0)
    rebuild.set_defaults(handler=cmd_rebuild)


def _run(what: str, coroutine: Any) -> int:
    from aiokafka.errors import KafkaError

    from streams.rag.client import RagError

    try:
        return asyncio.run(coroutine)
    except (KafkaError, OSError, RagError, TimeoutError, ValueError) as error:
        say(f"{what}: error: {describe(error)}")
        return 1


def cmd_add(args: argparse.Namespace, settings: Settings) -> int:
    return _run("docs add", _add(args, settings))


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    return _run("docs status", _status(args, settings))


def cmd_search(args: argparse.Namespace, settings: Settings) -> int:
    return _run("docs search", _search(args, settings))


def cmd_rebuild(args: argparse.Namespace, settings: Settings) -> int:
    return _run("index rebuild", _rebuild(args, settings))


async def _add(args: argparse.Namespace, settings: Settings) -> int:
    from rich.progress import Progress

    from streams.files.blobs import BlobStore
    from streams.files.store import FileStore
    from streams.rag.client import RagClient, RagError
    from streams.rag.jobs import attach, new_store

    missing = [str(p) for p in args.files if not p.is_file()]
    if missing:
        raise ValueError(f"no such file: {', '.join(missing)}")
    catalog = settings.catalog
    files = FileStore(settings.kafka, catalog, BlobStore(settings.files.dir), max_bytes=settings.files.max_bytes)
    await files.start()
    try:
        async with RagClient.session(settings.kafka, catalog) as client:
            try:
                record = client.store(args.store)
            except RagError:
                record = new_store(args.store, args.tenant)
                await client.publish(catalog.vector_stores.name, record.id, record)
                say(f"created vector store {record.id} ({args.store})")
            keys = {}
            for path in args.files:
                with path.open("rb") as source:
                    file = await files.create(tenant=record.tenant, filename=path.name, purpose="assistants",
                                              source=source)
                state, job = attach(record, file)
                await client.publish(catalog.documents.name, job.document_key, state)
                await client.publish(catalog.ingest_jobs.name, job.document_key, job)
                keys[job.document_key] = path.name
            with Progress() as bars:
                return await _follow(client, keys, bars, time.monotonic() + args.timeout)
    finally:
        await files.stop()


async def _follow(client: Any, keys: dict[str, str], bars: Any, deadline: float) -> int:
    tasks = {key: bars.add_task(name, total=100) for key, name in keys.items()}
    pending = set(keys)
    failed = 0
    while pending and time.monotonic() < deadline:
        await client.documents.caught_up()
        for key in list(pending):
            state = client.documents.get(key)
            if state is None:
                continue
            bars.update(tasks[key], completed=_STAGE[state.stage] if state.status != "completed" else 100)
            if state.status != "in_progress":
                pending.discard(key)
                if state.status == "failed":
                    failed += 1
                    bars.console.print(f"{keys[key]}: failed: {state.last_error.code}: {state.last_error.message}")
        await asyncio.sleep(0.3)
    if pending:
        say(f"still in progress: {', '.join(keys[k] for k in pending)}")
    return 1 if failed or pending else 0


async def _status(args: argparse.Namespace, settings: Settings) -> int:
    from streams.rag.client import RagClient

    async with RagClient.session(settings.kafka, settings.catalog) as client:
        stores = [client.store(args.store)] if args.store else client.stores.values()
        for record in stores:
            documents = client.documents_of(record.id)
            counts = {s: sum(1 for d in documents if d.status == s) for s in ("completed", "in_progress", "failed")}
            print(f"{record.id} {record.name!r} tenant={record.tenant} v{record.index_version}: "
                + ", ".join(f"{n} {s}" for s, n in counts.items()))
            for d in sorted(documents, key=lambda d: d.job.filename):
                error = f" ({d.last_error.code}: {d.last_error.message})" if d.last_error else ""
                print(f"  {d.file_id} {d.job.filename}: {d.status}, {d.chunks or 0} chunks{error}")
    return 0


async def _search(args: argparse.Namespace, settings: Settings) -> int:
    from streams.rag.client import RagClient

    async with RagClient.session(settings.kafka, settings.catalog) as client:
        record = client.store(args.store)
        # The operator searches as the store's tenant: the retriever answers a tenant only from its own stores.
        found = await client.search([record.id], tenant=record.tenant, query=args.query,
                                    max_num_results=args.max_results, hybrid=args.hybrid)
        for rank, passage in enumerate(found.passages, start=1):
            text = " ".join(passage.text.split())
            print(f"{rank}. {passage.score:.3f} {passage.filename} [{passage.char_start}:{passage.char_end}] "
                f"{text[:200]}")
    return 0


async def _rebuild(args: argparse.Namespace, settings: Settings) -> int:
    from schemas.documents import StaticChunking
    from streams.rag.client import RagClient
    from streams.rag.rebuild import rebuild

    chunking = None
    if args.max_chunk_tokens is not None or args.overlap_tokens is not None:
        chunking = StaticChunking(**{k: v for k, v in (("max_chunk_size_tokens", args.max_chunk_tokens),
                                                       ("chunk_overlap_tokens", args.overlap_tokens)) if v is not None})
    async with RagClient.session(settings.kafka, settings.catalog) as client:
        done = await rebuild(client, args.store, chunking=chunking, canary=args.canary, timeout_s=args.timeout,
                             progress=say)
    say(f"rebuilt {done.store_id}: v{done.old_version} -> v{done.new_version}, {done.documents} document(s), "
        f"{done.points} points in {done.seconds:.1f} s")
    return 0
