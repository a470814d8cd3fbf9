"""The secured local broker: TLS from a private CA, SCRAM (and PLAIN) users, the StandardAuthorizer.

``python -m infra.kafka start --secure`` runs a single node whose only client
listener is SASL_SSL (default port 9192, state in ``kafka-secure``), so the
whole pipeline can be tested the way a company cluster, Confluent Cloud or MSK
runs it. Everything secret is generated once into ``<state>/secure`` (0600
files, never in the source tree):

* ``ca.pem``: the private CA clients trust (``kafka.ssl_cafile``);
  ``broker.pem``: the broker's key and chain; ``client.pem`` / ``client-key.pem``:
  a client certificate for mutual TLS (``ssl.client.auth=requested``).
* ``users.json``: a password per user: ``admin`` (super user, for operators, the
  CLI and inter-broker traffic) and one per service (``specstream-edge``,
  ``specstream-worker``), created in the metadata at format time
  (``kafka-storage format --add-scram``).
* ``client.yaml``: the ``kafka`` section for the local stack (no secrets), and
  ``<user>.env``: ``SPECSTREAM_KAFKA__SASL_USERNAME`` / ``..._PASSWORD`` of one user.

With the authorizer on, nothing but the super users may do anything until ACLs
are granted (``specstream kafka acls --apply``). The controller listener stays
PLAINTEXT on 127.0.0.1, where KRaft needs its principal (``ANONYMOUS``) to be a
super user; it serves only controller traffic.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from infra.kafka import certs
from infra.kafka.paths import state_root
from infra.kafka.spec import BrokerSecurity, ClusterSpec, KafkaNodeSpec, single_node

DEFAULT_SECURE_PORT = 9192
ADMIN_MECHANISM = "SCRAM-SHA-512"
SCRAM_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256")
_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


def secured_single_node(port: int = DEFAULT_SECURE_PORT, state_dir: Path | None = None, *,
                        authorizer: bool = True) -> ClusterSpec:
    """One node with a SASL_SSL client listener on ``port`` (controller on ``port + 1``), its own state folder."""
    root = state_dir if state_dir is not None else state_root() / (
        "kafka-secure" if port == DEFAULT_SECURE_PORT else f"kafka-secure-{port}")
    return single_node(port=port, state_dir=root, security=BrokerSecurity(folder=root / "secure", authorizer=authorizer))


# --- files ----------------------------------------------------------------------------------------------------------


def ca_file(security: BrokerSecurity) -> Path:
    return security.folder / "ca.pem"


def client_config_file(security: BrokerSecurity) -> Path:
    return security.folder / "client.yaml"


def user_env_file(security: BrokerSecurity, user: str) -> Path:
    return security.folder / f"{user}.env"


def passwords(security: BrokerSecurity) -> dict[str, str]:
    """Every user's password (created by :func:`prepare`)."""
    return dict(json.loads((security.folder / "users.json").read_text()))


def prepare(cluster: ClusterSpec) -> None:
    """Create what is missing: CA and certificates, user passwords, client files. Idempotent."""
    security = cluster.security
    if security is None:
        return
    folder = security.folder
    if not ca_file(security).is_file():
        ca = certs.new_ca()
        broker = certs.issue(ca, "localhost", server=True)
        client = certs.issue(ca, "specstream-client", server=False)
        certs.write_private(folder / "ca-key.pem", ca.key_pem)
        certs.write_private(folder / "broker.pem", broker.key_pem + broker.cert_pem + ca.cert_pem)
        certs.write_private(folder / "client-key.pem", client.key_pem)
        certs.write_private(folder / "client.pem", client.cert_pem)
        certs.write_private(ca_file(security), ca.cert_pem)
    users = folder / "users.json"
    known = passwords(security) if users.is_file() else {}
    wanted = {user: known.get(user) or secrets.token_urlsafe(24) for user in security.all_users}
    if wanted != known:
        certs.write_private(users, json.dumps(wanted, indent=1).encode())
    _write_client_files(cluster, security, wanted)


def _write_client_files(cluster: ClusterSpec, security: BrokerSecurity, users: dict[str, str]) -> None:
    lines = [
        "# Written by `specstream kafka start --secure`: the local secured broker. The user and its password come",
        f"# from the environment: `set -a; . {user_env_file(security, security.admin_user)}; set +a`.",
        "kafka:",
        f"  bootstrap_servers: {json.dumps(cluster.bootstrap_servers)}",
        "  security_protocol: SASL_SSL",
        f"  sasl_mechanism: {ADMIN_MECHANISM}",
        f"  ssl_cafile: {json.dumps(str(ca_file(security)))}",
        "  manage_local: false",
    ]
    certs.write_private(client_config_file(security), ("\n".join(lines) + "\n").encode())
    for user, password in users.items():
        env = f"SPECSTREAM_KAFKA__SASL_USERNAME={user}\nSPECSTREAM_KAFKA__SASL_PASSWORD={password}\n"
        certs.write_private(user_env_file(security, user), env.encode())


# --- broker side ----------------------------------------------------------------------------------------------------


def scram_format_flags(security: BrokerSecurity) -> list[str]:
    """``kafka-storage format`` arguments creating every user's SCRAM credentials in the bootstrap metadata.

    The formatter takes them on its command line only, so the passwords are visible to local ``ps`` for the
    seconds it runs; acceptable for a local broker whose passwords also sit in its state folder.
    """
    flags: list[str] = []
    for user, password in passwords(security).items():
        for mechanism in SCRAM_MECHANISMS:
            flags += ["--add-scram", f"{mechanism}=[name={user},password={password}]"]
    return flags


def _jaas(module: str, user: str, password: str, extra: str = "") -> str:
    return f'org.apache.kafka.common.security.{module} required username="{user}" password="{password}"{extra};'


def broker_security_properties(security: BrokerSecurity, node: KafkaNodeSpec) -> dict[str, str]:
    users = passwords(security)
    admin, admin_password = security.admin_user, users[security.admin_user]
    listener = node.protocol.lower()
    # PLAIN checks passwords against this list (SCRAM uses the credentials stored at format time).
    plain_users = "".join(f' user_{user}="{password}"' for user, password in users.items())
    properties = {
        "sasl.enabled.mechanisms": ",".join((*SCRAM_MECHANISMS, "PLAIN")),
        "sasl.mechanism.inter.broker.protocol": ADMIN_MECHANISM,
        **{f"listener.name.{listener}.{mechanism.lower()}.sasl.jaas.config": _jaas(
            "scram.ScramLoginModule", admin, admin_password) for mechanism in SCRAM_MECHANISMS},
        f"listener.name.{listener}.plain.sasl.jaas.config": _jaas(
            "plain.PlainLoginModule", admin, admin_password, plain_users),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(security.folder / "broker.pem"),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(ca_file(security)),
        "ssl.client.auth": "requested",
        "ssl.endpoint.identification.algorithm": "https",
    }
    if security.authorizer:
        properties.update({
            "authorizer.class.name": _AUTHORIZER,
            "super.users": f"User:{admin};User:ANONYMOUS",
            "allow.everyone.if.no.acl.found": "false",
        })
    return properties


def admin_client_options(security: BrokerSecurity) -> dict[str, Any]:
    """aiokafka keyword arguments of the admin user (the broker's own readiness probe)."""
    from aiokafka.helpers import create_ssl_context

    return {
        "security_protocol": "SASL_SSL",
        "ssl_context": create_ssl_context(cafile=str(ca_file(security))),
        "sasl_mechanism": ADMIN_MECHANISM,
        "sasl_plain_username": security.admin_user,
        "sasl_plain_password": passwords(security)[security.admin_user],
    }
