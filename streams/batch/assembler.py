"""The batch assembler: a consumer on the foundation (``batch-assembler``) of ``<prefix>.batch-results``.

Each answer to a batch line (a ``Completion`` or ``ErrorEvent`` keyed ``<batch id>.<line>``) becomes its line
of the output or error file (:mod:`streams.batch.outputs`), recorded in the batch's journal
(:mod:`streams.batch.journal`) before its offset is committed, once per custom_id: a line answered twice (a
worker killed mid-line, an assembler restarted before its commit) is counted as a duplicate and written once.
Progress (``request_counts``) goes to the batches topic every ``batch.assembler.progress_interval_s``; when every
line has an outcome the batch is finalized: its files are written to the files store and its final state
published (completed, expired when some lines expired, cancelled when it was being cancelled).

At start, after reading the batches topic, it finalizes any batch whose journal is already complete (killed
between its last answer and its final state); the files' ids are derived from the batch's
(:func:`~streams.batch.files.batch_file_id`), so files written before the kill are found and reused, not copied.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from schemas.batch import BatchLineReply, BatchState, parse_line_request_id
from schemas.documents import FileObject
from schemas.events import GenerateRequest
from streams.batch.book import TERMINAL, BatchBook
from streams.batch.files import (
    BatchFileMissing,
    BatchFiles,
    StoreFiles,
    batch_file_id,
    journal_dir,
    store_of,
)
from streams.batch.journal import Journal
from streams.batch.lines import line_request
from streams.batch.outputs import outcome_of
from streams.batch.validation import InvalidBatchFile, parse_batch_file
from streams.config import Settings
from streams.kafka import clients
from streams.kafka.acls import assembler_grants
from streams.service import Consumer, Delivery, Output, ServiceOptions
from streams.service.app import serve
from streams.service.runner import ConsumerService

log = logging.getLogger("specstream.batch.assembler")
ASSEMBLER_KIND = "batch-assembler"
RETRY_S = 5.0


@dataclass
class _Line:
    custom_id: str
    request: GenerateRequest


@dataclass
class _Batch:
    lines: dict[int, _Line]
    journal: Journal
    published_at: float = 0.0


class BatchAssembler:
    """``files``/``journals``: by default its own files store (``files.dir``) and journals beside its blobs."""

    def __init__(self, settings: Settings, files: BatchFiles | None = None, *, journals: Path | None = None) -> None:
        self.settings = settings
        self.catalog = catalog = settings.catalog
        section = settings.batch.assembler
        self._store = store_of(settings, f"specstream-{ASSEMBLER_KIND}-{section.resolved_id()}") \
            if files is None else None
        self.files: BatchFiles = files if files is not None else StoreFiles(self._store)
        self.journal_dir = journals if journals is not None else journal_dir(self._store)
        self.book = BatchBook(settings.kafka, catalog.batches)
        self._batches: dict[str, _Batch] = {}
        self._finalizing: set[str] = set()
        self._retries: set[asyncio.Task[None]] = set()
        self.service = ConsumerService(ServiceOptions.from_settings(settings, section), Consumer(
            kind=ASSEMBLER_KIND, topic=catalog.batch_results, input_model=BatchLineReply, handle=self._on_answer,
            outputs=[Output(catalog.batches, BatchState), Output(catalog.files, FileObject)], group_id=section.resolved_group_id(catalog.prefix),
            key_of=lambda reply: reply.request_id, route_of=lambda reply: None, grants=assembler_grants,
            prepare=self._prepare, started=self._sweep, close=self._close,
        ))

    @property
    def duplicates(self) -> int:
        return sum(b.journal.duplicates for b in self._batches.values())

    async def _prepare(self) -> None:
        if self._store is not None:
            await self._store.start()
        await self.book.start()
        await self.book.caught_up.wait()

    async def _close(self) -> None:
        for task in self._retries:
            task.cancel()  # the next start's sweep finalizes what is left
        await self.book.stop()
        if self._store is not None:
            await self._store.stop()

    async def _sweep(self) -> None:
        for state in list(self.book.batches.values()):
            if state.status not in TERMINAL:
                batch = await self._batch(state)
                if batch is not None and len(batch.journal.outcomes) >= state.request_counts.total:
                    await self._finalize_until_done(state, batch)

    # --- one answer -------------------------------------------------------------------------------------------------

    async def _on_answer(self, reply: BatchLineReply, delivery: Delivery) -> None:
        ids = parse_line_request_id(reply.request_id)
        state = self.book.get(ids[0]) if ids is not None else None
        if ids is None or state is None:
            log.warning("answer %s belongs to no known batch; dropped", reply.request_id or delivery.source)
            return
        if state.status in TERMINAL:
            return  # a late copy of an answer already in the batch's files
        batch = await self._batch(state)
        line = batch.lines.get(ids[1]) if batch is not None else None
        if batch is None or line is None:
            log.warning("answer %s: no such line in batch %s", reply.request_id, state.id)
            return
        # Synced to disk before this answer's offset is committed (answers are handled one at a time).
        await asyncio.to_thread(batch.journal.add, outcome_of(line.request, line.custom_id, ids[1], reply.root))
        if len(batch.journal.outcomes) >= state.request_counts.total:
            await self._finalize_until_done(state, batch)
        elif time.monotonic() - batch.published_at >= self.settings.batch.assembler.progress_interval_s:
            batch.published_at = time.monotonic()
            self._publish(self._progress(state, batch))

    async def _batch(self, state: BatchState) -> _Batch | None:
        """The batch's lines (rebuilt from its input file as the edge built them) and its journal."""
        batch = self._batches.get(state.id)
        if batch is not None:
            return batch
        try:
            _, data = await self.files.read(state.input_file_id, state.tenant)
            parsed = parse_batch_file(data, self.settings.batch)
        except (BatchFileMissing, InvalidBatchFile) as error:
            log.error("batch %s: cannot read its input file %s: %s", state.id, state.input_file_id, error)
            return None
        lines = {ln.number: _Line(ln.custom_id, line_request(
            ln, batch_id=state.id, tenant=state.tenant, results_topic=self.catalog.batch_results.name,
            expires_at=state.expires_at, edge=self.settings.edge, now=state.created_at)) for ln in parsed}
        journal = await asyncio.to_thread(Journal, self.journal_dir / f"{state.id}.jsonl")
        batch = self._batches[state.id] = _Batch(lines, journal)
        return batch

    # --- state ------------------------------------------------------------------------------------------------------

    def _progress(self, state: BatchState, batch: _Batch, **update: object) -> BatchState:
        journal = batch.journal
        counts = state.request_counts.model_copy(update={
            "completed": journal.count("completed"), "failed": journal.count("failed", "expired", "cancelled")})
        return self.book.apply(state.model_copy(update={
            "request_counts": counts, "answered": len(journal.outcomes), "at": time.time(), **update}))

    def _publish(self, state: BatchState) -> asyncio.Future[object]:
        return self.service.publish(self.catalog.batches.name, None, clients.request_key(state.id), state)

    async def _finalize_until_done(self, state: BatchState, batch: _Batch) -> None:
        """Finalize now; if the files store or Kafka fails, keep trying in the background (the journal already
        holds every answer, so the answers' offsets may be committed meanwhile)."""
        try:
            await self._finalize(state, batch)
        except Exception as error:  # noqa: BLE001 - retried below; the batch is not lost
            log.warning("batch %s: could not finalize (%s); retrying", state.id, error)
            task = asyncio.create_task(self._retry_finalize(state, batch), name=f"finalize-{state.id}")
            self._retries.add(task)
            task.add_done_callback(self._retries.discard)

    async def _retry_finalize(self, state: BatchState, batch: _Batch) -> None:
        while True:
            await asyncio.sleep(RETRY_S)
            try:
                await self._finalize(state, batch)
                return
            except Exception as error:  # noqa: BLE001 - keep trying until it is written
                log.warning("batch %s: could not finalize (%s); retrying in %.0f s", state.id, error, RETRY_S)

    async def _finalize(self, state: BatchState, batch: _Batch) -> None:
        if state.id in self._finalizing:
            return
        self._finalizing.add(state.id)
        try:
            now = int(time.time())
            cancelling = self.book.get(state.id).status == "cancelling"  # type: ignore[union-attr]
            if not cancelling:
                await self._publish(self._progress(state, batch, status="finalizing", finalizing_at=now))
            output, errors = self._files_of(batch)
            output_id = await self._write(state, "output", output)
            error_id = await self._write(state, "error", errors)
            status, stamp = ("cancelled", "cancelled_at") if cancelling else (
                ("expired", "expired_at") if batch.journal.count("expired") else ("completed", "completed_at"))
            final = self._progress(state, batch, status=status, output_file_id=output_id, error_file_id=error_id,
                                   **{stamp: int(time.time())})
            await self._publish(final)
            log.info("batch %s %s: %d completed, %d failed, %d duplicate answer(s) dropped", state.id, status,
                     final.request_counts.completed, final.request_counts.failed, batch.journal.duplicates)
        finally:
            self._finalizing.discard(state.id)

    async def _write(self, state: BatchState, kind: str, data: bytes) -> str | None:
        if not data:
            return None
        return await self.files.write(state.tenant, f"{state.id}_{kind}.jsonl", data,
                                      file_id=batch_file_id(state.id, kind))

    @staticmethod
    def _files_of(batch: _Batch) -> tuple[bytes, bytes]:
        output, errors = [], []
        for outcome in batch.journal.in_order():
            (output if outcome.to_output_file else errors).append(outcome.dumps() + "\n")
        return "".join(output).encode(), "".join(errors).encode()


async def run_assembler(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM, then drain and stop (exit 0)."""
    await serve(BatchAssembler(settings).service)
