"""The one place where telemetry hooks into every consumer.

The foundation calls these hooks at each step of a message's life; this base
does nothing (telemetry off). :class:`~streams.service.consumer_telemetry.ConsumerTelemetry`
fills them with a consumer span per message, producer spans on its publishes and
the generic per-kind metrics; :class:`~streams.service.runner.ConsumerService`
builds it from ``ServiceOptions.telemetry``, so no consumer instruments itself.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from streams.service.delivery import Delivery
from streams.service.intake import Rejection

NO_HEADERS: Mapping[str, str] = {}


class Running(Protocol):
    """What telemetry reads of the running service (:class:`~streams.service.runner.ConsumerService`)."""

    kind: str
    group_id: str

    @property
    def in_flight(self) -> int: ...

    def input_consumer(self) -> Any: ...  # the aiokafka consumer of the input topic, None until started


class Telemetry:
    metrics_url: str | None = None  # where this service's /metrics is served (announced)

    def beside(self, kind: str, group_id: str) -> Telemetry:
        """The telemetry of another consumer in this process: one /metrics (one port) and one tracer for all."""
        return self

    def start(self, service: Running) -> None:
        """Before the first message: serve /metrics, start sampling lag (the service's event loop runs)."""

    def stop(self) -> None:
        """After the last message: stop serving and export what is buffered."""

    def admitted(self, delivery: Delivery) -> None:
        """A message passed intake and is about to be handled (``delivery.payload`` is its validated event)."""

    def rejected(self, delivery: Delivery, rejection: Rejection) -> None:
        """A message was answered without reaching the handler (and dead-lettered if ``rejection.dead_letter``)."""

    def publishing(self, delivery: Delivery, topic: str) -> Mapping[str, str]:
        """An event of ``delivery`` is about to be published to ``topic``: the Kafka headers to add (traceparent)."""
        return NO_HEADERS

    def dead_lettered(self, reason: str) -> None:
        """A dead letter was published, for ``reason`` ('<code>: <message>')."""

    def settled(self, delivery: Delivery, failures: int) -> None:
        """A delivery's outcome is acknowledged by Kafka (``failures`` events could not be published)."""

    def handed_back(self, delivery: Delivery) -> None:
        """A delivery was given up unanswered (rebalance or drain timeout); Kafka redelivers it."""
