"""The engine in this process: the same workload without edge, Kafka or worker process.

This is the baseline of the bus-overhead comparison. To isolate the bus it
drives the engine the way the worker does: the bench request becomes the same
``GenerateRequest`` an edge would publish, the worker's own intake
(``streams.worker.intake.to_engine_request``: chat template, tokenization,
sampling) turns it into an engine request on the engine thread, and the
worker's ``EngineDriver`` runs the engine in its own thread and hands each
step's outputs to the event loop. Every output is one chunk, as the worker
publishes one TokenChunk per output. What differs from a run against the
service is the edge, Kafka, the worker's Kafka I/O and the serialization
between them.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from streams.bench.backends.base import Backend, BackendOptions, generate_request
from streams.bench.record import RequestRecord, StreamChecker


def engine_config_for(options: BackendOptions) -> Any:
    """The engine configuration: the one given, else the project's settings (as the worker reads them)."""
    if options.engine_config is not None:
        config = options.engine_config
    else:
        from streams.config import load_settings

        config = load_settings().engine
    if options.model and options.model != config.model:
        config = config.model_copy(update={"model": options.model})
    return config


class InProcessBackend(Backend):
    name = "inprocess"

    def __init__(self, options: BackendOptions, timeout_s: float | None = None) -> None:
        super().__init__(options)
        self.timeout_s = timeout_s
        self.engine: Any = None
        self.config: Any = None
        self._driver: Any = None
        self._routes: dict[str, tuple[StreamChecker, asyncio.Future[None], list[int]]] = {}

    def describe(self) -> dict[str, Any]:
        out = {**super().describe(), "model": getattr(self.config, "model", self.options.model)}
        spec = getattr(self.config, "speculation", None)
        if spec is not None:
            out["speculation"] = {"enabled": spec.enabled, "method": spec.method, "max_draft_tokens": spec.max_draft_tokens}
        for key in ("device", "dtype", "max_running_requests", "max_batched_tokens"):
            if hasattr(self.config, key):
                out[key] = getattr(self.config, key)
        return out

    async def start(self) -> None:
        from engine.llm_engine import LLMEngine
        from streams.worker.engine_driver import EngineDriver

        self.config = engine_config_for(self.options)
        loop = asyncio.get_running_loop()
        self.engine = await asyncio.to_thread(LLMEngine.from_config, self.config)
        self._driver = EngineDriver(self.engine, loop, self._on_outputs, self._on_failure, name="bench-engine")
        self._driver.start()

    async def close(self) -> None:
        if self._driver is not None:
            await asyncio.to_thread(self._driver.stop)
            self._driver = None

    def _on_outputs(self, outputs: list[Any]) -> None:
        now = time.perf_counter()
        for out in outputs:
            route = self._routes.get(out.request_id)
            if route is None:
                continue
            checker, done, counter = route
            checker.chunk(now, text=out.text, token_ids=list(out.token_ids), index=counter[0],
                          drafted=out.spec.drafted, accepted=out.spec.accepted)
            counter[0] += 1
            if out.finished:
                stats = out.stats
                server = None
                if stats is not None:
                    server = {
                        "timings": {"queued_s": stats.queued_s, "ttft_s": stats.ttft_s, "total_s": stats.total_s},
                        "spec": {"drafted": stats.spec.drafted, "accepted": stats.spec.accepted,
                                 "tokens_per_forward": stats.tokens_per_forward},
                    }
                checker.final(
                    now, finish_reason=out.finish_reason or "stop", num_chunks=counter[0],
                    prompt_tokens=getattr(stats, "prompt_tokens", None),
                    completion_tokens=getattr(stats, "completion_tokens", None), server=server,
                )
                if not done.done():
                    done.set_result(None)

    def _on_failure(self, error: BaseException) -> None:
        now = time.perf_counter()
        for checker, done, _ in list(self._routes.values()):
            checker.error(now, "error:internal_error", f"engine step failed: {type(error).__name__}: {error}")
            if not done.done():
                done.set_result(None)

    async def run(self, record: RequestRecord, checker: StreamChecker) -> None:
        from engine.request import RequestRejected
        from streams.worker.intake import to_engine_request

        request = generate_request(record, self.options.model, "inprocess", timeout_s=self.timeout_s, partition=None)
        if request.model != self.engine.model_name:
            checker.error(time.perf_counter(), "error:unknown_model", f"the in-process engine serves {self.engine.model_name}")
            return

        def prepare(engine: Any) -> Any:
            return to_engine_request(request, engine.tokenizer, arrival_time=time.time())

        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._routes[record.request_id] = (checker, done, [0])
        record.start = time.perf_counter()
        try:
            try:
                await self._driver.add(prepare)
            except RequestRejected as error:
                checker.error(time.perf_counter(), f"error:{error.code}", error.message)
                return
            await done
        except asyncio.CancelledError:
            self._driver.abort(record.request_id)
            raise
        finally:
            self._routes.pop(record.request_id, None)
