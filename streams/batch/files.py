"""What batch jobs need of the files store (:mod:`streams.files`): read an input file, write an output file."""
from __future__ import annotations

from typing import Protocol


class BatchFileMissing(Exception):
    """The file is not there (deleted, or another tenant's)."""


class BatchFiles(Protocol):
    async def read(self, file_id: str, tenant: str) -> tuple[str, bytes]:
        """(purpose, bytes) of a tenant's file; :class:`BatchFileMissing` when it has none of that id."""
        ...

    async def write(self, tenant: str, filename: str, data: bytes) -> str:
        """Store a ``batch_output`` file of the tenant; its id."""
        ...
