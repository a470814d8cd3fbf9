"""A minimal OTLP/HTTP trace collector, for tests and benchmarks: what the SDK's real exporter sends, decoded.

    with OtlpReceiver() as receiver:          # OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint
        ...
        receiver.trace(trace_id)              # the spans of one trace, from every process that exported them

It accepts ``POST /v1/traces`` (protobuf, optionally gzip) and decodes each export with ``opentelemetry-proto``.
"""
from __future__ import annotations

import gzip
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]


class OtlpReceiver:
    """A minimal OTLP/HTTP collector on 127.0.0.1: ``endpoint`` is what OTEL_EXPORTER_OTLP_ENDPOINT names."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class OtlpHandler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_error(404 if self.path != "/v1/traces" else 415)
                    return
                receiver._take(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), OtlpHandler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_port}"

    def _take(self, export: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in export.resource_spans:
            service = next((a.value.string_value for a in resource_spans.resource.attributes
                            if a.key == "service.name"), "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {a.key: getattr(a.value, a.value.WhichOneof("value")) for a in span.attributes}
                    spans.append(ReceivedSpan(service, span.name, span.trace_id.hex(), span.span_id.hex(),
                                              span.parent_span_id.hex(), span.kind, attributes))
        with self._lock:
            self.requests += 1
            self.spans.extend(spans)

    def trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
