"""Documents and retrieval on the bus, measured end to end in one run (issue 11).

    python -m bench.rag_bench                                   # the full run (docs/performance.md)
    python -m bench.rag_bench --docs 4 --pages 2 --questions 8 --no-generation   # a smoke run
    python -m bench.rag_bench --embedder-only                   # only the embedder row (bus vs plain loop)

What runs: `specstream parser` and `specstream rag` (and, unless --no-generation, an engine worker with the default
model), as subprocesses on a topic prefix of their own, on the broker at --bootstrap. The corpus is built here: PDFs
of --pages pages, each page holding filler prose and one fact of its own ("The access code of locker D3P2 is
amber-falcon-17."; a label BM25 keeps, as it drops one-character tokens), so every question has exactly one page
that answers it.

Measured:
* ingestion: the PDFs uploaded and attached (as `specstream docs add` does), until every document is `completed`:
  pages/s and chunks/s end to end (blob store, parser, indexer);
* embedder: the same chunks (cut locally with the parser's chunker) published straight to the indexer, until
  completed: vectors/s through the bus (Kafka, embedding, Qdrant upsert), against a plain transformers loop
  (streams.rag.embedding, same batch size and threads) over the same texts in this process; target >= 0.9x;
* search latency over the bus (retrieval request -> answer), p50/p99 at 1 and 8 concurrent;
* recall@4: the answering page's chunk among the 4 best, vector only and fused with BM25;
* generation (unless --no-generation): the questions answered grounded (through the retriever) and without
  retrieval: prompt-lookup acceptance and tokens/s of each.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schemas.documents import StaticChunking
from schemas.events import (
    ChatMessage,
    Completion,
    GenerateRequest,
    ReplyRoute,
    SamplingParams,
)
from schemas.retrieval import FileSearch, RetrievalRequest
from streams.kafka import clients
from streams.config import Settings
from streams.rag.client import RagClient
from streams.rag.jobs import attach, new_store
from streams.testing.stack import _stop, spawn_process, stack_env

if TYPE_CHECKING:
    from streams.rag.embedding import Embedder

WORDS = ["amber", "falcon", "river", "granite", "lantern", "meadow", "copper", "orchid", "harbor", "willow", "cobalt",
         "ember", "thistle", "quartz", "maple", "saffron", "tundra", "velvet", "beacon", "cinder"]
TOPICS = ("shipping schedules", "bakery recipes", "garden care", "train timetables", "museum exhibits",
          "tax forms", "bicycle repair", "weather records")
CHUNKING = StaticChunking(max_chunk_size_tokens=200, chunk_overlap_tokens=40)


@dataclass(frozen=True)
class Question:
    text: str
    answer: str  # the code; the passage holding it answers the question


def corpus(docs: int, pages: int, seed: int = 7) -> tuple[list[tuple[str, bytes]], list[Question]]:
    from tests.document_files import pdf

    rng = random.Random(seed)
    files, questions = [], []
    for d in range(docs):
        texts = []
        for p in range(pages):
            code = f"{rng.choice(WORDS)}-{rng.choice(WORDS)}-{rng.randrange(100)}"
            topic = rng.choice(TOPICS)
            filler = " ".join(f"Notes on {topic} mention the {rng.choice(WORDS)} {rng.choice(WORDS)} section."
                              for _ in range(6))
            texts.append(f"{filler} The access code of locker D{d}P{p} is {code}. {filler}")
            questions.append(Question(f"What is the access code of locker D{d}P{p}?", code))
        files.append((f"lockers-{d}.pdf", pdf(texts)))
    return files, questions


async def wait_completed(client: RagClient, store_id: str, count: int, timeout_s: float = 3600) -> int:
    """Chunks of the store's documents once all `count` are completed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await client.documents.caught_up()
        states = client.documents_of(store_id)
        failed = [s for s in states if s.status == "failed"]
        if failed:
            raise RuntimeError(f"{failed[0].job.filename} failed: {failed[0].last_error}")
        if len(states) == count and all(s.status == "completed" for s in states):
            return sum(s.chunks or 0 for s in states)
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{store_id}: not indexed within {timeout_s:.0f} s")


async def ingest(client: RagClient, settings: Settings, files: list[tuple[str, bytes]], pages: int) -> dict[str, Any]:
    from streams.files.blobs import BlobStore
    from streams.files.store import FileStore

    store = new_store("bench-ingest", "bench", chunking=CHUNKING)
    await client.publish(client.catalog.vector_stores.name, store.id, store)
    blobs = FileStore(settings.kafka, client.catalog, BlobStore(settings.files.dir), max_bytes=1 << 30)
    await blobs.start()
    started = time.monotonic()
    try:
        for name, data in files:
            file = await blobs.create(tenant="bench", filename=name, purpose="assistants", source=[data])
            state, job = attach(store, file)
            await client.publish(client.catalog.documents.name, job.document_key, state)
            await client.publish(client.catalog.ingest_jobs.name, job.document_key, job)
        chunks = await wait_completed(client, store.id, len(files))
    finally:
        await blobs.stop()
    seconds = time.monotonic() - started
    return {"store": store.id, "documents": len(files), "pages": len(files) * pages, "chunks": chunks,
            "seconds": seconds, "pages_per_s": len(files) * pages / seconds, "chunks_per_s": chunks / seconds}


def local_chunks(files: list[tuple[str, bytes]]) -> list[list[Any]]:
    from streams.rag.parsing.chunking import Chunker
    from streams.rag.parsing.extract import extract

    chunker = Chunker.load()
    return [chunker.chunks(extract(data, name), CHUNKING) for name, data in files]


@dataclass(frozen=True)
class Rate:
    vectors_per_s: float
    cpu_s: float  # CPU seconds the embedding process spent meanwhile (its share of a loaded machine aside)


async def embed_through_bus(client: RagClient, files: list[tuple[str, bytes]], chunks: list[list[Any]],
                            rag_pid: int) -> Rate:
    from schemas.documents import FileObject
    from streams.rag.parser import chunk_parts

    store = new_store("bench-embed", "bench", chunking=CHUNKING)
    await client.publish(client.catalog.vector_stores.name, store.id, store)
    parts = []
    for i, ((name, _), doc_chunks) in enumerate(zip(files, chunks)):
        file = FileObject(id=f"file-bench{i}", bytes=1, created_at=0, filename=name, purpose="assistants",
                          tenant="bench", blob_key="none", sha256="0" * 64)
        state, job = attach(store, file)
        await client.publish(client.catalog.documents.name, job.document_key, state)
        parts += [(job.document_key, p) for p in chunk_parts(job, doc_chunks)]
    await client.documents.caught_up()
    cpu = _cpu_s(rag_pid)
    started = time.monotonic()
    for key, part in parts:
        await client.publish(client.catalog.document_chunks.name, key, part)
    total = await wait_completed(client, store.id, len(files))
    return Rate(total / (time.monotonic() - started), _cpu_s(rag_pid) - cpu)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc: psutil is not one of our dependencies)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime: fields 14, 15


def plain_loop(embedder: Embedder, texts: list[str]) -> Rate:
    cpu, started = time.process_time(), time.monotonic()  # this process does nothing else meanwhile
    embedder.embed(texts)
    return Rate(len(texts) / (time.monotonic() - started), time.process_time() - cpu)


async def embedder_row(client: RagClient, files: list[tuple[str, bytes]], args: argparse.Namespace,
                       rag_pid: int) -> dict[str, Any]:
    """The same chunks in a plain loop, through the bus, and in the plain loop again (one run, side by side; the
    loop's two runs bracket the bus's, so a machine whose load drifts weighs on both sides alike). Besides the
    wall-clock ratio, the CPU ratio: the loop's CPU seconds over the rag process's during the bus run, which a
    busy machine does not skew (what the bus costs beyond the forward passes, in work rather than in time)."""
    from streams.rag.embedding import Embedder, EmbedderOptions

    chunks = local_chunks(files)
    texts = [c.text for doc in chunks for c in doc]
    embedder = Embedder(EmbedderOptions(batch_size=args.batch_size, threads=args.threads))
    embedder.embed(texts[:args.batch_size])  # warm-up, as the service's first batch is not counted either
    print(f"embedding {len(texts)} chunks in a plain loop, through the bus, then in the loop again ...", flush=True)
    before = plain_loop(embedder, texts)
    bus = await embed_through_bus(client, files, chunks, rag_pid)
    after = plain_loop(embedder, texts)
    plain = (before.vectors_per_s + after.vectors_per_s) / 2
    plain_cpu = (before.cpu_s + after.cpu_s) / 2
    return {"vectors": len(texts), "bus_vectors_per_s": bus.vectors_per_s, "plain_vectors_per_s": plain,
            "plain_before_vectors_per_s": before.vectors_per_s, "plain_after_vectors_per_s": after.vectors_per_s,
            "ratio": bus.vectors_per_s / plain, "bus_cpu_s": bus.cpu_s, "plain_cpu_s": plain_cpu,
            "cpu_ratio": plain_cpu / bus.cpu_s}


async def concurrently(n: int, jobs: list[Callable[[], Awaitable[float]]]) -> list[float]:
    gate = asyncio.Semaphore(n)

    async def one(job: Callable[[], Awaitable[float]]) -> float:
        async with gate:
            return await job()
    return await asyncio.gather(*(one(j) for j in jobs))


async def latency(client: RagClient, store_id: str, questions: list[Question], concurrency: int) -> dict[str, float]:
    async def ask(question: Question) -> float:
        started = time.monotonic()
        await client.search([store_id], tenant="bench", query=question.text, max_num_results=4)
        return (time.monotonic() - started) * 1000

    times = sorted(await concurrently(concurrency, [lambda q=q: ask(q) for q in questions * 2]))
    return {"p50_ms": statistics.median(times), "p99_ms": times[min(len(times) - 1, int(len(times) * 0.99))]}


async def recall(client: RagClient, store_id: str, questions: list[Question], hybrid: bool) -> float:
    hits = 0
    for question in questions:
        found = await client.search([store_id], tenant="bench", query=question.text, max_num_results=4, hybrid=hybrid)
        hits += any(question.answer in p.text for p in found.passages)
    return hits / len(questions)


async def generate(client: RagClient, settings: Settings, store_id: str, questions: list[Question],
                   grounded: bool, max_tokens: int) -> dict[str, float]:
    """Each question answered one at a time (greedy); the engine's speculation stats and tokens/s."""
    completions: list[Completion] = []
    for question in questions:
        request = GenerateRequest(request_id=f"bench-{uuid.uuid4().hex}", model=settings.engine.model,
                                  messages=[ChatMessage(role="user", content=question.text)],
                                  sampling=SamplingParams(max_tokens=max_tokens, temperature=0.0),
                                  reply_to=ReplyRoute(topic=client.reply_topic), tenant="bench",
                                  created_at=time.time())
        wrapped = RetrievalRequest(request_id=request.request_id, reply_to=request.reply_to, tenant="bench",
                                   op="chat", generate=request,
                                   search=FileSearch(vector_store_ids=[store_id], max_num_results=2))
        topic = client.catalog.retrieval.name if grounded else client.catalog.requests.name
        completions.append(await client.await_final(topic, request.request_id, wrapped if grounded else request))
    drafted = sum(c.spec.drafted for c in completions)
    tokens = sum(c.usage.completion_tokens for c in completions)
    decode_s = sum(max(1e-6, c.timings.total_s - c.timings.ttft_s) for c in completions)
    return {"acceptance": sum(c.spec.accepted for c in completions) / drafted if drafted else 0.0,
            "tokens_per_s": tokens / decode_s, "completion_tokens": tokens}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bootstrap", default="127.0.0.1:9092")
    parser.add_argument("--docs", type=int, default=40, help="PDF documents")
    parser.add_argument("--pages", type=int, default=5, help="pages per document (one fact each)")
    parser.add_argument("--questions", type=int, default=100, help="questions asked (recall, latency)")
    parser.add_argument("--generate-questions", type=int, default=20, help="questions answered by the model")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--batch-size", type=int, default=32, help="embedding batch (service and plain loop)")
    parser.add_argument("--threads", type=int, default=0, help="embedding threads (0: the service's default)")
    parser.add_argument("--no-generation", action="store_true", help="skip the model (no engine worker)")
    parser.add_argument("--embedder-only", action="store_true",
                        help="only the embedder row: no ingestion, search or generation (no engine worker)")
    parser.add_argument("--out", type=Path, help="also write the results as JSON")
    return parser.parse_args(argv)


def start_services(args: argparse.Namespace, prefix: str, root: Path) -> list[Any]:
    from tests.rag_stack import ready_kinds, wait_rag_ready

    env = stack_env(args.bootstrap, prefix, "unused", 1, {
        "SPECSTREAM_FILES__DIR": str(root / "files"), "SPECSTREAM_RAG__STATE_DIR": str(root / "rag"),
        "SPECSTREAM_RAG__EMBED_BATCH_SIZE": str(args.batch_size), "SPECSTREAM_RAG__EMBED_THREADS": str(args.threads),
        "SPECSTREAM_RAG__MAX_PROMPT_CHARS": "1500"})
    processes = [spawn_process("parser", ["parser"], env, root), spawn_process("rag", ["rag"], env, root)]
    generation = not (args.no_generation or args.embedder_only)
    if generation:
        processes.append(spawn_process("worker", ["worker"], env, root))
    wait_rag_ready(processes[1], args.bootstrap, prefix, timeout_s=600)
    if generation:  # the first start converts the model
        deadline = time.monotonic() + 900
        while "engine-worker" not in asyncio.run(ready_kinds(args.bootstrap, prefix, processes[2].popen.pid)):
            if time.monotonic() > deadline or processes[2].popen.poll() is not None:
                raise RuntimeError(f"the engine worker is not ready\n{processes[2].tail()}")
            time.sleep(1.0)
    return processes


async def run(args: argparse.Namespace, prefix: str, root: Path, rag_pid: int) -> dict[str, Any]:
    settings = Settings(kafka={"bootstrap_servers": args.bootstrap, "topic_prefix": prefix},
                        files={"dir": str(root / "files")})
    files, questions = corpus(args.docs, args.pages)
    questions = random.Random(11).sample(questions, min(args.questions, len(questions)))
    results: dict[str, Any] = {}
    async with RagClient.session(settings.kafka, settings.catalog) as client:
        if args.embedder_only:
            results["embedder"] = await embedder_row(client, files, args, rag_pid)
            return results
        print(f"ingesting {len(files)} PDFs of {args.pages} pages ...", flush=True)
        results["ingestion"] = ingestion = await ingest(client, settings, files, args.pages)
        results["embedder"] = await embedder_row(client, files, args, rag_pid)
        store = ingestion["store"]
        print("search latency and recall ...", flush=True)
        results["latency"] = {str(n): await latency(client, store, questions, n) for n in (1, 8)}
        results["recall_at_4"] = {"vector": await recall(client, store, questions, hybrid=False),
                                  "hybrid_bm25": await recall(client, store, questions, hybrid=True)}
        if not args.no_generation:
            asked = questions[:args.generate_questions]
            print(f"answering {len(asked)} questions grounded and plain ...", flush=True)
            results["generation"] = {
                "grounded": await generate(client, settings, store, asked, True, args.max_tokens),
                "no_retrieval": await generate(client, settings, store, asked, False, args.max_tokens)}
    return results


def report(results: dict[str, Any]) -> str:
    e = results["embedder"]
    embedder = (f"| embedder through the bus / plain loop | {e['bus_vectors_per_s']:.1f} / "
                f"{e['plain_vectors_per_s']:.1f} vectors/s = **{e['ratio']:.2f}x** ({e['vectors']} chunks; loop "
                f"{e['plain_before_vectors_per_s']:.1f} before, {e['plain_after_vectors_per_s']:.1f} after); CPU "
                f"{e['plain_cpu_s']:.1f} s in the loop / {e['bus_cpu_s']:.1f} s in the rag process = "
                f"**{e['cpu_ratio']:.2f}x** |")
    if "ingestion" not in results:  # --embedder-only
        return f"| measure | value |\n|---|---|\n{embedder}"
    i, r = results["ingestion"], results["recall_at_4"]
    lines = [
        "| measure | value |", "|---|---|",
        (f"| ingestion, end to end | {i['pages_per_s']:.2f} pages/s, {i['chunks_per_s']:.2f} chunks/s "
         f"({i['documents']} PDFs, {i['pages']} pages, {i['chunks']} chunks in {i['seconds']:.1f} s) |"),
        embedder,
        *[f"| search latency, {n} concurrent | p50 {v['p50_ms']:.0f} ms, p99 {v['p99_ms']:.0f} ms |"
          for n, v in results["latency"].items()],
        f"| recall@4 | vector {r['vector']:.2f}, fused with BM25 {r['hybrid_bm25']:.2f} |",
    ]
    for name, g in results.get("generation", {}).items():
        lines.append(f"| answers, {name.replace('_', ' ')} | acceptance {g['acceptance']:.2f}, "
                     f"{g['tokens_per_s']:.1f} tokens/s |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prefix = f"bench-rag-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory(prefix="rag-bench-") as folder:
        root = Path(folder)
        asyncio.run(clients.ensure_topics(args.bootstrap, Settings(
            kafka={"bootstrap_servers": args.bootstrap, "topic_prefix": prefix}).catalog.shared_topics()))
        processes = start_services(args, prefix, root)
        try:
            results = asyncio.run(run(args, prefix, root, processes[1].popen.pid))
        finally:
            for process in reversed(processes):
                _stop(process, 30.0)
    print(report(results))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
