"""The index's life on the real broker with real processes (`specstream parser`, `specstream rag`): the `docs` CLI,
a rebuild with queries running throughout (none fails, answers move to the new version), and a rag service killed
with SIGKILL in the middle of a document that completes after a restart with no duplicate points."""
from __future__ import annotations

import asyncio
import io
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
from aiokafka import TopicPartition

from schemas.retrieval import IndexState
from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.files.blobs import BlobStore
from streams.files.store import FileStore
from streams.rag.client import RagClient
from streams.rag.jobs import attach
from streams.rag.rebuild import rebuild
from streams.testing.stack import REPO, Process, _stop, spawn_process, stack_env
from tests.kafka_fixtures import kafka_bootstrap  # noqa: F401
from tests.rag_stack import kill_hard, start_rag, wait_rag_ready
from tests.rag_support import chunks_of, job, publish, queued, store_record, wait_status

LIGHTHOUSE = b"# Lighthouse\n\nThe lighthouse keeper winds the lamp's clockwork every four hours.\n"

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.kafka, pytest.mark.timeout(900)]

NOTES = {
    "harbour.md": "# Harbour\n\nThe harbour master's parrot is called Marmalade.\n\nFerries leave at nine.\n",
    "garden.md": "# Garden\n\nTomatoes need six hours of sun a day.\n\nWater the basil in the morning.\n",
}


@dataclass
class Deployment:
    bootstrap: str
    prefix: str
    root: Path
    rag: Process
    parser: Process

    @property
    def env(self) -> dict[str, str]:
        return stack_env(self.bootstrap, self.prefix, "unused", 1, {"SPECSTREAM_FILES__DIR": str(self.root / "files")})

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "streams.cli", *args], cwd=REPO, env=self.env, text=True,
                              capture_output=True, timeout=600)


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def deployment(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Deployment]:  # noqa: F811
    prefix = f"t-rebuild-{uuid.uuid4().hex[:8]}"
    root = tmp_path_factory.mktemp("rebuild")
    await clients.ensure_topics(kafka_bootstrap, TopicCatalog(prefix=prefix).shared_topics())
    env = stack_env(kafka_bootstrap, prefix, "unused", 1, {"SPECSTREAM_FILES__DIR": str(root / "files")})
    parser = spawn_process("parser", ["parser"], env, root)
    rag = start_rag(kafka_bootstrap, prefix, root / "state", root)
    await asyncio.to_thread(wait_rag_ready, rag, kafka_bootstrap, prefix)
    deployment = Deployment(kafka_bootstrap, prefix, root, rag, parser)
    try:
        yield deployment
    finally:
        _stop(deployment.rag, 20.0)
        _stop(parser, 20.0)


async def test_docs_cli_adds_files_until_indexed_then_status_and_search_show_them(deployment: Deployment) -> None:
    paths = []
    for name, text in NOTES.items():
        (deployment.root / name).write_text(text)
        paths.append(str(deployment.root / name))
    added = await asyncio.to_thread(deployment.cli, "docs", "add", *paths, "--store", "notes")
    assert added.returncode == 0, added.stdout + added.stderr
    status = await asyncio.to_thread(deployment.cli, "docs", "status", "--store", "notes")
    assert status.returncode == 0 and status.stdout.count(": completed") == 2, status.stdout + status.stderr
    found = await asyncio.to_thread(deployment.cli, "docs", "search", "what is the parrot called", "--store", "notes")
    assert found.returncode == 0 and found.stdout.splitlines()[0].split()[2] == "harbour.md", found.stdout
    missing = await asyncio.to_thread(deployment.cli, "docs", "search", "x", "--store", "no-such-store")
    assert missing.returncode == 1 and "no vector store with id or name 'no-such-store'" in missing.stderr


async def test_a_rebuild_swaps_versions_while_queries_keep_answering_and_files_stay_completed(
        deployment: Deployment) -> None:
    async with RagClient.session(deployment.bootstrap, TopicCatalog(prefix=deployment.prefix)) as client:
        store = client.store("notes")
        seen: list[int] = []
        statuses: set[str] = set()  # the files' visible statuses during the rebuild
        failures: list[BaseException] = []
        stop = asyncio.Event()

        async def query_throughout() -> None:
            while not stop.is_set():
                try:
                    answer = await client.search([store.id], tenant=store.tenant, query="parrot", timeout_s=30)
                    assert answer.passages, "no passage"
                    seen.append(answer.index_versions[store.id])
                    statuses.update(d.status for d in client.documents_of(store.id))
                except BaseException as error:  # noqa: BLE001 - every failure counts
                    failures.append(error)

        queries = asyncio.create_task(query_throughout())
        done = await rebuild(client, "notes", progress=print, timeout_s=600)
        await asyncio.sleep(1.0)
        stop.set()
        await queries
    assert not failures, failures[:3]
    assert statuses == {"completed"}, statuses
    assert (done.old_version, done.new_version, done.documents) == (1, 2, 2)
    assert seen[0] == 1 and seen[-1] == 2 and seen == sorted(seen), seen
    async with RagClient.session(deployment.bootstrap, TopicCatalog(prefix=deployment.prefix)) as client:
        state = await client.command("count", store.id, version=2)
        assert isinstance(state, IndexState) and state.versions == [2] and state.points == done.points
        assert client.store(store.id).index_version == 2


async def test_a_file_still_being_ingested_at_rebuild_time_is_not_waited_for_and_lands_in_the_new_version(
        deployment: Deployment) -> None:
    catalog = TopicCatalog(prefix=deployment.prefix)
    files = FileStore(deployment.bootstrap, catalog, BlobStore(deployment.root / "files"), max_bytes=1 << 20)
    await files.start()
    try:
        async with RagClient.session(deployment.bootstrap, catalog) as client:
            record = client.store("notes")
            file = await files.create(tenant=record.tenant, filename="lighthouse.md", purpose="assistants",
                                      source=io.BytesIO(LIGHTHOUSE))
            state, ingest = attach(record, file)
            await client.publish(catalog.documents.name, ingest.document_key, state)  # in progress from here on
            requeued = asyncio.Event()

            def progress(line: str) -> None:
                print(line)
                if "document(s) indexed" in line:  # the rebuild has queued its jobs
                    requeued.set()

            rebuilding = asyncio.create_task(rebuild(client, "notes", progress=progress, timeout_s=300))
            await asyncio.wait_for(requeued.wait(), 120)
            # The file's own job lands after the rebuild's (the edge publishes a file's state, then its job): it
            # used to be rebuilt too, then finish at the old version after the swap had dropped it; finishing
            # before the rebuild's last check, it held the rebuild until its timeout (its state named v1).
            await client.publish(catalog.ingest_jobs.name, ingest.document_key, ingest)
            done = await asyncio.wait_for(rebuilding, 240)
            assert done.documents == 2  # the notes; the file in progress was not part of the rebuild
            final = await wait_status(deployment.bootstrap, catalog.documents.name, record.id, file.id, "completed",
                                      timeout_s=240)
            for _ in range(240):  # its own job completes first (at v1), then the rebuild's requeue at v2
                if final.job.index_version == done.new_version:
                    break
                await asyncio.sleep(0.5)
                final = await wait_status(deployment.bootstrap, catalog.documents.name, record.id, file.id,
                                          "completed", timeout_s=240)
            assert final.job.index_version == done.new_version, final
            found = await client.search([record.id], tenant=record.tenant,
                                        query="who winds the lamp of the lighthouse")
            assert found.index_versions[record.id] == done.new_version
            assert found.passages and found.passages[0].file_id == file.id, found.passages
    finally:
        await files.stop()


async def _committed_parts(bootstrap: str, group: str, topic: str, partitions: int) -> int:
    consumer = clients.make_consumer(bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        total = 0
        for p in range(partitions):
            total += await consumer.committed(TopicPartition(topic, p)) or 0
        return total
    finally:
        await consumer.stop()


async def test_the_rag_service_killed_mid_document_completes_it_after_restart_without_duplicates(
        deployment: Deployment) -> None:
    catalog = TopicCatalog(prefix=deployment.prefix)
    ingest = job("vs_crash", "file-crash", "crash.md")
    texts = [f"Line {i}: the quick brown fox number {i} jumps over the lazy dog near river {i % 17}."
             for i in range(600)]
    group, topic = f"{deployment.prefix}.indexers", catalog.document_chunks
    before = await _committed_parts(deployment.bootstrap, group, topic.name, topic.partitions)
    producer = clients.make_producer(deployment.bootstrap, client_id="pytest-crash")
    await producer.start()
    try:
        await publish(producer, catalog.vector_stores.name, "vs_crash", store_record("vs_crash"))
        await publish(producer, catalog.documents.name, ingest.document_key, queued(ingest))
        for message in chunks_of(ingest, texts, parts=12):
            await publish(producer, catalog.document_chunks.name, ingest.document_key, message)
    finally:
        await producer.stop()
    while await _committed_parts(deployment.bootstrap, group, topic.name, topic.partitions) <= before:
        await asyncio.sleep(0.2)
    kill_hard(deployment.rag)
    committed = await _committed_parts(deployment.bootstrap, group, topic.name, topic.partitions)
    assert before < committed < before + 12, "the kill was not in the middle of the document"
    deployment.rag = start_rag(deployment.bootstrap, deployment.prefix, deployment.root / "state", deployment.root,
                               name="rag-restarted")
    await asyncio.to_thread(wait_rag_ready, deployment.rag, deployment.bootstrap, deployment.prefix)
    state = await wait_status(deployment.bootstrap, catalog.documents.name, "vs_crash", "file-crash", "completed",
                              timeout_s=600)
    assert state.chunks == len(texts)
    async with RagClient.session(deployment.bootstrap, catalog) as client:
        counted = await client.command("count", "vs_crash", version=1)
    assert isinstance(counted, IndexState) and counted.points == len(texts)
