"""The vector index: one Qdrant collection per store and version (`<store>_v<N>`) behind an alias (`<store>`).

Queries and writes name the alias, so a rebuild fills `<store>_v<N+1>` while the alias still answers from
`v<N>`, then moves the alias in one `update_collection_aliases` call (atomic on a server; local mode applies
the operations to a copy and saves it before swapping it in) and drops the old collection.

Default: Qdrant's embedded local mode, on disk under the state folder. Local mode allows one process per
folder, so only the rag service opens it; everything else asks that service over the bus. `rag.qdrant_url`
points the same code at a Qdrant server instead (the client API is the same; only the constructor differs).

Point ids are deterministic (uuid5 of file id, index version and chunk index), so a redelivered batch
overwrites the same points instead of adding copies.
"""
from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qdrant_client import QdrantClient
from qdrant_client import models as qm

from streams.rag.embedding import DIMENSION

POINT_NAMESPACE = uuid.UUID("6b1d6a52-5a3e-4d1c-9a57-2f3c1b9e0c11")
_VERSIONED = re.compile(r"^(?P<store>.+)_v(?P<version>\d+)$")


@dataclass(frozen=True, kw_only=True)
class IndexedChunk:
    """A chunk as the index holds it (its payload): where it is in its file, and its text."""

    file_id: str
    filename: str
    index: int
    text: str
    char_start: int
    char_end: int
    page: int | None = None
    attributes: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class ChunkPoint(IndexedChunk):
    """A chunk to store, with its vector."""

    vector: list[float]


@dataclass(frozen=True, kw_only=True)
class Hit(IndexedChunk):
    """A chunk found, with its score."""

    score: float

    @classmethod
    def of(cls, score: float, payload: dict[str, Any]) -> Hit:
        return cls(score=float(score), file_id=str(payload.get("file_id", "")),
                   filename=str(payload.get("filename", "")), index=int(payload.get("chunk_index", 0)),
                   text=str(payload.get("text", "")), char_start=int(payload.get("char_start", 0)),
                   char_end=int(payload.get("char_end", 0)), page=payload.get("page"),
                   attributes=dict(payload.get("attributes") or {}))


def point_id(file_id: str, version: int, index: int) -> str:
    return str(uuid.uuid5(POINT_NAMESPACE, f"{file_id}/{version}/{index}"))


def collection_name(store: str, version: int) -> str:
    return f"{store}_v{version}"


def open_client(*, path: Path | None = None, url: str | None = None, api_key: str | None = None) -> QdrantClient:
    """A server at `url` when given, else local mode in `path` (or in memory when neither: tests)."""
    if url:
        return QdrantClient(url=url, api_key=api_key)
    if path is not None:
        path.mkdir(parents=True, exist_ok=True)
        return QdrantClient(path=str(path))
    return QdrantClient(location=":memory:")


class VectorIndex:
    """The stores' collections and aliases. Calls are serialised: the local client is not thread-safe."""

    def __init__(self, client: QdrantClient, *, server: bool = False) -> None:
        self.client = client
        self.server = server  # payload indexes only do something on a server
        self.lock = threading.RLock()

    # --- versions and the alias -----------------------------------------------------------------------------------

    def version(self, store: str) -> int | None:
        """The version the alias points at; None: the store has no index yet."""
        with self.lock:
            for alias in self.client.get_aliases().aliases:
                if alias.alias_name == store:
                    match = _VERSIONED.match(alias.collection_name)
                    return int(match["version"]) if match else None
        return None

    def versions(self, store: str) -> list[int]:
        with self.lock:
            names = [c.name for c in self.client.get_collections().collections]
        return sorted(int(m["version"]) for n in names if (m := _VERSIONED.match(n)) and m["store"] == store)

    def ensure(self, store: str) -> int:
        """The store's current version, creating v1 and its alias on first use."""
        with self.lock:
            current = self.version(store)
            if current is not None:
                return current
            self.ensure_version(store, 1)
            return 1

    def ensure_version(self, store: str, version: int) -> None:
        """The collection of `version` exists (the indexer writes a rebuild's version before it answers queries);
        the alias is created when the store has none."""
        with self.lock:
            if not self.client.collection_exists(collection_name(store, version)):
                self.create_version(store, version)
            if self.version(store) is None:
                self.client.update_collection_aliases(change_aliases_operations=[self._alias(store, version)])

    @staticmethod
    def _alias(store: str, version: int) -> qm.CreateAliasOperation:
        return qm.CreateAliasOperation(create_alias=qm.CreateAlias(collection_name=collection_name(store, version),
                                                                   alias_name=store))

    def create_version(self, store: str, version: int) -> None:
        name = collection_name(store, version)
        with self.lock:
            if self.client.collection_exists(name):
                self.client.delete_collection(name)  # a rebuild that died half-way: start it over
            self.client.create_collection(name, vectors_config=qm.VectorParams(size=DIMENSION,
                                                                                distance=qm.Distance.COSINE))
            if self.server:
                self.client.create_payload_index(name, "file_id", qm.PayloadSchemaType.KEYWORD)

    def swap(self, store: str, version: int) -> None:
        """Point the alias at `version` in one operation, then drop the other versions."""
        with self.lock:
            self.client.update_collection_aliases(change_aliases_operations=[
                qm.DeleteAliasOperation(delete_alias=qm.DeleteAlias(alias_name=store)), self._alias(store, version),
            ])
            for old in self.versions(store):
                if old != version:
                    self.client.delete_collection(collection_name(store, old))

    def drop(self, store: str) -> None:
        with self.lock:
            if self.version(store) is not None:
                self.client.update_collection_aliases(change_aliases_operations=[
                    qm.DeleteAliasOperation(delete_alias=qm.DeleteAlias(alias_name=store))])
            for version in self.versions(store):
                self.client.delete_collection(collection_name(store, version))

    # --- points -----------------------------------------------------------------------------------------------------

    def upsert(self, store: str, chunks: Sequence[ChunkPoint], *, version: int | None = None) -> int:
        """Idempotent: the same chunks again overwrite the same points. Returns the version written."""
        with self.lock:
            version = version if version is not None else self.ensure(store)
            points = [qm.PointStruct(id=point_id(c.file_id, version, c.index), vector=c.vector, payload={
                "file_id": c.file_id, "filename": c.filename, "chunk_index": c.index, "text": c.text,
                "char_start": c.char_start, "char_end": c.char_end, "page": c.page, "attributes": c.attributes,
            }) for c in chunks]
            if points:
                self.client.upsert(collection_name(store, version), points=points, wait=True)
            return version

    def delete_file(self, store: str, file_id: str, *, version: int | None = None) -> None:
        with self.lock:
            version = version if version is not None else self.version(store)
            if version is None:
                return
            self.client.delete(collection_name(store, version), wait=True,
                               points_selector=qm.FilterSelector(filter=_file_filter(file_id)))

    def count(self, store: str, *, file_id: str | None = None, version: int | None = None) -> int:
        with self.lock:
            version = version if version is not None else self.version(store)
            if version is None:
                return 0
            found = self.client.count(collection_name(store, version), exact=True,
                                      count_filter=_file_filter(file_id) if file_id else None)
            return found.count

    def search(self, store: str, vector: list[float], limit: int, *, where: qm.Filter | None = None,
               version: int | None = None) -> list[Hit]:
        with self.lock:
            version = version if version is not None else self.version(store)
            if version is None:
                return []
            found = self.client.query_points(collection_name(store, version), query=vector, limit=limit,
                                             query_filter=where, with_payload=True)
        return [Hit.of(p.score, p.payload or {}) for p in found.points]

    def close(self) -> None:
        with self.lock:
            self.client.close()


def _file_filter(file_id: str) -> qm.Filter:
    return qm.Filter(must=[qm.FieldCondition(key="file_id", match=qm.MatchValue(value=file_id))])

