"""Documents uploaded into a vector store during the chaos run, each then checked: indexed once, with the chunk
count the parser's chunker gives, and found by a search."""
from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from dataclasses import dataclass
from typing import Any

import httpx

from bench.chaos.edge_calls import (
    Json,
    as_json,
    count,
    create,
    finder,
    kafka_settings,
    request,
    sleep_until,
    why,
)
from bench.chaos.ledger import FlowContext, Tally, say

STATIC = {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 20}
_WORDS = [s.split("|") for s in (
    "before dawn|during the spring fair|in the third week of October|after the long storm|as the snow began",
    "the harbour pilot|a retired geologist|the night baker|the lighthouse keeper|an orchard manager|a beekeeper",
    "repaired|catalogued|painted|measured|photographed|weighed|restored|counted|sketched",
    "a copper telescope|the brass weather vane|seventeen clay jars|the tide tables|an old canvas sail|a broken loom",
    "near the northern quay|beside the salt marsh|under the railway viaduct|inside the abandoned mill|on the headland",
    "vel|mor|ka|thin|dra|lo|quen|sar|bru|ix|tal|ven")]


def _document(rng: random.Random, marker: str) -> tuple[str, str]:
    """1.5-3 KB of sentences about a made-up town, the first carrying the marker: (text, first sentence). Search is
    by that sentence: rag.hybrid is off by default (streams/config/rag.py:31), embeddings do not rank a marker word."""
    when, who, did, what, where, syllables = _WORDS
    town = "".join(rng.choice(syllables) for _ in range(3)).capitalize()

    def sentence() -> str:
        return (f"{rng.choice(when).capitalize()}, {rng.choice(who)} of {town} {rng.choice(did)} {rng.choice(what)} "
                f"{rng.choice(where)}, entry {rng.randint(100, 9999)}.")

    paragraphs, size = [f"Record {marker} from {town}: {sentence()}"], rng.randint(1500, 2400)
    while sum(map(len, paragraphs)) < size:
        paragraphs.append(" ".join(sentence() for _ in range(rng.randint(3, 6))))
    return "\n\n".join(paragraphs), paragraphs[0]


@dataclass
class _Doc:
    file_id: str
    marker: str  # also its `chaos_marker` attribute: a search filtered by it lists its chunks alone
    filename: str
    data: bytes
    query: str


class DocumentFlow:
    """One vector store (static 100/20 chunking) fed a generated text file every ``interval_s``."""

    def __init__(self, interval_s: float = 20.0, seed: int = 0) -> None:
        self.interval_s, self.seed = interval_s, seed
        self.tally = Tally("documents")
        self.store_id: str | None = None
        self.docs: list[_Doc] = []

    async def run(self, ctx: FlowContext, stop_at: float) -> None:
        async with httpx.AsyncClient(timeout=60) as client:
            name = f"chaos-docs-{uuid.uuid4().hex[:8]}"
            status, body, _ = await create(client, ctx, "/v1/vector_stores", deadline=stop_at,
                                           find=finder(client, ctx, "/v1/vector_stores?limit=100", "name", name),
                                           json={"name": name, "chunking_strategy": {"type": "static",
                                                                                      "static": STATIC}})
            if status // 100 != 2:
                return self.tally.note(f"no vector store: {why(status, body)}")
            self.store_id, i = body["id"], 0
            while time.monotonic() < stop_at:
                due = time.monotonic() + self.interval_s
                await self._add(client, ctx, i, stop_at)
                i += 1
                await sleep_until(min(due, stop_at))

    async def _add(self, client: httpx.AsyncClient, ctx: FlowContext, i: int, stop_at: float) -> None:
        rng = random.Random(f"{self.seed}-{i}")
        marker = f"zq{rng.getrandbits(40):010x}"
        text, query = _document(rng, marker)
        filename, data = f"notes-{marker}.txt", text.encode()
        status, body, uploaded = await create(
            client, ctx, "/v1/files", deadline=stop_at, n=i, data={"purpose": "assistants"},
            find=finder(client, ctx, "/v1/files?purpose=assistants", "filename", filename),
            files={"file": (filename, data, "text/plain")})
        if status // 100 != 2:
            return self._refused(f"upload {filename}", status, body)
        path = f"/v1/vector_stores/{self.store_id}/files"
        status, body, added = await create(client, ctx, path, deadline=stop_at + 30, n=i,
                                           find=finder(client, ctx, f"{path}/{body['id']}"),
                                           json={"file_id": body["id"], "attributes": {"chaos_marker": marker}})
        if status // 100 != 2:  # status 0: unknown whether it was added (its points would then be unaccounted for)
            return self._refused(f"add {filename}", status, body)
        self.tally.accepted += 1
        self.docs.append(_Doc(body["id"], marker, filename, data, query))
        if uploaded or added:
            say(f"documents: {filename} {'uploaded' if uploaded else 'added'} by an unanswered call (not resent)")

    def _refused(self, what: str, status: int, body: Json) -> None:
        """An explicit 4xx/5xx is an accepted call answered with an error; no answer at all is only noted."""
        if status:
            self.tally.accepted += 1
            count(self.tally, "errors", f"{what}: {why(status, body)}")
        else:
            self.tally.note(f"{what}: {why(status, body)}")

    async def settle(self, ctx: FlowContext, timeout_s: float) -> Tally:
        deadline = time.monotonic() + timeout_s
        if self.store_id is None:
            return self.tally
        async with httpx.AsyncClient(timeout=60) as client:
            ended: dict[str, Json] = {}  # file id -> its vector store file, once not in_progress
            while len(ended) < len(self.docs) and time.monotonic() < deadline:
                for doc in (d for d in self.docs if d.file_id not in ended):
                    with contextlib.suppress(httpx.TransportError):
                        response = await request(client, ctx, "GET", f"/v1/vector_stores/{self.store_id}/files/"
                                                 f"{doc.file_id}", deadline=deadline)
                        if response.status_code == 200 and as_json(response).get("status") != "in_progress":
                            ended[doc.file_id] = as_json(response)
                await asyncio.sleep(0 if len(ended) == len(self.docs) else 2.0)
            done = [d for d in self.docs if ended.get(d.file_id, {}).get("status") == "completed"]
            problems = await _verify(client, ctx, self.store_id, done, len(ended) == len(self.docs), self.tally,
                                     deadline) if done else {}
        for doc in self.docs:
            file = ended.get(doc.file_id)
            if file is None:
                count(self.tally, "lost", f"{doc.file_id}: still in_progress (or unreadable) at the timeout")
            elif file.get("status") == "failed":
                count(self.tally, "errors", f"{doc.file_id} failed: {file.get('last_error')}")
            elif file.get("status") != "completed":
                count(self.tally, "wrong", f"{doc.file_id}: status {file.get('status')!r}")
            else:
                count(self.tally, "wrong" if problems[doc.file_id] else "complete",
                       f"{doc.file_id}: {'; '.join(problems[doc.file_id])}" if problems[doc.file_id] else None)
        return self.tally


async def _verify(client: httpx.AsyncClient, ctx: FlowContext, store_id: str, docs: list[_Doc], all_ended: bool,
                  tally: Tally, deadline: float) -> dict[str, list[str]]:
    """Each completed file's problems: its chunk count on the bus against the parser's own chunker on its text, its
    chunks in the index (a search filtered to it: each once), an unfiltered search finding it by its first sentence;
    and the index's point count against the files' chunks (store-wide)."""
    from schemas.documents import StaticChunking
    from streams.rag.parsing.chunking import Chunker
    from streams.rag.parsing.extract import extract

    chunker = await asyncio.to_thread(Chunker.load)
    expected = {d.file_id: len(chunker.chunks(extract(d.data, d.filename), StaticChunking(**STATIC))) for d in docs}
    problems: dict[str, list[str]] = {d.file_id: [] for d in docs}
    states, points = None, None
    try:
        states, points = await _bus_view(ctx, store_id, deadline)
    except Exception as error:  # noqa: BLE001 - said in a note: those checks are then not made
        tally.note(f"chunk counts on the bus and index points NOT verified: {type(error).__name__}: {error}")
    for d in docs:
        want, state = expected[d.file_id], (states or {}).get(d.file_id)
        if states is not None and (state is None or state.status != "completed" or state.chunks != want):
            problems[d.file_id].append(f"bus: {state and (state.status, state.chunks)} (chunker: {want} chunks)")
        held = await _search(client, ctx, store_id, d.query, 50, deadline,
                             {"type": "eq", "key": "chaos_marker", "value": d.marker})
        texts = [(r.get("content") or [{}])[0].get("text") for r in held or []]
        if held is None or len(texts) != want or len(set(texts)) != want:
            problems[d.file_id].append("filtered search failed" if held is None else
                                       f"index: {len(texts)} chunks ({len(set(texts))} distinct), want {want}")
        top = await _search(client, ctx, store_id, d.query, 3, deadline)
        if top is None or d.file_id not in {r.get("file_id") for r in top}:
            problems[d.file_id].append("search failed" if top is None else "not in the top 3 for its first sentence")
    if points is not None and points != sum(expected.values()):
        if all_ended and not any(problems.values()):  # no file explains it (files never ended may hold points too)
            tally.wrong += 1
        tally.note(f"index holds {points} points, the completed files {sum(expected.values())} chunks"
                   + ("" if all_ended else " (not comparable: some files never ended)"))
    return problems


async def _bus_view(ctx: FlowContext, store_id: str, deadline: float) -> tuple[dict[str, Any], int]:
    """The store's DocumentStates on the compacted documents topic, and its current index version's points."""
    from schemas.topics import TopicCatalog
    from streams.rag.client import RagClient, RagError

    catalog = TopicCatalog(ctx.topic_prefix)
    async with RagClient.session(kafka_settings(ctx), catalog, client_id="chaos-documents") as rag:
        await rag.documents.caught_up()
        await rag.stores.caught_up()
        states = {d.file_id: d for d in rag.documents_of(store_id)}
        version = rag.store(store_id).index_version
        while True:
            try:
                return states, (await rag.command("count", store_id, version=version, timeout_s=30)).points
            except RagError:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(2.0)


async def _search(client: httpx.AsyncClient, ctx: FlowContext, store_id: str, query: str, n: int, deadline: float,
                  filters: Json | None = None) -> list[Json] | None:
    body = {"query": query, "max_num_results": n, **({"filters": filters} if filters else {})}
    try:  # a search changes nothing: retried like a read
        response = await request(client, ctx, "POST", f"/v1/vector_stores/{store_id}/search",
                                 deadline=max(deadline, time.monotonic() + 30), json=body)
    except httpx.TransportError:
        return None
    return as_json(response).get("data") if response.status_code == 200 else None


