"""Debian's Prometheus for the telemetry tests (the OTLP receiver is :mod:`streams.testing.otlp`).

* :func:`prometheus_server` starts the ``prometheus`` binary on a free port with a generated
  configuration, its own storage, and our rule files; :class:`Prometheus` queries its HTTP API.
"""
from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from streams.testing.stack import REPO, free_port

RULES = sorted((REPO / "infra" / "prometheus" / "rules").glob("*.yml"))


def by_consumer(metrics_text: str, name: str) -> dict[str, float]:
    """A consumer series' value per `consumer` label (the consumer kind), from a /metrics page."""
    return {s.labels["consumer"]: s.value for family in text_string_to_metric_families(metrics_text)
            for s in family.samples if s.name == name}


class Prometheus:
    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def query(self, promql: str) -> list[dict[str, Any]]:
        response = httpx.get(f"{self.base_url}/api/v1/query", params={"query": promql}, timeout=10.0)
        body = response.json()
        assert body.get("status") == "success", f"{promql}: {body}"
        return body["data"]["result"]

    def value(self, promql: str) -> float | None:
        """The single sample's value, or None when the query returns nothing."""
        result = self.query(promql)
        if not result:
            return None
        assert len(result) == 1, f"{promql}: expected one series, got {result}"
        return float(result[0]["value"][1])

    def wait_for(self, promql: str, expected: float, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        last: float | None = None
        while time.monotonic() < deadline:
            last = self.value(promql)
            if last == expected:
                return
            time.sleep(0.5)
        raise AssertionError(f"{promql} = {last}, expected {expected} within {timeout_s:.0f}s")


@contextlib.contextmanager
def prometheus_server(edge_target: str, worker_targets_file: Path, *, scrape_s: float = 1.0) -> Iterator[Prometheus]:
    """Debian's prometheus scraping the edge (static) and the workers (file_sd), with infra/prometheus's rules."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("prometheus not found: install Debian's prometheus package (./dev setup does)")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="specstream-prometheus-") as tmp:
        config = {
            "global": {"scrape_interval": f"{scrape_s:g}s", "evaluation_interval": f"{scrape_s:g}s"},
            "rule_files": [str(path) for path in RULES],
            "scrape_configs": [
                {"job_name": "specstream-edge", "static_configs": [{"targets": [edge_target]}]},
                {"job_name": "specstream-workers",
                 "file_sd_configs": [{"files": [str(worker_targets_file)], "refresh_interval": "1s"}]},
            ],
        }
        config_file = Path(tmp) / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        log = open(Path(tmp) / "prometheus.log", "wb")  # noqa: SIM115 - closed below
        process = subprocess.Popen(
            [binary, f"--config.file={config_file}", f"--storage.tsdb.path={tmp}/data",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"prometheus exited: {(Path(tmp) / 'prometheus.log').read_text()[-2000:]}")
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{base}/-/ready", timeout=1.0).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise TimeoutError("prometheus not ready after 60 s")
                time.sleep(0.3)
            yield Prometheus(base)
        finally:
            process.terminate()  # Prometheus stops within a second on SIGTERM; a hung one is killed after 15 s
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(15)
            if process.poll() is None:
                process.kill()
            log.close()


def histogram_quantile(q: float, values: list[float], buckets: tuple[float, ...]) -> float:
    """Prometheus' histogram_quantile over these observations in these buckets (linear within a bucket)."""
    bounds = [*buckets, float("inf")]
    counts = [sum(1 for v in values if v <= bound) for bound in bounds]
    rank = q * counts[-1]
    index = next(i for i, count in enumerate(counts) if count >= rank)
    if index == len(bounds) - 1:
        return bounds[-2]
    lower, below = (0.0, 0) if index == 0 else (bounds[index - 1], counts[index - 1])
    return lower + (bounds[index] - lower) * (rank - below) / (counts[index] - below)
