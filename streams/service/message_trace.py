"""One consumed message's spans, for every consumer on the foundation.

::

    process <input topic>     CONSUMER  consumed -> outcome acknowledged by Kafka  (parent: the producer's span)
    └── publish <topic>       PRODUCER  first event to that topic handed over -> the delivery settled

The consumer span continues the W3C ``traceparent`` of the record's Kafka headers, else of the event's ``trace``
field (which survives a dead-letter redrive, where headers do not). One producer span per destination topic, not
per event: an engine worker publishes a chunk per token, and a span each would cost more than the answer. Every
record published carries its producer span's context in its headers, so the next consumer continues the trace.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from pydantic import BaseModel

from schemas.events import ErrorEvent, TraceContext
from streams.service.delivery import Delivery
from streams.telemetry import tracing as tracing_mod


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _trace_field(payload: BaseModel | None) -> TraceContext | None:
    field_value = getattr(payload, "trace", None)
    return field_value if isinstance(field_value, TraceContext) else None


@dataclass
class MessageTrace:
    tracer: trace.Tracer
    span: trace.Span
    producers: dict[str, trace.Span] = field(default_factory=dict)
    headers: dict[str, Mapping[str, str]] = field(default_factory=dict)  # per topic, computed once
    events: dict[str, int] = field(default_factory=dict)

    @classmethod
    def start(cls, tracer: trace.Tracer, delivery: Delivery, group_id: str) -> MessageTrace:
        source = delivery.source
        parent = tracing_mod.extract(delivery.headers, _trace_field(delivery.payload))
        parent_span = trace.get_current_span(parent).get_span_context() if parent is not None else None
        attributes: dict[str, str] = {
            "messaging.system": "kafka", "messaging.operation.type": "process",
            "messaging.destination.name": source.topic, "messaging.destination.partition.id": str(source.partition),
            "messaging.kafka.offset": str(source.offset), "messaging.consumer.group.name": group_id,
        }
        if delivery.request_id:
            attributes.update({"messaging.message.id": delivery.request_id, "specstream.request_id": delivery.request_id})
        span = tracer.start_span(
            f"process {source.topic}", context=parent, kind=SpanKind.CONSUMER, start_time=_ns(delivery.received_at),
            # The link is the messaging convention's; the parent makes it one trace with the producer's spans.
            links=[Link(parent_span)] if parent_span is not None else None, attributes=attributes,
        )
        return cls(tracer, span)

    def publishing(self, topic: str) -> Mapping[str, str]:
        """The headers of an event to ``topic``: its producer span's context (the span opens with the first)."""
        headers = self.headers.get(topic)
        if headers is None:
            producer = self.producers[topic] = self.tracer.start_span(
                f"publish {topic}", context=trace.set_span_in_context(self.span), kind=SpanKind.PRODUCER,
                attributes={"messaging.system": "kafka", "messaging.operation.type": "publish",
                            "messaging.destination.name": topic})
            headers = self.headers[topic] = tracing_mod.carrier_of(trace.set_span_in_context(producer))
        self.events[topic] = self.events.get(topic, 0) + 1
        return headers

    def end(self, delivery: Delivery, undelivered: int) -> None:
        """The outcome is acknowledged (or given up): close the producer spans, then the consumer span."""
        for topic, producer in self.producers.items():
            producer.set_attribute("messaging.batch.message_count", self.events.get(topic, 0))
            if undelivered:
                producer.set_status(Status(StatusCode.ERROR, f"{undelivered} event(s) of this message not delivered"))
            producer.end()
        self.producers.clear()
        final = delivery.final_event
        if isinstance(final, ErrorEvent):
            self.span.set_status(Status(StatusCode.ERROR, f"{final.code}: {final.message}"))
            self.span.set_attribute("error.type", final.code)
        self.span.end()


def rejected_span(tracer: trace.Tracer, delivery: Delivery, group_id: str, code: str, message: str) -> None:
    """A message refused before its handler: one consumer span, ended at once with the reason."""
    held = MessageTrace.start(tracer, delivery, group_id)
    held.span.set_status(Status(StatusCode.ERROR, f"{code}: {message}"))
    held.span.set_attribute("error.type", code)
    held.span.end()
