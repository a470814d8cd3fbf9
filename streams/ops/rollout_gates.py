"""The health gates of a canary step: the candidate pool's answers against stable's, and its dead letters.

Per pool, over the step so far: error rate (ErrorEvents among final events), p99 time to first token, p99
inter-token latency ((total - ttft) / (completion tokens - 1)), speculative acceptance rate. The candidate fails the
step when

* its error rate exceeds stable's by more than ``max_error_rate_increase`` (with at least ``min_errors`` errors, so
  one unlucky request does not roll back a 1 % step);
* its p99 TTFT or inter-token latency exceeds stable's x ``latency_ratio`` + ``latency_slack_s`` (both pools with at
  least ``min_samples`` answers; stable's figures accumulate over the whole rollout, so a 100 % step still has a
  baseline);
* its acceptance rate is ``max_acceptance_drop`` below stable's (when both drafted ``min_drafted`` tokens: the
  rate of a few short requests is noise);
* it dead-lettered more than ``max_dead_letters`` messages;
* or it stopped answering: no live worker in the pool.

The gates judge :class:`PoolFigures`, whoever measured them: :class:`PoolStats` from the answers on the bus
(:mod:`streams.ops.rollout_watch`), or Prometheus' recording rules (:mod:`streams.ops.rollout_prometheus`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from schemas.events import Completion, ErrorEvent


@dataclass(frozen=True)
class Gates:
    max_error_rate_increase: float = 0.05
    min_errors: int = 2
    latency_ratio: float = 1.5
    latency_slack_s: float = 0.25
    min_samples: int = 5
    max_acceptance_drop: float = 0.15
    min_drafted: int = 200
    max_dead_letters: int = 0


@dataclass(frozen=True)
class PoolFigures:
    """What the gates compare of one pool: counts, error codes (when known), p99 latencies (NaN: none measured)."""

    completions: int = 0
    errors: int = 0
    error_codes: dict[str, int] = field(default_factory=dict)
    p99_ttft_s: float = math.nan
    p99_itl_s: float = math.nan
    drafted: float = 0.0
    acceptance: float | None = None
    source: str = "bus"

    @property
    def finals(self) -> int:
        return self.completions + self.errors

    @property
    def error_rate(self) -> float:
        return self.errors / self.finals if self.finals else 0.0

    def summary(self) -> str:
        acceptance = "-" if self.acceptance is None else f"{self.acceptance:.2f}"
        return (f"{self.finals} answered, {self.errors} errors ({100 * self.error_rate:.0f} %), p99 TTFT "
                f"{self.p99_ttft_s:.2f} s, p99 ITL {1000 * self.p99_itl_s:.0f} ms, acceptance {acceptance}")


@dataclass
class PoolStats:
    completions: int = 0
    errors: int = 0
    error_codes: dict[str, int] = field(default_factory=dict)
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0

    def add(self, event: Completion | ErrorEvent) -> None:
        if isinstance(event, ErrorEvent):
            self.errors += 1
            self.error_codes[event.code] = self.error_codes.get(event.code, 0) + 1
            return
        self.completions += 1
        self.ttft_s.append(event.timings.ttft_s)
        tokens = event.usage.completion_tokens
        if tokens > 1:
            self.itl_s.append((event.timings.total_s - event.timings.ttft_s) / (tokens - 1))
        self.drafted += event.spec.drafted
        self.accepted += event.spec.accepted

    def figures(self) -> PoolFigures:
        return PoolFigures(self.completions, self.errors, dict(self.error_codes), p99(self.ttft_s), p99(self.itl_s),
                           self.drafted, self.accepted / self.drafted if self.drafted else None)


def p99(values: list[float]) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


def failed_gate(gates: Gates, candidate: PoolFigures, stable: PoolFigures, dead_letters: int) -> str | None:
    """Why the candidate fails (one line naming the gate and the figures), or None while it holds."""
    if dead_letters > gates.max_dead_letters:
        return f"dead letters: the candidate dead-lettered {dead_letters} message(s) (at most {gates.max_dead_letters})"
    if candidate.errors >= gates.min_errors and \
            candidate.error_rate > stable.error_rate + gates.max_error_rate_increase:
        codes = ": " + ", ".join(f"{c} x{n}" for c, n in sorted(candidate.error_codes.items())) \
            if candidate.error_codes else ""
        return (f"error rate: candidate {100 * candidate.error_rate:.0f} % ({candidate.errors} of {candidate.finals}"
                f"{codes}) against stable {100 * stable.error_rate:.0f} % (from {candidate.source})")
    if candidate.completions >= gates.min_samples and stable.completions >= gates.min_samples:
        for name, ours, theirs in (("p99 TTFT", candidate.p99_ttft_s, stable.p99_ttft_s),
                                   ("p99 inter-token latency", candidate.p99_itl_s, stable.p99_itl_s)):
            limit = theirs * gates.latency_ratio + gates.latency_slack_s
            if not math.isnan(ours) and not math.isnan(theirs) and ours > limit:
                return (f"{name}: candidate {ours:.3f} s against stable {theirs:.3f} s (limit {limit:.3f} s, from "
                        f"{candidate.source})")
        drafted = min(candidate.drafted, stable.drafted) >= gates.min_drafted
        if drafted and candidate.acceptance is not None and stable.acceptance is not None and \
                candidate.acceptance < stable.acceptance - gates.max_acceptance_drop:
            return (f"acceptance rate: candidate {candidate.acceptance:.2f} against stable {stable.acceptance:.2f} "
                    f"(at most {gates.max_acceptance_drop:g} lower, from {candidate.source})")
    return None
