"""vLLM's engine behind the worker's ``Engine`` seam (``engine.backend: vllm``).

The worker's engine thread drives vLLM's v1 ``LLMEngine`` step by step, exactly as it drives ours: requests in,
per-step deltas out. vLLM's engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``; see
``load_vllm_engine`` for why).
Everything above the seam (topics, chunks, commits, cancellation, deadlines, telemetry) is the worker's own.
Runs only in the vLLM environment (``./dev setup vllm`` -> ``.venv-vllm``); ``specstream worker`` moves there.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.config import EngineConfig
from engine.engine_setup import resolve_max_model_len
from engine.logprobs import LogprobEntry
from engine.outputs import FinishReason, RequestOutput, RequestStats, SpecCounters
from engine.request import EngineRequest, RequestRejected
from streams.worker.vllm_adapters import VllmAdapters
from streams.worker.vllm_mapping import engine_kwargs, sampling_kwargs

Progress = Callable[[str], None]

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort"}


@dataclass
class _Tracked:
    """What the worker's Completion needs and vLLM's delta outputs do not carry: counts and times."""

    request: EngineRequest
    completion_tokens: int = 0
    first_token_at: float | None = None
    cached_prompt_tokens: int = 0
    prompt_logprobs_sent: bool = False

    def stats(self, now: float) -> RequestStats:
        arrival = self.request.arrival_time
        ttft = (self.first_token_at or now) - arrival
        return RequestStats(
            prompt_tokens=len(self.request.prompt_token_ids), completion_tokens=self.completion_tokens,
            # vLLM does not report when a request was first scheduled per output: queueing is inside the TTFT.
            queued_s=0.0, ttft_s=ttft, total_s=now - arrival, cached_prompt_tokens=self.cached_prompt_tokens)


class VllmEngine:
    """Our ``Engine`` protocol over ``vllm.v1.engine.llm_engine.LLMEngine``."""

    def __init__(self, engine: Any, tokenizer: Any, model_name: str, max_model_len: int, speculates: bool,
                 lora: VllmAdapters | None = None) -> None:
        self._engine = engine
        self.lora = lora  # the adapters topic's registry (WorkerAdapters); None: engine.lora.max_loaded is 0
        self.speculates = speculates
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len
        self._tracked: dict[str, _Tracked] = {}

    def add_request(self, request: EngineRequest) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams

        if len(request.prompt_token_ids) >= self.max_model_len:
            raise RequestRejected("context_length_exceeded", f"the prompt has {len(request.prompt_token_ids)} "
                                  f"tokens; this model serves at most {self.max_model_len} (prompt + completion)")
        lora_request = None
        if request.lora is not None:
            if self.lora is None or request.lora not in self.lora.requests:
                raise RequestRejected("unknown_model",
                                      f"model '{request.lora}' is not served; available: {self.model_name}")
            lora_request = self.lora.request_for(request.lora)
        try:
            kwargs = sampling_kwargs(request, self.speculates)
            if "structured_outputs" in kwargs:
                kwargs["structured_outputs"] = StructuredOutputsParams(**kwargs["structured_outputs"])
            params = SamplingParams(**kwargs, output_kind=RequestOutputKind.DELTA)
            self._engine.add_request(request.request_id, TokensPrompt(prompt_token_ids=list(request.prompt_token_ids)),
                                     params, arrival_time=request.arrival_time, priority=request.priority,
                                     lora_request=lora_request)
        except ValueError as error:  # vLLM's own validation (its VLLMValidationError is one): the request, not us
            raise RequestRejected("invalid_request", f"vLLM refused the request: {error}") from error
        self._tracked[request.request_id] = _Tracked(request)

    def abort(self, request_id: str) -> RequestOutput | None:
        tracked = self._tracked.pop(request_id, None)
        if tracked is None:
            return None
        self._engine.abort_request([request_id])
        return RequestOutput(request_id, [], "", finished=True, finish_reason="abort",
                             stats=tracked.stats(time.time()))

    def has_unfinished(self) -> bool:
        return bool(self._tracked) or self._engine.has_unfinished_requests()

    def step(self) -> list[RequestOutput]:
        outputs = [self._convert(out) for out in self._engine.step()]
        outputs = [out for out in outputs if out is not None]
        return outputs + self._expire_deadlines()

    def _convert(self, out: Any) -> RequestOutput | None:
        tracked = self._tracked.get(out.request_id)
        if tracked is None:  # aborted after vLLM produced this step's output
            return None
        now = time.time()
        completion = out.outputs[0]
        tokens = list(completion.token_ids)
        if tokens and tracked.first_token_at is None:
            tracked.first_token_at = now
        tracked.completion_tokens += len(tokens)
        tracked.cached_prompt_tokens = out.num_cached_tokens or 0
        sampling = tracked.request.sampling
        result = RequestOutput(out.request_id, tokens, completion.text, spec=SpecCounters(),
                               logprobs=_logprobs(tokens, completion.logprobs, sampling.logprobs or 0))
        if out.prompt_logprobs is not None and not tracked.prompt_logprobs_sent:
            tracked.prompt_logprobs_sent = True
            result.prompt_logprobs = _logprobs(list(out.prompt_token_ids or [])[1:], out.prompt_logprobs[1:],
                                               sampling.prompt_logprobs or 0)
        if out.finished:
            del self._tracked[out.request_id]
            result.finished = True
            result.finish_reason = _FINISH.get(completion.finish_reason or "stop", "stop")
            result.stats = tracked.stats(now)
        return result

    def _expire_deadlines(self) -> list[RequestOutput]:
        """vLLM has no deadlines: a request past its own is aborted here and finishes with reason ``deadline``."""
        now = time.time()
        expired = [rid for rid, t in self._tracked.items()
                   if t.request.deadline is not None and t.request.deadline <= now]
        if expired:
            self._engine.abort_request(expired)
        return [RequestOutput(rid, [], "", finished=True, finish_reason="deadline",
                              stats=self._tracked.pop(rid).stats(now)) for rid in expired]


def _logprobs(tokens: list[int], per_token: Any, top_n: int) -> list[LogprobEntry] | None:
    """vLLM's per-position {token id: Logprob} dicts as our entries: the chosen token's logprob and the ``top_n``
    most likely (vLLM adds the chosen token to its top list when it ranks below; ours does not)."""
    if per_token is None:
        return None
    entries = []
    for token, ranked in zip(tokens, per_token, strict=True):
        chosen = ranked[token].logprob
        top = sorted(((tid, lp.logprob) for tid, lp in ranked.items() if lp.rank is not None and lp.rank <= top_n),
                     key=lambda pair: -pair[1])
        entries.append(LogprobEntry(token, chosen, tuple(top)))
    return entries


def load_vllm_engine(config: EngineConfig, progress: Progress | None) -> VllmEngine:
    """vLLM's engine on our resolved model folder (a known name's GGUF is converted once, as for our engine)."""
    try:
        from vllm import EngineArgs
        from vllm.config import StructuredOutputsConfig
        from vllm.v1.engine.llm_engine import LLMEngine
    except ImportError as exc:
        raise RuntimeError("engine.backend: vllm needs vLLM: run ./dev setup vllm (it installs .venv-vllm)") from exc
    from transformers import AutoConfig

    from engine.loader import resolve_model_dir
    from engine.model_text import tokenizer_from_folder

    say = progress or (lambda _line: None)
    # In the worker's process, vLLM's Python scheduling contends for the GIL with the event loop that publishes each
    # chunk; in a child (vLLM's default) it does not. Children outlive a parent killed with -9 unless they die with
    # it: streams.cli's spawn hook (die_with_parent) sees to that.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1" if config.vllm_core_process else "0"
    model_dir = resolve_model_dir(config.model, say)
    hf_config = AutoConfig.from_pretrained(model_dir)
    max_len = resolve_max_model_len(config.max_model_len, hf_config.max_position_embeddings)
    kwargs = engine_kwargs(config, str(model_dir), max_len)
    kwargs["structured_outputs_config"] = StructuredOutputsConfig(**kwargs["structured_outputs_config"])
    if kwargs["max_num_batched_tokens"] != config.max_batched_tokens:
        say(f"engine.max_batched_tokens {config.max_batched_tokens} -> {kwargs['max_num_batched_tokens']} for vLLM: "
            "with LoRA and speculation it holds every running request's drafts in one step")
    say(f"starting vLLM's engine on {model_dir} ({kwargs['dtype']}) ...")
    engine = LLMEngine.from_engine_args(EngineArgs(**kwargs))
    lora = None
    if config.lora.enabled:
        lora = VllmAdapters(engine, config.lora.max_rank)
        for name, path in config.lora.adapters.items():  # served from the start: a bad one fails the start
            adapter = lora.read(name, path)
            lora.register(name, path)
            lora.install(adapter)
    # The edge counts and renders prompts with the same tokenizer class our engine uses: keep them identical.
    return VllmEngine(engine, tokenizer_from_folder(model_dir), config.model, max_len,
                      speculates="speculative_config" in kwargs, lora=lora)
