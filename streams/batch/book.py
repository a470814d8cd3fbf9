"""Every batch's state, as the compacted batches topic says, merged so that its writers never undo each other.

The edge writes a batch when it is created and when it is cancelled; the assembler writes its progress and its
end. Both may write at once, so every reader (edges, the assembler, engine workers) merges what it reads into
what it knows (:func:`merge`): the status only moves forward, counts only grow, a timestamp or file id once set
stays. The book follows the topic from its start (:class:`~streams.kafka.compacted_table.CompactedTable`, with :func:`merge`
as its policy), so a restarted process knows every batch.
"""
from __future__ import annotations

from collections.abc import Callable

from schemas.batch import BatchRequestCounts, BatchState, BatchStatus
from schemas.topics import Topic
from streams.kafka.compacted_table import BackgroundView, CompactedTable, merged
from streams.kafka.connection import Connectable

# Forward only. finalizing and cancelling tie: the first one written wins (a cancel after every line was
# answered changes nothing; a batch being cancelled ends cancelled, not completed).
_RANK: dict[str, int] = {"validating": 0, "in_progress": 1, "finalizing": 2, "cancelling": 2, "completed": 3,
                         "failed": 3, "expired": 3, "cancelled": 3}
TERMINAL: frozenset[BatchStatus] = frozenset({"completed", "failed", "expired", "cancelled"})
_ONCE = ("in_progress_at", "finalizing_at", "completed_at", "failed_at", "expired_at", "cancelling_at",
         "cancelled_at", "output_file_id", "error_file_id")


def merge(old: BatchState | None, new: BatchState) -> BatchState:
    """What is known of a batch after reading ``new`` on top of ``old``."""
    if old is None:
        return new
    status = new.status if _RANK[new.status] > _RANK[old.status] else old.status
    counts = BatchRequestCounts(
        total=max(old.request_counts.total, new.request_counts.total),
        completed=max(old.request_counts.completed, new.request_counts.completed),
        failed=max(old.request_counts.failed, new.request_counts.failed),
    )
    update: dict[str, object] = {
        "status": status, "request_counts": counts, "answered": max(old.answered, new.answered),
        "estimated_tokens": max(old.estimated_tokens, new.estimated_tokens),
        "errors": old.errors or new.errors, "at": max(old.at, new.at),
    }
    for name in _ONCE:
        update[name] = getattr(old, name) if getattr(old, name) is not None else getattr(new, name)
    return old.model_copy(update=update)


class BatchBook(BackgroundView[BatchState]):
    def __init__(self, kafka: Connectable, topic: Topic,
                 on_change: Callable[[BatchState], None] | None = None) -> None:
        """The topic must exist when it starts."""
        super().__init__(CompactedTable(kafka, topic, BatchState, policy=merged(merge), key_of=lambda s: s.id,
                                        on_change=self._changed, create_topic=False))
        self.on_change = on_change  # called with each merged state read from the topic
        self.batches: dict[str, BatchState] = self.table.rows

    def get(self, batch_id: str) -> BatchState | None:
        return self.batches.get(batch_id)

    def apply(self, state: BatchState) -> BatchState:
        """Record a state just written here (read-your-writes); returns the merged one."""
        kept = self.table.put(state.id, state)
        assert kept is not None  # merge() never ignores a state
        return kept

    def is_stopped(self, batch_id: str) -> bool:
        """A line of this batch must not start: the batch is being cancelled, or is over."""
        state = self.batches.get(batch_id)
        return state is not None and (state.status == "cancelling" or state.status in TERMINAL)

    def _changed(self, batch_id: str, state: BatchState | None) -> None:
        if state is not None and self.on_change is not None:
            self.on_change(state)
