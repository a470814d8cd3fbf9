"""The document parser on the real broker: an IngestJob in, the document's state and its chunks out; bad files end
their jobs with a precise last_error while the parser keeps serving; a parser killed with SIGKILL mid-job is
replaced and the job completes, every chunk index present with the same text however often it was published."""
from __future__ import annotations

import asyncio
import io
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from pydantic import ValidationError

from schemas.documents import DocumentChunks, DocumentState, IngestJob, StaticChunking
from schemas.events import DeadLetter, ServiceAnnouncement
from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.config import FilesSettings, KafkaSettings, ParserSettings, Settings
from streams.files.blobs import BlobStore
from streams.rag.parser import build
from streams.rag.parsing import extract
from streams.rag.parsing.chunking import Chunker
from streams.service.runner import ConsumerService
from tests import document_files
from tests.edge_support import topic_records
from tests.kafka_fixtures import kafka_bootstrap  # noqa: F401

pytestmark = [pytest.mark.asyncio(loop_scope="session"), pytest.mark.kafka, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
SMALL = StaticChunking(max_chunk_size_tokens=100, chunk_overlap_tokens=20)


class Parsing:
    """A topic prefix and blob folder of its own, a producer of jobs, and readers of what the parser published."""

    def __init__(self, bootstrap: str, blobs: Path) -> None:
        self.bootstrap = bootstrap
        self.settings = Settings(
            kafka=KafkaSettings(bootstrap_servers=bootstrap, topic_prefix=f"t-parser-{uuid.uuid4().hex[:8]}"),
            files=FilesSettings(dir=str(blobs)), parser=ParserSettings(heartbeat_s=0.5, drain_timeout_s=2.0))
        self.catalog: TopicCatalog = self.settings.catalog
        self.blobs = BlobStore(blobs)
        self.producer = clients.make_producer(bootstrap, client_id="pytest-parser")

    async def job(self, data: bytes, filename: str, *, chunking: StaticChunking = SMALL,
                  sha256: str | None = None) -> IngestJob:
        file_id = f"file-{uuid.uuid4().hex[:12]}"
        ref = self.blobs.put(file_id, io.BytesIO(data))
        job = IngestJob(job_id=f"job-{uuid.uuid4().hex[:8]}", vector_store_id="vs_test", file_id=file_id,
                        tenant="t", filename=filename, blob_key=ref.key, sha256=sha256 or ref.sha256,
                        bytes=ref.size, chunking=chunking, created_at=time.time())
        await self.producer.send_and_wait(self.catalog.ingest_jobs.name, clients.encode(job),
                                          key=job.document_key.encode())
        return job

    async def events(self, topic: str, model: type, job: IngestJob) -> list:
        found = []
        for record in await topic_records(self.bootstrap, topic):
            try:
                event = clients.decode(record.value, model)
            except ValidationError:
                continue
            if getattr(event, "job_id", None) == job.job_id or getattr(getattr(event, "job", None), "job_id",
                                                                         None) == job.job_id:
                found.append(event)
        return found

    async def state(self, job: IngestJob, timeout_s: float = 60.0) -> DocumentState:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            states = await self.events(self.catalog.documents.name, DocumentState, job)
            if states:
                return states[-1]
            await asyncio.sleep(0.3)
        raise AssertionError(f"no document state for {job.filename} within {timeout_s}s")

    async def chunks(self, job: IngestJob) -> list[DocumentChunks]:
        return await self.events(self.catalog.document_chunks.name, DocumentChunks, job)


@pytest.fixture(scope="module")
def chunker() -> Chunker:
    return Chunker.load()


@pytest_asyncio.fixture(loop_scope="session")
async def parsing(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[Parsing]:  # noqa: F811
    harness = Parsing(kafka_bootstrap, tmp_path / "blobs")
    await clients.ensure_topics(kafka_bootstrap, harness.catalog.shared_topics())
    await harness.producer.start()
    try:
        yield harness
    finally:
        await harness.producer.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def parser(parsing: Parsing, chunker: Chunker) -> AsyncIterator[ConsumerService]:
    service = ConsumerService(*build(parsing.settings, chunker=chunker))
    await service.start()
    try:
        yield service
    finally:
        await service.stop()


def _assert_whole(job: IngestJob, data: bytes, state: DocumentState, parts: list[DocumentChunks]) -> None:
    """Every chunk index once (copies identical), each chunk exactly its span of the extracted text."""
    text = extract(data, job.filename).text
    assert state.status == "in_progress" and state.stage == "parsed" and state.characters == len(text)
    by_index: dict[int, set[str]] = {}
    for part in parts:
        assert part.total_chunks == state.chunks and part.file_id == job.file_id
        for chunk in part.chunks:
            assert text[chunk.char_start:chunk.char_end] == chunk.text
            by_index.setdefault(chunk.index, set()).add(chunk.model_dump_json())
    assert sorted(by_index) == list(range(state.chunks or 0))
    assert all(len(copies) == 1 for copies in by_index.values()), "a republished chunk differs"


@pytest.mark.parametrize("filename, data", [
    ("notes.md", b"# Kafka\n\n" + b"Partitions are ordered logs. " * 200),
    ("page.html", document_files.HTML_WITH_BOILERPLATE),
    ("spec.docx", document_files.docx(["Consumer groups share partitions. " * 40, "Offsets are committed."])),
    ("book.pdf", document_files.pdf([f"Page {p}: " + "brokers replicate partitions " * 12 for p in (1, 2, 3)])),
])
async def test_an_ingest_job_becomes_its_document_state_and_every_chunk(parsing: Parsing, parser: ConsumerService,
                                                                          filename: str, data: bytes) -> None:
    job = await parsing.job(data, filename)
    state = await parsing.state(job)
    await asyncio.sleep(0.5)  # the chunks follow the state
    parts = await parsing.chunks(job)
    _assert_whole(job, data, state, parts)
    if filename.endswith(".pdf"):
        assert state.pages == 3 and {c.page for p in parts for c in p.chunks} <= {1, 2, 3}
    if filename.endswith(".html"):
        assert "Copyright" not in " ".join(c.text for p in parts for c in p.chunks)


@pytest.mark.parametrize("filename, data, code, words", [
    ("broken.pdf", b"%PDF-1.7\n garbage garbage", "invalid_file", "the PDF is corrupt"),
    ("locked.pdf", document_files.encrypted_pdf(["secret"]), "invalid_file", "the PDF is encrypted"),
    ("empty.txt", b"", "invalid_file", "is empty"),
    ("blank.pdf", document_files.pdf([""]), "invalid_file", "no extractable text"),
    ("photo.png", b"\x89PNG....", "unsupported_file", "'.png' are not supported"),
])
async def test_a_bad_file_ends_its_job_failed_with_a_precise_error(parsing: Parsing, parser: ConsumerService,
                                                                   filename: str, data: bytes, code: str,
                                                                   words: str) -> None:
    job = await parsing.job(data, filename)
    state = await parsing.state(job)
    assert state.status == "failed" and state.stage == "failed" and state.last_error is not None
    assert state.last_error.code == code and words in state.last_error.message
    assert await parsing.chunks(job) == []


async def test_changed_bytes_and_malformed_jobs_do_not_stop_the_parser(parsing: Parsing,
                                                                       parser: ConsumerService) -> None:
    tampered = await parsing.job(b"some text", "a.txt", sha256="0" * 64)
    state = await parsing.state(tampered)
    assert state.last_error is not None and state.last_error.message.startswith("checksum mismatch")
    sent = await parsing.producer.send_and_wait(parsing.catalog.ingest_jobs.name, b"{not json", key=b"x")
    letters = [clients.decode(r.value, DeadLetter) for r in
               await topic_records(parsing.bootstrap, parsing.catalog.dead_letters.name)]
    deadline = time.monotonic() + 30
    while not any(d.source_offset == sent.offset and d.source_partition == sent.partition for d in letters):
        assert time.monotonic() < deadline, "the malformed job was not dead-lettered"
        await asyncio.sleep(0.3)
        letters = [clients.decode(r.value, DeadLetter) for r in
                   await topic_records(parsing.bootstrap, parsing.catalog.dead_letters.name)]
    good = await parsing.job(b"Still serving after bad input.", "after.txt")
    assert (await parsing.state(good)).status == "in_progress"


def _spawn_parser(parsing: Parsing, tmp_path: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "SPECSTREAM_KAFKA__BOOTSTRAP_SERVERS": parsing.bootstrap,
           "SPECSTREAM_KAFKA__TOPIC_PREFIX": parsing.catalog.prefix,
           "SPECSTREAM_FILES__DIR": str(parsing.blobs.root), "SPECSTREAM_PARSER__HEARTBEAT_S": "0.5",
           "SPECSTREAM_PARSER__MAX_INFLIGHT": "1",
           # The broker's floor instead of the parser's default 10 s: the replacement of a parser killed with -9
           # waits this long for the group to drop the dead member.
           "SPECSTREAM_PARSER__SESSION_TIMEOUT_MS": "6000"}
    env.pop("SPECSTREAM_CONFIG", None)
    return subprocess.Popen([sys.executable, "-m", "streams.cli", "parser"], cwd=tmp_path, env=env,
                            stdout=(tmp_path / f"parser-{time.time_ns()}.log").open("wb"),
                            stderr=subprocess.STDOUT)


async def _busy(parsing: Parsing, process: subprocess.Popen[bytes], timeout_s: float = 120.0) -> None:
    """Until the parser announces a job in flight (its heartbeat carries in_flight)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the parser exited with {process.returncode}"
        for record in await topic_records(parsing.bootstrap, parsing.catalog.services.name):
            announcement = clients.decode(record.value, ServiceAnnouncement)
            if announcement.pid == process.pid and announcement.in_flight > 0:
                return
        await asyncio.sleep(0.2)
    raise AssertionError("the parser never held the job")


async def test_a_parser_killed_mid_job_is_replaced_and_the_job_completes_once_per_chunk_index(
        parsing: Parsing, tmp_path: Path) -> None:
    # ~6 M characters: parsing takes seconds, far longer than noticing the job in flight, so the kill lands mid-job
    data = " ".join(f"Record {i} of the long log describes replication." for i in range(120_000)).encode()
    first = _spawn_parser(parsing, tmp_path)
    try:
        job = await parsing.job(data, "long.txt", chunking=StaticChunking())
        await _busy(parsing, first)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    done_before = {c.index for p in await parsing.chunks(job) for c in p.chunks}
    states_before = await parsing.events(parsing.catalog.documents.name, DocumentState, job)
    assert not states_before or len(done_before) < (states_before[-1].chunks or 0), "killed after the job was done"
    second = _spawn_parser(parsing, tmp_path)
    try:
        state = await parsing.state(job, timeout_s=180)
        deadline = time.monotonic() + 60
        while len({c.index for p in await parsing.chunks(job) for c in p.chunks}) < (state.chunks or 0):
            assert time.monotonic() < deadline, "the redone job did not publish every chunk"
            await asyncio.sleep(0.5)
        _assert_whole(job, data, state, await parsing.chunks(job))
    finally:
        second.send_signal(signal.SIGTERM)
        assert second.wait(60) == 0  # drains and exits cleanly
