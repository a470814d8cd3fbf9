"""A batch's output and error files have ids derived from the batch's: written again (an assembler restarted after
writing them, before publishing the batch's end), they are the same files, not second copies. Real Kafka."""
from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from schemas.topics import TopicCatalog
from streams.batch.files import StoreFiles, batch_file_id
from streams.config import KafkaSettings
from streams.files.blobs import BlobStore
from streams.files.store import FileStore
from streams.kafka.clients import ensure_topics
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(120)]


def test_batch_file_ids_depend_only_on_the_batch_and_the_kind() -> None:
    assert batch_file_id("batch_a", "output") == batch_file_id("batch_a", "output")
    assert len({batch_file_id("batch_a", "output"), batch_file_id("batch_a", "error"),
                batch_file_id("batch_b", "output")}) == 3
    assert batch_file_id("batch_a", "output").startswith("file-")


def test_an_output_file_written_again_after_a_restart_reuses_the_first(kafka_bootstrap: str,  # noqa: F811
                                                                        tmp_path: Path) -> None:
    async def scenario() -> None:
        kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=f"t-bfiles-{uuid.uuid4().hex[:8]}")
        catalog = TopicCatalog(prefix=kafka.topic_prefix)
        await ensure_topics(kafka, [catalog.files])
        file_id = batch_file_id("batch_x", "output")
        ids = []
        for _ in range(2):  # two assembler lifetimes, each with its own store reading the files topic
            store = FileStore(kafka, catalog, BlobStore(tmp_path), max_bytes=1 << 20)
            await store.start()
            try:
                ids.append(await StoreFiles(store).write("alice", "batch_x_output.jsonl", b'{"a":1}\n',
                                                         file_id=file_id))
                page = await store.list("alice")
            finally:
                await store.stop()
            assert [f.id for f in page.files] == [file_id]  # one file, never an orphaned first copy
        assert ids == [file_id, file_id]
        assert len([p for p in tmp_path.rglob("*") if p.is_file()]) == 1  # one blob

    asyncio.run(scenario())
