"""Requests of LoRA adapters on their way into the batch: refused, parked until their adapter is in memory, pinned.

A request naming a served adapter that sits in a slot enters the scheduler at
once and pins the adapter (it cannot be evicted under it). One whose adapter
was evicted waits here, outside the scheduler, while the loader thread reads
the adapter again; `poll()` (between steps) lets it in once the adapter is in
its slot, or fails it when the read fails.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.lora.manager import LoRAManager
from engine.request import RequestRejected
from engine.scheduler import ScheduledSequence
from engine.sequence import Sequence


@dataclass(frozen=True)
class ParkedFailure:
    seq: Sequence
    code: str
    message: str


class LoRARequests:
    def __init__(self, manager: LoRAManager, enter: Callable[[Sequence], None], base_model: str) -> None:
        self.manager = manager
        self._enter = enter  # Scheduler.add (raises RequestRejected)
        self.base_model = base_model
        self.parked: list[Sequence] = []
        self._pinned: dict[str, str] = {}  # request id -> adapter it pins

    def admit(self, seq: Sequence) -> None:
        """Into the scheduler now, or parked until the adapter is read; RequestRejected for an unknown name."""
        name = seq.request.lora
        if name is None:
            self._enter(seq)
            return
        if name not in self.manager.paths:
            served = ", ".join([self.base_model, *self.manager.served()])
            raise RequestRejected("unknown_model", f"model '{name}' is not served; available: {served}")
        if self.manager.is_resident(name):
            seq.cache_salt = self.manager.cache_key(name)
            self._enter(seq)
            self._pin(seq, name)
            return
        self.manager.request_load(name)
        self.parked.append(seq)

    def poll(self) -> list[ParkedFailure]:
        """Between steps: finish loads, let parked requests whose adapter is in memory in; the ones that cannot go."""
        failed = {r.name: r.error for r in self.manager.poll() if r.error is not None}
        failures: list[ParkedFailure] = []
        still: list[Sequence] = []
        for seq in self.parked:
            name = seq.request.lora
            assert name is not None
            if name in failed or name not in self.manager.paths:
                why = failed.get(name) or f"LoRA adapter '{name}' was unloaded"
                failures.append(ParkedFailure(seq, "unknown_model" if name not in failed else "internal_error", why))
            elif self.manager.is_resident(name):
                seq.cache_salt = self.manager.cache_key(name)
                try:
                    self._enter(seq)
                except RequestRejected as rejected:
                    failures.append(ParkedFailure(seq, rejected.code, rejected.message))
                    continue
                self._pin(seq, name)
            else:
                self.manager.request_load(name)  # a slot frees when a running adapter's requests end
                still.append(seq)
        self.parked = still
        return failures

    def wait_if_idle(self, scheduler_busy: bool) -> None:
        """With only parked requests, block until a load finishes (instead of spinning)."""
        if self.parked and not scheduler_busy and self.manager.loading():
            # Short: the worker's engine thread applies new commands (adds, aborts) between steps.
            self.manager.wait(timeout_s=0.05)

    def abort(self, request_id: str) -> Sequence | None:
        for i, seq in enumerate(self.parked):
            if seq.request_id == request_id:
                return self.parked.pop(i)
        return None

    def release(self, seq: Sequence) -> None:
        """The sequence left the scheduler (finished, aborted, expired)."""
        name = self._pinned.pop(seq.request_id, None)
        if name is not None:
            self.manager.release(name)

    def _pin(self, seq: Sequence, name: str) -> None:
        self.manager.acquire(name)
        self._pinned[seq.request_id] = name

    def begin_step(self, scheduled: list[ScheduledSequence]) -> None:
        """Row -> slot for this step's flat batch (the runner lays rows out in schedule order)."""
        rows: list[int] = []
        for s in scheduled:
            rows.extend([self.manager.slot_of(s.seq.request.lora)] * s.num_new_tokens)
        self.manager.begin_step(rows)
