"""Which pool a new request goes to while a model is rolled out: the edge asks :class:`RolloutRouter`.

A request goes to the candidate pool when its bucket, a stable hash into [0, 100) of its conversation id (when the
client gave one: ``GenerateRequest.conversation_id``) or else of its request id, is below the rollout's ``percent``.
The same key always lands in the same bucket, so every turn of a conversation, and a redelivered or retried request,
stays in its pool while the share holds, and raising the percentage only moves keys from stable to the candidate,
never back. The
router follows the compacted ``<prefix>.rollouts`` topic from its start (the newest state of every model), so an
edge that restarts, or a second edge, routes alike within one poll (0.2 s) of a change.
"""
from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from schemas.events import RolloutState
from schemas.topics import TopicCatalog
from streams import kafka_io
from streams.kafka_connection import Connectable

log = logging.getLogger(__name__)
ROUTING_STATES = ("starting", "running", "paused", "completed")  # a candidate receives traffic in these
CANDIDATE_SUFFIX = "-candidate"


def candidate_prefix(prefix: str) -> str:
    """The candidate pool's topic prefix: its request, cancellation, announcement and dead-letter topics."""
    return f"{prefix}{CANDIDATE_SUFFIX}"


def bucket(key: str) -> float:
    """A stable position of a routing key in [0, 100) (SHA-256, so every edge and language agrees)."""
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:8], "big") % 10_000 / 100


def to_candidate(state: RolloutState | None, request_id: str, conversation_id: str | None = None) -> bool:
    """Whether a new request goes to the candidate: by its conversation when it names one, else by its own id."""
    key = conversation_id or request_id
    return state is not None and state.state in ROUTING_STATES and bucket(key) < state.percent


class RolloutRouter:
    def __init__(self, kafka: Connectable, catalog: TopicCatalog, *, log_changes: bool = True) -> None:
        self.kafka = kafka
        self.catalog = catalog
        self.log_changes = log_changes
        self.states: dict[str, RolloutState] = {}
        self._task: asyncio.Task[None] | None = None
        self._consumer: AIOKafkaConsumer | None = None

    def request_topic(self, model: str, request_id: str, conversation_id: str | None = None) -> str:
        state = self.states.get(model)
        if to_candidate(state, request_id, conversation_id):
            assert state is not None
            return TopicCatalog(state.candidate_prefix, self.catalog.request_partitions).requests.name
        return self.catalog.requests.name

    def cancel_topics(self, model: str | None = None) -> list[str]:
        """Where a cancellation goes: stable's topic, and each routing candidate's (the edge does not remember
        which pool a request went to; a worker ignores cancellations of requests it does not hold)."""
        topics = [self.catalog.cancellations.name]
        for state in self.states.values():
            if state.state in ROUTING_STATES and state.percent > 0 and (model is None or state.model == model):
                topics.append(TopicCatalog(state.candidate_prefix).cancellations.name)
        return topics

    async def start(self) -> None:
        self._consumer = kafka_io.make_consumer(self.kafka, enable_auto_commit=False, auto_offset_reset="earliest")
        await self._consumer.start()
        self._task = asyncio.create_task(self._follow(), name="rollout-router")

    async def stop(self) -> None:
        await kafka_io.stop_polling(self._task, self._consumer)
        self._task = self._consumer = None

    async def _follow(self) -> None:
        consumer = self._consumer
        assert consumer is not None
        topic = self.catalog.rollouts.name
        while topic not in await consumer.topics():  # no rollout ever started; look again now and then
            await asyncio.sleep(2.0)
            await consumer._client.force_metadata_update()  # noqa: SLF001 - aiokafka has no public refresh
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        while True:
            try:
                batch = await consumer.getmany(tp, timeout_ms=200)
            except KafkaError as error:  # the broker moving or gone: keep the last states, try again
                log.warning("rollouts: cannot read %s (%s); routing by the last known states", topic, error)
                await asyncio.sleep(1.0)
                continue
            for record in batch.get(tp, []):
                self._file(record.value)

    def _file(self, value: bytes | None) -> None:
        if value is None:
            return
        with contextlib.suppress(ValidationError, ValueError):
            state = kafka_io.decode(value, RolloutState)
            previous = self.states.get(state.model)
            if previous is None or state.at >= previous.at:
                self.states[state.model] = state
                if self.log_changes and (previous is None or
                                         (previous.state, previous.percent) != (state.state, state.percent)):
                    log.info("rollout of %s: %s, %.4g %% to the candidate (%s)", state.model, state.state,
                             state.percent, state.reason or "no reason given")
