"""How every client reaches Kafka (addresses, TLS, SASL) and how replies are routed and delivered."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from streams.config.base import _TOPIC_SAFE, Section

# Bound on one publish's acknowledgement, for the edge's requests and every consumer's replies: longer than a
# partition leader's failover (a stopped or killed broker is fenced after broker.session.timeout.ms, Kafka's default
# 9 s, after a controller election when it was the active controller, and its in-flight requests are retried at the
# new leader after the producer's request timeout).
FAILOVER_BOUND_S = 30.0


class KafkaSettings(Section):
    bootstrap_servers: str = Field(
        default="127.0.0.1:9092", min_length=1, description="Comma-separated host:port list of Kafka brokers."
    )
    topic_prefix: str = Field(
        default="specstream", max_length=150, pattern=_TOPIC_SAFE,
        description="Prefix of every topic name, so several deployments can share a cluster.",
    )
    request_partitions: int = Field(
        default=6, ge=1, le=1000, description="Partitions of the request topic: the most workers that can share the load."
    )
    replication_factor: int = Field(default=1, ge=1, description="Replicas of each topic (3 on a production cluster).")
    min_insync_replicas: int = Field(
        default=1, ge=1, description="Replicas that must hold a write before acks=all succeeds (2 with 3 replicas)."
    )
    manage_local: bool = Field(
        default=True,
        description="`specstream up` starts a local broker when bootstrap_servers names this machine, "
        "security_protocol is PLAINTEXT and none answers.",
    )
    local_port: int | None = Field(
        default=None, ge=1, le=65535,
        description="Port of the managed local broker; null: the port in bootstrap_servers.",
    )
    # Connection security, shared by every client of every service (streams.kafka.connection builds it).
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        default="PLAINTEXT", description="PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or SASL_SSL (SASL over TLS)."
    )
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"] | None = Field(
        default=None, description="SASL mechanism (SASL_* protocols): PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER."
    )
    sasl_username: str | None = Field(default=None, min_length=1, description="SASL user (PLAIN, SCRAM).")
    sasl_password: SecretStr | None = Field(
        default=None, description="SASL password (PLAIN, SCRAM); give it as $SPECSTREAM_KAFKA__SASL_PASSWORD. Never printed."
    )
    sasl_oauth_token_provider: str | None = Field(
        default=None, pattern=r"^[\w.]+:[\w.]+$",
        description="OAUTHBEARER: 'module:name' of an aiokafka AbstractTokenProvider class or factory.",
    )
    ssl_cafile: str | None = Field(
        default=None, min_length=1, description="CA certificates (PEM) that sign the brokers'; null: the system's."
    )
    ssl_certfile: str | None = Field(default=None, min_length=1, description="Client certificate (PEM), for mutual TLS.")
    ssl_keyfile: str | None = Field(default=None, min_length=1, description="Private key (PEM) of ssl_certfile.")
    ssl_check_hostname: bool = Field(
        default=True, description="Check that a broker's certificate names the host connected to."
    )

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @model_validator(mode="after")
    def _consistent(self) -> "KafkaSettings":
        if self.min_insync_replicas > self.replication_factor:
            raise ValueError(
                f"min_insync_replicas ({self.min_insync_replicas}) exceeds replication_factor ({self.replication_factor}):"
                " no write could ever succeed"
            )
        local = self.local_bootstrap_port
        if self.local_port is not None and local is not None and local != self.local_port:
            raise ValueError(
                f"local_port ({self.local_port}) differs from the port in bootstrap_servers ({local}); set only one"
            )
        self._check_security()
        return self

    def _check_security(self) -> None:
        protocol = self.security_protocol
        unused = [name for name, used in (
            ("sasl_mechanism", self.uses_sasl), ("sasl_username", self.uses_sasl), ("sasl_password", self.uses_sasl),
            ("sasl_oauth_token_provider", self.uses_sasl), ("ssl_cafile", self.uses_tls),
            ("ssl_certfile", self.uses_tls), ("ssl_keyfile", self.uses_tls),
        ) if getattr(self, name) is not None and not used]
        if unused:
            raise ValueError(f"{unused[0]} is set but security_protocol {protocol} does not use it")
        if self.uses_sasl and self.sasl_mechanism is None:
            raise ValueError(f"security_protocol {protocol} needs sasl_mechanism")
        if self.sasl_mechanism == "OAUTHBEARER" and self.sasl_oauth_token_provider is None:
            raise ValueError("sasl_mechanism OAUTHBEARER needs sasl_oauth_token_provider")
        if self.sasl_mechanism not in (None, "OAUTHBEARER"):
            missing = [name for name in ("sasl_username", "sasl_password") if getattr(self, name) is None]
            if missing:
                raise ValueError(f"sasl_mechanism {self.sasl_mechanism} needs {' and '.join(missing)}")
        if self.ssl_keyfile is not None and self.ssl_certfile is None:
            raise ValueError("ssl_keyfile is set without ssl_certfile")

    @property
    def local_bootstrap_port(self) -> int | None:
        """The port when bootstrap_servers is one address on this machine, else None."""
        servers = [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()]
        if len(servers) != 1:
            return None
        host, _, port = servers[0].rpartition(":")
        if host.strip("[]") not in ("127.0.0.1", "localhost", "::1") or not port.isdigit():
            return None
        return int(port)

    @property
    def managed_port(self) -> int | None:
        """Port of the local broker `specstream up` should start, or None when Kafka is someone else's."""
        # The managed broker is the plain one; a secured local broker is started with `specstream kafka start --secure`.
        if not self.manage_local or self.security_protocol != "PLAINTEXT":
            return None
        return self.local_bootstrap_port




class DeliverySettings(Section):
    reply_topic_patterns: list[str] = Field(
        default_factory=lambda: ["{prefix}.replies.*"], min_length=1,
        description="Topics a request may name as its reply_to (shell-style patterns; {prefix} is kafka.topic_prefix). "
        "Requests naming any other topic are dead-lettered as reply_topic_forbidden.",
    )
    publish_timeout_s: float = Field(
        default=FAILOVER_BOUND_S, gt=0, le=300,
        description="Most seconds a reply, rejection or dead letter may take to be acknowledged; one that takes longer "
        "is given up (a reply is dead-lettered) so no partition waits on it. Longer than a partition leader's "
        "failover, so a broker frozen or killed under a reply does not lose it.",
    )
    topic_cache_ttl_s: float = Field(
        default=30.0, gt=0,
        description="How long a reply topic seen to exist is trusted before its metadata is looked up again.",
    )
    metadata_timeout_s: float = Field(
        default=2.0, gt=0, le=60,
        description="Bound on one metadata look-up of reply topics; if it fails (a broker failing over), the request is "
        "served and its bounded publish decides.",
    )

    missing_topic_restart_s: float = Field(
        default=30.0, ge=0,
        description="How long a topic a process created at its start may be missing from the cluster (deleted, or "
        "the broker's storage reset) before the process starts again to recreate it: an edge reconnects, a consumer "
        "exits with status 1 for its supervisor to restart it. 0: never.",
    )

    @field_validator("reply_topic_patterns")
    @classmethod
    def _patterns_name_topics(cls, patterns: list[str]) -> list[str]:
        for pattern in patterns:
            if pattern.strip() in ("", "*", "{prefix}*", "{prefix}.*"):
                raise ValueError(
                    f"{pattern!r} would let requests write into any (internal) topic; name reply topics, "
                    "e.g. '{prefix}.replies.*'"
                )
        return patterns
