"""clients.retrying: what it asks again (Kafka's transient errors), for how long, with what pauses."""
from __future__ import annotations

import time

import pytest
from aiokafka.errors import (
    KafkaError,
    KafkaTimeoutError,
    NodeNotReadyError,
    NotLeaderForPartitionError,
    TopicAuthorizationFailedError,
)

from streams.kafka import clients


class Flaky:
    """A Kafka call that fails with ``errors``, in order, then answers "ok"."""

    def __init__(self, *errors: KafkaError) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


async def test_a_broker_not_ready_a_moving_leader_and_a_client_timeout_are_asked_again() -> None:
    call = Flaky(NodeNotReadyError("node 3"), NotLeaderForPartitionError(), KafkaTimeoutError())
    heard: list[KafkaError] = []
    assert await clients.retrying(call, timeout_s=5, pause_s=0.01, on_retry=heard.append) == "ok"
    assert call.calls == 4
    assert [type(e) for e in heard] == [NodeNotReadyError, NotLeaderForPartitionError, KafkaTimeoutError]


async def test_no_broker_answering_a_metadata_request_is_asked_again() -> None:
    # What aiokafka's fetch_all_metadata raises (a plain KafkaError, not retriable) while every broker restarts.
    call = Flaky(KafkaError("Unable to get cluster metadata over all known brokers"))
    assert await clients.retrying(call, timeout_s=5, pause_s=0.01) == "ok"
    assert not clients.transient(KafkaError("topic t does not exist"))


async def test_an_error_retrying_cannot_fix_is_raised_at_once() -> None:
    call = Flaky(TopicAuthorizationFailedError())
    with pytest.raises(TopicAuthorizationFailedError):
        await clients.retrying(call, timeout_s=5, pause_s=0.01)
    assert call.calls == 1


async def test_past_its_bound_the_last_error_is_raised() -> None:
    call = Flaky(*[NodeNotReadyError("node 3")] * 1000)
    started = time.monotonic()
    with pytest.raises(NodeNotReadyError, match="node 3"):
        await clients.retrying(call, timeout_s=0.3, pause_s=0.01, max_pause_s=0.05)
    assert 0.3 <= time.monotonic() - started < 1.0
    assert 6 <= call.calls < 40  # doubling pauses: 0.01, 0.02, 0.04, then 0.05 each


async def test_on_retry_may_give_up_at_once() -> None:
    def give_up(error: KafkaError) -> None:
        raise RuntimeError(f"stopped: {error}")

    call = Flaky(NodeNotReadyError("node 3"))
    with pytest.raises(RuntimeError, match="stopped"):
        await clients.retrying(call, timeout_s=5, pause_s=0.01, on_retry=give_up)
    assert call.calls == 1
