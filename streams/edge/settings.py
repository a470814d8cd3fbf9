"""The edge's view of the project settings: :class:`streams.config.Settings`, plus what the edge derives from it.

The edge reads its sections as they are (``options.kafka.bootstrap_servers``,
``options.edge.max_body_bytes``, ``options.edge.auth.enabled``), so a setting
is declared, defaulted and validated once, in :mod:`streams.config`. What the
edge adds is derived, never copied:

* ``edge_id``: ``edge.edge_id``, or ``<hostname>-<port>`` usable in a topic name;
* ``models``: the served models, by default ``engine.model``;
* ``max_model_len`` (``engine.max_model_len``), the context prompts are checked
  against, and ``heartbeat_s`` (``worker.heartbeat_s``), how often workers
  announce themselves: the two values of other layers the edge depends on;
* the topic catalog and this edge's reply topic.

Tests build one from a ``Settings`` (``EdgeOptions(Settings(kafka=..., edge=...))``);
authentication is on by default here too, so a test that does not exercise it
says ``edge=EdgeSettings(auth=EdgeAuthSettings(enabled=False))``.
"""
from __future__ import annotations

import re
import socket
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from schemas.topics import TopicCatalog
from streams.config import EdgeSettings, KafkaSettings, Settings, load_settings

_TOPIC_UNSAFE = re.compile(r"[^a-zA-Z0-9._-]+")


def default_edge_id(host: str, port: int) -> str:
    """``<hostname>-<port>``, usable inside a topic name; the host itself when it names a specific interface."""
    name = socket.gethostname() if host in ("0.0.0.0", "::", "127.0.0.1", "::1", "localhost", "") else host
    return _TOPIC_UNSAFE.sub("-", f"{name}-{port}").strip("-.") or f"edge-{port}"


@dataclass(frozen=True)
class EdgeOptions:
    settings: Settings
    models: tuple[str, ...] = ()  # the served models; empty: the engine's model
    edge_id: str = field(init=False)

    # The prefix of the edge's Kafka client ids (the edge id follows), as brokers' logs and quotas see them.
    client_id: ClassVar[str] = "specstream-edge"

    def __post_init__(self) -> None:
        object.__setattr__(self, "models", tuple(self.models) or (self.settings.engine.model,))
        edge = self.settings.edge
        # EdgeSettings validates an explicit edge_id as topic-safe; only the default needs cleaning.
        object.__setattr__(self, "edge_id", edge.edge_id or default_edge_id(edge.host, edge.port))

    @classmethod
    def from_settings(cls, settings: "Settings | EdgeOptions | None" = None) -> "EdgeOptions":
        """From the project settings (None: :func:`streams.config.load_settings`)."""
        if isinstance(settings, EdgeOptions):
            return settings
        return cls(settings if settings is not None else load_settings())

    @property
    def kafka(self) -> KafkaSettings:
        return self.settings.kafka

    @property
    def edge(self) -> EdgeSettings:
        return self.settings.edge

    @property
    def max_model_len(self) -> int | None:
        """The context prompt + max_tokens must fit; None: the model's own, at most 2048 (as the engine)."""
        return self.settings.engine.max_model_len

    @property
    def heartbeat_s(self) -> float:
        """How often workers announce themselves (/readyz counts them alive for a few of these)."""
        return self.settings.worker.heartbeat_s

    @property
    def catalog(self) -> TopicCatalog:
        return self.settings.catalog

    @property
    def reply_topic(self) -> str:
        return self.catalog.replies(self.edge_id).name

    def with_edge(self, **values: Any) -> "EdgeOptions":
        """A copy with some ``edge`` settings changed (validated again), e.g. the port a test server bound."""
        edge = EdgeSettings.model_validate({**self.edge.model_dump(), **values})
        return replace(self, settings=self.settings.model_copy(update={"edge": edge}))
