"""What the edge reads from the project settings, as one flat, frozen object.

:class:`EdgeOptions` is built from :class:`streams.config.Settings` (sections
``kafka``, ``edge``, ``worker``, ``engine``) by :meth:`EdgeOptions.from_settings`;
tests may also construct one directly. The served model list is
``engine.model``; the worker heartbeat that /readyz counts in is
``worker.heartbeat_s``; the context the edge checks prompts against is
``engine.max_model_len``. Authentication is on by default here too
(``auth_enabled``): a test that does not exercise it says ``auth_enabled=False``.
"""
from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field, fields, replace
from typing import Any

from schemas.topics import TopicCatalog
from streams.config import DEFAULT_MODEL, KafkaSettings, Settings, load_settings

_TOPIC_UNSAFE = re.compile(r"[^a-zA-Z0-9._-]+")


def default_edge_id(host: str, port: int) -> str:
    """``<hostname>-<port>``, usable inside a topic name; the host itself when it names a specific interface."""
    name = socket.gethostname() if host in ("0.0.0.0", "::", "127.0.0.1", "::1", "localhost", "") else host
    return _TOPIC_UNSAFE.sub("-", f"{name}-{port}").strip("-.") or f"edge-{port}"


@dataclass(frozen=True)
class EdgeOptions:
    bootstrap_servers: str = "127.0.0.1:9092"
    topic_prefix: str = "specstream"
    request_partitions: int = 6
    replication_factor: int = 1
    min_insync_replicas: int = 1
    host: str = "127.0.0.1"
    port: int = 8000
    edge_id: str = ""  # empty: <hostname>-<port>
    models: tuple[str, ...] = (DEFAULT_MODEL,)
    request_timeout_s: float | None = 120.0  # becomes each request's deadline; None: no deadline
    deadline_grace_s: float = 5.0  # the edge waits this much past the deadline for the worker's own reply
    heartbeat_s: float = 5.0  # workers announce this often...
    ready_heartbeats: int = 3  # ...and count as alive within this many heartbeats
    max_tokens_default: int = 128
    startup_timeout_s: float = 30.0
    client_id: str = "specstream-edge"
    # Authentication and limits (streams.edge.auth, streams.edge.keys, streams.edge.limits).
    auth_enabled: bool = True
    keys_file: str | None = None  # None: ~/.config/specstream/keys.json
    key_hashes: tuple[str, ...] = ()  # 'tenant:sha256-hex' entries
    default_rpm: int | None = 600  # limits of a tenant that sets none; None: no limit
    default_tpm: int | None = 500_000
    default_concurrency: int | None = 32
    redis_url: str | None = None  # None: limit counters in memory (per edge)
    # Validation (streams.edge.validation).
    max_body_bytes: int = 1024 * 1024
    max_ws_frame_bytes: int = 1024 * 1024
    max_model_len: int | None = None  # None: the model's context, at most 2048 (as the engine)
    count_tokens: bool = True  # load the tokenizer to check prompt lengths before publishing
    # How every Kafka client of the edge connects (TLS, SASL); its bootstrap_servers follow the field above.
    kafka: KafkaSettings = field(default_factory=KafkaSettings)

    def __post_init__(self) -> None:
        edge_id = _TOPIC_UNSAFE.sub("-", self.edge_id or default_edge_id(self.host, self.port)).strip("-.")
        if not edge_id:
            raise ValueError(f"edge id {self.edge_id!r} has no character usable in a topic name")
        object.__setattr__(self, "edge_id", edge_id)
        object.__setattr__(self, "models", tuple(self.models))
        object.__setattr__(self, "key_hashes", tuple(self.key_hashes))
        if self.kafka.bootstrap_servers != self.bootstrap_servers:
            object.__setattr__(self, "kafka", self.kafka.model_copy(update={"bootstrap_servers": self.bootstrap_servers}))

    @property
    def catalog(self) -> TopicCatalog:
        return TopicCatalog(prefix=self.topic_prefix, request_partitions=self.request_partitions)

    @property
    def reply_topic(self) -> str:
        return self.catalog.replies(self.edge_id).name

    @classmethod
    def from_settings(cls, settings: "Settings | EdgeOptions | None" = None, **overrides: Any) -> "EdgeOptions":
        """From the project settings (None: :func:`streams.config.load_settings`), with keyword overrides."""
        if isinstance(settings, EdgeOptions):
            return replace(settings, **overrides) if overrides else settings
        if settings is None:
            settings = load_settings()
        kafka, edge = settings.kafka, settings.edge
        values: dict[str, Any] = dict(
            bootstrap_servers=kafka.bootstrap_servers,
            topic_prefix=kafka.topic_prefix,
            request_partitions=kafka.request_partitions,
            replication_factor=kafka.replication_factor,
            min_insync_replicas=kafka.min_insync_replicas,
            host=edge.host,
            port=edge.port,
            edge_id=edge.edge_id or "",
            models=(settings.engine.model,),
            request_timeout_s=edge.request_timeout_s,
            deadline_grace_s=edge.deadline_grace_s,
            heartbeat_s=settings.worker.heartbeat_s,
            ready_heartbeats=edge.ready_heartbeats,
            max_tokens_default=edge.max_tokens_default,
            startup_timeout_s=edge.startup_timeout_s,
            auth_enabled=edge.auth.enabled,
            keys_file=edge.auth.keys_file,
            key_hashes=tuple(edge.auth.key_hashes),
            default_rpm=edge.limits.rpm,
            default_tpm=edge.limits.tpm,
            default_concurrency=edge.limits.concurrency,
            redis_url=edge.redis_url,
            max_body_bytes=edge.max_body_bytes,
            max_ws_frame_bytes=edge.max_ws_frame_bytes,
            max_model_len=settings.engine.max_model_len,
            kafka=kafka,
        )
        unknown = set(overrides) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"unknown edge option(s): {', '.join(sorted(unknown))}")
        values.update(overrides)
        return cls(**values)
