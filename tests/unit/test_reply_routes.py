"""Reply routes: only this deployment's reply topics, only existing ones, checked at the cost of a dict lookup."""
from __future__ import annotations

import asyncio

import pytest

from streams.config import ConfigError, DeliverySettings, load_settings
from streams.kafka.reply_routes import ReplyRoutes, compile_patterns


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Metadata:
    """The cluster's topic list, counting look-ups (the real look-up is the admin client's list_topics)."""

    def __init__(self, *topics: str) -> None:
        self.topics = set(topics)
        self.lookups = 0
        self.fail = False
        self.delay_s = 0.0

    async def __call__(self) -> set[str]:
        self.lookups += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail:
            raise ConnectionError("broker gone")
        return set(self.topics)


def routes(metadata: Metadata, clock: Clock, *, ttl_s: float = 30.0) -> ReplyRoutes:
    return ReplyRoutes(compile_patterns(DeliverySettings().reply_topic_patterns, "sp"), metadata,
                       ttl_s=ttl_s, lookup_timeout_s=0.5, clock=clock)


async def test_only_reply_topics_of_this_deployment_are_allowed() -> None:
    r = routes(Metadata(), Clock())
    assert r.allowed("sp.replies.edge-1")
    for internal in ("sp.workers", "sp.services", "sp.dead-letters", "sp.requests", "other.replies.edge-1",
                     "sp.repliesX", "sp.replies"):
        assert not r.allowed(internal), internal


async def test_a_forbidden_topic_is_refused_without_a_metadata_lookup() -> None:
    metadata = Metadata("sp.workers")
    problem = await routes(metadata, Clock()).check("sp.workers")
    assert problem is not None and problem.code == "reply_topic_forbidden"
    assert "sp.workers" in problem.message and "sp.replies.*" in problem.message
    assert metadata.lookups == 0


async def test_a_missing_topic_is_refused_and_an_existing_one_accepted() -> None:
    r = routes(Metadata("sp.replies.a"), Clock())
    assert await r.check("sp.replies.a") is None
    problem = await r.check("sp.replies.b")
    assert problem is not None and problem.code == "reply_topic_missing" and "sp.replies.b" in problem.message


async def test_an_existing_topic_is_looked_up_once_per_ttl() -> None:
    metadata, clock = Metadata("sp.replies.a"), Clock()
    r = routes(metadata, clock, ttl_s=30.0)
    for _ in range(100):
        assert await r.exists("sp.replies.a")
    assert metadata.lookups == 1
    clock.now += 31.0
    assert await r.exists("sp.replies.a")
    assert metadata.lookups == 2


async def test_a_missing_topic_is_looked_up_again_after_a_second_so_a_new_topic_is_found() -> None:
    metadata, clock = Metadata(), Clock()
    r = routes(metadata, clock)
    assert not await r.exists("sp.replies.new")
    assert not await r.exists("sp.replies.new")
    assert metadata.lookups == 1  # a flood of requests for one missing topic costs one look-up a second
    metadata.topics.add("sp.replies.new")
    clock.now += 1.5
    assert await r.exists("sp.replies.new")


async def test_requests_arriving_together_share_one_lookup() -> None:
    metadata = Metadata("sp.replies.a")
    metadata.delay_s = 0.05
    r = routes(metadata, Clock())
    results = await asyncio.gather(*(r.exists(t) for t in ["sp.replies.a", "sp.replies.b", "sp.replies.a"]))
    assert results == [True, False, True]
    assert metadata.lookups == 1


async def test_a_failed_lookup_does_not_refuse_work() -> None:
    # A broker failing over must not turn every new reply topic into a dead letter; the publish is bounded anyway.
    metadata = Metadata()
    metadata.fail = True
    assert await routes(metadata, Clock()).exists("sp.replies.unknown")


async def test_a_lookup_slower_than_its_bound_counts_as_failed() -> None:
    metadata = Metadata()
    metadata.delay_s = 5.0
    started = asyncio.get_running_loop().time()
    assert await routes(metadata, Clock()).exists("sp.replies.unknown")
    assert asyncio.get_running_loop().time() - started < 2.0


async def test_forget_makes_the_next_check_look_the_topic_up_again() -> None:
    metadata, clock = Metadata("sp.replies.a"), Clock()
    r = routes(metadata, clock)
    assert await r.exists("sp.replies.a")
    metadata.topics.clear()  # deleted, e.g. by `specstream topics gc`
    r.forget("sp.replies.a")
    assert not await r.exists("sp.replies.a")


@pytest.mark.parametrize("pattern", ["*", "{prefix}.*", " "])
def test_a_pattern_that_opens_every_topic_fails_at_start_naming_the_key(pattern: str) -> None:
    with pytest.raises(ConfigError, match="delivery.reply_topic_patterns"):
        load_settings(None, delivery={"reply_topic_patterns": [pattern]})


def test_extra_patterns_admit_clients_own_reply_topics() -> None:
    settings = load_settings(None, delivery={"reply_topic_patterns": ["{prefix}.replies.*", "team-a.answers.*"]})
    r = ReplyRoutes(compile_patterns(settings.delivery.reply_topic_patterns, settings.kafka.topic_prefix),
                    Metadata(), ttl_s=1, lookup_timeout_s=1)
    assert r.allowed("team-a.answers.x") and r.allowed("specstream.replies.e") and not r.allowed("team-b.answers.x")
