"""The doors a benchmark can drive: OpenAI HTTP/SSE, websocket, Kafka, or the engine in this process."""
from __future__ import annotations

from streams.bench.backends.base import Backend, BackendOptions

BACKENDS = ("openai", "ws", "kafka", "inprocess")


def make_backend(name: str, options: BackendOptions) -> Backend:
    if name == "openai":
        from streams.bench.backends.openai_http import OpenAIBackend

        return OpenAIBackend(options)
    if name == "ws":
        from streams.bench.backends.websocket import WebSocketBackend

        return WebSocketBackend(options)
    if name == "kafka":
        from streams.bench.backends.kafka import KafkaBackend

        return KafkaBackend(options)
    if name == "inprocess":
        from streams.bench.backends.inprocess import InProcessBackend

        return InProcessBackend(options)
    raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(BACKENDS)}")


__all__ = ["BACKENDS", "Backend", "BackendOptions", "make_backend"]
