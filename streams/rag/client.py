"""A bus client of the documents pipeline, for the CLI (`docs`, `index rebuild`) and the benchmark: the stores' and
documents' tables, publishing jobs and records, and request/reply with the rag service on a reply topic of its own
(deleted afterwards)."""
from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any, Literal, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from pydantic import BaseModel

from schemas.documents import DocumentState
from schemas.events import ErrorEvent, ReplyRoute, TokenChunk
from schemas.retrieval import (
    FileSearch,
    IndexCommand,
    IndexState,
    RetrievalRequest,
    Retrieved,
    SearchResults,
    VectorStoreRecord,
)
from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.kafka.compacted_table import CompactedTable
from streams.kafka.connection import Connectable


class RagError(Exception):
    pass


class RagTimeout(RagError):
    """No answer in time: the rag service is down, or too busy."""


class RagClient:
    def __init__(self, kafka: Connectable, catalog: TopicCatalog, replies: AIOKafkaConsumer,
                 producer: AIOKafkaProducer, reply_topic: str) -> None:
        self.kafka, self.catalog = kafka, catalog
        self.replies, self.producer, self.reply_topic = replies, producer, reply_topic
        self.stores = CompactedTable(kafka, catalog.vector_stores, VectorStoreRecord)
        self.documents = CompactedTable(kafka, catalog.documents, DocumentState)
        self._answers: dict[str, asyncio.Future[BaseModel]] = {}
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def session(cls, kafka: Connectable, catalog: TopicCatalog, *, name: str | None = None,
                      client_id: str = "specstream-rag-cli", documents: bool = True) -> AsyncIterator[RagClient]:
        """``name``: of the reply topic (default ``cli-<random>``); ``documents``: follow the documents' table too."""
        reply = catalog.replies(name or f"cli-{uuid.uuid4().hex[:10]}")
        async with clients.reply_session(kafka, reply, client_id=client_id) as (replies, producer):
            client = cls(kafka, catalog, replies, producer, reply.name)
            tables = [client.stores, client.documents] if documents else [client.stores]
            for table in tables:
                await table.start()
            client._reader = asyncio.create_task(client._read())
            try:
                yield client
            finally:
                await clients.stop_polling(client._reader, None)
                for table in tables:
                    await table.stop()

    def store(self, ref: str) -> VectorStoreRecord:
        """A store by id, or by name when exactly one store has it."""
        record = self.stores.get(ref)
        if record is not None:
            return record
        named = [s for s in self.stores.values() if s.name == ref]
        if len(named) != 1:
            raise RagError(f"no vector store with id or name {ref!r}" if not named else
                           f"{len(named)} vector stores are named {ref!r}; give the id ({', '.join(s.id for s in named)})")
        return named[0]

    def documents_of(self, store_id: str) -> list[DocumentState]:
        return [d for d in self.documents.values() if d.vector_store_id == store_id]

    async def publish(self, topic: str, key: str, event: BaseModel | None) -> None:
        await self.producer.send_and_wait(topic, None if event is None else clients.encode(event), key=key.encode())

    async def search(self, store_ids: list[str], *, tenant: str, query: str, max_num_results: int = 4,
                     filters: dict[str, Any] | None = None, hybrid: bool | None = None,
                     timeout_s: float = 60.0) -> SearchResults:
        """A tenant's search on the retrieval topic (the retriever refuses a store of another tenant); RagError for
        its ErrorEvent, RagTimeout for no answer in time."""
        request = RetrievalRequest(
            request_id=f"cli-{uuid.uuid4().hex}", reply_to=ReplyRoute(topic=self.reply_topic), op="search",
            tenant=tenant,
            search=FileSearch(vector_store_ids=store_ids, query=query, max_num_results=max_num_results,
                              filters=filters, hybrid=hybrid))
        answer = await self.await_final(self.catalog.retrieval.name, request.request_id, request, timeout_s=timeout_s)
        return _expected(answer, SearchResults)

    async def command(self, op: Literal["prepare", "swap", "count", "canary"], store_id: str, *, version: int,
                      query: str = "", timeout_s: float = 60.0) -> IndexState | SearchResults:
        """Index administration on the index-commands topic: IndexState (SearchResults for a canary); RagError for the
        service's ErrorEvent, RagTimeout for no answer in time."""
        command = IndexCommand(request_id=f"cli-{uuid.uuid4().hex}", reply_to=ReplyRoute(topic=self.reply_topic),
                               op=op, vector_store_id=store_id, version=version, query=query)
        answer = await self.await_final(self.catalog.index_commands.name, command.request_id, command,
                                        timeout_s=timeout_s)
        return _expected(answer, SearchResults if op == "canary" else IndexState)

    async def await_final(self, topic: str, request_id: str, message: BaseModel, *, timeout_s: float = 300.0) -> Any:
        """Publish `message` and wait for its request's final answer (not a chunk, not the passages)."""
        answer: asyncio.Future[BaseModel] = asyncio.get_running_loop().create_future()
        self._answers[request_id] = answer
        try:
            await self.publish(topic, request_id, message)
            event = await asyncio.wait_for(answer, timeout_s)
        except TimeoutError:
            raise RagTimeout(f"no answer to {request_id} within {timeout_s:.0f} s (is `specstream rag` "
                           "running?)") from None
        finally:
            self._answers.pop(request_id, None)
        if isinstance(event, ErrorEvent):
            raise RagError(f"{event.code}: {event.message}")
        return event

    async def _read(self) -> None:
        while True:
            for records in (await self.replies.getmany(timeout_ms=200)).values():
                for record in records:
                    with contextlib.suppress(Exception):
                        event = clients.decode_reply(record.value)
                        if isinstance(event, (TokenChunk, Retrieved)):
                            continue
                        waiting = self._answers.get(getattr(event, "request_id", None) or "")
                        if waiting is not None and not waiting.done():
                            waiting.set_result(event)


AnswerT = TypeVar("AnswerT", bound=BaseModel)


def _expected(answer: BaseModel, kind: type[AnswerT]) -> AnswerT:
    if not isinstance(answer, kind):
        raise RagError(f"the rag service answered {type(answer).__name__}, not {kind.__name__}")
    return answer
