"""When requests are sent: open-loop arrival times.

Inter-arrival gaps follow a gamma distribution with shape ``burstiness`` and
mean ``1 / rate`` (as in ``vllm bench serve``): burstiness 1 is a Poisson
process, below 1 is burstier, above 1 is more even; an infinite rate sends
everything at once. Times come from their own seeded generator, so the same
seed gives the same schedule whatever else the run draws at random.
"""
from __future__ import annotations

import math
import random
from collections.abc import Iterator


def gaps(rate: float, burstiness: float = 1.0, seed: int | None = 0) -> Iterator[float]:
    """Endless inter-arrival gaps in seconds (0.0 forever for an infinite rate)."""
    if rate <= 0:
        raise ValueError(f"request rate must be positive, not {rate}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, not {burstiness}")
    if math.isinf(rate):
        while True:
            yield 0.0
    rng = random.Random(f"arrivals:{seed}")
    scale = 1.0 / (rate * burstiness)
    while True:
        yield rng.gammavariate(burstiness, scale)


def arrival_times(n: int, rate: float, burstiness: float = 1.0, seed: int | None = 0) -> list[float]:
    """Offsets (seconds from the start) of ``n`` arrivals; the first request leaves at 0."""
    times: list[float] = []
    t = 0.0
    source = gaps(rate, burstiness, seed)
    for i in range(n):
        if i:
            t += next(source)
        times.append(t)
    return times


def parse_rate(text: str) -> float:
    """'4' -> 4.0; 'inf' -> infinity (all requests at once)."""
    value = float(text)
    if value <= 0 or math.isnan(value):
        raise ValueError(f"request rate must be positive, not {text!r}")
    return value


def parse_rates(text: str) -> list[float]:
    """'1,2,4' -> [1.0, 2.0, 4.0]."""
    rates = [parse_rate(p) for p in text.split(",") if p.strip()]
    if not rates:
        raise ValueError("--sweep-rates needs at least one rate")
    return rates
