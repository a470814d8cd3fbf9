"""One answer to one request, recorded or replayed, reduced to what evaluation compares."""
from __future__ import annotations

from dataclasses import dataclass

from schemas.events import Completion, ErrorEvent


@dataclass(frozen=True)
class Outcome:
    text: str | None  # None: the request failed
    finish_reason: str | None
    error_code: str | None
    completion_tokens: int
    ttft_s: float | None
    itl_s: float | None  # mean time between tokens after the first
    e2e_s: float | None
    acceptance_rate: float | None  # None when nothing was drafted
    tokens_per_forward: float | None

    @property
    def failed(self) -> bool:
        return self.error_code is not None

    @classmethod
    def of(cls, final: Completion | ErrorEvent) -> "Outcome":
        if isinstance(final, ErrorEvent):
            return cls(None, None, final.code, 0, None, None, None, None, None)
        tokens, timings, spec = final.usage.completion_tokens, final.timings, final.spec
        itl = (timings.total_s - timings.ttft_s) / (tokens - 1) if tokens > 1 else None
        return cls(
            text=final.text, finish_reason=final.finish_reason, error_code=None, completion_tokens=tokens,
            ttft_s=timings.ttft_s, itl_s=itl, e2e_s=timings.total_s,
            acceptance_rate=spec.acceptance_rate if spec.drafted else None,
            tokens_per_forward=spec.tokens_per_forward,
        )


@dataclass(frozen=True)
class Pair:
    """A recorded request's answer, the candidate's answer to its replay, and a reference answer when one is known."""

    request_id: str
    recorded: Outcome
    candidate: Outcome
    reference: str | None = None
    tags: tuple[str, ...] = ()
