"""The Prometheus metrics, named as vLLM names them under our prefix so dashboards translate.

``vllm:time_to_first_token_seconds`` is ``specstream:time_to_first_token_seconds`` here, and so
on (vLLM's label ``model_name`` too). Every process keeps its metrics in a registry of its own
(:class:`prometheus_client.CollectorRegistry`), so an edge and a worker built in one test
process do not collide.

The two latencies users feel, time to first token and end-to-end latency, are measured twice:
by the worker (``measured_at="worker"``: from the request's publication, as ``Completion.timings``
reports) and by the edge (``measured_at="edge"``: from the HTTP request's arrival to the first
and the last byte its client receives). Alert on the edge's; the worker's explain it.

Label values that come from clients are bounded: :class:`BoundedLabel` keeps the first
``telemetry.metrics.max_tenants`` tenants (and the first 64 model names: LoRA adapters are models of
their own) and counts the rest as ``other``.
"""
from __future__ import annotations

import copy
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics

PREFIX = "specstream:"
# vLLM v1's buckets: seconds-scale latencies on slow hardware still land in a finite bucket.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
# A consumer's handling time: milliseconds (a parser) to minutes (a long generation).
HANDLING_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                    600.0)
OTHER = "other"
# Distinct model_name values a worker labels (the base model and the LoRA adapters it served); the rest are "other".
MAX_MODELS = 64
# The *_created series double every counter and histogram and no dashboard or rule of ours reads them.
disable_created_metrics()


class BoundedLabel:
    """Maps client-chosen label values to themselves for the first ``limit`` distinct ones, then to ``other``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        with self._lock:
            if len(self._seen) < self.limit:
                self._seen.add(value)
                return value
        return OTHER


class WorkerMetrics:
    """What an engine worker serves at /metrics."""

    def __init__(self, registry: CollectorRegistry, *, max_tenants: int = 50) -> None:
        self.registry = registry
        self.tenant = BoundedLabel(max_tenants)
        # model_name is a LoRA adapter's name for its requests (per-adapter series); adapters come and go, so bounded.
        self.model = BoundedLabel(MAX_MODELS)
        by_request = ["measured_at", "model_name", "tenant"]
        self.ttft = Histogram(f"{PREFIX}time_to_first_token_seconds", "Time to first token: publication to the "
                              "first token (worker) or request arrival to the first byte sent (edge).",
                              by_request, buckets=TTFT_BUCKETS, registry=registry)
        self.e2e = Histogram(f"{PREFIX}e2e_request_latency_seconds", "End-to-end request latency: publication to "
                             "the final event (worker) or request arrival to the last byte sent (edge).",
                             by_request, buckets=REQUEST_BUCKETS, registry=registry)
        self.itl = Histogram(f"{PREFIX}inter_token_latency_seconds", "Time between two outputs of one request.",
                             ["model_name"], buckets=ITL_BUCKETS, registry=registry)
        self.queue_time = Histogram(f"{PREFIX}request_queue_time_seconds", "Publication to the first scheduled step.",
                                    ["model_name"], buckets=REQUEST_BUCKETS, registry=registry)
        self.running = Gauge(f"{PREFIX}num_requests_running", "Requests in the engine's running batch.",
                             ["model_name"], registry=registry)
        self.waiting = Gauge(f"{PREFIX}num_requests_waiting", "Requests waiting for the engine to start them.",
                             ["model_name"], registry=registry)
        self.kv_usage = Gauge(f"{PREFIX}kv_cache_usage_perc", "KV cache usage (1 = 100%).", ["model_name"],
                              registry=registry)
        self.num_drafts = Counter(f"{PREFIX}spec_decode_num_drafts", "Speculative drafts (one per request and step "
                                  "that drafted).", ["model_name"], registry=registry)
        self.draft_tokens = Counter(f"{PREFIX}spec_decode_num_draft_tokens", "Draft tokens proposed.",
                                    ["model_name"], registry=registry)
        self.accepted_tokens = Counter(f"{PREFIX}spec_decode_num_accepted_tokens", "Draft tokens accepted.",
                                       ["model_name"], registry=registry)
        self.accepted_per_pos = Counter(f"{PREFIX}spec_decode_num_accepted_tokens_per_pos",
                                        "Draft tokens accepted, by position in the draft.", ["model_name", "position"],
                                        registry=registry)
        self.draft_tokens_by_source = Counter(f"{PREFIX}spec_decode_num_draft_tokens_by_source",
                                              "Draft tokens proposed, by draft source (suffix, lookup, head, or "
                                              "the method).", ["model_name", "source"], registry=registry)
        self.accepted_by_source = Counter(f"{PREFIX}spec_decode_num_accepted_tokens_by_source",
                                          "Draft tokens accepted, by draft source.", ["model_name", "source"],
                                          registry=registry)
        self.prompt_tokens = Counter(f"{PREFIX}prompt_tokens", "Prompt tokens of finished requests.",
                                     ["model_name", "tenant"], registry=registry)
        self.generation_tokens = Counter(f"{PREFIX}generation_tokens", "Generated tokens of finished requests.",
                                         ["model_name", "tenant"], registry=registry)
        # vLLM's prefix-cache counters count tokens: prompt tokens looked up, and of them found cached.
        self.prefix_cache_queries = Counter(f"{PREFIX}prefix_cache_queries", "Prompt tokens looked up in the prefix "
                                            "cache (finished requests).", ["model_name"], registry=registry)
        self.prefix_cache_hits = Counter(f"{PREFIX}prefix_cache_hits", "Prompt tokens found in the prefix cache "
                                         "(finished requests).", ["model_name"], registry=registry)
        self.preemptions = Counter(f"{PREFIX}num_preemptions", "Times a request gave its KV back to a more urgent "
                                   "one and was recomputed (finished requests).", ["model_name"], registry=registry)
        self.request_success = Counter(f"{PREFIX}request_success", "Finished requests by finish reason.",
                                       ["model_name", "finished_reason"], registry=registry)

    def watch_engine(self, model_name: str, running: Callable[[], float], waiting: Callable[[], float],
                     kv_usage: Callable[[], float]) -> None:
        """Gauges read from the engine at scrape time: nothing is done per step for them."""
        self.running.labels(model_name).set_function(_guarded(running))
        self.waiting.labels(model_name).set_function(_guarded(waiting))
        self.kv_usage.labels(model_name).set_function(_guarded(kv_usage))


OUTCOMES = ("answered", "error", "rejected", "undelivered", "handed_back")


class ConsumerMetrics:
    """What the consumer foundation counts for every consumer (engine worker, parser, ...), labelled by its kind.

    The Kafka-side health of a consumer (lag, dead letters, failed publishes) and how its messages ended:
    ``answered`` (final event not an error), ``error`` (answered with an ErrorEvent), ``rejected`` (refused before
    its handler), ``undelivered`` (some of its events never acknowledged), ``handed_back`` (rebalance, drain).
    """

    def __init__(self, registry: CollectorRegistry, kind: str) -> None:
        self.registry = registry
        self.kind = kind
        self.messages = Counter(f"{PREFIX}consumer_messages", "Input messages handled, by consumer kind and outcome.",
                                ["consumer", "outcome"], registry=registry)
        self.handling = Histogram(f"{PREFIX}consumer_handling_seconds", "Consumed to outcome acknowledged by "
                                  "Kafka, per message.", ["consumer"], buckets=HANDLING_BUCKETS, registry=registry)
        self.in_flight = Gauge(f"{PREFIX}consumer_in_flight", "Messages held by the consumer's handler.",
                               ["consumer"], registry=registry)
        self.consumer_lag = Gauge(f"{PREFIX}kafka_consumer_lag", "Records not yet read by the consumer group, per "
                                  "partition (high watermark - position).", ["group", "topic", "partition"],
                                  registry=registry)
        self.dead_letters = Counter(f"{PREFIX}dead_letters", "Messages dead-lettered, by consumer kind and reason "
                                    "code.", ["consumer", "reason"], registry=registry)
        self.producer_errors = Counter(f"{PREFIX}producer_errors", "Events published that failed or were not "
                                       "acknowledged in time.", ["consumer"], registry=registry)
        self._born(kind)

    def of(self, kind: str) -> ConsumerMetrics:
        """The same series for another consumer of this process (the worker's batch lane), labelled by its kind."""
        other = copy.copy(self)
        other.kind = kind
        other._born(kind)
        return other

    def _born(self, kind: str) -> None:
        # Every outcome from zero: rate() and increase() miss the first increment of a series born at 1.
        for outcome in OUTCOMES:
            self.messages.labels(kind, outcome)
        self.producer_errors.labels(kind)

    def dead_lettered(self, reason: str) -> None:
        # The code before the first ':' ("reply_topic_missing: ..."): a bounded label.
        self.dead_letters.labels(self.kind, reason.split(":", 1)[0].strip() or "unknown").inc()

    def handled(self, outcome: str, seconds: float | None = None) -> None:
        self.messages.labels(self.kind, outcome).inc()
        if seconds is not None:
            self.handling.labels(self.kind).observe(seconds)

    def watch_in_flight(self, count: Callable[[], float]) -> None:
        self.in_flight.labels(self.kind).set_function(_guarded(count))


class EdgeMetrics:
    """What the edge serves at /metrics: requests by route and status, rate-limit refusals, client latencies."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(f"{PREFIX}edge_requests", "HTTP requests answered, by route and status.",
                                ["route", "status"], registry=registry)
        self.rate_limited = Counter(f"{PREFIX}rate_limit_rejections", "Requests refused with 429, by the limit hit "
                                    "(rpm, tpm, concurrency).", ["limit"], registry=registry)
        self.ttft = Histogram(f"{PREFIX}time_to_first_token_seconds", "Time to first token: request arrival to the "
                              "first byte of the answer its client receives.", ["measured_at", "route"],
                              buckets=TTFT_BUCKETS, registry=registry)
        self.e2e = Histogram(f"{PREFIX}e2e_request_latency_seconds", "End-to-end latency: request arrival to the last "
                             "byte its client receives.", ["measured_at", "route"], buckets=REQUEST_BUCKETS,
                             registry=registry)
        self.ready_workers = Gauge(f"{PREFIX}ready_workers", "Engine workers this edge counts as ready (announced "
                                   "ready within edge.ready_heartbeats heartbeats).", registry=registry)

    def watch_ready_workers(self, count: Callable[[], float]) -> None:
        self.ready_workers.set_function(_guarded(count))


def _guarded(read: Callable[[], float]) -> Callable[[], float]:
    """A scrape must never fail because the engine is busy or gone: NaN instead."""

    def value() -> float:
        try:
            return float(read())
        except Exception:  # noqa: BLE001 - diagnostics only
            return float("nan")

    return value
