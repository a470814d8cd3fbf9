"""infra/prometheus is valid for Debian's Prometheus, its alerts fire on what they name, and the workers' file_sd
targets come from their announcements."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from schemas.events import ServiceAnnouncement
from streams.telemetry.targets import file_sd
from streams.testing.stack import REPO

PROMETHEUS_DIR = REPO / "infra" / "prometheus"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        raise RuntimeError("promtool not found: install Debian's prometheus package (./dev setup does)")
    return subprocess.run([binary, *args], cwd=PROMETHEUS_DIR, capture_output=True, text=True, timeout=120)


def test_the_rule_files_pass_promtool_check() -> None:
    result = _promtool("check", "rules", *sorted(str(p) for p in (PROMETHEUS_DIR / "rules").glob("*.yml")))
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_scrape_config_passes_promtool_check() -> None:
    result = _promtool("check", "config", "--syntax-only", "prometheus.yml")
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_alert_fires_on_its_situation_and_not_before() -> None:
    result = _promtool("test", "rules", "rules_test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    alerts = {"SpecstreamNoReadyWorker", "SpecstreamTTFTOverSLO", "SpecstreamAcceptanceCollapse",
              "SpecstreamConsumerLagGrowing", "SpecstreamDeadLetters"}
    tests = (PROMETHEUS_DIR / "rules_test.yml").read_text()
    assert all(f"alertname: {alert}" in tests for alert in alerts)


def _announcement(service_id: str, *, state: str = "ready", at: float = 100.0, url: str | None = "http://h:9464/metrics",
                  kind: str = "engine-worker") -> ServiceAnnouncement:
    return ServiceAnnouncement(kind=kind, service_id=service_id, state=state, started_at=0.0, at=at,  # type: ignore[arg-type]
                               metrics_url=url)


def test_file_sd_lists_live_services_with_their_announced_metrics_address() -> None:
    entries = file_sd([
        _announcement("w1", at=90.0, url="http://10.0.0.1:9000/metrics"),
        _announcement("w1", at=99.0, url="http://10.0.0.1:9001/metrics"),  # the newest announcement wins
        _announcement("w2", state="stopped", at=99.0),
        _announcement("w3", at=10.0),  # silent for too long
        _announcement("w4", url=None),  # serves no metrics
        _announcement("w5", state="draining", url="http://[::1]:9100/m"),
    ], now=100.0, max_age_s=15.0)
    assert entries == [
        {"targets": ["10.0.0.1:9001"], "labels": {"kind": "engine-worker", "service_id": "w1", "pool": "stable",
                                                  "__metrics_path__": "/metrics", "__scheme__": "http"}},
        {"targets": ["[::1]:9100"], "labels": {"kind": "engine-worker", "service_id": "w5", "pool": "stable",
                                               "__metrics_path__": "/m", "__scheme__": "http"}},
    ]


@pytest.mark.parametrize("state", ["starting", "stopped"])
def test_file_sd_skips_services_that_are_not_serving(state: str) -> None:
    assert file_sd([_announcement("w", state=state)], now=100.0, max_age_s=15.0) == []
