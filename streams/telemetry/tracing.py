"""Tracing setup and W3C trace-context propagation.

Each process builds its own :class:`Tracing` (never the global tracer provider, so tests can
run an edge and a worker with separate providers in one process) from
``telemetry.tracing`` in the YAML and the standard OpenTelemetry variables:
``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``), ``OTEL_EXPORTER_OTLP_PROTOCOL``,
``OTEL_SERVICE_NAME``, ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG``. A YAML key that
is set wins over its variable; a null key leaves the variable (or the SDK's default) in charge.

Off (the default without an endpoint) means :func:`build_tracing` returns None: callers skip
every span, so tracing costs nothing when it is not wanted.

Context travels as ``traceparent``/``tracestate``: in Kafka record headers (what FastStream's
and other Kafka instrumentations read) and in ``GenerateRequest.trace`` (what survives a
dead-letter redrive, which keeps only the value).
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from schemas.events import TraceContext
from streams.config import TracingSettings

_PROPAGATOR = TraceContextTextMapPropagator()
_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
KafkaHeaders = Sequence[tuple[str, bytes]]


class Tracing:
    """A tracer provider of this process and its tracer."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer: trace.Tracer = provider.get_tracer("specstream")

    @classmethod
    def with_processor(cls, processor: SpanProcessor, service_name: str, sampler: Sampler | None = None) -> Tracing:
        """Tracing into a given span processor (tests: the SDK's in-memory exporter behind a SimpleSpanProcessor)."""
        provider = TracerProvider(sampler=sampler, resource=Resource.create({"service.name": service_name}),
                                  shutdown_on_exit=False)
        provider.add_span_processor(processor)
        return cls(provider)

    def shutdown(self) -> None:
        """Export what is buffered, then stop (bounded by the exporter's own timeout)."""
        self.provider.shutdown()


def tracing_enabled(settings: TracingSettings, env: Mapping[str, str] = os.environ) -> bool:
    if settings.enabled is not None:
        return settings.enabled
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return settings.endpoint is not None or any(env.get(name) for name in _ENDPOINT_VARS)


def build_tracing(settings: TracingSettings, default_service: str,
                  env: Mapping[str, str] = os.environ) -> Tracing | None:
    """The process's tracing from the settings and the OTEL_* variables; None when tracing is off."""
    if not tracing_enabled(settings, env):
        return None
    service = settings.service_name or env.get("OTEL_SERVICE_NAME") or default_service
    provider = TracerProvider(sampler=_sampler(settings), resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(_exporter(settings, env)))
    return Tracing(provider)


def _sampler(settings: TracingSettings) -> Sampler | None:
    """The YAML's sampler; None lets the SDK read OTEL_TRACES_SAMPLER / _ARG itself."""
    name = settings.sampler
    if name is None:
        return None
    ratio = TraceIdRatioBased(settings.sampler_arg if settings.sampler_arg is not None else 1.0)
    root = {"always_on": ALWAYS_ON, "always_off": ALWAYS_OFF, "traceidratio": ratio}[name.removeprefix("parentbased_")]
    return ParentBased(root) if name.startswith("parentbased_") else root


def _exporter(settings: TracingSettings, env: Mapping[str, str]) -> SpanExporter:
    protocol = settings.protocol or env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf"
    # A YAML endpoint is a base URL like OTEL_EXPORTER_OTLP_ENDPOINT; None lets the exporter read the variables.
    endpoint = settings.endpoint.rstrip("/") if settings.endpoint else None
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

        return GrpcExporter(endpoint=endpoint)
    if protocol != "http/protobuf":
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not supported (http/protobuf or grpc)")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(endpoint=f"{endpoint}/v1/traces" if endpoint else None)


# --- propagation ----------------------------------------------------------------------------------------------------


def carrier_of(span_context: otel_context.Context | None = None) -> dict[str, str]:
    """``traceparent`` (and ``tracestate``) of the current span, or of the span in ``span_context``."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=span_context)
    return carrier


def kafka_headers(carrier: Mapping[str, str]) -> list[tuple[str, bytes]]:
    return [(name, value.encode()) for name, value in carrier.items()]


def trace_context(carrier: Mapping[str, str]) -> TraceContext | None:
    if "traceparent" not in carrier:
        return None
    return TraceContext(traceparent=carrier["traceparent"], tracestate=carrier.get("tracestate"))


def extract(headers: KafkaHeaders | None, trace_field: TraceContext | None) -> otel_context.Context | None:
    """The parent context of a consumed request: its Kafka headers first, else ``GenerateRequest.trace``."""
    carrier: dict[str, str] = {}
    for name, value in headers or ():
        if name in ("traceparent", "tracestate") and value:
            carrier[name] = value.decode("latin-1")
    if "traceparent" not in carrier and trace_field is not None and trace_field.traceparent:
        carrier["traceparent"] = trace_field.traceparent
        if trace_field.tracestate:
            carrier["tracestate"] = trace_field.tracestate
    if "traceparent" not in carrier:
        return None
    parent = _PROPAGATOR.extract(carrier)
    return parent if trace.get_current_span(parent).get_span_context().is_valid else None


def extract_http(headers: Mapping[str, str]) -> otel_context.Context | None:
    """The client's context from an incoming HTTP ``traceparent`` header, or None."""
    if "traceparent" not in headers:
        return None
    parent = _PROPAGATOR.extract(headers)
    return parent if trace.get_current_span(parent).get_span_context().is_valid else None


def trace_id_hex(span: trace.Span | None = None) -> str | None:
    """The current (or given) span's trace id as 32 hex digits; None without a valid span."""
    span_context = (span or trace.get_current_span()).get_span_context()
    return format(span_context.trace_id, "032x") if span_context.is_valid else None
