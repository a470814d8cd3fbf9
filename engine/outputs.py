"""What the engine reports after each step, per request."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "abort", "deadline"]


@dataclass
class SpecStats:
    """Speculation counters; per step in a RequestOutput, cumulative in RequestStats."""

    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass
class RequestStats:
    prompt_tokens: int
    completion_tokens: int
    queued_s: float  # arrival -> first scheduled
    ttft_s: float  # arrival -> first token
    total_s: float  # arrival -> finish
    spec: SpecStats = field(default_factory=SpecStats)
    # Tokens emitted per target forward that included this request (1.0 without speculation).
    tokens_per_forward: float = 1.0
    # accepted_at[i] counts how often draft position i was accepted.
    accepted_at: list[int] = field(default_factory=list)
    drafted_at: list[int] = field(default_factory=list)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0

    @property
    def tokens_per_s(self) -> float:
        decode = self.total_s - self.ttft_s
        return (self.completion_tokens - 1) / decode if decode > 0 and self.completion_tokens > 1 else 0.0


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
    spec: SpecStats = field(default_factory=SpecStats)
    stats: RequestStats | None = None  # set on the finishing output


@dataclass
class RequestOutputAccum:
    """All of one request's outputs merged (what `LLMEngine.generate` returns)."""

    request_id: str
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finished: bool = False
    finish_reason: FinishReason | None = None
    spec: SpecStats = field(default_factory=SpecStats)
    stats: RequestStats | None = None

    def add(self, out: RequestOutput) -> None:
        self.token_ids.extend(out.token_ids)
        self.text += out.text
        self.spec.drafted += out.spec.drafted
        self.spec.accepted += out.spec.accepted
        if out.finished:
            self.finished = True
            self.finish_reason = out.finish_reason
            self.stats = out.stats
