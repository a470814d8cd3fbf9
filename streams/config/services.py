"""The sections of the services on the bus: engine workers, the edge, evaluation and telemetry."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from streams.config.base import _TOPIC_SAFE, MIB, ByteSize, Section, host_pid_id
from streams.config.kafka import FAILOVER_BOUND_S


class ConsumerSettings(Section):
    """What every consumer on the foundation (streams/service/) is configured by; each service's section narrows
    the defaults and descriptions to its messages."""

    id: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=_TOPIC_SAFE,
        description="Worker id in announcements and dead letters; null: <hostname>-<pid>.",
    )
    max_message_bytes: ByteSize = Field(
        default=MIB, ge=1024, description="Larger request messages are rejected (message_too_large) and dead-lettered."
    )
    heartbeat_s: float = Field(default=5.0, gt=0, description="Seconds between `ready` announcements on the services topic.")
    max_inflight: int = Field(
        default=128, ge=1, description="Most requests held (running + queued); beyond it the worker stops reading requests."
    )
    drain_timeout_s: float = Field(
        default=30.0, ge=0, description="On shutdown, seconds to finish running requests before aborting the rest."
    )
    session_timeout_ms: int = Field(
        default=6000, ge=1000, le=300_000,
        description="Consumer-group session timeout: a worker killed without warning loses its request partitions "
        "to the others after this long (the broker's group.min.session.timeout.ms, 6000 by default, is the floor).",
    )
    heartbeat_interval_ms: int = Field(
        default=1000, ge=100, description="Consumer-group heartbeats; a rebalance reaches a worker within one of them."
    )

    def resolved_id(self) -> str:
        return self.id or host_pid_id("worker")

    @model_validator(mode="after")
    def _heartbeat_below_session(self) -> "ConsumerSettings":
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError(
                f"heartbeat_interval_ms ({self.heartbeat_interval_ms}) must be below session_timeout_ms "
                f"({self.session_timeout_ms})"
            )
        return self


class WorkerSettings(ConsumerSettings):
    group_id: str | None = Field(
        default=None, min_length=1, description="Consumer group of the request topic; null: <topic_prefix>.engine-workers."
    )

    def resolved_group_id(self, topic_prefix: str) -> str:
        return self.group_id or f"{topic_prefix}.engine-workers"


class EdgeAuthSettings(Section):
    enabled: bool = Field(
        default=True, description="Require an API key on every API call; false: anyone may call (`specstream up` warns)."
    )
    keys_file: str | None = Field(
        default=None, description="Hashed API keys and tenant limits (`specstream keys`); null: ~/.config/specstream/keys.json."
    )
    key_hashes: list[str] = Field(
        default_factory=list,
        description="More keys as 'tenant:sha256-hex' entries, e.g. from the environment (`specstream keys hash`).",
    )


class EdgeLimitSettings(Section):
    rpm: int | None = Field(default=600, ge=1, description="Requests per minute of a tenant that sets none; null: no limit.")
    tpm: int | None = Field(
        default=500_000, ge=1, description="Tokens (prompt + max_tokens) per minute of a tenant that sets none; null: no limit."
    )
    concurrency: int | None = Field(
        default=32, ge=1, description="Requests in flight at once for a tenant that sets none; null: no limit."
    )
    # Batch jobs have budgets of their own: a batch spends none of rpm/tpm/concurrency, a request none of these.
    batch_tokens_per_day: int | None = Field(
        default=20_000_000, ge=1, description="Tokens (prompt + max_tokens of every line, counted when the batch is "
        "created) of the batches a tenant that sets none may create in 24 h; null: no limit.",
    )
    batch_queued_lines: int | None = Field(
        default=100_000, ge=1, description="Lines of its batches not answered yet a tenant that sets none may have "
        "at once; a batch that would pass it is refused when created; null: no limit.",
    )


class EdgeSettings(Section):
    host: str = Field(default="127.0.0.1", min_length=1, description="Address the HTTP/websocket edge listens on.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port the edge listens on.")
    edge_id: str | None = Field(
        default=None, min_length=1, max_length=64, pattern=_TOPIC_SAFE,
        description="Names this edge's reply topic <topic_prefix>.replies.<edge_id>; null: <hostname>-<port>.",
    )
    request_timeout_s: float | None = Field(
        default=120.0, gt=0, description="End-to-end limit of a request, sent as its deadline; null: none."
    )
    deadline_grace_s: float = Field(
        default=5.0, ge=0, description="Extra seconds the edge waits past a deadline for the worker's own reply."
    )
    ready_heartbeats: int = Field(
        default=3, ge=1, description="/readyz counts a worker alive within this many worker heartbeats."
    )
    max_tokens_default: int = Field(default=128, ge=1, le=32768, description="max_tokens when a client gives none.")
    startup_timeout_s: float = Field(default=30.0, gt=0, description="Seconds the edge waits for Kafka at start.")
    publish_timeout_s: float = Field(
        default=FAILOVER_BOUND_S, gt=0, le=300,
        description="Most seconds a request's publish waits for the broker's acknowledgement before the client gets "
        "503. Longer than a partition leader's failover (as kafka.delivery.publish_timeout_s).",
    )
    redis_url: str | None = Field(
        default=None, description="Redis for rate-limit counters shared by every edge; null: in memory, per edge."
    )
    shutdown_grace_s: float = Field(
        default=20.0, gt=0, le=300,
        description="On SIGTERM, seconds the edge lets requests in flight finish before it closes their connections "
        "(websockets are closed at once, their requests cancelled); below the pod's terminationGracePeriodSeconds "
        "(30).",
    )
    max_body_bytes: ByteSize = Field(default=MIB, ge=1024, description="Larger HTTP request bodies get 413.")
    max_ws_frame_bytes: ByteSize = Field(
        default=MIB, ge=1024, description="Larger websocket frames close the socket with code 1009."
    )
    responses_retention_h: float = Field(
        default=720.0, gt=0, description="Hours a stored response of the Responses API (`store: true`) is kept for "
        "GET /v1/responses/{id} and `previous_response_id` (the responses topic's retention; OpenAI keeps 30 days).",
    )
    auth: EdgeAuthSettings = Field(default_factory=EdgeAuthSettings)
    limits: EdgeLimitSettings = Field(default_factory=EdgeLimitSettings)


class CandidateSampling(Section):
    max_tokens_cap: int | None = Field(
        default=None, ge=1,
        description="Candidate policy for `eval replay`: caps every replayed request's max_tokens; null: as recorded.",
    )
    temperature: float | None = Field(
        default=None, ge=0.0, le=2.0,
        description="Candidate policy for `eval replay`: replaces the recorded temperature; null: as recorded.",
    )
    top_p: float | None = Field(
        default=None, gt=0.0, le=1.0,
        description="Candidate policy for `eval replay`: replaces the recorded top_p; null: as recorded.",
    )
    top_k: int | None = Field(
        default=None, ge=0,
        description="Candidate policy for `eval replay`: replaces the recorded top_k; null: as recorded.",
    )


class EvalSettings(Section):
    log_completions: bool = Field(
        default=True, description="Workers publish every finished request once to <prefix>.completions (what "
        "`specstream eval replay` replays); a tenant's `log_prompts: false` keeps its prompts out.",
    )
    completions_retention_h: float = Field(
        default=168.0, gt=0, description="Hours the completions topic keeps records (how far back a replay reaches).",
    )
    candidate_sampling: CandidateSampling = Field(
        default_factory=CandidateSampling,
        description="Read when this file is the --candidate of `specstream eval replay`: the sampling policy of the "
        "candidate deployment, applied to each recorded request before it is replayed.",
    )


class TracingSettings(Section):
    """OpenTelemetry tracing. Each key is null by default: the standard OTEL_* variable (or the SDK's default) applies."""

    enabled: bool | None = Field(
        default=None,
        description="Trace requests; null: on when OTEL_EXPORTER_OTLP_ENDPOINT (or _TRACES_ENDPOINT) is set and "
        "OTEL_SDK_DISABLED is not true. Off costs nothing: no tracer is built.",
    )
    endpoint: str | None = Field(
        default=None, description="OTLP collector base URL, e.g. http://127.0.0.1:4318; null: OTEL_EXPORTER_OTLP_ENDPOINT."
    )
    protocol: Literal["http/protobuf", "grpc"] | None = Field(
        default=None, description="OTLP transport; null: OTEL_EXPORTER_OTLP_PROTOCOL, else http/protobuf."
    )
    service_name: str | None = Field(
        default=None, min_length=1,
        description="service.name of the spans; null: OTEL_SERVICE_NAME, else specstream-edge / specstream-worker.",
    )
    sampler: Literal["always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
                     "parentbased_traceidratio"] | None = Field(
        default=None, description="Which requests are traced; null: OTEL_TRACES_SAMPLER, else parentbased_always_on."
    )
    sampler_arg: float | None = Field(
        default=None, ge=0.0, le=1.0, description="Ratio of the *traceidratio samplers; null: OTEL_TRACES_SAMPLER_ARG."
    )


class MetricsSettings(Section):
    enabled: bool = Field(
        default=True, description="Serve Prometheus metrics: GET /metrics on the edge's port and on each worker's (and "
        "other consumer service's) own."
    )
    worker_host: str = Field(
        default="127.0.0.1", min_length=1,
        description="Address the /metrics of a worker (or any consumer service: parser, embedder, ...) listens on.",
    )
    worker_port: int | None = Field(
        default=None, ge=0, le=65535,
        description="Port of a worker's (or other consumer service's) /metrics; null or 0: a free port. Each announces "
        "its own (metrics_url) and logs it.",
    )
    max_tenants: int = Field(
        default=50, ge=1, description="Distinct tenant label values per process; later tenants are counted as 'other'.",
    )


class TelemetrySettings(Section):
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
