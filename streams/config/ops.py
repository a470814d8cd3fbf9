"""The ``ops`` section: how operations tools (``specstream rollout``) read the deployment, and how ``specstream up``
restarts what it runs."""
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
    kafka_outage_s: float = Field(
        default=120.0, gt=0, le=3600,
        description="How long `rollout start` rides through Kafka errors that retrying may fix (a broker restarting, "
        "a leader moving: three brokers with min.insync.replicas 2 still serve with one down), asking again with "
        "pauses from 0.5 to 5 s; past it, it records the rollback if Kafka takes it, stops the candidate workers it "
        "started and exits 1 naming the error. A SIGINT/SIGTERM meanwhile ends the wait at its next try.",
    )
    @field_validator("prometheus_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"expected an http(s) URL such as http://127.0.0.1:9090, got {value!r}")
        return value.rstrip("/")


class RestartSettings(Section):
    first_backoff_s: float = Field(default=1.0, gt=0, le=300, description="`specstream up`: wait before restarting a "
                                   "service that died; doubled for each death in a row.")
    max_backoff_s: float = Field(default=15.0, gt=0, le=3600, description="The longest wait between restarts.")
    healthy_after_s: float = Field(
        default=60.0, gt=0, description="A service that ran this long before dying starts a new count of deaths in a "
        "row: longer than a warm start and first heartbeats, so one that dies while loading its model every time counts.",
    )
    crash_loop_after: int = Field(default=6, ge=2, le=100, description="Deaths in a row, each before healthy_after_s, "
                                  "after which `up` stops restarting it, stops the rest and exits 1 (crash-looping).")


class OpsSettings(Section):
    rollout: RolloutSettings = Field(default_factory=RolloutSettings)
    restart: RestartSettings = Field(default_factory=RestartSettings)
