"""The blob store: the bytes of uploaded files, in a folder, one file per id, checked against their SHA-256.

Bytes never travel on Kafka; messages carry a blob's key and checksum. A blob is written to a temporary file
in the same folder, flushed to disk and renamed into place, so a reader sees either nothing or all of it (a
crash mid-upload leaves only a temporary file, never a partial blob). Every read verifies the checksum the
message named, so a truncated, corrupted or replaced blob is an error naming it, never silently wrong text.
"""
from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from infra.kafka.paths import state_root

COPY_BYTES = 1024 * 1024
_KEY = re.compile(r"^[0-9a-f]{2}/[A-Za-z0-9_-]+$")


class BlobError(Exception):
    """A blob that cannot be read as named: missing, or not the bytes its checksum says."""


class BlobMissing(BlobError):
    pass


class ChecksumMismatch(BlobError):
    pass


class TooLarge(Exception):
    def __init__(self, limit: int) -> None:
        super().__init__(f"larger than {limit} bytes")
        self.limit = limit


@dataclass(frozen=True)
class BlobRef:
    key: str  # relative to the store's folder: "<2 hex of the id's hash>/<id>"
    sha256: str
    size: int


def default_dir() -> Path:
    return state_root() / "files"


def blob_key(file_id: str) -> str:
    """Spread over 256 subfolders so no folder grows past what file systems list quickly."""
    return f"{hashlib.sha256(file_id.encode()).hexdigest()[:2]}/{file_id}"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as source:
        while block := source.read(COPY_BYTES):
            digest.update(block)
    return digest.hexdigest()


class BlobStore:
    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root).expanduser() if root is not None else default_dir()

    def path(self, key: str) -> Path:
        if not _KEY.match(key):  # keys come from messages: never let one point outside the folder
            raise BlobMissing(f"blob key {key!r} is not one this store writes")
        return self.root / key

    def put(self, file_id: str, source: BinaryIO, *, limit: int | None = None) -> BlobRef:
        """Copy ``source`` to the blob of ``file_id``; :class:`TooLarge` (nothing kept) past ``limit`` bytes."""
        return self.put_chunks(file_id, iter(lambda: source.read(COPY_BYTES), b""), limit=limit)

    def put_chunks(self, file_id: str, chunks: Iterable[bytes], *, limit: int | None = None) -> BlobRef:
        key = blob_key(file_id)
        target = self.root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        digest, size = hashlib.sha256(), 0
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{file_id}.", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    size += len(chunk)
                    if limit is not None and size > limit:
                        raise TooLarge(limit)
                    digest.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(temp, target)
        except BaseException:
            Path(temp).unlink(missing_ok=True)
            raise
        return BlobRef(key, digest.hexdigest(), size)

    def verified_path(self, key: str, sha256: str) -> Path:
        """The blob's path once its bytes are checked against ``sha256`` (hashes the whole file)."""
        path = self.path(key)
        try:
            actual = sha256_of(path)
        except FileNotFoundError:
            raise BlobMissing(f"blob {key} is missing from {self.root}") from None
        if actual != sha256:
            raise ChecksumMismatch(f"blob {key} has SHA-256 {actual}, expected {sha256}: the stored bytes changed")
        return path

    def read(self, key: str, sha256: str) -> bytes:
        """The blob's bytes, checked against ``sha256``."""
        data = self._read(key)
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256:
            raise ChecksumMismatch(f"blob {key} has SHA-256 {actual}, expected {sha256}: the stored bytes changed")
        return data

    def _read(self, key: str) -> bytes:
        try:
            return self.path(key).read_bytes()
        except FileNotFoundError:
            raise BlobMissing(f"blob {key} is missing from {self.root}") from None

    def delete(self, key: str) -> None:
        self.path(key).unlink(missing_ok=True)
