"""`specstream status` reads real ServiceAnnouncements from a real services topic on the broker."""
from __future__ import annotations

import asyncio
import json
import os
import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from schemas.events import ServiceAnnouncement
from schemas.topics import TopicCatalog
from streams import cli
from streams.kafka import clients
from streams.commands.common import format_duration
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401  (pytest fixtures)

pytestmark = pytest.mark.kafka


@dataclass
class Bus:
    bootstrap: str
    catalog: TopicCatalog

    def announce(self, *records: tuple[bytes, bytes | None]) -> None:
        async def send() -> None:
            producer = clients.make_producer(self.bootstrap, client_id="test-status")
            await producer.start()
            try:
                for key, value in records:
                    await producer.send_and_wait(self.catalog.services.name, value, key=key)
            finally:
                await producer.stop()

        asyncio.run(send())


def announcement(kind: str, service_id: str, state: str = "ready", *, age_s: float = 0.0, up_s: float = 300.5,
                 **fields: object) -> tuple[bytes, bytes]:
    now = time.time()
    event = ServiceAnnouncement(kind=kind, service_id=service_id, state=state, host="box", pid=4242,
                                started_at=now - age_s - up_s, at=now - age_s, **fields)
    return f"{kind}/{service_id}".encode(), clients.encode(event)


@pytest.fixture
def bus(kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bus]:  # noqa: F811
    catalog = TopicCatalog(f"t-status-{uuid.uuid4().hex[:8]}")
    monkeypatch.setenv("SPECSTREAM_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("SPECSTREAM_KAFKA__TOPIC_PREFIX", catalog.prefix)
    asyncio.run(clients.ensure_topics(kafka_bootstrap, [catalog.services]))
    try:
        yield Bus(kafka_bootstrap, catalog)
    finally:
        asyncio.run(clients.delete_topics(kafka_bootstrap, [catalog.services.name]))


def status(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str], str]:
    code = cli.main(["--config", os.devnull, "status", *args])
    captured = capsys.readouterr()
    return code, captured.out.splitlines(), captured.err


def test_status_shows_each_service_with_its_newest_state_host_pid_uptime_load_and_models(
        bus: Bus, capsys: pytest.CaptureFixture[str]) -> None:
    bus.announce(announcement("engine-worker", "w1", "starting"),
                 announcement("engine-worker", "w1", "ready", in_flight=3, models=["smollm2-135m-instruct"]),
                 announcement("edge", "e1", "ready", up_s=3725))
    code, lines, err = status(capsys)
    assert code == 0
    assert lines[0].split() == ["KIND", "ID", "STATE", "HOST/PID", "UPTIME", "IN", "FLIGHT", "MODELS", "LAST", "SEEN"]
    # Uptime and last seen move on while the test runs: seconds after the announcements, they read like this.
    assert re.fullmatch(r"edge +e1 +ready +box/4242 +1h02m +0 +- +\ds ago", lines[1]), lines[1]
    assert re.fullmatch(r"engine-worker +w1 +ready +box/4242 +5m0\ds +3 +smollm2-135m-instruct +\ds ago",
                        lines[2]), lines[2]
    assert len(lines) == 3
    assert f"2 service(s) on {bus.catalog.services.name}" in err


def test_a_service_not_heard_from_within_the_readiness_window_is_shown_as_stale(
        bus: Bus, capsys: pytest.CaptureFixture[str]) -> None:
    bus.announce(announcement("engine-worker", "gone", "ready", age_s=120), announcement("edge", "fresh"))
    code, lines, _ = status(capsys)
    assert code == 0
    stale = next(line for line in lines if " gone " in line)
    # Uptime of a stale service: how long it ran until it was last heard from.
    assert stale.split()[2:6] == ["stale", "(ready)", "box/4242", "5m00s"] and stale.endswith("2m00s ago")
    assert "stale" not in next(line for line in lines if " fresh " in line)
    code, lines, _ = status(capsys, "--stale-after", "600")
    assert "stale" not in next(line for line in lines if " gone " in line)


def test_stopped_services_are_hidden_unless_all_is_asked_for(bus: Bus, capsys: pytest.CaptureFixture[str]) -> None:
    bus.announce(announcement("engine-worker", "old", "stopped"), announcement("engine-worker", "new"))
    code, lines, err = status(capsys)
    assert code == 0 and [line.split()[1] for line in lines[1:]] == ["new"]
    assert "1 stopped not shown (--all shows them)" in err
    code, lines, _ = status(capsys, "--all")
    assert [line.split()[1:3] for line in lines[1:]] == [["new", "ready"], ["old", "stopped"]]


def test_json_output_has_every_announcement_field_plus_staleness_uptime_and_last_seen(
        bus: Bus, capsys: pytest.CaptureFixture[str]) -> None:
    bus.announce(announcement("parser", "p1", "draining", in_flight=2, metrics_url="http://box:9100/metrics"))
    code, lines, _ = status(capsys, "--json")
    assert code == 0
    (service,) = json.loads("\n".join(lines))
    assert {k: service[k] for k in ("kind", "service_id", "state", "host", "pid", "in_flight", "metrics_url")} == {
        "kind": "parser", "service_id": "p1", "state": "draining", "host": "box", "pid": 4242, "in_flight": 2,
        "metrics_url": "http://box:9100/metrics"}
    assert service["stale"] is False and 299 <= service["uptime_s"] <= 330 and service["last_seen_s"] < 30


def test_a_tombstone_removes_a_service_and_unreadable_records_are_skipped_and_counted(
        bus: Bus, capsys: pytest.CaptureFixture[str]) -> None:
    bus.announce(announcement("edge", "e1"), (b"edge/e1", None), (b"junk", b"{not json"),
                 (b"x", b'{"type": "service", "kind": "edge"}'), announcement("edge", "e2"))
    code, lines, err = status(capsys)
    assert code == 0 and [line.split()[1] for line in lines[1:]] == ["e2"]
    assert "skipped 2 record(s)" in err and "not service announcements" in err


def test_status_without_a_services_topic_says_nothing_announced_itself(
        kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    monkeypatch.setenv("SPECSTREAM_KAFKA__BOOTSTRAP_SERVERS", kafka_bootstrap)
    monkeypatch.setenv("SPECSTREAM_KAFKA__TOPIC_PREFIX", f"t-none-{uuid.uuid4().hex[:8]}")
    code, lines, err = status(capsys)
    assert code == 1 and lines == []
    assert "no service announced itself (is the stack up? `specstream up`)" in err


def test_durations_are_short_enough_for_a_table_column() -> None:
    assert [format_duration(s) for s in (0, 59.9, 60, 3599, 3600, 86399, 90000)] == [
        "0s", "59s", "1m00s", "59m59s", "1h00m", "23h59m", "1d01h"]
