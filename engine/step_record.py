"""What one engine step did, for step observers (benchmarks, tests): `LLMEngine.add_step_observer`.

The record is built only when an observer is registered; the engine's own
bookkeeping never reads it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.scheduler import SchedulerOutput
from engine.sequence import Sequence


@dataclass(frozen=True)
class StepRecord:
    """One `LLMEngine.step()`, read after it ran.

    start / end: time.perf_counter() at the step's entry and just before it
    returns (a monotonic clock: only differences mean anything). Rows are the
    target forward's input rows: a decode feeds 1 + k (its drafts included), a
    prefill chunk its tokens. The scheduler's `is_batch` decides the class.
    """

    start: float
    end: float
    interactive_decode_rows: int
    interactive_prefill_tokens: int
    # Every row of batch work: decodes with their drafts and prompt chunks.
    batch_rows: int
    # Requests first scheduled in this step (admitted from the waiting queue), in schedule order.
    admitted: tuple[str, ...]
    batch: SchedulerOutput

    @property
    def wall_s(self) -> float:
        return self.end - self.start

    @property
    def num_rows(self) -> int:
        return self.batch.num_batched_tokens

    @property
    def is_empty(self) -> bool:
        """No forward ran (nothing to schedule); the step may still have reported expired requests."""
        return self.batch.is_empty

    @classmethod
    def of(
        cls, batch: SchedulerOutput, start: float, end: float, now: float, is_batch: Callable[[Sequence], bool]
    ) -> StepRecord:
        """now: the time.time() the step scheduled with (what the scheduler stamps on an admission)."""
        decode = prefill = batch_rows = 0
        for s in batch.scheduled:
            if is_batch(s.seq):
                batch_rows += s.num_new_tokens
            elif s.is_prefill:
                prefill += s.num_new_tokens
            else:
                decode += s.num_new_tokens
        admitted = tuple(s.seq.request_id for s in batch.scheduled if s.seq.first_scheduled_time == now)
        return cls(start, end, decode, prefill, batch_rows, admitted, batch)


StepObserver = Callable[[StepRecord], None]
