"""The engine in this process: the same workload without edge, Kafka or worker process.

This is the baseline of the bus-overhead comparison. To isolate the bus, it
drives the engine exactly as the worker does: through the worker's
``EngineDriver`` (one engine thread, tokenization on that thread, outputs
handed to the event loop once per step), so what differs between the two runs
is the edge, Kafka and the serialization between them.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from streams.bench.backends.base import Backend, BackendOptions
from streams.bench.record import RequestRecord, StreamChecker
from streams.bench.workload import BenchRequest


def engine_config_for(options: BackendOptions) -> Any:
    """The engine configuration: the one given, else the project's settings (as the worker reads them)."""
    if options.engine_config is not None:
        return options.engine_config
    try:
        from streams.config import load_settings

        config = load_settings().engine.to_engine_config()
    except ImportError:
        from engine.config import EngineConfig

        config = EngineConfig()
    if options.model and options.model != config.model:
        config.model = options.model
    return config


def prompt_token_ids(tokenizer: Any, request: BenchRequest) -> list[int]:
    """Token ids of the request, rendered as the worker renders it."""
    try:
        from streams.worker.prompts import render_prompt  # the worker's own rendering, once it exists
    except ImportError:
        render_prompt = None
    if render_prompt is not None:
        return list(render_prompt(tokenizer, prompt=request.prompt, messages=request.messages_list()))
    if request.messages is not None:
        encoded = tokenizer.apply_chat_template(request.messages_list(), add_generation_prompt=True, tokenize=True)
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
    return list(tokenizer.encode(request.prompt))


class InProcessBackend(Backend):
    name = "inprocess"

    def __init__(self, options: BackendOptions) -> None:
        super().__init__(options)
        self.engine: Any = None
        self._driver: Any = None
        self._routes: dict[str, tuple[StreamChecker, asyncio.Future[None], list[int]]] = {}
        self.config: Any = None

    def describe(self) -> dict[str, Any]:
        out = {**super().describe(), "model": getattr(self.config, "model", self.options.model)}
        spec = getattr(self.config, "speculation", None)
        if spec is not None:
            out["speculation"] = {"enabled": spec.enabled, "method": spec.method, "max_draft_tokens": spec.max_draft_tokens}
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
            if out.token_ids or out.text:
                checker.chunk(now, text=out.text, token_ids=list(out.token_ids), index=counter[0],
                              drafted=out.spec.drafted, accepted=out.spec.accepted)
                counter[0] += 1
            if out.finished:
                stats = out.stats
                checker.final(
                    now, finish_reason=out.finish_reason, num_chunks=counter[0],
                    prompt_tokens=getattr(stats, "prompt_tokens", None),
                    completion_tokens=getattr(stats, "completion_tokens", None),
                    server={"timings": {"queued_s": stats.queued_s, "ttft_s": stats.ttft_s, "total_s": stats.total_s},
                            "spec": {"drafted": stats.spec.drafted, "accepted": stats.spec.accepted,
                                     "tokens_per_forward": stats.tokens_per_forward}} if stats is not None else None,
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
        from engine.request import EngineRequest, RequestRejected, SamplingParams

        req = record.request
        sampling = SamplingParams(
            max_tokens=req.max_tokens, temperature=req.sampling.temperature, top_p=req.sampling.top_p,
            top_k=req.sampling.top_k, seed=req.seed,
        )

        def prepare(engine: Any) -> EngineRequest:
            return EngineRequest(
                request_id=record.request_id, prompt_token_ids=prompt_token_ids(engine.tokenizer, req),
                sampling=sampling, speculation=req.sampling.speculation,
            )

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
