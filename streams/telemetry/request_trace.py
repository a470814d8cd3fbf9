"""One request's spans in an engine worker.

::

    process <requests topic>      CONSUMER  consumed -> final reply acknowledged   (the foundation's)
    ├── engine queue                        consumed -> first scheduled step
    ├── engine prefill                      first scheduled step -> first token
    ├── engine decode                       first token -> finish; one event per engine step
    ├── publish <reply topic>     PRODUCER  first chunk handed to the producer -> acknowledged (the foundation's)
    └── publish <completions>     PRODUCER  the completions record (the foundation's)

The consumer span and the producer spans are the foundation's, as for every consumer
(:mod:`streams.service.message_trace`); this module adds the engine's stages under it.

The engine reports queue, prefill and decode times once, when the request finishes
(``RequestStats``), so those spans are written then with their real start and end times; the
engine thread itself never touches a span. Per step only a tuple is kept (batch size, tokens,
drafted, accepted), and only for traced requests.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Status, StatusCode

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

    @classmethod
    def within(cls, tracer: trace.Tracer, span: trace.Span, request: GenerateRequest,
               received_at: float) -> RequestTrace:
        """The engine's stages of ``request``, under its consumer span ``span``."""
        span.set_attributes({"specstream.tenant": request.tenant, "gen_ai.request.model": request.model,
                             "gen_ai.request.max_tokens": request.sampling.max_tokens})
        return cls(tracer, span, received_at)

    def step(self, at: float, batch_size: int, tokens: int, drafted: int, accepted: int) -> None:
        self.steps.append(Step(at, batch_size, tokens, drafted, accepted))

    def engine_done(self, stats: RequestStats | None, finish_reason: str | None) -> None:
        """Write the queue, prefill and decode spans."""
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

    def failed(self, code: str, message: str) -> None:
        self.span.set_status(Status(StatusCode.ERROR, f"{code}: {message}"))
        self.span.set_attribute("error.type", code)

    def _closed(self, name: str, parent: Context, start: float, end: float,
                attributes: dict[str, int] | None = None) -> None:
        self.tracer.start_span(name, context=parent, start_time=_ns(start), attributes=attributes).end(
            end_time=_ns(max(start, end)))
