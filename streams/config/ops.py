"""The ``ops`` section: how operations tools (``specstream rollout``) read the deployment."""
from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, field_validator

from streams.config.base import Section


class RolloutSettings(Section):
    prometheus_url: str | None = Field(
        default=None,
        description="Prometheus' base URL (http://prometheus:9090): `rollout start` reads the error rate, p99 TTFT and "
        "inter-token latency and acceptance of each pool (target label `pool`: stable, candidate) from the recording "
        "rules of infra/prometheus; null: from the bus (reply topics). Dead letters and liveness always come from the "
        "bus.",
    )
    prometheus_timeout_s: float = Field(default=5.0, gt=0, description="Bound of one Prometheus query.")
    @field_validator("prometheus_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"expected an http(s) URL such as http://127.0.0.1:9090, got {value!r}")
        return value.rstrip("/")


class OpsSettings(Section):
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
