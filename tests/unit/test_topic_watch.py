"""When the topics a process created at its start count as gone (the log it writes meanwhile: test_telemetry.py).

With real Kafka: tests/stacks/test_reliability_topics.py (topics deleted under a running edge and worker).
"""
from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import KafkaConnectionError

from streams.kafka import clients
from streams.kafka.topic_watch import MissingTopics, TopicsGone, watch_topics

WINDOW_S = 30.0


def test_a_topic_is_gone_only_once_every_lookup_for_the_window_missed_it() -> None:
    missing = MissingTopics(["requests", "replies"], WINDOW_S)
    assert missing.observe(["requests"], now=100.0) == []
    assert missing.observe(["requests"], now=120.0) == []
    assert missing.observe(["requests"], now=130.0) == ["replies"]


def test_a_topic_seen_again_starts_its_window_over() -> None:
    missing = MissingTopics(["replies"], WINDOW_S)
    missing.observe([], now=0.0)
    missing.observe(["replies"], now=20.0)  # a broker that had not replayed the metadata log yet, then one that had
    assert missing.observe([], now=40.0) == []
    assert missing.observe([], now=70.0) == ["replies"]


def test_topics_other_than_the_watched_ones_do_not_matter() -> None:
    missing = MissingTopics(["requests"], WINDOW_S)
    assert missing.observe(["requests"], now=0.0) == []
    assert missing.observe(["requests", "someone-elses"], now=100.0) == []


def test_the_error_names_every_gone_topic_and_the_likely_causes() -> None:
    message = str(TopicsGone(["p.requests", "p.replies.e1"]))
    assert "p.requests, p.replies.e1" in message
    assert "deleted, or the broker's storage was reset" in message


async def test_a_zero_window_or_no_topics_watches_nothing() -> None:
    calls: list[list[str]] = []
    # No broker at this address: returning at once means no client was even made.
    await watch_topics("127.0.0.1:1", ["requests"], gone_after_s=0, on_gone=calls.append, client_id="t")
    await watch_topics("127.0.0.1:1", [], gone_after_s=WINDOW_S, on_gone=calls.append, client_id="t")
    assert calls == []


class _FlakyAdmin:
    """An admin client whose look-ups fail, once in a way nobody expected, and then find no topics."""

    def __init__(self) -> None:
        self.failures: list[Exception] = [KafkaConnectionError("broker restarting"), RuntimeError("surprise")]
        self.closed = False

    async def start(self) -> None:
        pass

    async def list_topics(self) -> list[str]:
        if self.failures:
            raise self.failures.pop(0)
        return []

    async def close(self) -> None:
        self.closed = True


async def test_failed_lookups_are_not_counted_and_do_not_end_the_watch(monkeypatch: pytest.MonkeyPatch) -> None:
    admin = _FlakyAdmin()
    monkeypatch.setattr(clients, "make_admin", lambda kafka, client_id: admin)
    calls: list[list[str]] = []
    await asyncio.wait_for(watch_topics("unused:9092", ["requests"], gone_after_s=0.15, on_gone=calls.append,
                                        client_id="t"), timeout=10)
    assert calls == [["requests"]]
    assert admin.failures == [] and admin.closed


async def test_a_service_whose_services_topic_is_gone_announces_nothing_more_while_it_drains() -> None:
    from types import SimpleNamespace

    from streams.service.announcer import Announcer
    from streams.service.app import StartTopics

    sent: list[str] = []

    async def send(topic: str, key: bytes, value: bytes) -> None:
        sent.append(topic)

    def service(services_topic: str) -> SimpleNamespace:
        return SimpleNamespace(kind="k", service_id="s",
                               announcer=Announcer(send, services_topic, kind="k", service_id="s", heartbeat_s=1.0))

    gone_topic, kept_topic = service("p.services"), service("q.services")
    stopped: list[bool] = []
    topics = StartTopics([gone_topic, kept_topic], stop=lambda: stopped.append(True))  # type: ignore[list-item]
    topics._gone(["p.requests", "p.services"])
    await gone_topic.announcer.announce("draining")
    await kept_topic.announcer.announce("draining")
    assert sent == ["q.services"] and stopped == [True]
    assert gone_topic.announcer.muted == "its topic p.services is gone"
    with pytest.raises(TopicsGone, match="p.requests, p.services"):
        topics.raise_if_gone()
