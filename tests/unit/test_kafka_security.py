"""Kafka security settings, the one place that turns them into client options, the ACL plan, the secured broker's files.

No broker here: tests/stacks/test_kafka_secured.py runs all of it on a real SASL_SSL broker.
"""
from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from aiokafka.abc import AbstractTokenProvider
from faststream.security import BaseSecurity, SASLOAuthBearer, SASLScram512

from infra.kafka.properties import server_properties
from infra.kafka.secure import client_config_file, passwords, prepare, scram_format_flags, secured_single_node
from schemas.topics import TopicCatalog
from streams.commands import kafka_acls
from streams.cli import main as cli_main
from streams.config import ConfigError, KafkaSettings, load_settings
from streams.kafka.acls import Grant, edge_grants, topics_of, worker_grants
from streams.kafka.connection import KafkaAccessError, client_options, faststream_options

SECRET = "s3cret-Pa55"


class StaticToken(AbstractTokenProvider):
    async def token(self) -> str:
        return "a-token"


@pytest.fixture(scope="module")
def broker_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The secured broker's CA, certificates and users, generated as `kafka start --secure` does (no JVM)."""
    spec = secured_single_node(port=39500, state_dir=tmp_path_factory.mktemp("secure"))
    prepare(spec)
    assert spec.security is not None
    return spec.security.folder


def scram(**overrides: object) -> KafkaSettings:
    values: dict[str, object] = dict(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                                     sasl_username="worker", sasl_password=SECRET)
    values.update(overrides)
    return KafkaSettings.model_validate(values)


@pytest.mark.parametrize(("env", "message"), [
    ({"SECURITY_PROTOCOL": "SASL_SSL"}, "security_protocol SASL_SSL needs sasl_mechanism"),
    ({"SECURITY_PROTOCOL": "SASL_SSL", "SASL_MECHANISM": "SCRAM-SHA-256", "SASL_USERNAME": "u"},
     "sasl_mechanism SCRAM-SHA-256 needs sasl_password"),
    ({"SECURITY_PROTOCOL": "SASL_PLAINTEXT", "SASL_MECHANISM": "OAUTHBEARER"},
     "sasl_mechanism OAUTHBEARER needs sasl_oauth_token_provider"),
    ({"SSL_CAFILE": "/etc/ca.pem"}, "ssl_cafile is set but security_protocol PLAINTEXT does not use it"),
    ({"SECURITY_PROTOCOL": "SSL", "SSL_KEYFILE": "k.pem"}, "ssl_keyfile is set without ssl_certfile"),
    ({"SECURITY_PROTOCOL": "TLS"}, "kafka.security_protocol: Input should be 'PLAINTEXT', 'SSL'"),
])
def test_inconsistent_security_settings_fail_at_load_naming_the_key(
        env: dict[str, str], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in env.items():
        monkeypatch.setenv(f"SPECSTREAM_KAFKA__{key}", value)
    with pytest.raises(ConfigError, match=message):
        load_settings(Path("/dev/null"))


def test_an_open_broker_gets_plaintext_options_and_no_faststream_security() -> None:
    assert client_options("127.0.0.1:9092") == {"bootstrap_servers": "127.0.0.1:9092", "security_protocol": "PLAINTEXT"}
    assert faststream_options("a:1, b:2") == {"bootstrap_servers": ["a:1", "b:2"]}


def test_scram_over_tls_gives_every_client_the_same_credentials_and_tls_context(broker_files: Path) -> None:
    kafka = scram(ssl_cafile=str(broker_files / "ca.pem"))
    options = client_options(kafka)
    assert options["security_protocol"] == "SASL_SSL" and options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (options["sasl_plain_username"], options["sasl_plain_password"]) == ("worker", SECRET)
    context = options["ssl_context"]
    assert isinstance(context, ssl.SSLContext) and context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    security = faststream_options(kafka)["security"]
    assert isinstance(security, SASLScram512) and security.use_ssl and security.ssl_context is context
    assert (security.username, security.password) == ("worker", SECRET)


def test_mutual_tls_loads_the_client_certificate_and_hostname_checks_can_be_turned_off(broker_files: Path) -> None:
    kafka = KafkaSettings(security_protocol="SSL", ssl_cafile=str(broker_files / "ca.pem"),
                          ssl_certfile=str(broker_files / "client.pem"), ssl_keyfile=str(broker_files / "client-key.pem"),
                          ssl_check_hostname=False)
    assert client_options(kafka)["ssl_context"].check_hostname is False
    security = faststream_options(kafka)["security"]
    assert type(security) is BaseSecurity and security.use_ssl


def test_unreadable_or_invalid_tls_files_are_one_line_errors_naming_the_key(broker_files: Path) -> None:
    with pytest.raises(KafkaAccessError, match=r"cannot read kafka.ssl_cafile /nonexistent/ca.pem: No such file"):
        client_options(scram(ssl_cafile="/nonexistent/ca.pem"))
    with pytest.raises(KafkaAccessError, match="kafka.ssl_cafile is not valid PEM"):
        client_options(scram(ssl_cafile=str(broker_files / "users.json")))


def test_oauthbearer_imports_the_configured_token_provider() -> None:
    kafka = KafkaSettings(security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER",
                          sasl_oauth_token_provider=f"{__name__}:StaticToken")
    options = client_options(kafka)
    assert isinstance(options["sasl_oauth_token_provider"], StaticToken) and "sasl_plain_password" not in options
    fast = faststream_options(kafka)
    assert isinstance(fast["security"], SASLOAuthBearer) and isinstance(fast["sasl_oauth_token_provider"], StaticToken)
    with pytest.raises(KafkaAccessError, match="kafka.sasl_oauth_token_provider: cannot import nowhere:Token"):
        client_options(kafka.model_copy(update={"sasl_oauth_token_provider": "nowhere:Token"}))


def test_config_check_show_masks_the_password(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for key, value in {"SECURITY_PROTOCOL": "SASL_SSL", "SASL_MECHANISM": "PLAIN", "SASL_USERNAME": "edge",
                       "SASL_PASSWORD": SECRET}.items():
        monkeypatch.setenv(f"SPECSTREAM_KAFKA__{key}", value)
    assert cli_main(["--config", "/dev/null", "config", "check", "--show"]) == 0
    shown = capsys.readouterr()
    assert "sasl_password: '**********'" in shown.out and SECRET not in shown.out + shown.err


def test_the_worker_may_read_its_inputs_and_write_replies_dead_letters_completions_and_announcements() -> None:
    catalog = TopicCatalog(prefix="p")
    grants = {(g.operation, g.resource) for g in worker_grants(catalog, "p.engine-workers")}
    assert grants == {("READ", "topic p.requests"), ("READ", "group p.engine-workers"), ("READ", "topic p.cancellations"),
                      ("READ", "topic p.adapters"),  # the LoRA adapter registry
                      ("WRITE", "topic p.replies.*"), ("WRITE", "topic p.dead-letters"), ("WRITE", "topic p.services"),
                      ("WRITE", "topic p.completions"), ("WRITE", "topic p.tool-intents"),
                      ("READ", "topic p.tool-results"),
                      ("READ", "topic p.completions"),  # every worker's answers, for suffix decoding
                      # its batch lane: batch lines as their own group, answers out, batches' state
                      ("READ", "topic p.batch-lines"), ("READ", "group p.batch-workers"),
                      ("WRITE", "topic p.batch-results"), ("READ", "topic p.batches")}
    assert [t.name for t in topics_of(worker_grants(catalog, "g"))] == [
        "p.requests", "p.cancellations", "p.adapters", "p.dead-letters", "p.completions", "p.tool-intents",
        "p.tool-results", "p.services", "p.batch-lines", "p.batch-results", "p.batches"]


def test_the_edge_may_publish_requests_read_announcements_and_own_its_reply_topic() -> None:
    catalog = TopicCatalog(prefix="p")
    grants = {(g.operation, g.resource) for g in edge_grants(catalog)}
    assert grants == {("WRITE", "topic p.requests"), ("WRITE", "topic p.cancellations"), ("WRITE", "topic p.edges"),
                      ("WRITE", "topic p.services"), ("READ", "topic p.services"),
                      ("READ", "topic p.replies.*"), ("CREATE", "topic p.replies.*"),
                      ("READ", "topic p.rollouts"), ("WRITE", "topic p-candidate.*"),  # canary routing
                      ("READ", "topic p.files"), ("WRITE", "topic p.files"),  # /v1/files
                      ("WRITE", "topic p.batch-lines"), ("READ", "topic p.batches"), ("WRITE", "topic p.batches"),
                      ("WRITE", "topic p.adapters"),  # POST /v1/load_lora_adapter
                      ("READ", "topic p.responses"), ("WRITE", "topic p.responses"),  # /v1/responses
                      # /v1/vector_stores: the stores' and documents' tables, ingest jobs, the retriever's input
                      ("READ", "topic p.vector-stores"), ("WRITE", "topic p.vector-stores"),
                      ("READ", "topic p.documents"), ("WRITE", "topic p.documents"),
                      ("WRITE", "topic p.ingest-jobs"), ("WRITE", "topic p.retrieval")}
    own = [g for g in edge_grants(catalog, "e1") if g.name.startswith("p.replies")]
    assert own == [Grant("READ", "TOPIC", "p.replies.e1"), Grant("CREATE", "TOPIC", "p.replies.e1")]


def test_acls_print_writes_kafka_acls_commands_for_each_service(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPECSTREAM_KAFKA__TOPIC_PREFIX", "acme")
    assert kafka_acls.main("/dev/null", ["--print", "--principal", "worker=User:gpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# batch-assembler (User:specstream-batch-assembler): READ topic acme.batch-results")
    assert "\n# edge (User:specstream-edge): WRITE topic acme.requests" in out
    assert ("--add --allow-principal User:gpu --operation WRITE --topic acme.replies. --resource-pattern-type prefixed"
            in out)
    assert "--allow-principal User:gpu --operation READ --group acme.engine-workers" in out
    assert kafka_acls.main("/dev/null", ["--print", "--principal", "worker=gpu"]) == 2


def test_the_secured_broker_listens_only_on_sasl_ssl_with_an_authorizer_and_scram_users(broker_files: Path) -> None:
    spec = secured_single_node(port=39500, state_dir=broker_files.parent)
    assert spec.security is not None
    properties = server_properties(spec, spec.nodes[0])
    assert properties["listeners"] == "SASL_SSL://127.0.0.1:39500,CONTROLLER://127.0.0.1:39501"
    assert properties["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT"
    assert properties["inter.broker.listener.name"] == "SASL_SSL"
    assert properties["authorizer.class.name"].endswith("StandardAuthorizer")
    assert properties["allow.everyone.if.no.acl.found"] == "false"
    assert properties["ssl.keystore.type"] == "PEM" and properties["ssl.endpoint.identification.algorithm"] == "https"
    users = passwords(spec.security)
    assert set(users) == {"admin", "specstream-edge", "specstream-worker"}
    flags = scram_format_flags(spec.security)
    assert flags.count("--add-scram") == 2 * len(users)
    assert f"SCRAM-SHA-512=[name=specstream-worker,password={users['specstream-worker']}]" in flags
    client_config = client_config_file(spec.security).read_text()
    assert "security_protocol: SASL_SSL" in client_config and not [p for p in users.values() if p in client_config]
    assert all((broker_files / name).stat().st_mode & 0o077 == 0 for name in ("users.json", "ca-key.pem", "admin.env"))


def test_preparing_again_keeps_the_ca_and_the_passwords(broker_files: Path) -> None:
    spec = secured_single_node(port=39500, state_dir=broker_files.parent)
    assert spec.security is not None
    before = (passwords(spec.security), (broker_files / "ca.pem").read_bytes())
    prepare(spec)
    assert (passwords(spec.security), (broker_files / "ca.pem").read_bytes()) == before


def test_up_never_starts_the_plain_local_broker_for_a_secured_configuration() -> None:
    assert KafkaSettings().managed_port == 9092
    assert scram(bootstrap_servers="127.0.0.1:9092").managed_port is None
