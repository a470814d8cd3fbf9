"""Logging for every process: text (the default) or JSON, one switch (``log_format``).

In JSON each line is one object: ``ts``, ``level``, ``logger``, ``message``, ``request_id`` and
``trace_id`` (null outside a request), and ``exc`` with a traceback. The request id and trace id
come from a context variable that the edge and the worker set while they handle a request
(:func:`bind_request`); the trace id falls back to the current span's.

What is never logged: prompts and API keys. The Kafka client logs whole messages (prompts,
completions) at DEBUG, so its payload loggers stay at INFO whatever ``log_level`` says.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

from opentelemetry import trace

# aiokafka's loggers whose DEBUG records carry message bytes ("Sending (key=... value=...)", fetch responses).
_PAYLOAD_LOGGERS = ("aiokafka.producer.producer", "aiokafka.conn", "aiokafka.consumer.fetcher",
                    "aiokafka.producer.sender", "aiokafka.producer.message_accumulator")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_request: contextvars.ContextVar[tuple[str | None, str | None]] = contextvars.ContextVar(
    "specstream_log_request", default=(None, None))


def bind_request(request_id: str | None, trace_id: str | None = None) -> None:
    """Log lines of the current task (and of tasks it starts from now on) carry this request id and trace id.

    In a task that serves many requests one after another (a consumer's loop), call it inside :func:`request_scope`.
    """
    _request.set((request_id, trace_id))


@contextlib.contextmanager
def request_scope() -> Iterator[None]:
    """What :func:`bind_request` binds inside this block is unbound at its end."""
    token = _request.set(_request.get())
    try:
        yield
    finally:
        _request.reset(token)


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id in a W3C ``traceparent`` (``00-<trace id>-<span id>-<flags>``), or None."""
    parts = traceparent.split("-") if traceparent else []
    return parts[1] if len(parts) == 4 and len(parts[1]) == 32 else None


class _RequestFields(logging.Filter):
    """Adds ``request_id`` and ``trace_id`` to every record (a handler filter: it sees every logger's records)."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id, trace_id = _request.get()
        if trace_id is None:
            span_context = trace.get_current_span().get_span_context()
            if span_context.is_valid:
                trace_id = format(span_context.trace_id, "032x")
        record.request_id = request_id
        record.trace_id = trace_id
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", None),
            "trace_id": getattr(record, "trace_id", None),
        }
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False, default=str)


class _ThrottleMissingTopicErrors(logging.Filter):
    """Reply topics come and go (an edge shuts down, `specstream send` deletes its own), but the producer keeps
    asking for every topic it ever wrote to and logs an ERROR per metadata refresh (several a second) for each one
    that is gone; a reader of a topic deleted under it asks in a loop without backoff (thousands a second, until
    streams.kafka.topic_watch restarts the process). Keep one line per topic and interval: enough to see it, not enough
    to bury everything else."""

    interval_s = 60.0

    def __init__(self) -> None:
        super().__init__()
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != "Topic %s not found in cluster metadata" or not record.args:
            return True
        topic = str(record.args[0] if isinstance(record.args, tuple) else record.args)
        now = time.monotonic()
        if now - self._last.get(topic, -self.interval_s) < self.interval_s:
            return False
        if len(self._last) > 10_000:
            self._last.clear()
        self._last[topic] = now
        return True


_missing_topic_throttle = _ThrottleMissingTopicErrors()


def throttle_missing_topic_errors() -> None:
    """Install the throttle on aiokafka's metadata logger; idempotent."""
    logger = logging.getLogger("aiokafka.cluster")
    if _missing_topic_throttle not in logger.filters:
        logger.addFilter(_missing_topic_throttle)


def configure_logging(level: str, log_format: str = "text") -> None:
    """Root handler on stderr in the chosen format; replaces handlers an earlier call installed."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    handler.addFilter(_RequestFields())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    throttle_missing_topic_errors()
    debug = logging.getLevelName(level) <= logging.DEBUG
    for name in _PAYLOAD_LOGGERS:
        # Their DEBUG records carry message bytes (prompts): never below INFO. Above DEBUG they follow their parent
        # (the CLI keeps the aiokafka family at WARNING: its per-connection INFO lines are noise).
        logging.getLogger(name).setLevel(logging.INFO if debug else logging.NOTSET)
