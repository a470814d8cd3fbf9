"""``GET /metrics`` on a port of its own (the worker's), in a daemon thread.

Always Prometheus' text format: prometheus_client's own server answers Prometheus' OpenMetrics
``Accept`` with names escaped to underscores (``specstream_...``), which would break vLLM's
``prefix:name`` convention that dashboards and our rules rely on. The edge's route does the same.
"""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest


class MetricsPortError(OSError):
    """The configured address of a consumer's /metrics cannot be bound (in use, not this host's, no permission)."""


class MetricsServer:
    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        class MetricsHandler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404, "only /metrics is served here")
                    return
                body = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_LATEST)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass  # one line per scrape is noise

        try:
            self._server = ThreadingHTTPServer((host, port), MetricsHandler)
        except OSError as error:  # the process cannot serve as configured: say which settings, not just errno
            raise MetricsPortError(f"cannot serve /metrics on {host}:{port} (telemetry.metrics.worker_host, "
                                   f"worker_port): {error.strerror or error}") from error
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self._server.server_port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
