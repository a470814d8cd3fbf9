"""The vector store API through the official `openai` client, on the real broker with the real rag service
(`specstream rag`: the embedding model and a local Qdrant): stores, files and their statuses, batches, search with
attribute filters, deletion, and OpenAI's 404 for unknown ids. The files and the parser's chunks are published as
their contract says (docs/retrieval.md), so this tests the API and the rag service, not the parser."""
from __future__ import annotations

import asyncio
import hashlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai import OpenAI

from schemas.documents import FileObject, IngestJob
from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.edge.keys import create_key
from streams.edge.server import serve_in_thread
from tests.edge_support import edge_options
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)
from tests.rag_stack import running_rag
from tests.rag_support import chunks_of, read_topic

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

TENANT = "rag-api-tests"
DOCS = {
    "lighthouse.md": ["The Vellmar lighthouse was built in 1887 from local granite.",
                      "Its lamp was electrified in 1931 and automated in 1978."],
    "bakery.md": ["The bakery opens at six and sells rye bread until noon.",
                  "Its croissants use butter from the valley's dairy."],
}


class Bus:
    """Publishes what the files API and the parser would, on the test's prefix."""

    def __init__(self, bootstrap: str, prefix: str, keys_file: Path | None = None, key: str = "") -> None:
        self.bootstrap, self.catalog = bootstrap, TopicCatalog(prefix=prefix)
        self.keys_file, self.key = keys_file, key  # for a second edge on the same bus

    async def _send(self, topic: str, key: str, value: bytes) -> None:
        producer = clients.make_producer(self.bootstrap, client_id="pytest-rag-bus")
        await producer.start()
        try:
            await producer.send_and_wait(topic, value, key=key.encode())
        finally:
            await producer.stop()

    def upload(self, filename: str) -> str:
        file_id = f"file-{uuid.uuid4().hex[:12]}"
        record = FileObject(id=file_id, bytes=100, created_at=int(time.time()), filename=filename,
                            purpose="assistants", tenant=TENANT, blob_key=f"b/{file_id}",
                            sha256=hashlib.sha256(file_id.encode()).hexdigest())
        asyncio.run(self._send(self.catalog.files.name, file_id, clients.encode(record)))
        return file_id

    def parse(self, store_id: str, file_id: str, texts: list[str]) -> None:
        """The parser's answer to the store's ingest job for the file: its chunks."""
        jobs = asyncio.run(read_topic(self.bootstrap, self.catalog.ingest_jobs, IngestJob))
        job = next(j for j in jobs if j.vector_store_id == store_id and j.file_id == file_id)
        for message in chunks_of(job, texts):
            asyncio.run(self._send(self.catalog.document_chunks.name, job.document_key, clients.encode(message)))


@pytest.fixture(scope="module")
def rig(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[OpenAI, Bus]]:  # noqa: F811
    prefix = f"t-vs-{uuid.uuid4().hex[:8]}"
    root = tmp_path_factory.mktemp("rag")
    keys_file: Path = root / "keys.json"
    key, _ = create_key(keys_file, TENANT)
    asyncio.run(clients.ensure_topics(kafka_bootstrap, TopicCatalog(prefix=prefix).shared_topics()))
    with running_rag(kafka_bootstrap, prefix, root / "state", root):
        options = edge_options(kafka_bootstrap, prefix, f"vs-{uuid.uuid4().hex[:6]}", keys_file)
        with serve_in_thread(options) as edge:
            yield OpenAI(base_url=edge.base_url + "/v1", api_key=key, max_retries=0, timeout=120), \
                Bus(kafka_bootstrap, prefix, keys_file, key)


def wait_file(client: OpenAI, store_id: str, file_id: str, timeout_s: float = 90.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = client.vector_stores.files.retrieve(file_id, vector_store_id=store_id).status
        if status != "in_progress":
            return status
        time.sleep(0.5)
    raise AssertionError(f"{file_id} still in_progress after {timeout_s:.0f} s")


def test_a_store_s_files_go_completed_and_search_finds_the_passage_holding_the_fact(rig: tuple[OpenAI, Bus]) -> None:
    client, bus = rig
    files = {name: bus.upload(name) for name in DOCS}
    store = client.vector_stores.create(name="facts", chunking_strategy={
        "type": "static", "static": {"max_chunk_size_tokens": 200, "chunk_overlap_tokens": 50}})
    assert store.object == "vector_store" and store.name == "facts"
    client.vector_stores.files.create(vector_store_id=store.id, file_id=files["lighthouse.md"],
                                      attributes={"topic": "history", "year": 1887})
    batch = client.vector_stores.file_batches.create(vector_store_id=store.id, file_ids=[files["bakery.md"]],
                                                     attributes={"topic": "food", "year": 2020})
    assert batch.object == "vector_store.files_batch" and batch.file_counts.total == 1
    assert [f.status for f in client.vector_stores.files.list(vector_store_id=store.id)] == ["in_progress"] * 2
    for name, file_id in files.items():
        bus.parse(store.id, file_id, DOCS[name])
        assert wait_file(client, store.id, file_id) == "completed"
    assert client.vector_stores.file_batches.retrieve(batch.id, vector_store_id=store.id).status == "completed"
    assert bus.keys_file is not None
    second = edge_options(bus.bootstrap, bus.catalog.prefix, f"vs2-{uuid.uuid4().hex[:6]}", bus.keys_file)
    with serve_in_thread(second) as other:  # a batch lives on the bus, not in the edge that created it
        other_client = OpenAI(base_url=other.base_url + "/v1", api_key=bus.key, max_retries=0, timeout=120)
        again = other_client.vector_stores.file_batches.retrieve(batch.id, vector_store_id=store.id)
        assert (again.status, again.file_counts.completed, again.created_at) == ("completed", 1, batch.created_at)
        with pytest.raises(openai.NotFoundError):
            other_client.vector_stores.file_batches.retrieve("vsfb_nosuchbatch", vector_store_id=store.id)
    assert client.vector_stores.retrieve(store.id).file_counts.completed == 2

    found = client.vector_stores.search(store.id, query="When was the lighthouse electrified?", max_num_results=3)
    best = found.data[0]
    assert best.file_id == files["lighthouse.md"] and best.filename == "lighthouse.md"
    assert "1931" in best.content[0].text and best.score > found.data[-1].score

    food = client.vector_stores.search(store.id, query="When was the lighthouse electrified?",
                                       filters={"key": "topic", "type": "eq", "value": "food"})
    assert {r.file_id for r in food.data} == {files["bakery.md"]}
    old = client.vector_stores.search(store.id, query="bread", filters={"key": "year", "type": "lt", "value": 2000})
    assert {r.file_id for r in old.data} == {files["lighthouse.md"]}
    assert [f.id for f in client.vector_stores.files.list(vector_store_id=store.id, filter="completed")]

    deleted = client.vector_stores.files.delete(files["lighthouse.md"], vector_store_id=store.id)
    assert deleted.deleted
    deadline = time.monotonic() + 30
    while files["lighthouse.md"] in {r.file_id for r in client.vector_stores.search(store.id, query="lighthouse").data}:
        assert time.monotonic() < deadline, "a deleted file's chunks are still found"
        time.sleep(0.5)


def test_unknown_ids_are_404_in_openai_s_shape(rig: tuple[OpenAI, Bus]) -> None:
    client, _ = rig
    with pytest.raises(openai.NotFoundError) as caught:
        client.vector_stores.retrieve("vs_nosuchstore")
    assert caught.value.body["code"] == "not_found" and "vs_nosuchstore" in caught.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.search("vs_nosuchstore", query="x")
    store = client.vector_stores.create(name="empty")
    with pytest.raises(openai.NotFoundError) as caught:
        client.vector_stores.files.create(vector_store_id=store.id, file_id="file-nosuchfile")
    assert caught.value.body["param"] == "file_id"
    with pytest.raises(openai.BadRequestError) as bad:
        client.vector_stores.search(store.id, query="x", filters={"key": "a", "type": "near", "value": 1})
    assert bad.value.body["param"] == "filters"
    assert client.vector_stores.delete(store.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.vector_stores.retrieve(store.id)
    assert store.id not in {s.id for s in client.vector_stores.list()}
