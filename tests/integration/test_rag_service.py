"""The rag service on the real broker, with the real embedding model and a real (local, on-disk) Qdrant: parsed
chunks become points and a completed document; searches over the bus find them; redelivery adds nothing; a deleted
document leaves no points; an unknown store is a precise error. Users' searches and index administration travel on
topics of their own: another tenant's store is refused, and an op on the wrong topic is dead-lettered naming why."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from pydantic import BaseModel

from schemas.documents import document_key
from schemas.events import ChatMessage, DeadLetter, ErrorEvent, GenerateRequest, ReplyRoute
from schemas.retrieval import FileSearch, IndexCommand, IndexState, RetrievalRequest, SearchResults
from streams.kafka import clients
from streams.config import Settings
from streams.config.services import MetricsSettings, TelemetrySettings
from streams.rag.service import RagService
from streams.testing.stack import free_port
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
from tests.telemetry_support import by_consumer

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
        self.sent_offset = -1  # of the last message `answer` published

    async def add_store(self, store: str, *, tenant: str = "default") -> None:
        await publish(self.producer, self.catalog.vector_stores.name, store, store_record(store, tenant))

    async def add_document(self, store: str, file_id: str, texts: list[str], *, parts: int = 1,
                           tenant: str = "default") -> list:
        ingest = job(store, file_id, f"{file_id}.md", tenant=tenant)
        await publish(self.producer, self.catalog.documents.name, ingest.document_key, queued(ingest))
        messages = chunks_of(ingest, texts, parts=parts)
        for message in messages:
            await publish(self.producer, self.catalog.document_chunks.name, ingest.document_key, message)
        return messages

    async def search(self, stores: list[str], query: str, *, tenant: str = "default", op: str = "search",
                     generate: GenerateRequest | None = None) -> BaseModel:
        request = RetrievalRequest(request_id=f"q-{uuid.uuid4().hex[:8]}", reply_to=ReplyRoute(topic=self.reply_topic),
                                   op=op, tenant=tenant, generate=generate,
                                   search=FileSearch(vector_store_ids=stores, query=query, max_num_results=2))
        return await self.answer(self.catalog.retrieval.name, request.request_id, clients.encode(request))

    async def command(self, op: str, store: str, version: int, query: str = "") -> BaseModel:
        command = IndexCommand(request_id=f"c-{uuid.uuid4().hex[:8]}", reply_to=ReplyRoute(topic=self.reply_topic),
                               op=op, vector_store_id=store, version=version, query=query)
        return await self.answer(self.catalog.index_commands.name, command.request_id, clients.encode(command))

    async def answer(self, topic: str, request_id: str, value: bytes) -> BaseModel:
        """Publish `value` as it is and wait for the answer to `request_id` on the reply topic."""
        self.sent_offset = (await self.producer.send_and_wait(topic, value, key=request_id.encode())).offset
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for records in (await self.replies.getmany(timeout_ms=500)).values():
                for record in records:
                    event = clients.decode_reply(record.value)
                    if event.request_id == request_id:
                        return event
        raise AssertionError(f"no answer to {request_id} on {topic}")

    async def dead_letter_of(self, topic: str, offset: int) -> DeadLetter:
        """The dead letter of the message at `offset` of `topic`, once the rag service has kept it."""
        letters = clients.make_consumer(self.settings.kafka, auto_offset_reset="earliest", enable_auto_commit=False)
        await letters.start()
        try:
            letters.assign([TopicPartition(self.catalog.dead_letters.name, 0)])
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                for records in (await letters.getmany(timeout_ms=500)).values():
                    for record in records:
                        letter = clients.decode(record.value, DeadLetter)
                        if (letter.source_topic, letter.source_offset) == (topic, offset):
                            return letter
        finally:
            await letters.stop()
        raise AssertionError(f"no dead letter of {topic} offset {offset}")


@pytest_asyncio.fixture(loop_scope="session")
async def rig(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Rig]:  # noqa: F811
    settings = rag_settings(kafka_bootstrap, tmp_path)
    # A fixed port, as deployments configure it: the service's three consumers must share it.
    settings = settings.model_copy(update={"telemetry": TelemetrySettings(metrics=MetricsSettings(
        worker_port=free_port()))})
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

    answer = await rig.search(["vs_alpha"], "When was the lighthouse built?")
    assert isinstance(answer, SearchResults)
    assert "1887" in answer.passages[0].text
    assert answer.passages[0].score > answer.passages[1].score
    assert answer.index_versions == {"vs_alpha": 1}


async def test_its_three_consumers_are_counted_on_the_one_configured_metrics_port(rig: Rig) -> None:
    first, *others = rig.service.services
    port = rig.settings.telemetry.metrics.worker_port
    assert first.telemetry.metrics_url == f"http://127.0.0.1:{port}/metrics"
    assert [s.telemetry.metrics_url for s in others] == [None, None]  # announced once, by the first
    async with httpx.AsyncClient() as client:
        text = (await client.get(first.telemetry.metrics_url)).text
    assert set(by_consumer(text, "specstream:consumer_in_flight")) == {s.kind for s in rig.service.services}


async def test_a_redelivered_part_changes_nothing(rig: Rig) -> None:
    await rig.add_store("vs_redo")
    messages = await rig.add_document("vs_redo", "file-redo", FACTS)
    await wait_status(rig.settings.kafka, rig.catalog.documents.name, "vs_redo", "file-redo", "completed")
    for message in messages:  # the parser redid the job
        await publish(rig.producer, rig.catalog.document_chunks.name, "vs_redo/file-redo", message)
    counted = await rig.command("count", "vs_redo", version=1)
    assert isinstance(counted, IndexState) and counted.points == len(FACTS)


async def test_a_deleted_document_leaves_no_points(rig: Rig) -> None:
    await rig.add_store("vs_del")
    await rig.add_document("vs_del", "file-keep", FACTS[:1])
    await rig.add_document("vs_del", "file-gone", FACTS[1:])
    for file_id in ("file-keep", "file-gone"):
        await wait_status(rig.settings.kafka, rig.catalog.documents.name, "vs_del", file_id, "completed")
    await publish(rig.producer, rig.catalog.documents.name, document_key("vs_del", "file-gone"), None)
    deadline = time.monotonic() + 20
    while (counted := await rig.command("count", "vs_del", version=1)).points != 1:
        assert time.monotonic() < deadline, f"points left: {counted.points}"
    answer = await rig.search(["vs_del"], "quarterly revenue")
    assert {p.file_id for p in answer.passages} == {"file-keep"}


async def test_a_search_of_an_unknown_store_is_an_error_naming_it(rig: Rig) -> None:
    answer = await rig.search(["vs_nosuch"], "anything")
    assert isinstance(answer, ErrorEvent)
    assert answer.code == "invalid_request" and "vs_nosuch" in answer.message


async def test_a_document_deleted_while_it_is_indexed_leaves_no_points(rig: Rig) -> None:
    await rig.add_store("vs_race")
    texts = [f"Note {i}: the harbour crane {i % 7} lifts ferry parts onto pier {i % 5}." for i in range(240)]
    await rig.add_document("vs_race", "file-race", texts, parts=8)
    # Delete as soon as the first part is indexed, while the others are being embedded (a fixed sleep let a fast
    # machine finish all 8 parts first, and a document completed before its deletion is rightly reported so).
    deadline = time.monotonic() + 60
    while (await rig.command("count", "vs_race", version=1)).points == 0:
        assert time.monotonic() < deadline, "no part of the document was indexed"
        await asyncio.sleep(0.05)
    await publish(rig.producer, rig.catalog.documents.name, document_key("vs_race", "file-race"), None)
    indexer = rig.service.services[0]
    deadline = time.monotonic() + 120
    while True:
        counted = await rig.command("count", "vs_race", version=1)
        settled = indexer.in_flight == 0 and await rig.service.documents.caught_up() is None
        if settled and counted.points == 0:
            await asyncio.sleep(3.0)  # parts still arriving are dropped too
            if indexer.in_flight == 0 and (await rig.command("count", "vs_race", version=1)).points == 0:
                break
        assert time.monotonic() < deadline, f"{counted.points} points of a deleted document remain"
        await asyncio.sleep(0.5)
    states = await document_states(rig.settings.kafka, rig.catalog.documents.name, "vs_race/file-race")
    assert all(s.status != "completed" for s in states), "a deleted document was reported completed"


async def test_a_search_or_chat_of_another_tenants_store_sent_straight_to_the_retrieval_topic_is_refused(
        rig: Rig) -> None:
    await rig.add_store("vs_acme", tenant="acme")
    await rig.add_document("vs_acme", "file-acme", FACTS, tenant="acme")
    await wait_status(rig.settings.kafka, rig.catalog.documents.name, "vs_acme", "file-acme", "completed")
    owner = await rig.search(["vs_acme"], "When was the lighthouse built?", tenant="acme")
    assert isinstance(owner, SearchResults) and "1887" in owner.passages[0].text

    stranger = await rig.search(["vs_acme"], "When was the lighthouse built?", tenant="mallory")
    assert isinstance(stranger, ErrorEvent), stranger
    assert stranger.code == "invalid_request" and stranger.param == "vector_store_ids"
    assert stranger.message == "No vector store found with id 'vs_acme' for tenant 'mallory'."
    chat = GenerateRequest(request_id="unused", model="m", messages=[ChatMessage(role="user", content="lighthouse?")],
                           reply_to=ReplyRoute(topic=rig.reply_topic), tenant="mallory")
    grounded = await rig.search(["vs_acme"], "", tenant="mallory", op="chat", generate=chat)
    assert isinstance(grounded, ErrorEvent) and "for tenant 'mallory'" in grounded.message


async def test_index_administration_on_the_index_commands_topic_prepares_counts_and_swaps_a_version(rig: Rig) -> None:
    await rig.add_store("vs_admin", tenant="acme")  # commands are the operator's, whichever tenant owns the store
    prepared = await rig.command("prepare", "vs_admin", version=2)
    assert isinstance(prepared, IndexState) and 2 in prepared.versions and prepared.version != 2
    counted = await rig.command("count", "vs_admin", version=2)
    assert isinstance(counted, IndexState) and counted.points == 0
    swapped = await rig.command("swap", "vs_admin", version=2)
    assert isinstance(swapped, IndexState) and (swapped.version, swapped.versions) == (2, [2])
    unknown = await rig.command("count", "vs_nosuch", version=1)
    assert isinstance(unknown, ErrorEvent) and "vs_nosuch" in unknown.message


async def test_an_op_on_the_wrong_topic_or_of_an_unknown_version_is_dead_lettered_naming_why(rig: Rig) -> None:
    await rig.add_store("vs_wrong")
    route = {"topic": rig.reply_topic}
    search = {"type": "retrieval_request", "request_id": "wrong-1", "reply_to": route, "op": "search",
              "search": {"vector_store_ids": ["vs_wrong"], "query": "anything"}}
    answer = await rig.answer(rig.catalog.index_commands.name, "wrong-1", json.dumps(search).encode())
    assert isinstance(answer, ErrorEvent) and answer.code == "invalid_request"
    assert answer.message.startswith("op 'search' is a user's operation: publish a RetrievalRequest to the retrieval")
    letter = await rig.dead_letter_of(rig.catalog.index_commands.name, rig.sent_offset)
    assert letter.reason == f"invalid_request: {answer.message}"

    swap = {"type": "index_command", "request_id": "wrong-2", "reply_to": route, "op": "swap",
            "vector_store_id": "vs_wrong", "version": 1}
    answer = await rig.answer(rig.catalog.retrieval.name, "wrong-2", json.dumps(swap).encode())
    assert isinstance(answer, ErrorEvent)
    assert answer.message.startswith("op 'swap' is index administration: publish an IndexCommand to the index-commands")
    letter = await rig.dead_letter_of(rig.catalog.retrieval.name, rig.sent_offset)
    assert "index administration" in letter.reason

    future = {**swap, "request_id": "wrong-3", "op": "count", "schema_version": 2}
    answer = await rig.answer(rig.catalog.index_commands.name, "wrong-3", json.dumps(future).encode())
    assert isinstance(answer, ErrorEvent) and answer.code == "unsupported_schema_version"
    await rig.dead_letter_of(rig.catalog.index_commands.name, rig.sent_offset)
    # Both consumers keep serving.
    assert isinstance(await rig.command("count", "vs_wrong", version=1), IndexState)
    assert isinstance(await rig.search(["vs_wrong"], "anything"), SearchResults)
