"""What every backend implements, and the options they share."""
from __future__ import annotations

import abc
import time
from dataclasses import dataclass
from typing import Any

from schemas.events import ChatMessage, GenerateRequest, ReplyRoute, SamplingParams

from streams.bench.record import RequestRecord, StreamChecker

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass(frozen=True)
class BackendOptions:
    model: str = DEFAULT_MODEL
    base_url: str = "http://127.0.0.1:8000"  # openai and ws (ws derives ws://host:port/v1/ws)
    endpoint: str = "auto"  # openai: auto (chat for messages, completions for prompts), chat, completions
    ws_connections: int = 4
    bootstrap_servers: str = "127.0.0.1:9092"  # kafka
    kafka: Any = None  # kafka: the project's KafkaSettings (TLS, SASL) for bootstrap_servers; None: an open broker
    topic_prefix: str = "specstream"
    api_key: str | None = None
    # inprocess: engine settings; None takes the project's settings (streams.config) or the engine's defaults.
    engine_config: Any = None
    max_connections: int = 256


class Backend(abc.ABC):
    """Sends one request and reads its whole stream into ``record`` through ``checker``.

    ``run`` sets ``record.start`` right before sending, reports each chunk and the
    final message to the checker with ``time.perf_counter()`` arrival times, and
    returns when the stream is over. Failures are recorded on the record with
    an error kind (see :mod:`streams.bench.record`), never raised, except that
    a ``run`` cancelled by the caller's timeout raises ``CancelledError``.
    """

    name: str = "?"

    def __init__(self, options: BackendOptions) -> None:
        self.options = options

    async def start(self) -> None:
        """Connect, load, create topics: everything not to be measured."""

    async def close(self) -> None:
        pass

    @abc.abstractmethod
    async def run(self, record: RequestRecord, checker: StreamChecker) -> None: ...

    def describe(self) -> dict[str, Any]:
        """What the result file records about this backend."""
        return {"backend": self.name, "model": self.options.model}

    async def __aenter__(self) -> "Backend":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class FailedBackend(Backend):
    """Stands in for a backend that could not start (broker or edge unreachable, model missing).

    Every request fails at once with kind ``connect`` and the start error, so an
    unreachable service shows up in the figures as errors like any other.
    """

    dead = True

    def __init__(self, name: str, options: BackendOptions, error: BaseException, describe: dict[str, Any] | None = None) -> None:
        super().__init__(options)
        self.name = name
        self.error = f"the {name} backend could not start: {type(error).__name__}: {error}"
        self._describe = describe or {}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), **self._describe, "backend": self.name, "start_error": self.error}

    async def run(self, record: RequestRecord, checker: StreamChecker) -> None:
        import time as _time

        record.start = _time.perf_counter()
        checker.error(record.start, "connect", self.error)


async def start_or_fail(backend: Backend) -> Backend:
    """Start ``backend``; if that fails, close it and return a :class:`FailedBackend` in its place."""
    try:
        await backend.start()
        return backend
    except Exception as error:  # noqa: BLE001 - any start failure becomes per-request errors
        try:
            await backend.close()
        except Exception:  # noqa: BLE001
            pass
        return FailedBackend(backend.name, backend.options, error, backend.describe())


def error_code_of(payload: Any) -> str | None:
    """The error code in an OpenAI error body, a websocket error message or an ErrorEvent."""
    if not isinstance(payload, dict):
        return None
    inner = payload.get("error")
    if isinstance(inner, dict):
        return inner.get("code") or inner.get("type")
    if isinstance(inner, str) and payload.get("code") is None:
        return None
    return payload.get("code")


def error_message_of(payload: Any) -> str:
    if isinstance(payload, dict):
        inner = payload.get("error")
        if isinstance(inner, dict):
            return str(inner.get("message", inner))
        if "message" in payload:
            return str(payload["message"])
    return str(payload)[:500]


def generate_request(
    record: RequestRecord, model: str, reply_topic: str, *, timeout_s: float | None = None, partition: int | None = 0,
) -> GenerateRequest:
    """The GenerateRequest for a bench request, as an edge would publish it (the Kafka and in-process backends)."""
    req = record.request
    sampling = SamplingParams(
        max_tokens=req.max_tokens, temperature=req.sampling.temperature, top_p=req.sampling.top_p,
        top_k=req.sampling.top_k, seed=req.seed, speculation=req.sampling.speculation,
    )
    now = time.time()
    return GenerateRequest(
        request_id=record.request_id,
        prompt=req.prompt,
        messages=[ChatMessage(**m) for m in req.messages] if req.messages is not None else None,
        model=model,
        sampling=sampling,
        reply_to=ReplyRoute(topic=reply_topic, partition=partition),
        deadline=now + timeout_s if timeout_s else None,
        created_at=now,
    )
