"""One generation's reply stream: engine outputs become TokenChunks, then one Completion.

Chunks are numbered 0, 1, 2, ... without gaps and carry their position in the
whole answer (``text_offset``, ``token_offset``), so the edge can deduplicate a
regenerated stream by position; the Completion repeats the whole text with
usage, timings (including the Kafka transit before the worker read the
request) and speculation statistics.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.logprobs import LogprobEntry
from engine.outputs import RequestOutput
from engine.request import EngineRequest
from schemas.answer import PromptTokensDetails, TopLogprob
from schemas.events import (
    Completion,
    GenerateRequest,
    PromptLogprob,
    SpecStats,
    SpecStepStats,
    Timings,
    TokenChunk,
    TokenLogprob,
    Usage,
)
from streams.service import Delivery


@dataclass
class Generation:
    request: GenerateRequest
    delivery: Delivery
    transit_s: float  # publication -> consumption, added to the engine's timings
    engine_request: EngineRequest | None = None
    next_index: int = 0
    text: list[str] = field(default_factory=list)
    text_chars: int = 0  # characters published so far: the next chunk's text_offset
    tokens: int = 0  # tokens published so far: the next chunk's token_offset
    logprobs: list[TokenLogprob] | None = None  # the whole answer's, when the request asked for them
    prompt_logprobs: list[PromptLogprob] | None = None  # the prompt's, when the request asked for them

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def chunk(self, output: RequestOutput, finish_reason: Any,
              decode: Callable[[int], str] | None = None) -> TokenChunk:
        """The step's chunk; decode: one token's text (for logprobs)."""
        logprobs = wire_logprobs(output.logprobs, decode)
        if logprobs is not None:
            self.logprobs = (self.logprobs or []) + logprobs
        prompt = None
        if output.prompt_logprobs is not None:
            first = self.engine_request.prompt_token_ids[0] if self.engine_request is not None else None
            prompt = self.prompt_logprobs = wire_prompt_logprobs(first, output.prompt_logprobs, decode)
        chunk = TokenChunk(
            request_id=self.request_id,
            index=self.next_index,
            text=output.text,
            token_ids=list(output.token_ids),
            finish_reason=finish_reason,
            spec=SpecStepStats(drafted=output.spec.drafted, accepted=output.spec.accepted),
            text_offset=self.text_chars,
            token_offset=self.tokens,
            logprobs=logprobs,
            prompt_logprobs=prompt,
        )
        self.next_index += 1
        self.text.append(output.text)
        self.text_chars += len(output.text)
        self.tokens += len(output.token_ids)
        return chunk

    def completion(self, output: RequestOutput, finish_reason: Any, model: str | None,
                   adapter: str | None = None) -> Completion:
        stats = output.stats
        if stats is not None:
            usage = Usage(
                prompt_tokens=stats.prompt_tokens,
                completion_tokens=stats.completion_tokens,
                total_tokens=stats.prompt_tokens + stats.completion_tokens,
                prompt_tokens_details=PromptTokensDetails(cached_tokens=stats.cached_prompt_tokens),
            )
            timings = Timings(
                queued_s=max(0.0, stats.queued_s) + self.transit_s,
                ttft_s=max(0.0, stats.ttft_s) + self.transit_s,
                total_s=max(0.0, stats.total_s) + self.transit_s,
            )
            spec = SpecStats(
                drafted=stats.spec.drafted,
                accepted=stats.spec.accepted,
                acceptance_rate=min(1.0, stats.spec.acceptance_rate),
                tokens_per_forward=stats.tokens_per_forward,
            )
        else:  # the engine gave no stats (e.g. an abort before the first step): our own clock
            prompt_tokens = len(self.engine_request.prompt_token_ids) if self.engine_request else 0
            usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=0, total_tokens=prompt_tokens,
                          prompt_tokens_details=PromptTokensDetails(cached_tokens=0))
            total = time.time() - self.delivery.received_at + self.transit_s
            timings = Timings(queued_s=total, ttft_s=total, total_s=total)
            spec = SpecStats()
        return Completion(
            request_id=self.request_id,
            text="".join(self.text),
            finish_reason=finish_reason,
            num_chunks=self.next_index,
            usage=usage,
            timings=timings,
            spec=spec,
            model=model,
            adapter=adapter,
            logprobs=self.logprobs,
            prompt_logprobs=self.prompt_logprobs,
        )


def _floor(x: float) -> float:
    return max(x, -9999.0)  # OpenAI's floor; keeps -inf out of JSON


def wire_logprobs(entries: list[LogprobEntry] | None, decode: Callable[[int], str] | None) -> list[TokenLogprob] | None:
    if entries is None:
        return None
    text = decode or str
    return [TokenLogprob(token_id=e.token_id, token=text(e.token_id), logprob=_floor(e.logprob),
                         top=[TopLogprob(token_id=t, token=text(t), logprob=_floor(v)) for t, v in e.top])
            for e in entries]


def wire_prompt_logprobs(first: int | None, entries: list[LogprobEntry],
                         decode: Callable[[int], str] | None) -> list[PromptLogprob]:
    """The prompt's logprobs on the wire: the first token (nothing before it to predict it: null, as OpenAI and vLLM
    report it), then one per engine entry; first None: not known (left out)."""
    text = decode or str
    head = [] if first is None else [PromptLogprob(token_id=first, token=text(first), logprob=None, top=None)]
    return head + [PromptLogprob(token_id=t.token_id, token=t.token, logprob=t.logprob, top=t.top)
                   for t in wire_logprobs(entries, decode) or []]
