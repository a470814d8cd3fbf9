"""specstream on a secured Kafka: SASL_SSL + SCRAM, the StandardAuthorizer, least-privilege ACLs per service.

One secured broker for the module (its own ports and state folder). The edge and
the worker each run as their own SCRAM user with exactly the grants of
``specstream kafka acls --apply``; topics are created by the admin user, as an
operator would. Users who cannot get in, or lack a grant, stop at start with one
line naming the setting or the permission.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from openai import OpenAI
from websockets.sync.client import connect as ws_connect

from schemas.topics import TopicCatalog
from streams.kafka import acls
from tests.edge_support import WORKER_ENV
from tests.secured_kafka import ADMIN, EDGE_USER, WORKER_USER, SecuredKafka, kafka_secured  # noqa: F401
from streams.testing.stack import DEFAULT_MODEL, REPO, Stack, running_stack

pytestmark = [pytest.mark.kafka, pytest.mark.timeout(600)]

QUESTION = [{"role": "user", "content": "Name three colors."}]


def cli(kafka_env: dict[str, str], *args: str, prefix: str = "specstream", timeout_s: float = 120.0,
        ) -> subprocess.CompletedProcess[str]:
    """``specstream ARGS`` with these Kafka settings (and nothing from the caller's SPECSTREAM_* environment)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECSTREAM_") or k.endswith("_DIR")}
    env.update({"SPECSTREAM_CONFIG": os.devnull, "SPECSTREAM_KAFKA__TOPIC_PREFIX": prefix, **kafka_env})
    return subprocess.run([sys.executable, "-m", "streams.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout_s)


def grant_all(kafka: SecuredKafka, prefix: str) -> None:
    """What an operator does once per deployment: topics as the admin, then every service's ACLs."""
    admin = kafka.env(ADMIN)
    for args in (("topics", "create"), ("kafka", "acls", "--apply")):
        done = cli(admin, *args, prefix=prefix)
        assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def stack(kafka_secured: SecuredKafka) -> Iterator[Stack]:  # noqa: F811
    with running_stack(
        kafka_secured.bootstrap_servers, env={**WORKER_ENV, **kafka_secured.env(ADMIN)},
        worker_env=kafka_secured.env(WORKER_USER), edge_env=kafka_secured.env(EDGE_USER),
        prepare=lambda s: grant_all(kafka_secured, s.topic_prefix),
    ) as running:
        yield running


def _one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The command failed with status 1 and said why in exactly one line (no library log lines, no traceback)."""
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


@pytest.mark.model
def test_the_stack_on_sasl_ssl_with_least_privilege_acls_serves_the_openai_client(stack: Stack) -> None:
    client = OpenAI(base_url=stack.base_url + "/v1", api_key=stack.api_key, max_retries=0, timeout=120)
    answer = client.chat.completions.create(model=DEFAULT_MODEL, messages=QUESTION, max_tokens=6)
    assert answer.choices[0].message.content and 0 < answer.usage.completion_tokens <= 6
    streamed = client.chat.completions.create(model=DEFAULT_MODEL, messages=QUESTION, max_tokens=6, stream=True)
    chunks = [c.choices[0].delta.content or "" for c in streamed if c.choices]
    assert "".join(chunks)


@pytest.mark.model
def test_the_stack_on_sasl_ssl_serves_a_websocket_client(stack: Stack) -> None:
    with ws_connect(stack.ws_url, additional_headers=stack.headers) as ws:
        ws.send(json.dumps({"id": 1, "model": DEFAULT_MODEL, "messages": QUESTION, "max_tokens": 6}))
        events = []
        while not events or events[-1]["type"] not in ("done", "error"):
            events.append(json.loads(ws.recv(timeout=120)))
    assert events[-1]["type"] == "done", events[-1]
    assert "".join(e["text"] for e in events if e["type"] == "chunk")


@pytest.mark.model
def test_the_cli_sends_a_request_as_the_admin_user(kafka_secured: SecuredKafka, stack: Stack) -> None:  # noqa: F811
    done = cli(kafka_secured.env(ADMIN), "send", "Name a color.", "--max-tokens", "4", prefix=stack.topic_prefix)
    assert done.returncode == 0, done.stderr
    assert "completion tokens" in done.stderr


@pytest.mark.model
def test_secrets_never_appear_in_the_logs_or_in_config_check_show(kafka_secured: SecuredKafka, stack: Stack) -> None:  # noqa: F811
    secrets = [kafka_secured.password(user) for user in (ADMIN, EDGE_USER, WORKER_USER)]
    for process in stack.processes:
        log = process.log.read_text(encoding="utf-8", errors="replace")
        assert log, f"{process.name} wrote no log"
        assert not [s for s in secrets if s in log], f"a password appears in the {process.name} log"
    shown = cli(kafka_secured.env(WORKER_USER), "config", "check", "--show")
    assert shown.returncode == 0, shown.stderr
    assert "sasl_password: '**********'" in shown.stdout
    assert not [s for s in secrets if s in shown.stdout + shown.stderr]


def test_a_wrong_password_stops_the_worker_with_one_line_naming_the_settings(kafka_secured: SecuredKafka) -> None:  # noqa: F811
    done = cli(kafka_secured.env(WORKER_USER, sasl_password="not-the-password"), "worker")
    line = _one_line_error(done)
    assert line == (f"worker: error: kafka: authentication failed for user {WORKER_USER} with SCRAM-SHA-512 at "
                    f"{kafka_secured.bootstrap_servers} (kafka.sasl_username / kafka.sasl_password)")


def test_a_client_that_does_not_trust_the_ca_gets_one_line_naming_ssl_cafile(
        kafka_secured: SecuredKafka, tmp_path: Path) -> None:  # noqa: F811
    # No CA file: the system's CA bundle, which has never heard of the local CA.
    system = {k: v for k, v in kafka_secured.env(EDGE_USER).items() if not k.endswith("SSL_CAFILE")}
    line = _one_line_error(cli(system, "edge", timeout_s=60))
    assert line.startswith(f"edge: error: kafka: the certificate of {kafka_secured.bootstrap_servers} is not trusted by")
    assert line.endswith("(kafka.ssl_cafile)")
    line = _one_line_error(cli(system, "topics", "list"))
    assert line.startswith("topics: error: kafka: the certificate of") and line.endswith("(kafka.ssl_cafile)")


def test_without_its_write_grant_on_reply_topics_the_worker_stops_naming_that_permission(
        kafka_secured: SecuredKafka) -> None:  # noqa: F811
    prefix = f"noreply-{uuid.uuid4().hex[:6]}"
    grant_all(kafka_secured, prefix)
    catalog = TopicCatalog(prefix=prefix)
    write_replies = acls.Grant("WRITE", "TOPIC", catalog.replies("").name, prefixed=True)
    assert write_replies in acls.worker_grants(catalog, f"{prefix}.engine-workers")
    asyncio.run(acls.revoke(kafka_secured.settings(ADMIN), "User:" + WORKER_USER, [write_replies]))
    line = _one_line_error(cli(kafka_secured.env(WORKER_USER), "worker", prefix=prefix))
    assert line == (f"worker: error: kafka: not authorized to WRITE topic {prefix}.replies.* — grant it with "
                    "`specstream kafka acls --apply`")


def test_a_user_without_any_grant_is_told_every_missing_permission(kafka_secured: SecuredKafka) -> None:  # noqa: F811
    prefix = f"nogrant-{uuid.uuid4().hex[:6]}"
    assert cli(kafka_secured.env(ADMIN), "topics", "create", prefix=prefix).returncode == 0
    line = _one_line_error(cli(kafka_secured.env(EDGE_USER), "edge", prefix=prefix, timeout_s=60))
    assert line.startswith("edge: error: kafka: not authorized to ") and line.endswith(
        "— grant them with `specstream kafka acls --apply`")
    for grant in acls.edge_grants(TopicCatalog(prefix=prefix)):
        if grant.operation != "CREATE" and not grant.prefixed:
            assert f"{grant.operation} {grant.resource}" in line
