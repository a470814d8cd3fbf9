"""Recorded answers against a candidate's answers: the numbers of the `eval replay` report.

Text is compared only where both sides answered (a failed side counts against exact match but has no divergence or
length); latencies and speculation are compared as distributions over every answered request on each side.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from streams.eval.outcome import Outcome, Pair
from streams.eval.scoring import (
    delta,
    first_divergence,
    length_ratio,
    mean,
    percentile,
    rate,
    reference_match,
    token_f1,
)

LATENCIES = ("ttft_s", "itl_s", "e2e_s")


def compare(pairs: Sequence[Pair]) -> dict[str, Any]:
    """The comparison section of the report (see docs/eval.md for each field)."""
    return {
        "replayed": len(pairs),
        "exact_match_rate": rate(sum(1 for p in pairs if _exact(p)), len(pairs)),
        "first_divergence": _divergence(pairs),
        "length_ratio": _length_ratio(pairs),
        "finish_reason_changes": _finish_changes(pairs),
        "latency": {name: _latency(pairs, name) for name in LATENCIES},
        "speculation": {
            name: delta(_mean_of(pairs, lambda p: p.recorded, name), _mean_of(pairs, lambda p: p.candidate, name)).as_dict()
            for name in ("acceptance_rate", "tokens_per_forward")
        },
        "error_rate": delta(rate(sum(p.recorded.failed for p in pairs), len(pairs)),
                            rate(sum(p.candidate.failed for p in pairs), len(pairs))).as_dict(),
        "reference": reference_scores(pairs),
        "per_request": [_row(p) for p in pairs],
    }


def reference_scores(pairs: Sequence[Pair]) -> dict[str, Any] | None:
    """Exact match and token F1 against reference answers, for both sides; None when no pair has a reference."""
    scored = [p for p in pairs if p.reference is not None]
    if not scored:
        return None

    return {"count": len(scored),
            "recorded": against_references([(p.recorded.text or "", p.reference or "") for p in scored]),
            "candidate": against_references([(p.candidate.text or "", p.reference or "") for p in scored])}


def against_references(texts: Sequence[tuple[str, str]]) -> dict[str, float | None]:
    """Exact match rate and mean token F1 of (answer, reference) pairs; a failed request's answer is empty."""
    return {"exact_match": rate(sum(reference_match(a, r) for a, r in texts), len(texts)),
            "token_f1": mean([token_f1(a, r) for a, r in texts])}


def _exact(pair: Pair) -> bool:
    return not pair.recorded.failed and not pair.candidate.failed and pair.recorded.text == pair.candidate.text


def _answered(pairs: Sequence[Pair]) -> list[Pair]:
    return [p for p in pairs if not p.recorded.failed and not p.candidate.failed]


def _divergence(pairs: Sequence[Pair]) -> dict[str, Any]:
    """Where differing answers part ways, in characters and as a fraction of the recorded text."""
    positions: list[float] = []
    fractions: list[float] = []
    for p in _answered(pairs):
        at = first_divergence(p.recorded.text or "", p.candidate.text or "")
        if at is not None:
            positions.append(at)
            fractions.append(at / max(1, len(p.recorded.text or "")))
    return {"diverged": len(positions), "min_chars": min(positions, default=None),
            "p50_chars": percentile(positions, 50), "mean_fraction": mean(fractions)}


def _length_ratio(pairs: Sequence[Pair]) -> dict[str, float | None]:
    ratios = [r for p in _answered(pairs)
              if (r := length_ratio(p.candidate.completion_tokens, p.recorded.completion_tokens)) is not None]
    return {"mean": mean(ratios), "p50": percentile(ratios, 50), "min": min(ratios, default=None),
            "max": max(ratios, default=None)}


def _finish_changes(pairs: Sequence[Pair]) -> dict[str, Any]:
    changes = Counter(f"{_finish(p.recorded)}->{_finish(p.candidate)}" for p in pairs
                      if _finish(p.recorded) != _finish(p.candidate))
    return {"count": sum(changes.values()), "rate": rate(sum(changes.values()), len(pairs)), "by_change": dict(changes)}


def _finish(outcome: Outcome) -> str:
    return outcome.finish_reason or f"error:{outcome.error_code}"


def _latency(pairs: Sequence[Pair], name: str) -> dict[str, Any]:
    recorded = [v for p in pairs if (v := getattr(p.recorded, name)) is not None]
    candidate = [v for p in pairs if (v := getattr(p.candidate, name)) is not None]
    return {f"p{q}": delta(percentile(recorded, q), percentile(candidate, q)).as_dict() for q in (50, 99)}


def _mean_of(pairs: Sequence[Pair], pick: Callable[[Pair], Outcome], name: str) -> float | None:
    return mean([v for p in pairs if (v := getattr(pick(p), name)) is not None])


def _row(pair: Pair) -> dict[str, Any]:
    recorded, candidate = pair.recorded, pair.candidate
    return {
        "request_id": pair.request_id,
        "exact_match": _exact(pair),
        "first_divergence": first_divergence(recorded.text or "", candidate.text or "") if _answered([pair]) else None,
        "finish_reason": [_finish(recorded), _finish(candidate)],
        "completion_tokens": [recorded.completion_tokens, candidate.completion_tokens],
        "recorded_text": recorded.text,
        "candidate_text": candidate.text,
    }
