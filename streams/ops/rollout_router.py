"""Which pool a new request goes to while a model is rolled out: the edge asks :class:`RolloutRouter`.

A request goes to the candidate pool when its bucket, a stable hash into [0, 100) of its conversation id (when the
client gave one: ``GenerateRequest.conversation_id``) or else of its request id, is below the rollout's ``percent``.
The same key always lands in the same bucket, so every turn of a conversation, and a redelivered or retried request,
stays in its pool while the share holds, and raising the percentage only moves keys from stable to the candidate,
never back. The router follows the compacted ``<prefix>.rollouts`` topic from its start (the newest state of every
model, by ``at``), so an edge that restarts, or a second edge, routes alike within one poll (0.2 s) of a change.
"""
from __future__ import annotations

import hashlib
import logging

from schemas.events import RolloutState
from schemas.topics import TopicCatalog
from streams.kafka.compacted_table import BackgroundView, CompactedTable, newest_by
from streams.kafka.connection import Connectable

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


class RolloutRouter(BackgroundView[RolloutState]):
    def __init__(self, kafka: Connectable, catalog: TopicCatalog, *, log_changes: bool = True) -> None:
        """The topic appears with the first rollout: until then every request goes to stable."""
        # Newest by ``at``: the controller and an operator's CLI may both write a model's state.
        super().__init__(CompactedTable(kafka, catalog.rollouts, RolloutState, policy=newest_by(lambda s: s.at),
                                        key_of=lambda s: s.model, on_change=self._changed, create_topic=False,
                                        wait_for_topic=True))
        self.catalog = catalog
        self.log_changes = log_changes
        self.states: dict[str, RolloutState] = self.table.rows
        self._said: dict[str, RolloutState | None] = {}  # the last state logged per model

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

    def _changed(self, model: str, state: RolloutState | None) -> None:
        previous, self._said[model] = self._said.get(model), state
        if not self.log_changes or state is None:
            return
        if previous is None or (previous.state, previous.percent) != (state.state, state.percent):
            log.info("rollout of %s: %s, %.4g %% to the candidate (%s)", state.model, state.state,
                     state.percent, state.reason or "no reason given")
