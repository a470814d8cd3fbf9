"""Exceptions raised by the local Kafka tooling.

Every message is meant to be shown to a person as one line, so callers (the CLI,
pytest fixtures) can print ``str(error)`` without a traceback.
"""

from __future__ import annotations


class KafkaInfraError(RuntimeError):
    """Base class: something about the local Kafka setup is wrong."""


class JavaError(KafkaInfraError):
    """Java is missing or too old to run the broker."""


class JarResolutionError(KafkaInfraError):
    """Maven could not produce the broker's classpath."""


class BrokerStartError(KafkaInfraError):
    """A broker process could not be started, or died while starting."""


class NotReadyError(KafkaInfraError):
    """The broker(s) did not become ready before the deadline."""
