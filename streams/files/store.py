"""The files store: bytes in the blob store, metadata on the compacted files topic, a view to read them back.

The edge serves `/v1/files` from it; the batch API writes its output files through it (``purpose``
``batch_output``). Creating a file stores its bytes first (atomically, with their SHA-256), runs its purpose's
validator, and only then publishes its :class:`FileObject`: a file that is listed always has its bytes. Deleting
publishes a tombstone first, then removes the bytes: a file that is gone from the list is never half there.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from schemas.documents import FileObject
from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.files.blobs import BlobRef, BlobStore
from streams.files.purposes import validator_for
from streams.files.view import FilesView
from streams.kafka.connection import Connectable

# How long a request waits for the view to read the topic up to its end before answering 503.
CATCH_UP_S = 10.0


class NoSuchFile(Exception):
    def __init__(self, file_id: str) -> None:
        super().__init__(f"No such File object: {file_id}")
        self.file_id = file_id


class FilesUnavailable(Exception):
    """The files topic cannot be read or written now (Kafka unreachable, the view not caught up)."""


@dataclass(frozen=True)
class Page:
    files: list[FileObject]
    has_more: bool


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex[:24]}"


class FileStore:
    def __init__(self, kafka: Connectable, catalog: TopicCatalog, blobs: BlobStore, *, max_bytes: int,
                 client_id: str = "specstream-files") -> None:
        self.kafka = kafka
        self.topic = catalog.files
        self.blobs = blobs
        self.max_bytes = max_bytes
        self.client_id = client_id
        self.view = FilesView(kafka, self.topic)
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        """Connect and start following the files topic (which must exist: the edge's start creates it)."""
        producer = clients.make_producer(self.kafka, client_id=self.client_id)
        await producer.start()
        self._producer = producer
        await self.view.start()

    async def stop(self) -> None:
        await self.view.stop()
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    # --- writing -----------------------------------------------------------------------------------------------

    async def create(self, *, tenant: str, filename: str, purpose: str, source: BinaryIO | Iterable[bytes],
                     expires_after_s: int | None = None, file_id: str | None = None) -> FileObject:
        """Store, check and publish a new file. Raises TooLarge (past max_bytes), InvalidFile (its purpose's
        validator refused it) or FilesUnavailable; none of them leaves anything behind. ``file_id``: an id the
        caller derived (a batch's output file), null: a new random one."""
        file_id = file_id or new_file_id()
        ref = await asyncio.to_thread(self._put, file_id, source)
        try:
            validator = validator_for(purpose)
            if validator is not None:
                await asyncio.to_thread(validator, self.blobs.path(ref.key), filename)
            created_at = int(time.time())
            file = FileObject(
                id=file_id, bytes=ref.size, created_at=created_at, filename=filename, purpose=purpose,  # type: ignore[arg-type]
                tenant=tenant, blob_key=ref.key, sha256=ref.sha256,
                expires_at=created_at + expires_after_s if expires_after_s is not None else None,
            )
            await self._send(file_id, clients.encode(file))
        except BaseException:
            self.blobs.delete(ref.key)
            raise
        self.view.apply(file_id, file)  # read-your-writes on this edge; the others read it from the topic
        return file

    def _put(self, file_id: str, source: BinaryIO | Iterable[bytes]) -> BlobRef:
        if hasattr(source, "read"):
            return self.blobs.put(file_id, source, limit=self.max_bytes)  # type: ignore[arg-type]
        return self.blobs.put_chunks(file_id, source, limit=self.max_bytes)  # type: ignore[arg-type]

    async def delete(self, tenant: str, file_id: str) -> None:
        file = await self.get(tenant, file_id)
        await self._send(file_id, None)
        self.view.apply(file_id, None)
        self.blobs.delete(file.blob_key)

    async def _send(self, file_id: str, value: bytes | None) -> None:
        if self._producer is None:
            raise FilesUnavailable("not connected to Kafka")
        try:
            await asyncio.wait_for(self._producer.send_and_wait(self.topic.name, value, key=file_id.encode()), 10.0)
        except Exception as error:  # noqa: BLE001 - every failure to store the record means the same to a client
            raise FilesUnavailable(f"could not write {self.topic.name}: {error!r}") from error

    # --- reading -----------------------------------------------------------------------------------------------

    async def get(self, tenant: str, file_id: str) -> FileObject:
        """The tenant's file (NoSuchFile for another tenant's, a deleted or an expired one). One uploaded through
        another edge a moment ago is found: a miss catches up with the topic before it is NoSuchFile."""
        await self._caught_up()
        try:
            file = await self.view.find(file_id)
        except (TimeoutError, KafkaError) as error:
            raise FilesUnavailable(f"could not catch up with {self.topic.name}: {error}") from error
        if file is None or file.tenant != tenant or _expired(file):
            raise NoSuchFile(file_id)
        return file

    async def list(self, tenant: str, *, purpose: str | None = None, order: Literal["asc", "desc"] = "desc",
                   after: str | None = None, limit: int = 10_000) -> Page:
        """OpenAI's listing: by created_at (then id), from just past ``after``, at most ``limit``."""
        await self._caught_up()
        files = [f for f in self.view.files.values()
                 if f.tenant == tenant and (purpose is None or f.purpose == purpose) and not _expired(f)]
        files.sort(key=lambda f: (f.created_at, f.id), reverse=order == "desc")
        if after is not None:
            ids = [f.id for f in files]
            files = files[ids.index(after) + 1:] if after in ids else []
        return Page(files[:limit], has_more=len(files) > limit)

    async def content_path(self, tenant: str, file_id: str) -> Path:
        """Where the file's bytes are, once checked against its SHA-256 (BlobError otherwise)."""
        file = await self.get(tenant, file_id)
        return await asyncio.to_thread(self.blobs.verified_path, file.blob_key, file.sha256)

    async def _caught_up(self) -> None:
        try:
            await asyncio.wait_for(self.view.caught_up.wait(), CATCH_UP_S)
        except TimeoutError:
            raise FilesUnavailable(f"still reading {self.topic.name}") from None


def _expired(file: FileObject) -> bool:
    return file.expires_at is not None and file.expires_at <= time.time()
