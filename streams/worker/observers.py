"""What the engine worker tells telemetry and the completions log, on the foundation's hooks.

The foundation calls :class:`ServiceTelemetry` at each step of a message's life (rejected, settled, handed
back); the engine-specific calls (received with the parsed request, each engine step, the engine's finish) are
the worker's own. :class:`CompletionsLog` records each delivered answer on the completions topic before the
request's offset is committed (a crash in between regenerates the request, which may then be recorded twice:
readers deduplicate by request_id).
"""
from __future__ import annotations

import asyncio
import logging
from schemas.events import Completion, ErrorEvent
from streams import kafka_io
from streams.eval.completions_log import completion_record
from streams.service.delivery import Delivery
from streams.service.intake import Rejection
from streams.service.offsets import Source
from streams.service.telemetry import Telemetry
from streams.telemetry.worker import WorkerTelemetry

log = logging.getLogger("specstream.worker")


class ServiceTelemetry(Telemetry):
    """The foundation's hooks, forwarded to the worker's traces and metrics."""

    def __init__(self, worker: WorkerTelemetry) -> None:
        self.worker = worker

    def rejected(self, source: Source, rejection: Rejection) -> None:
        if rejection.dead_letter:
            self.worker.dead_lettered(f"{rejection.code}: {rejection.message}")

    def settled(self, delivery: Delivery, failures: int) -> None:
        if failures:
            self.worker.publish_failed("reply")
        if delivery.request_id:
            self.worker.settled(delivery.request_id, failures)

    def handed_back(self, delivery: Delivery) -> None:
        if delivery.request_id:
            self.worker.handed_back(delivery.request_id, "handed back (rebalance or drain)")


class CompletionsLog:
    def __init__(self, topic: str, *, worker_id: str, fingerprint: str, enabled: bool) -> None:
        self.topic = topic
        self.worker_id = worker_id
        self.fingerprint = fingerprint
        self.enabled = enabled

    async def finish(self, delivery: Delivery, served_model: str | None) -> None:
        """Once the answer is acknowledged, record it (best effort), then let the delivery commit."""
        final, request = delivery.final_event, delivery.payload
        if self.enabled and isinstance(final, (Completion, ErrorEvent)) and request is not None:
            results = await asyncio.gather(*delivery.published, return_exceptions=True)
            if not any(isinstance(r, BaseException) for r in results):
                await self._record(delivery, final, served_model)
        delivery.finish()

    async def _record(self, delivery: Delivery, final: Completion | ErrorEvent, served_model: str | None) -> None:
        record = completion_record(delivery.payload, final, worker_id=self.worker_id,  # type: ignore[arg-type]
                                   fingerprint=self.fingerprint, served_model=served_model)
        try:
            await delivery.outlet.publish(self.topic, None, kafka_io.request_key(record.request_id), record)
        except Exception as error:  # noqa: BLE001 - the client has its answer; only the log misses it
            log.error("could not record %s in %s: %s", record.request_id, self.topic, error)

