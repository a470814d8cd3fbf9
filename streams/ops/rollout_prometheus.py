"""The figures of a rollout's gates from Prometheus, where the deployment has one (``ops.rollout.prometheus_url``).

Each pool's error rate, p99 time to first token and inter-token latency, and acceptance rate are read from the
recording rules of ``infra/prometheus/rules/recording.yml`` (group ``specstream-pools``: 5-minute windows, by the
target label ``pool``, ``stable`` or ``candidate``), which every dashboard and alert shares, rather than from a
second computation over the reply topics. What Prometheus cannot say exactly stays on the bus: dead letters (a
counter born at its first increment loses that increment to ``increase()``) and whether the pool's workers live.

At 100 % stable serves nothing, and its 5-minute figures age out: the last figures seen remain its baseline, as the
bus keeps stable's answers over the whole rollout.
"""
from __future__ import annotations

import math
from typing import Any

import httpx

from streams.ops.rollout_gates import PoolFigures

POOL_LABEL = "pool"
POOLS = ("stable", "candidate")
# What the gates need -> the recording rule that holds it (by pool).
RULES = {
    "answered": "pool:specstream_worker_answered:increase5m",
    "errors": "pool:specstream_worker_errors:increase5m",
    "ttft": "pool:specstream_worker_ttft_seconds:p99_5m",
    "itl": "pool:specstream_worker_itl_seconds:p99_5m",
    "drafted": "pool:specstream_spec_decode_draft_tokens:increase5m",
    "acceptance": "pool:specstream_spec_decode_acceptance:ratio_rate5m",
}


class PrometheusError(Exception):
    """Prometheus did not answer a query (unreachable, timed out, or refused it); the message says which."""


class PrometheusGates:
    def __init__(self, url: str, *, timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._stable: PoolFigures | None = None  # the last stable figures with answers in them

    async def figures(self) -> tuple[PoolFigures, PoolFigures]:
        """(candidate, stable) from the recording rules; raises :class:`PrometheusError`."""
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            values = {name: await self._by_pool(client, rule) for name, rule in RULES.items()}
        candidate, stable = (_pool_figures(values, pool) for pool in ("candidate", "stable"))
        if stable.completions:
            self._stable = stable
        return candidate, (stable if stable.completions or self._stable is None else self._stable)

    async def _by_pool(self, client: httpx.AsyncClient, rule: str) -> dict[str, float]:
        query = f'{rule}{{{POOL_LABEL}=~"{"|".join(POOLS)}"}}'
        try:
            response = await client.get(f"{self.url}/api/v1/query", params={"query": query})
            body: dict[str, Any] = response.json()
        except (httpx.HTTPError, ValueError) as error:
            raise PrometheusError(f"{self.url}: {type(error).__name__}: {error}") from error
        if body.get("status") != "success":
            raise PrometheusError(f"{self.url} refused {query}: {body.get('error') or response.status_code}")
        return {series["metric"].get(POOL_LABEL, ""): float(series["value"][1]) for series in body["data"]["result"]}


def _pool_figures(values: dict[str, dict[str, float]], pool: str) -> PoolFigures:
    def get(name: str) -> float:
        return values[name].get(pool, math.nan)

    def count(name: str) -> int:
        # increase() extrapolates over the window, so counts are fractional: the nearest whole number of messages.
        value = get(name)
        return 0 if math.isnan(value) else round(value)

    acceptance = get("acceptance")
    drafted = get("drafted")
    return PoolFigures(completions=count("answered"), errors=count("errors"), p99_ttft_s=get("ttft"),
                       p99_itl_s=get("itl"), drafted=0.0 if math.isnan(drafted) else drafted,
                       acceptance=None if math.isnan(acceptance) else acceptance, source="prometheus")
