"""The edge's side of batch jobs: create one (its lines onto the bus), read, list and cancel them.

Creating a batch reads its input file, fits each line to the context as an interactive request is
(:mod:`streams.edge.batches.sizing`), checks the tenant's batch budget (:mod:`streams.edge.batches.quota`), publishes the state
``validating``, every line as a request on ``<prefix>.batch-lines`` (acknowledged by Kafka), then
``in_progress``. Cancelling publishes ``cancelling``: workers then answer the lines not started yet
``cancelled`` at once, and the assembler ends the batch ``cancelled`` with what finished. The batches topic is
the only state: every edge follows it (:class:`~streams.batch.book.BatchBook`), so any edge answers for any batch.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError

from schemas.batch import BatchRequestCounts, BatchState
from schemas.events import GenerateRequest
from streams.batch.book import TERMINAL, BatchBook
from streams.batch.files import BatchFileMissing, BatchFiles
from streams.batch.lines import line_request
from streams.batch.validation import InvalidBatchFile, parse_batch_file
from streams.edge.batches.quota import BatchCost, check_batch_quota
from streams.edge.batches.sizing import fit_lines
from streams.edge.keys import TenantLimits
from streams.edge.settings import EdgeOptions
from streams.edge.tokenizers import Tokenizers
from streams.kafka import clients
from streams.wire.batch_models import BatchErrors, BatchObject
from streams.wire.errors import EdgeError

COMPLETION_WINDOWS_S = {"24h": 24 * 3600}
CATCH_UP_S = 10.0


def batch_not_found(batch_id: str) -> EdgeError:
    return EdgeError(404, f"No batch found with id '{batch_id}'.", param="batch_id", code="batch_not_found")


class BatchDesk:
    def __init__(self, options: EdgeOptions, files: BatchFiles, producer: Any) -> None:
        self.options = options
        self.files = files
        self._producer = producer  # () -> the edge's started AIOKafkaProducer
        self.catalog = options.catalog
        self.book = BatchBook(options.kafka, self.catalog.batches)

    async def start(self) -> None:
        await self.book.start()

    async def stop(self) -> None:
        await self.book.stop()

    async def _caught_up(self) -> None:
        try:
            await asyncio.wait_for(self.book.caught_up.wait(), CATCH_UP_S)
        except TimeoutError:
            raise EdgeError(503, f"still reading {self.catalog.batches.name}; try again", type="server_error",
                            code="not_ready") from None

    async def get(self, tenant: str, batch_id: str) -> BatchState:
        """The tenant's batch; one created through another edge a moment ago is found (a miss catches up first)."""
        await self._caught_up()
        try:
            state = await self.book.find(batch_id)
        except (TimeoutError, KafkaError):
            raise EdgeError(503, f"could not catch up with {self.catalog.batches.name}; try again",
                            type="server_error", code="not_ready") from None
        if state is None or state.tenant != tenant:
            raise batch_not_found(batch_id)
        return state

    async def list(self, tenant: str, *, after: str | None, limit: int) -> tuple[list[BatchState], bool]:
        """Newest first (OpenAI's order), from just past ``after``."""
        await self._caught_up()
        mine = sorted((s for s in self.book.batches.values() if s.tenant == tenant),
                      key=lambda s: (s.created_at, s.id), reverse=True)
        if after is not None:
            ids = [s.id for s in mine]
            mine = mine[ids.index(after) + 1:] if after in ids else []
        return mine[:limit], len(mine) > limit

    async def create(self, tenant: str, *, input_file_id: str, endpoint: str, metadata: dict[str, str] | None,
                     limits: TenantLimits, tokenizers: Tokenizers, log_prompt: bool = True) -> BatchState:
        """Check the batch against its tenant's batch budget (:mod:`streams.edge.batches.quota`), then put it on the bus."""
        await self._caught_up()
        lines = await self._lines(tenant, input_file_id)
        now = time.time()
        batch_id = f"batch_{uuid.uuid4().hex}"
        built = [line_request(ln, batch_id=batch_id, tenant=tenant, expires_at=int(now) + COMPLETION_WINDOWS_S["24h"],
                              results_topic=self.catalog.batch_results.name, edge=self.options.edge,
                              log_prompt=log_prompt, now=int(now)) for ln in lines]
        requests, tokens = await fit_lines(built, [ln.body.max_new_tokens() is not None for ln in lines], tokenizers)
        check_batch_quota(self.book.batches.values(), tenant, limits, BatchCost(len(lines), tokens), now)
        state = BatchState(
            id=batch_id, tenant=tenant, endpoint=endpoint, input_file_id=input_file_id,  # type: ignore[arg-type]
            status="validating", created_at=int(now), expires_at=int(now) + COMPLETION_WINDOWS_S["24h"],
            metadata=metadata, request_counts=BatchRequestCounts(total=len(lines)), estimated_tokens=tokens, at=now,
        )
        # In the book before the next await: a second create of the tenant on this edge counts this one.
        self.book.apply(state)
        try:
            await self._publish(state)
            await self._send_lines(requests)
        except Exception as error:
            self.book.apply(state.model_copy(update={"status": "failed", "failed_at": int(time.time()),
                                                     "at": time.time()}))
            with contextlib.suppress(Exception):
                await self._publish(self.book.batches[state.id])
            raise EdgeError(503, f"could not publish the batch's lines: {error!r}", type="server_error",
                            code="kafka_unavailable") from error
        return await self._publish(state.model_copy(update={"status": "in_progress", "in_progress_at": int(time.time()),
                                                            "at": time.time()}))

    async def _send_lines(self, requests: list[GenerateRequest]) -> None:
        producer: AIOKafkaProducer = self._producer()
        topic = self.catalog.batch_lines.name
        # Every line in the producer's buffer first (batched sends), then every acknowledgement.
        sends = [await producer.send(topic, clients.encode(r), key=clients.request_key(r.request_id))
                 for r in requests]
        await asyncio.gather(*sends)

    async def _lines(self, tenant: str, input_file_id: str) -> list[Any]:
        try:
            purpose, data = await self.files.read(input_file_id, tenant)
        except BatchFileMissing:
            raise EdgeError(404, f"No such File object: {input_file_id}", param="input_file_id") from None
        if purpose != "batch":
            raise EdgeError(400, f"File {input_file_id} has purpose '{purpose}'; a batch needs a file uploaded "
                            "with purpose 'batch'.", param="input_file_id", code="invalid_value")
        try:
            # Each line calls its own url (chat and completions may share a batch); `endpoint` is the batch's label.
            lines = parse_batch_file(data, self.options.settings.batch)
        except InvalidBatchFile as invalid:
            error = invalid.edge_error()
            error.param = "input_file_id"
            raise error from None
        return lines

    async def cancel(self, tenant: str, batch_id: str) -> BatchState:
        state = await self.get(tenant, batch_id)
        if state.status in ("cancelling", "cancelled"):
            return state
        if state.status in TERMINAL or state.status == "finalizing":
            raise EdgeError(409, f"Batch '{batch_id}' is {state.status} and can no longer be cancelled.",
                            param="batch_id", code="batch_not_cancellable")
        return await self._publish(state.model_copy(update={"status": "cancelling", "cancelling_at": int(time.time()),
                                                            "at": time.time()}))

    async def _publish(self, state: BatchState) -> BatchState:
        producer: AIOKafkaProducer = self._producer()
        await producer.send_and_wait(self.catalog.batches.name, clients.encode(state),
                                     key=clients.request_key(state.id))
        return self.book.apply(state)


def batch_object(state: BatchState) -> BatchObject:
    """OpenAI's Batch object."""
    fields = state.model_dump(exclude={"schema_version", "type", "tenant", "answered", "estimated_tokens", "errors",
                                       "at"})
    errors = BatchErrors(object="list", data=state.errors) if state.errors else None
    return BatchObject(**fields, object="batch", errors=errors, model=None, usage=None)
