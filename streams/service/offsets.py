"""Which request offsets may be committed.

Requests from one partition finish out of order (a short request overtakes a
long one), but a Kafka commit is one number per partition: "everything below
this offset is done". So the committable position of a partition is the
lowest offset still in flight, or one past the highest offset seen when none
is. A request is marked finished only after its Completion or ErrorEvent has
been acknowledged by Kafka, so a crash at any point redelivers (at least once)
every request whose reply may not have been stored.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Source:
    """Where a consumed message came from: what is committed once it is answered."""

    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}@{self.offset}"


@dataclass
class _Partition:
    in_flight: set[int] = field(default_factory=set)
    highest_seen: int = -1
    committed: int = -1  # last position committed by us (-1: none yet)


class OffsetTracker:
    def __init__(self) -> None:
        self._partitions: dict[tuple[str, int], _Partition] = {}

    def started(self, topic: str, partition: int, offset: int) -> None:
        state = self._partitions.setdefault((topic, partition), _Partition())
        state.in_flight.add(offset)
        state.highest_seen = max(state.highest_seen, offset)

    def finished(self, topic: str, partition: int, offset: int) -> None:
        state = self._partitions.get((topic, partition))
        if state is not None:
            state.in_flight.discard(offset)

    def committable(self) -> dict[tuple[str, int], int]:
        """Positions (next offset to read) that are ahead of what was last committed."""
        positions: dict[tuple[str, int], int] = {}
        for key, state in self._partitions.items():
            if state.highest_seen < 0:
                continue
            position = min(state.in_flight) if state.in_flight else state.highest_seen + 1
            if position > state.committed:
                positions[key] = position
        return positions

    def mark_committed(self, positions: dict[tuple[str, int], int]) -> None:
        for key, position in positions.items():
            state = self._partitions.get(key)
            if state is not None:
                state.committed = max(state.committed, position)

    def forget(self, topic: str, partition: int) -> None:
        """Drop a partition this consumer no longer owns; its new owner restarts from the last commit."""
        self._partitions.pop((topic, partition), None)

    def in_flight(self, topic: str, partition: int) -> int:
        state = self._partitions.get((topic, partition))
        return len(state.in_flight) if state else 0
