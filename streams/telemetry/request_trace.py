"""One request's spans in an engine worker.

::

    process <requests topic>      CONSUMER  consumed -> final reply acknowledged   (parent: the edge's publish span)
    ├── engine queue                        consumed -> first scheduled step
    ├── engine prefill                      first scheduled step -> first token
    ├── engine decode                       first token -> finish; one event per engine step
    └── publish <reply topic>     PRODUCER  final event handed to the producer -> acknowledged

The engine reports queue, prefill and decode times once, when the request finishes
(``RequestStats``), so those spans are written then with their real start and end times; the
engine thread itself never touches a span. Per step only a tuple is kept (batch size, tokens,
drafted, accepted), and only for traced requests.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from engine.outputs import RequestStats
from schemas.events import GenerateRequest


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


@dataclass(frozen=True)
class Step:
    at: float
    batch_size: int
    tokens: int
    drafted: int
    accepted: int


@dataclass
class RequestTrace:
    tracer: trace.Tracer
    span: trace.Span
    received_at: float
    steps: list[Step] = field(default_factory=list)
    reply: trace.Span | None = None

    @classmethod
    def start(cls, tracer: trace.Tracer, request: GenerateRequest, topic: str, partition: int,
              parent: Context | None, received_at: float) -> RequestTrace:
        parent_span = trace.get_current_span(parent).get_span_context() if parent is not None else None
        span = tracer.start_span(
            f"process {topic}", context=parent, kind=SpanKind.CONSUMER, start_time=_ns(received_at),
            # The link is the messaging convention's; the parent makes it one trace with the edge's spans.
            links=[Link(parent_span)] if parent_span is not None else None,
            attributes={
                "messaging.system": "kafka", "messaging.operation.type": "process",
                "messaging.destination.name": topic, "messaging.destination.partition.id": str(partition),
                "messaging.message.id": request.request_id, "specstream.request_id": request.request_id,
                "specstream.tenant": request.tenant, "gen_ai.request.model": request.model,
                "gen_ai.request.max_tokens": request.sampling.max_tokens,
            },
        )
        return cls(tracer, span, received_at)

    def step(self, at: float, batch_size: int, tokens: int, drafted: int, accepted: int) -> None:
        self.steps.append(Step(at, batch_size, tokens, drafted, accepted))

    def engine_done(self, stats: RequestStats | None, finish_reason: str | None, now: float) -> None:
        """Write the queue, prefill and decode spans, then open the reply's publish span."""
        parent = trace.set_span_in_context(self.span)
        start = self.received_at
        if stats is not None:
            queued, first = start + max(0.0, stats.queued_s), start + max(0.0, stats.ttft_s)
            end = start + max(0.0, stats.total_s)
            self._closed("engine queue", parent, start, queued)
            self._closed("engine prefill", parent, queued, first, {"gen_ai.usage.input_tokens": stats.prompt_tokens})
            decode = self.tracer.start_span("engine decode", context=parent, start_time=_ns(first), attributes={
                "gen_ai.usage.output_tokens": stats.completion_tokens,
                "specstream.spec.drafted": stats.spec.drafted, "specstream.spec.accepted": stats.spec.accepted,
                "specstream.tokens_per_forward": stats.tokens_per_forward,
            })
            for step in self.steps:
                decode.add_event("engine step", timestamp=_ns(step.at), attributes={
                    "batch_size": step.batch_size, "tokens": step.tokens,
                    "drafted": step.drafted, "accepted": step.accepted,
                })
            decode.end(end_time=_ns(max(end, first)))
        if finish_reason is not None:
            self.span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
        self.steps.clear()
        self.reply = self.tracer.start_span("publish reply", context=parent, kind=SpanKind.PRODUCER,
                                            start_time=_ns(now), attributes={"messaging.system": "kafka",
                                                                             "messaging.operation.type": "publish"})

    def failed(self, code: str, message: str) -> None:
        self.span.set_status(Status(StatusCode.ERROR, f"{code}: {message}"))
        self.span.set_attribute("error.type", code)

    def end(self, undelivered: int = 0) -> None:
        """The final reply is acknowledged (or given up): close the publish and process spans."""
        if self.reply is not None:
            if undelivered:
                self.reply.set_status(Status(StatusCode.ERROR, f"{undelivered} reply event(s) not delivered"))
            self.reply.end()
        self.span.end()

    def _closed(self, name: str, parent: Context, start: float, end: float,
                attributes: dict[str, int] | None = None) -> None:
        self.tracer.start_span(name, context=parent, start_time=_ns(start), attributes=attributes).end(
            end_time=_ns(max(start, end)))
