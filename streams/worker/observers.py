"""What the engine worker tells telemetry and the completions log, on the foundation's hooks.

:class:`ServiceTelemetry` is the foundation's telemetry of every consumer (consumer and producer spans, message
and bus metrics, /metrics), on the worker's tracer and registry; the engine-specific calls (received with the
parsed request, each engine step, the engine's finish) are the worker's own. :class:`CompletionsLog` records each
delivered answer on the completions topic before the request's offset is committed (a crash in between regenerates
the request, which may then be recorded twice: readers deduplicate by request_id).
"""
from __future__ import annotations

import asyncio
import logging

from schemas.events import Completion, ErrorEvent
from streams.kafka import clients
from streams.config import TelemetrySettings
from streams.worker.completions_log import completion_record
from streams.service.delivery import Delivery
from streams.service.consumer_telemetry import ConsumerTelemetry
from streams.telemetry.metrics import ConsumerMetrics
from streams.worker.telemetry import WorkerTelemetry

log = logging.getLogger("specstream.worker")


class ServiceTelemetry(ConsumerTelemetry):
    """The foundation's telemetry of every consumer, sharing the worker's tracer and registry, which also tells
    the worker's own telemetry when a request is over (the batch lane's too: it is :meth:`beside` this one)."""

    def __init__(self, worker: WorkerTelemetry, settings: TelemetrySettings, *, kind: str) -> None:
        metrics = ConsumerMetrics(worker.metrics.registry, kind) if worker.metrics is not None else None
        super().__init__(kind, worker.group_id, worker.tracing, metrics, host=settings.metrics.worker_host,
                         port=settings.metrics.worker_port)
        self.worker = worker

    def settled(self, delivery: Delivery, failures: int) -> None:
        super().settled(delivery, failures)
        self.worker.settled(delivery.request_id)

    def handed_back(self, delivery: Delivery) -> None:
        super().handed_back(delivery)
        self.worker.settled(delivery.request_id)


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
            await delivery.outlet.publish(self.topic, None, clients.request_key(record.request_id), record,
                                          origin=delivery)
        except Exception as error:  # noqa: BLE001 - the client has its answer; only the log misses it
            log.error("could not record %s in %s: %s", record.request_id, self.topic, error)

