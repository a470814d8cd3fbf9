"""The rollouts topic: publishing a model's rollout state, following the newest, and the operator's transitions."""
from __future__ import annotations

import time

from aiokafka import AIOKafkaProducer
from pydantic import ValidationError

from schemas.events import RolloutState
from schemas.topics import TopicCatalog
from streams.kafka import clients
from streams.kafka.connection import Connectable
from streams.ops.rollout_router import RolloutRouter

# What each operator action does to the newest state, and from which states it may.
TRANSITIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "pause": (("starting", "running"), "paused"),
    "resume": (("paused",), "running"),
    "abort": (("starting", "running", "paused", "completed"), "aborted"),
}


class RolloutError(ValueError):
    """An operator action that does not apply (no rollout, or one in a state it cannot leave that way)."""


class RolloutStore:
    def __init__(self, kafka: Connectable, catalog: TopicCatalog) -> None:
        self.kafka, self.catalog = kafka, catalog
        self.follower = RolloutRouter(kafka, catalog, log_changes=False)  # the controller says what it does
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        """Start, or stop what was started and raise: a start that failed on a broker going down may be tried again."""
        try:
            await clients.ensure_topics(self.kafka, [self.catalog.rollouts])
            self._producer = clients.make_producer(self.kafka, client_id="specstream-rollout")
            await self._producer.start()
            await self.follower.start()
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        await self.follower.stop()
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    async def publish(self, state: RolloutState) -> None:
        assert self._producer is not None
        await self._producer.send_and_wait(self.catalog.rollouts.name, clients.encode(state),
                                           key=state.model.encode())

    def latest(self, model: str) -> RolloutState | None:
        return self.follower.states.get(model)


async def read_states(kafka: Connectable, catalog: TopicCatalog) -> dict[str, RolloutState]:
    """Every model's newest rollout state, read from the topic's start to its end."""
    if catalog.rollouts.name not in await clients.list_topics(kafka):
        return {}
    newest: dict[str, RolloutState] = {}
    for record in await clients.read_partition(kafka, catalog.rollouts.name):
        if not record.value:
            continue
        try:
            state = clients.decode(record.value, RolloutState)
        except (ValidationError, ValueError):
            continue
        if state.model not in newest or state.at >= newest[state.model].at:
            newest[state.model] = state
    return newest


async def transition(kafka: Connectable, catalog: TopicCatalog, model: str, action: str, reason: str) -> RolloutState:
    """pause, resume or abort the model's rollout; abort also sets 0 %, so edges stop routing at once."""
    allowed, new_state = TRANSITIONS[action]
    current = (await read_states(kafka, catalog)).get(model)
    if current is None:
        raise RolloutError(f"no rollout of {model!r} on {catalog.rollouts.name}")
    if current.state not in allowed:
        raise RolloutError(f"the rollout of {model!r} is {current.state}: cannot {action} it")
    update: dict[str, object] = {"state": new_state, "reason": reason, "at": time.time()}
    if action == "abort":
        update["percent"] = 0.0
    state = current.model_copy(update=update)
    producer = clients.make_producer(kafka, client_id="specstream-rollout")
    await producer.start()
    try:
        await producer.send_and_wait(catalog.rollouts.name, clients.encode(state), key=model.encode())
    finally:
        await producer.stop()
    return state
