"""The rollouts topic on the real broker: an edge that starts after a rollout routes as the others do, and operator
actions that do not apply are refused naming why."""
from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from schemas.events import RolloutState
from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.ops.rollout_router import RolloutRouter, bucket, candidate_prefix
from streams.ops.rollout_store import RolloutError, RolloutStore, transition
from tests.kafka_fixtures import kafka_bootstrap, kafka_single  # noqa: F401

pytestmark = pytest.mark.kafka


@pytest_asyncio.fixture
async def catalog(kafka_bootstrap: str) -> AsyncIterator[TopicCatalog]:  # noqa: F811
    catalog = TopicCatalog(prefix=f"ro-{uuid.uuid4().hex[:8]}")
    yield catalog
    await clients.delete_topics(kafka_bootstrap, [catalog.rollouts.name])


async def _until(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)


async def test_an_edge_that_starts_after_the_rollout_routes_like_the_others(kafka_bootstrap: str,  # noqa: F811
                                                                           catalog: TopicCatalog) -> None:
    store = RolloutStore(kafka_bootstrap, catalog)
    await store.start()
    try:
        await store.publish(RolloutState(model="m", rollout_id="r1", candidate_prefix=candidate_prefix(catalog.prefix),
                                         state="running", percent=50, steps=[50, 100], at=time.time()))
        late = RolloutRouter(kafka_bootstrap, catalog)  # a restarted edge: it reads the topic from its start
        await late.start()
        try:
            await _until(lambda: "m" in late.states)
            to_candidate = next(i for i in (f"id-{n}" for n in range(100)) if bucket(i) < 50)
            assert late.request_topic("m", to_candidate) == f"{catalog.prefix}-candidate.requests"
            aborted = await transition(kafka_bootstrap, catalog, "m", "abort", "enough")
            assert (aborted.state, aborted.percent, aborted.reason) == ("aborted", 0.0, "enough")
            await _until(lambda: late.states["m"].state == "aborted")
            assert late.request_topic("m", to_candidate) == f"{catalog.prefix}.requests"
        finally:
            await late.stop()
    finally:
        await store.stop()


async def test_operator_actions_name_what_does_not_apply(kafka_bootstrap: str,  # noqa: F811
                                                         catalog: TopicCatalog) -> None:
    with pytest.raises(RolloutError, match="no rollout of 'm'"):
        await transition(kafka_bootstrap, catalog, "m", "pause", "x")
    store = RolloutStore(kafka_bootstrap, catalog)
    await store.start()
    try:
        await store.publish(RolloutState(model="m", rollout_id="r1", candidate_prefix="c", state="rolled_back",
                                         percent=0, at=time.time()))
    finally:
        await store.stop()
    with pytest.raises(RolloutError, match="is rolled_back: cannot resume it"):
        await transition(kafka_bootstrap, catalog, "m", "resume", "x")
