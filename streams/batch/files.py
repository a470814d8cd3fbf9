"""What batch jobs need of the files store (:mod:`streams.files`): read an input file, write an output file."""
from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any, Protocol


class BatchFileMissing(Exception):
    """The file is not there (deleted, or another tenant's)."""


class BatchFiles(Protocol):
    async def read(self, file_id: str, tenant: str) -> tuple[str, bytes]:
        """(purpose, bytes) of a tenant's file; :class:`BatchFileMissing` when it has none of that id."""
        ...

    async def write(self, tenant: str, filename: str, data: bytes, *, file_id: str) -> str:
        """Store a ``batch_output`` file of the tenant as ``file_id``, unless it has one of that id already; the id."""
        ...


def batch_file_id(batch_id: str, kind: str) -> str:
    """The id of a batch's ``output`` or ``error`` file, derived from the batch's: an assembler that dies after
    writing the file and before publishing the batch's end writes it again under the same id, not a second copy."""
    return "file-" + hashlib.sha256(f"{batch_id}:{kind}".encode()).hexdigest()[:24]


class StoreFiles:
    """:class:`BatchFiles` over the files store (:class:`streams.files.store.FileStore`)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    async def read(self, file_id: str, tenant: str) -> tuple[str, bytes]:
        from streams.files.store import NoSuchFile

        try:
            file = await self.store.get(tenant, file_id)
            path = await self.store.content_path(tenant, file_id)
        except NoSuchFile:
            raise BatchFileMissing(file_id) from None
        return file.purpose, await asyncio.to_thread(path.read_bytes)

    async def write(self, tenant: str, filename: str, data: bytes, *, file_id: str) -> str:
        from streams.files.store import NoSuchFile

        try:
            # Written before a restart: the journal it came from is final, so its bytes are these.
            return str((await self.store.get(tenant, file_id)).id)
        except NoSuchFile:
            pass
        file = await self.store.create(tenant=tenant, filename=filename, purpose="batch_output", source=[data],
                                       file_id=file_id)
        return str(file.id)


def store_of(settings: Any, client_id: str) -> Any:
    """A files store of its own (the assembler's; the edge has one already)."""
    from streams.files.blobs import BlobStore
    from streams.files.store import FileStore

    files = settings.files
    return FileStore(settings.kafka, settings.catalog, BlobStore(files.dir), max_bytes=files.max_bytes,
                     client_id=client_id)


def journal_dir(store: Any) -> Path:
    """Beside the blobs (shared storage when the assembler runs elsewhere); never a blob key (two hex digits)."""
    return Path(store.blobs.root) / "batch-journals"
