"""Observability: traces (OpenTelemetry), metrics (Prometheus) and structured logs.

* :mod:`streams.telemetry.tracing` builds a tracer provider of the process's own from
  ``telemetry.tracing`` and the standard ``OTEL_*`` variables, or nothing when tracing is off,
  and carries W3C trace context through Kafka headers and ``GenerateRequest.trace``.
* :mod:`streams.telemetry.metrics` defines the Prometheus metrics (vLLM's names under the
  ``specstream:`` prefix) in a registry per process.
* :mod:`streams.telemetry.request_trace` turns one engine request's stages into spans.
* :mod:`streams.telemetry.edge` is the edge's ASGI middleware (server span, route metrics, /metrics).
* :mod:`streams.telemetry.logs` configures logging: text or JSON with request_id and trace_id.

These are the parts; who calls them lives with the caller, so this package imports no service: the foundation's
hooks (:mod:`streams.service.consumer_telemetry`, :mod:`streams.service.message_trace`) and the engine worker's
(:mod:`streams.worker.telemetry`).
"""
