"""Statistics of a benchmark run: percentiles, SLOs and goodput.

Pure functions of numbers, so they are unit-tested without a model or a server.
Percentiles use linear interpolation between closest ranks (numpy's default,
and what ``vllm bench serve`` reports), so p50 of [1, 2, 3, 4] is 2.5.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PERCENTILES = (50, 90, 99)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0..100")
    data = sorted(values)
    if not data:
        return math.nan
    if len(data) == 1:
        return float(data[0])
    rank = (len(data) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return float(data[low])
    return float(data[low] + (data[high] - data[low]) * (rank - low))


def summarize(values: Iterable[float], scale: float = 1.0) -> dict[str, float | int | None]:
    """count, mean, std, min, p50, p90, p99, max of ``values * scale``; None instead of NaN (valid JSON)."""
    data = [v * scale for v in values]
    out: dict[str, float | int | None] = {"count": len(data)}
    if not data:
        out.update({k: None for k in ("mean", "std", "min", *(f"p{p}" for p in PERCENTILES), "max")})
        return out
    mean = sum(data) / len(data)
    out["mean"] = mean
    out["std"] = math.sqrt(sum((v - mean) ** 2 for v in data) / len(data))
    out["min"] = min(data)
    for p in PERCENTILES:
        out[f"p{p}"] = percentile(data, p)
    out["max"] = max(data)
    return out


# --- SLOs and goodput --------------------------------------------------------------------------------------------

SLO_METRICS = ("ttft", "tpot", "itl", "e2e")
_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|us)?\s*$")


def parse_duration_s(text: str) -> float:
    """'500ms' -> 0.5, '5s' -> 5.0, '250us' -> 0.00025; a bare number is milliseconds (as in vLLM's --goodput)."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"cannot read duration {text!r}; write e.g. 500ms or 5s")
    value, unit = float(match.group(1)), match.group(2) or "ms"
    return value * {"ms": 1e-3, "s": 1.0, "us": 1e-6}[unit]


def parse_slo(text: str | None) -> dict[str, float]:
    """'ttft=500ms,e2e=5s' -> {'ttft': 0.5, 'e2e': 5.0} (seconds). Metrics: ttft, tpot, itl (a request's worst gap), e2e."""
    if not text:
        return {}
    slo: dict[str, float] = {}
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep:
            name, sep, value = part.partition(":")
        name = name.strip().lower()
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"cannot read SLO {part!r}; write metric=duration with metric one of {', '.join(SLO_METRICS)}")
        seconds = parse_duration_s(value)
        if seconds <= 0:
            raise ValueError(f"SLO {part!r} must be positive")
        slo[name] = seconds
    return slo


@dataclass(frozen=True)
class SloOutcome:
    good: int
    total: int  # requests counted: successes and failures alike (a failed request is never good)
    duration_s: float

    @property
    def goodput(self) -> float:
        """Good requests per second."""
        return self.good / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def fraction(self) -> float:
        return self.good / self.total if self.total else 0.0


def meets_slo(metrics: dict[str, float | None], slo: dict[str, float]) -> bool:
    """True when every metric named in the SLO is known and within its bound (seconds)."""
    for name, bound in slo.items():
        value = metrics.get(name)
        if value is None or math.isnan(value) or value > bound:
            return False
    return True


def goodput(successes: Sequence[dict[str, float | None]], failures: int, slo: dict[str, float], duration_s: float) -> SloOutcome:
    """Requests per second that succeeded *and* met the SLO. Without an SLO every success is good."""
    good = sum(1 for m in successes if meets_slo(m, slo))
    return SloOutcome(good=good, total=len(successes) + failures, duration_s=duration_s)


def cdf(values: Sequence[float]) -> tuple[list[float], list[float]]:
    """Sorted values and their empirical cumulative fractions (for plotting)."""
    data = sorted(values)
    n = len(data)
    return data, [(i + 1) / n for i in range(n)]
