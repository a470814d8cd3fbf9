"""What the engine reports after each step, per request."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from engine.logprobs import LogprobEntry

FinishReason = Literal["stop", "length", "abort", "deadline"]


@dataclass
class SpecCounters:
    """Speculation counters; per step in a RequestOutput, cumulative in RequestStats.

    The worker reports them on the wire as `schemas.events.SpecStats`."""

    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass
class SpecTally(SpecCounters):
    """One request's speculation over its life: the counters plus where and at what cost.

    The sequence keeps one up to date; its finishing RequestStats carries a copy."""

    # drafted_at[i] / accepted_at[i]: how often draft position i was drafted / accepted.
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    # The counters per draft source (the method's name, or a combined proposer's source: suffix, lookup, head).
    by_source: dict[str, SpecCounters] = field(default_factory=dict)

    def record(self, drafted: int, accepted: int, draft_s: float, verify_s: float, source: str = "") -> None:
        """One verification of `drafted` drafts from `source`, the first `accepted` of them accepted."""
        self.drafted += drafted
        self.accepted += accepted
        if source:
            counters = self.by_source.setdefault(source, SpecCounters())
            counters.drafted += drafted
            counters.accepted += accepted
        while len(self.drafted_at) < drafted:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(drafted):
            self.drafted_at[i] += 1
        for i in range(accepted):
            self.accepted_at[i] += 1
        self.draft_time_s += draft_s
        self.verify_time_s += verify_s

    def copy(self) -> SpecTally:
        return replace(self, drafted_at=list(self.drafted_at), accepted_at=list(self.accepted_at),
                       by_source={name: replace(c) for name, c in self.by_source.items()})


@dataclass(frozen=True)
class PrefixCacheCounters:
    """The engine's cumulative prefix-cache and preemption counters (LLMEngine.prefix_cache_counters)."""

    queries: int  # prompt tokens looked up (vLLM counts tokens, not requests)
    hits: int  # of them, found cached
    preemptions: int


@dataclass
class RequestStats:
    prompt_tokens: int
    completion_tokens: int
    queued_s: float  # arrival -> first scheduled
    ttft_s: float  # arrival -> first token
    total_s: float  # arrival -> finish
    spec: SpecTally = field(default_factory=SpecTally)
    # Tokens emitted per target forward that included this request (1.0 without speculation).
    tokens_per_forward: float = 1.0
    # Prompt tokens whose KV came from the prefix cache (OpenAI's usage.prompt_tokens_details.cached_tokens).
    cached_prompt_tokens: int = 0
    # Times the request gave its KV back to a more urgent one and was recomputed.
    preemptions: int = 0


@dataclass
class RequestOutput:
    """New output of one request in one engine step.

    `text` is the new text since the last output; it never ends inside a
    multi-byte character and never contains (part of) a stop string.
    `token_ids` are the tokens accepted this step (all of them, even those whose
    text is held back until it is known not to start a stop string).
    """

    request_id: str
    token_ids: list[int]
    text: str
    finished: bool = False
    finish_reason: FinishReason | None = None
    spec: SpecCounters = field(default_factory=SpecCounters)
    stats: RequestStats | None = None  # set on the finishing output
    # (code, message) when the engine could not run the request after accepting it (a LoRA adapter
    # that failed to load again); the worker answers it with an ErrorEvent.
    error: tuple[str, str] | None = None
    # One per token of token_ids when the request asked for logprobs (engine.logprobs); None otherwise.
    logprobs: list[LogprobEntry] | None = None
    # On the request's first output, when it asked for prompt logprobs: one per prompt token after the first.
    prompt_logprobs: list[LogprobEntry] | None = None


@dataclass
class RequestOutputAccum:
    """All of one request's outputs merged (what `LLMEngine.generate` returns)."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished: bool = False
    finish_reason: FinishReason | None = None
    spec: SpecCounters = field(default_factory=SpecCounters)
    stats: RequestStats | None = None
    logprobs: list[LogprobEntry] | None = None
    prompt_logprobs: list[LogprobEntry] | None = None

    def add(self, out: RequestOutput) -> None:
        self.token_ids.extend(out.token_ids)
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs
        if out.logprobs is not None:
            self.logprobs = (self.logprobs or []) + out.logprobs
        self.text += out.text
        self.spec.drafted += out.spec.drafted
        self.spec.accepted += out.spec.accepted
        if out.finished:
            self.finished = True
            self.finish_reason = out.finish_reason
            self.stats = out.stats
