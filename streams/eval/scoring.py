"""The measures `specstream eval` reports: pure functions over texts and numbers, no Kafka.

* :func:`first_divergence`: where two texts first differ (characters), None when equal.
* :func:`length_ratio`: candidate length over recorded length (tokens).
* :func:`token_f1`: SQuAD-style token overlap of an answer with a reference.
* :func:`percentile` and :func:`delta`: latency percentiles and how they moved.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from streams.bench import stats

_PUNCTUATION = re.compile(f"[{re.escape(string.punctuation)}]")


def first_divergence(recorded: str, candidate: str) -> int | None:
    """Index of the first character where the texts differ; the shorter length when one is a prefix of the other."""
    if recorded == candidate:
        return None
    for index, (a, b) in enumerate(zip(recorded, candidate)):
        if a != b:
            return index
    return min(len(recorded), len(candidate))


def length_ratio(candidate_tokens: int, recorded_tokens: int) -> float | None:
    """Candidate completion tokens over recorded ones; None when the recording has none to compare with."""
    if recorded_tokens <= 0:
        return None
    return candidate_tokens / recorded_tokens


def answer_tokens(text: str) -> list[str]:
    """Lower-cased words without punctuation: what token F1 and reference exact match compare."""
    return _PUNCTUATION.sub(" ", text.lower()).split()


def reference_match(answer: str, reference: str) -> bool:
    """Exact match after normalisation (case, punctuation, whitespace), as reference benchmarks score it."""
    return answer_tokens(answer) == answer_tokens(reference)


def token_f1(answer: str, reference: str) -> float:
    """Harmonic mean of token precision and recall (bag of words); 1.0 when both are empty."""
    predicted, expected = answer_tokens(answer), answer_tokens(reference)
    if not predicted or not expected:
        return float(predicted == expected)
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) as `specstream bench` computes it (linear interpolation between closest ranks);
    None for no values, which JSON can carry where NaN cannot."""
    return stats.percentile(values, q) if values else None


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def rate(hits: int, total: int) -> float | None:
    return hits / total if total else None


@dataclass(frozen=True)
class Delta:
    """A measure of the recording and of the candidate, and how it moved (relative: over the recorded value)."""

    recorded: float | None
    candidate: float | None
    change: float | None
    relative: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def delta(recorded: float | None, candidate: float | None) -> Delta:
    if recorded is None or candidate is None:
        return Delta(recorded, candidate, None, None)
    change = candidate - recorded
    return Delta(recorded, candidate, change, change / recorded if recorded else None)
