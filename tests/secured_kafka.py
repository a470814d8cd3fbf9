"""A secured local broker for tests: SASL_SSL + SCRAM with the StandardAuthorizer, on ports and a folder of its own.

    from tests.secured_kafka import SecuredKafka, kafka_secured  # noqa: F401

    def test_x(kafka_secured: SecuredKafka) -> None:
        kafka_secured.settings("specstream-worker")   # KafkaSettings of that user
        kafka_secured.env("specstream-edge")          # the same as SPECSTREAM_KAFKA__* variables

Each module that uses it gets a fresh broker (formatted in a temporary state
folder, so no ACLs or users leak between runs) and stops it at the end; the
shared plain broker on 9092 is never touched.
"""
from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.kafka.broker import ClusterSpec, secured_single_node, start, stop
from infra.kafka.secure import ADMIN_MECHANISM, ca_file, passwords
from streams.config import KafkaSettings

ADMIN = "admin"
EDGE_USER = "specstream-edge"
WORKER_USER = "specstream-worker"


def _free_port_pair() -> int:
    """A port whose successor is free too (broker and controller)."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            with socket.socket() as second:
                try:
                    second.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
        return port
    raise RuntimeError("no two consecutive free ports")


@dataclass(frozen=True)
class SecuredKafka:
    spec: ClusterSpec

    @property
    def bootstrap_servers(self) -> str:
        return self.spec.bootstrap_servers

    @property
    def cafile(self) -> Path:
        assert self.spec.security is not None
        return ca_file(self.spec.security)

    def password(self, user: str) -> str:
        assert self.spec.security is not None
        return passwords(self.spec.security)[user]

    def settings(self, user: str, **overrides: object) -> KafkaSettings:
        values: dict[str, object] = dict(
            bootstrap_servers=self.bootstrap_servers, security_protocol="SASL_SSL", sasl_mechanism=ADMIN_MECHANISM,
            sasl_username=user, sasl_password=self.password(user), ssl_cafile=str(self.cafile),
        )
        values.update(overrides)
        return KafkaSettings.model_validate(values)

    def env(self, user: str, **overrides: str) -> dict[str, str]:
        """``SPECSTREAM_KAFKA__*`` variables connecting as ``user`` (the password too, as services get it)."""
        values = {
            "BOOTSTRAP_SERVERS": self.bootstrap_servers, "SECURITY_PROTOCOL": "SASL_SSL",
            "SASL_MECHANISM": ADMIN_MECHANISM, "SASL_USERNAME": user, "SASL_PASSWORD": self.password(user),
            "SSL_CAFILE": str(self.cafile), "MANAGE_LOCAL": "false",
        }
        values.update({key.upper(): value for key, value in overrides.items()})
        return {f"SPECSTREAM_KAFKA__{key}": value for key, value in values.items()}


@pytest.fixture(scope="module")
def kafka_secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    spec = secured_single_node(port=_free_port_pair(), state_dir=tmp_path_factory.mktemp("kafka-secure"))
    start(spec)
    try:
        yield SecuredKafka(spec)
    finally:
        stop(spec)
