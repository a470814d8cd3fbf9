"""The one place where telemetry hooks into every consumer.

The foundation calls these hooks at each step of a message's life; the default
does nothing. Traces and metrics (the observability issue) subclass
:class:`Telemetry` and pass it to :class:`~streams.service.runner.ConsumerService`,
so no consumer has to instrument itself.
"""
from __future__ import annotations

from streams.service.delivery import Delivery
from streams.service.intake import Rejection
from streams.service.offsets import Source


class Telemetry:
    def received(self, source: Source) -> None:
        """A message was read from the input topic."""

    def rejected(self, source: Source, rejection: Rejection) -> None:
        """A message was answered without reaching the handler (and dead-lettered if ``rejection.dead_letter``)."""

    def settled(self, delivery: Delivery, failures: int) -> None:
        """A delivery's outcome is acknowledged by Kafka (``failures`` events could not be published)."""

    def handed_back(self, delivery: Delivery) -> None:
        """A delivery was given up unanswered (rebalance or drain timeout); Kafka redelivers it."""
