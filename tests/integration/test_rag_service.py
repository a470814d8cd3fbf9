"""The rag service on the real broker, with the real embedding model and a real (local, on-disk) Qdrant: parsed
chunks become points and a completed document; searches over the bus find them; redelivery adds nothing; a deleted
document leaves no points; an unknown store is a precise error."""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from schemas.documents import document_key
from schemas.events import ErrorEvent, ReplyRoute
from schemas.retrieval import FileSearch, IndexState, RetrievalRequest, SearchResults
from streams.kafka import clients
from streams.config import Settings
from streams.rag.service import RagService
from tests.kafka_fixtures import kafka_bootstrap  # noqa: F401
from tests.rag_support import (
    chunks_of,
    document_states,
    job,
    publish,
    queued,
    rag_settings,
    shared_embedder,
    store_record,
    wait_status,
)

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.kafka]

FACTS = [
    "The lighthouse on Vellmar Island was built in 1887 from granite quarried nearby.",
    "Our quarterly revenue grew by twelve percent, driven by subscriptions in Europe.",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
]


class Rig:
    def __init__(self, settings: Settings, service: RagService, producer: AIOKafkaProducer,
                 replies: AIOKafkaConsumer) -> None:
        self.settings, self.service, self.producer, self.replies = settings, service, producer, replies
        self.catalog = settings.catalog
        self.reply_topic = self.catalog.replies("rag-test").name

    async def add_store(self, store: str) -> None:
        await publish(self.producer, self.catalog.vector_stores.name, store, store_record(store))

    async def add_document(self, store: str, file_id: str, texts: list[str], *, parts: int = 1) -> list:
        ingest = job(store, file_id, f"{file_id}.md")
        await publish(self.producer, self.catalog.documents.name, ingest.document_key, queued(ingest))
        messages = chunks_of(ingest, texts, parts=parts)
        for message in messages:
            await publish(self.producer, self.catalog.document_chunks.name, ingest.document_key, message)
        return messages

    async def ask(self, op: str, stores: list[str], query: str = "", version: int | None = None):  # type: ignore[no-untyped-def]
        request_id = f"q-{uuid.uuid4().hex[:8]}"
        request = RetrievalRequest(request_id=request_id, reply_to=ReplyRoute(topic=self.reply_topic), op=op,
                                   search=FileSearch(vector_store_ids=stores, query=query, max_num_results=2),
                                   version=version)
        await publish(self.producer, self.catalog.retrieval.name, request_id, request)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for records in (await self.replies.getmany(timeout_ms=500)).values():
                for record in records:
                    event = clients.decode_reply(record.value)
                    if event.request_id == request_id:
                        return event
        raise AssertionError(f"no answer to {op}")


@pytest_asyncio.fixture(loop_scope="session")
async def rig(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Rig]:  # noqa: F811
    settings = rag_settings(kafka_bootstrap, tmp_path)
    await clients.ensure_topics(kafka_bootstrap, settings.catalog.shared_topics())
    service = RagService(settings, embedder=shared_embedder())
    await service.start()
    try:
        async with clients.reply_session(kafka_bootstrap, settings.catalog.replies("rag-test"),
                                          client_id="pytest-rag") as (replies, producer):
            yield Rig(settings, service, producer, replies)
    finally:
        await service.stop()
        await clients.delete_topics(kafka_bootstrap, [t.name for t in settings.catalog.shared_topics()])


async def test_chunks_become_a_completed_document_and_a_search_over_the_bus_finds_its_passage(rig: Rig) -> None:
    await rig.add_store("vs_alpha")
    await rig.add_document("vs_alpha", "file-facts", FACTS, parts=2)
    state = await wait_status(rig.settings.kafka, rig.catalog.documents.name, "vs_alpha", "file-facts", "completed")
    assert state.stage == "indexed" and state.chunks == len(FACTS)

    answer = await rig.ask("search", ["vs_alpha"], "When was the lighthouse built?")
    assert isinstance(answer, SearchResults)
    assert "1887" in answer.passages[0].text
    assert answer.passages[0].score > answer.passages[1].score
    assert answer.index_versions == {"vs_alpha": 1}


async def test_a_redelivered_part_changes_nothing(rig: Rig) -> None:
    await rig.add_store("vs_redo")
    messages = await rig.add_document("vs_redo", "file-redo", FACTS)
    await wait_status(rig.settings.kafka, rig.catalog.documents.name, "vs_redo", "file-redo", "completed")
    for message in messages:  # the parser redid the job
        await publish(rig.producer, rig.catalog.document_chunks.name, "vs_redo/file-redo", message)
    counted = await rig.ask("count", ["vs_redo"], version=1)
    assert isinstance(counted, IndexState) and counted.points == len(FACTS)


async def test_a_deleted_document_leaves_no_points(rig: Rig) -> None:
    await rig.add_store("vs_del")
    await rig.add_document("vs_del", "file-keep", FACTS[:1])
    await rig.add_document("vs_del", "file-gone", FACTS[1:])
    for file_id in ("file-keep", "file-gone"):
        await wait_status(rig.settings.kafka, rig.catalog.documents.name, "vs_del", file_id, "completed")
    await publish(rig.producer, rig.catalog.documents.name, document_key("vs_del", "file-gone"), None)
    deadline = time.monotonic() + 20
    while (counted := await rig.ask("count", ["vs_del"], version=1)).points != 1:
        assert time.monotonic() < deadline, f"points left: {counted.points}"
    answer = await rig.ask("search", ["vs_del"], "quarterly revenue")
    assert {p.file_id for p in answer.passages} == {"file-keep"}


async def test_a_search_of_an_unknown_store_is_an_error_naming_it(rig: Rig) -> None:
    answer = await rig.ask("search", ["vs_nosuch"], "anything")
    assert isinstance(answer, ErrorEvent)
    assert answer.code == "invalid_request" and "vs_nosuch" in answer.message


async def test_a_document_deleted_while_it_is_indexed_leaves_no_points(rig: Rig) -> None:
    await rig.add_store("vs_race")
    texts = [f"Note {i}: the harbour crane {i % 7} lifts ferry parts onto pier {i % 5}." for i in range(240)]
    await rig.add_document("vs_race", "file-race", texts, parts=8)
    # Delete as soon as the first part is indexed, while the others are being embedded (a fixed sleep let a fast
    # machine finish all 8 parts first, and a document completed before its deletion is rightly reported so).
    deadline = time.monotonic() + 60
    while (await rig.ask("count", ["vs_race"], version=1)).points == 0:
        assert time.monotonic() < deadline, "no part of the document was indexed"
        await asyncio.sleep(0.05)
    await publish(rig.producer, rig.catalog.documents.name, document_key("vs_race", "file-race"), None)
    indexer = rig.service.services[0]
    deadline = time.monotonic() + 120
    while True:
        counted = await rig.ask("count", ["vs_race"], version=1)
        settled = indexer.in_flight == 0 and await rig.service.documents.caught_up() is None
        if settled and counted.points == 0:
            await asyncio.sleep(3.0)  # parts still arriving are dropped too
            if indexer.in_flight == 0 and (await rig.ask("count", ["vs_race"], version=1)).points == 0:
                break
        assert time.monotonic() < deadline, f"{counted.points} points of a deleted document remain"
        await asyncio.sleep(0.5)
    states = await document_states(rig.settings.kafka, rig.catalog.documents.name, "vs_race/file-race")
    assert all(s.status != "completed" for s in states), "a deleted document was reported completed"
