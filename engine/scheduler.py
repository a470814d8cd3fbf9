"""Iteration-level continuous batching.

Every step the scheduler builds one batch from scratch: requests join and
leave between any two steps. Order of business in `schedule()`:

1. requests past their deadline leave (running ones free their KV region;
   waiting ones are never started);
2. interactive decodes first: each running decoding sequence needs 1 + k
   tokens (its last token plus k drafts to verify), so a long prompt never
   stalls them;
3. interactive prefill chunks fill what is left of the token budget: first
   the sequences already part-way through their prompt, then new admissions
   from the waiting queue, in (priority, arrival) order;
4. only when step 3 scheduled nothing: batch work, one decode row per batch
   line, then batch prefill the same way and the batch decodes' drafts,
   together within ``batch_step_tokens``.

Batch work (priority at or above ``batch_priority``: offline batch jobs) sorts
after every interactive request. Batch lines never take an interactive
request's slot: interactive requests count only themselves against
``max_running_requests``, so an interactive arrival is admitted at the next
step however many batch lines run, taking their slots never and their KV
only when memory is short (below). A batch line is admitted into the slots
interactive work leaves free: at most ``batch_max_share`` of ``max_running_requests`` in all, and only
while ``batch_headroom`` slots stay free after it, so as interactive work
grows, finishing batch lines hand their slots back instead of being
replaced. Batch work only ever yields at admission, and otherwise yields
the step, never its place: a step
that carries interactive prefill carries no batch work at all (batch lines
skip it, keeping their slot and their KV); in other steps each batch line
feeds one decode row, and beyond those rows their prompt tokens and then
their drafts take at most ``batch_step_tokens``. On a compute-bound device a
step costs about its token count, so what a running batch adds to an
interactive request's first token is bounded by the step in flight when it
arrived: one row per running batch line (at most batch_max_share x
max_running_requests rows) plus at most ``batch_step_tokens``. Its own
prefill step (every chunk of it, for a long prompt) runs as if no batch were
there. While interactive prefill fills every step, batch lines wait.

Admission reserves a KV region for the sequence's whole life (prompt +
max_tokens + draft slack), so a running sequence never runs out of memory
mid-generation; one that could never fit is rejected when it is added. The
region comes through the prefix cache (engine.prefix_cache): the longest
cached prefix of the prompt is copied in and not computed again, and cached
blocks nobody runs on are evicted, least recently used first, to make room.
When the queue's head does not fit even so:
* it preempts running sequences of a strictly lower priority (batch lines
  first, then the newest; their rows in the step being built leave it), if
  that frees enough: they give their region back (their prompt's blocks stay
  cached, so recomputing those is a copy), go back to the queue in their old
  place, and resume with every token they had: the prompt recomputed (as
  vLLM v1 recomputes), the output's KV put back from a copy kept outside the
  arena (recomputing it with the chunk kernel would round differently from
  the decodes that wrote it);
* otherwise up to ``LOOKAHEAD`` requests of the same class behind it that fit
  are admitted instead (no head-of-line blocking), each counted against the
  head; once ``HEAD_BYPASS_LIMIT`` requests have passed it, nothing more does
  until it fits (it is never starved: running sequences finish and free their
  regions).

The scheduler owns two decisions the rest of the engine only reads:
* how many drafts a decode may verify (`draft_cap`, the one place k is capped);
* how many positions of a sequence's KV region hold valid KV: it reserves the
  region at admission, advances the counter after each step
  (`update_from_step`, which also drops rejected drafts) and frees it.
"""
from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.config import batch_line_slots
from engine.kv_cache import CacheSlot, KVCache
from engine.outputs import FinishReason
from engine.preemption import restore_output, save_output, victims_for
from engine.prefix_cache import PrefixCache
from engine.request import RequestRejected
from engine.sequence import Sequence, SequenceStatus
from engine.speculative.proposer import DraftProposal

# Waiting requests (the head included) looked at for one admission when the head does not fit.
LOOKAHEAD = 8
# Admissions that may pass a head that does not fit before it blocks the queue until it does.
HEAD_BYPASS_LIMIT = 16


def draft_cap(seq: Sequence, max_draft_tokens: int, free_tokens: int | None = None) -> int:
    """The most drafts `seq` may verify in one step: the one place k is capped.

    - max_draft_tokens: k_max, the draft slack every KV region is sized for;
    - never past max_tokens: a step emits up to k + 1 tokens;
    - free_tokens (what is left of the step's token budget, when known): the
      decode feeds its last token and its k drafts.
    """
    cap = min(max_draft_tokens, seq.params.max_tokens - len(seq.output_ids) - 1)
    if free_tokens is not None:
        cap = min(cap, free_tokens - 1)
    return max(0, cap)


def draft_room(base_rows: int, piece_rows: int | None) -> int | None:
    """The most drafts a step of base_rows rows may take in all before its bf16 GEMMs need one more call
    (engine.quant.linear.Bf16Kernel runs a wider step as pieces of piece_rows rows): one more piece reads every
    weight once more, which costs about a plain step and which the controller's linear cost model cannot see
    (64 decodes and a draft or two ran 5-15 % slower than 64 plain). None: no bf16 pieces, no bound."""
    return None if piece_rows is None else -base_rows % piece_rows


@dataclass
class ScheduledSequence:
    seq: Sequence
    # Rows fed this step: a prefill chunk, or 1 + len(draft_tokens) for a decode.
    num_new_tokens: int
    is_prefill: bool
    # A next-token distribution is needed: a prefill chunk that completes the
    # prompt (its last row), or a decode (all 1 + k rows).
    needs_logits: bool
    # Drafts this decode may verify: the controller's k within draft_cap.
    draft_budget: int = 0
    # The proposer's drafts (set_drafts), at most draft_budget of them.
    drafts: DraftProposal = field(default_factory=lambda: DraftProposal(tokens=[]))

    @property
    def draft_tokens(self) -> list[int]:
        return self.drafts.tokens

    def set_drafts(self, proposal: DraftProposal) -> None:
        """The proposer's answer: the decode feeds its last token and these drafts.

        Fewer than draft_budget is normal (no n-gram match); more would overrun
        the region's draft slack, which the Proposer protocol rules out.
        """
        if self.is_prefill or proposal.num_tokens > self.draft_budget:
            raise ValueError(
                f"{self.seq.request_id}: {proposal.num_tokens} drafts for a budget of {self.draft_budget}"
            )
        self.drafts = proposal
        self.num_new_tokens = 1 + proposal.num_tokens


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSequence]
    # Sequences that left before running this step (deadline); the engine reports them.
    finished: list[Sequence]

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    def __init__(
        self,
        kv_cache: KVCache,
        max_model_len: int,
        max_running_requests: int,
        max_batched_tokens: int,
        max_draft_tokens: int = 0,
        batch_priority: int = 10,
        batch_max_share: float = 1.0,
        batch_step_tokens: int | None = None,
        batch_headroom: int = 0,
        prefix_caching: bool = False,
    ) -> None:
        if max_running_requests < 1 or max_batched_tokens < 1:
            raise ValueError("max_running_requests and max_batched_tokens must be at least 1")
        if not 0.0 < batch_max_share <= 1.0:
            raise ValueError(f"batch_max_share must be in (0, 1], got {batch_max_share}")
        if batch_headroom < 0:
            raise ValueError(f"batch_headroom must be at least 0, got {batch_headroom}")
        if batch_step_tokens is not None and batch_step_tokens < 1:
            raise ValueError(f"batch_step_tokens must be at least 1, got {batch_step_tokens}")
        self.kv_cache = kv_cache
        # Every region is allocated and given back through it (a pass-through with prefix caching off).
        self.blocks = PrefixCache(kv_cache, enabled=prefix_caching)
        self.num_preemptions = 0
        # Admissions that passed each waiting head that did not fit (by request id).
        self._bypassed: dict[str, int] = {}
        self.max_model_len = max_model_len
        self.max_running_requests = max_running_requests
        self.max_batched_tokens = max_batched_tokens
        self.max_draft_tokens = max_draft_tokens
        self.batch_priority = batch_priority
        self.batch_slots = batch_line_slots(max_running_requests, batch_max_share)
        # Slots a new batch line must leave free (clamped so a one-slot engine still runs batch work).
        self.batch_headroom = min(batch_headroom, max_running_requests - 1)
        # Prompt tokens of batch lines in one step (None: no cap beyond the step's budget).
        self.batch_step_tokens = max_batched_tokens if batch_step_tokens is None else batch_step_tokens
        # (priority, arrival, tiebreak, seq); aborted entries are removed lazily.
        self._waiting: list[tuple[int, float, int, Sequence]] = []
        self._tiebreak = itertools.count()
        self.running: list[Sequence] = []  # admission order
        self._live: dict[str, Sequence] = {}  # waiting or running, by request id

    # ------------------------------------------------------------------ queue

    @property
    def num_waiting(self) -> int:
        return sum(1 for *_, s in self._waiting if s.status is SequenceStatus.WAITING)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def is_batch(self, seq: Sequence) -> bool:
        return seq.request.priority >= self.batch_priority

    @property
    def num_running_batch(self) -> int:
        return sum(1 for s in self.running if self.is_batch(s))

    def has_unfinished(self) -> bool:
        return bool(self._live)

    def get(self, request_id: str) -> Sequence | None:
        return self._live.get(request_id)

    def add(self, seq: Sequence) -> None:
        """Queue a sequence; raises RequestRejected when it could never run."""
        req = seq.request
        if req.request_id in self._live:
            raise RequestRejected("invalid_request", f"request id {req.request_id!r} is already in the engine")
        n, m, c = seq.num_prompt_tokens, seq.params.max_tokens, self.max_model_len
        if n == 0:
            raise RequestRejected("invalid_request", "prompt is empty")
        if m < 0:  # 0: the prompt is computed (and scored, with prompt logprobs), nothing generated
            raise RequestRejected("invalid_request", f"max_tokens must be at least 0, got {m}")
        if n + m > c:
            raise RequestRejected(
                "context_length_exceeded",
                f"prompt has {n} tokens and max_tokens is {m}: {n}+{m} exceeds the model's context of {c} tokens",
            )
        need = seq.kv_tokens_needed(self.max_draft_tokens)
        if need > self.kv_cache.num_tokens:
            raise RequestRejected(
                "context_length_exceeded",
                f"prompt has {n} tokens and max_tokens is {m}: the request needs {need} KV cache slots "
                f"but the whole KV cache holds {self.kv_cache.num_tokens} tokens",
            )
        seq.status = SequenceStatus.WAITING
        self._live[req.request_id] = seq
        heapq.heappush(self._waiting, (req.priority, req.arrival_time, next(self._tiebreak), seq))

    def abort(self, request_id: str, now: float | None = None) -> Sequence | None:
        """Remove a waiting or running request now, freeing its memory; None if unknown."""
        seq = self._live.get(request_id)
        if seq is None:
            return None
        self.finish(seq, "abort", now)
        return seq

    def finish(self, seq: Sequence, reason: FinishReason, now: float | None = None) -> None:
        """The sequence leaves: its region goes back to the arena at once."""
        if seq.status is SequenceStatus.FINISHED:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        # A waiting entry stays in the heap and is skipped when it surfaces.
        self.blocks.release(seq)
        self._bypassed.pop(seq.request_id, None)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.finish_time = time.time() if now is None else now
        self._live.pop(seq.request_id, None)

    def decoding(self) -> list[Sequence]:
        """Running sequences past their prompt (candidates for drafts this step)."""
        return [s for s in self.running if not s.is_prefilling]

    def pending_prefill_tokens(self) -> int:
        """Prompt tokens not yet computed, running and waiting (the speculation controller's base load)."""
        running = sum(s.prefill_target - s.num_computed for s in self.running if s.is_prefilling)
        waiting = sum(s.prefill_target for *_, s in self._waiting if s.status is SequenceStatus.WAITING)
        return running + waiting

    # --------------------------------------------------------------- schedule

    def _expire(self, now: float) -> list[Sequence]:
        expired: list[Sequence] = []
        for seq in list(self.running):
            d = seq.request.deadline
            if d is not None and d <= now:
                self.finish(seq, "deadline", now)
                expired.append(seq)
        for *_, seq in self._waiting:
            d = seq.request.deadline
            if seq.status is SequenceStatus.WAITING and d is not None and d <= now:
                self.finish(seq, "deadline", now)
                expired.append(seq)
        if expired:
            self._waiting = [e for e in self._waiting if e[3].status is SequenceStatus.WAITING]
            heapq.heapify(self._waiting)
        return expired

    def _pop_finished_heads(self) -> None:
        while self._waiting and self._waiting[0][3].status is not SequenceStatus.WAITING:
            heapq.heappop(self._waiting)

    def schedule(self, now: float | None = None, draft_lens: dict[str, int] | None = None) -> SchedulerOutput:
        """Build this step's batch. draft_lens: the controller's k per decoding sequence id."""
        now = time.time() if now is None else now
        draft_lens = draft_lens or {}
        finished = self._expire(now)
        budget = self.max_batched_tokens
        scheduled: list[ScheduledSequence] = []

        # 1. interactive decodes: 1 + k tokens each (k trimmed when the budget is short).
        budget = self._decodes(scheduled, budget, draft_lens, batch=False)
        # 2. interactive prefill: chunks of prompts part-way through, then admissions in queue order.
        budget = self._prefill(scheduled, budget, now, batch=False)
        # 3. batch work only in a step that carries no interactive prefill (the step an interactive request's
        #    first token waits on runs as if no batch were there): one decode row per batch line, then, together
        #    at most batch_step_tokens (which bounds the step an interactive arrival finds in flight), batch
        #    prefill first (a slot left unfilled idles) and the batch decodes' drafts.
        if not any(s.is_prefill for s in scheduled):
            budget = self._decodes(scheduled, budget, {}, batch=True)
            extra = self._prefill(scheduled, min(budget, self.batch_step_tokens), now, batch=True)
            self._batch_drafts(scheduled, extra, draft_lens)

        return SchedulerOutput(scheduled=scheduled, finished=finished)

    def _decodes(
        self, scheduled: list[ScheduledSequence], budget: int, draft_lens: Mapping[str, int], *, batch: bool
    ) -> int:
        """One decode per running sequence of one class past its prompt, with its drafts; returns what is left."""
        skipped: list[Sequence] = []
        for seq in self.running:
            if seq.is_prefilling or self.is_batch(seq) != batch:
                continue
            if budget < 1:
                skipped.append(seq)
                continue
            k = min(draft_lens.get(seq.request_id, 0), draft_cap(seq, self.max_draft_tokens, budget))
            scheduled.append(ScheduledSequence(seq, 1 + k, is_prefill=False, needs_logits=True, draft_budget=k))
            budget -= 1 + k
        if skipped:
            # More decodes than tokens in a step: those left out go first next step (round robin).
            self.running = skipped + [s for s in self.running if s not in skipped]
        return budget

    def _batch_drafts(self, scheduled: list[ScheduledSequence], budget: int, draft_lens: Mapping[str, int]) -> int:
        """Batch decodes get their drafts from what the interactive work left; returns what is left."""
        for sched in scheduled:
            if budget <= 0:
                break
            if sched.is_prefill or not self.is_batch(sched.seq):
                continue
            # The decode's own row is already counted: the drafts may take all of what is left.
            k = min(draft_lens.get(sched.seq.request_id, 0), draft_cap(sched.seq, self.max_draft_tokens, budget + 1))
            sched.draft_budget, sched.num_new_tokens = k, 1 + k
            budget -= k
        return budget

    def _prefill(self, scheduled: list[ScheduledSequence], budget: int, now: float, *, batch: bool) -> int:
        """Prefill chunks of one class of work (interactive or batch) within `budget`; returns what is left."""
        for seq in self.running:
            if budget <= 0:
                return budget
            if seq.is_prefilling and self.is_batch(seq) == batch:
                scheduled.append(self._prefill_chunk(seq, budget))
                budget -= scheduled[-1].num_new_tokens
        while budget > 0 and self._has_slot(batch):
            seq = self._admit(now, batch, scheduled)
            if seq is None:
                break
            scheduled.append(self._prefill_chunk(seq, budget))
            budget -= scheduled[-1].num_new_tokens
        return budget

    def _has_slot(self, batch: bool) -> bool:
        """Interactive requests count only themselves against max_running_requests: batch lines never take
        their slot. A batch line needs its share not yet held and, beyond itself, batch_headroom free slots."""
        if not batch:
            return len(self.running) - self.num_running_batch < self.max_running_requests
        return (self.num_running_batch < self.batch_slots
                and len(self.running) + 1 + self.batch_headroom <= self.max_running_requests)

    def _admit(self, now: float, batch: bool, scheduled: list[ScheduledSequence]) -> Sequence | None:
        """The first waiting request of this class of work that gets a region: the head (preempting lower
        priorities if need be), else one behind it while the head may still be passed."""
        self._pop_finished_heads()
        if not self._waiting:
            return None
        head = self._waiting[0][3]
        if self.is_batch(head) != batch:
            return None  # the other class's turn: interactive work always sorts first
        slot = self._region_for(head) or self._preempt_for(head, scheduled)
        if slot is not None:
            self._bypassed.pop(head.request_id, None)
            return self._start(head, slot, now)
        if self._bypassed.get(head.request_id, 0) >= HEAD_BYPASS_LIMIT:
            return None  # the head's turn: what finishes frees room for it
        for *_, seq in heapq.nsmallest(LOOKAHEAD, self._waiting)[1:]:
            if seq.status is not SequenceStatus.WAITING or self.is_batch(seq) != batch:
                continue
            slot = self._region_for(seq)
            if slot is not None:
                self._bypassed[head.request_id] = self._bypassed.get(head.request_id, 0) + 1
                return self._start(seq, slot, now)
        return None

    def _region_for(self, seq: Sequence) -> CacheSlot | None:
        return self.blocks.allocate(seq, seq.kv_tokens_needed(self.max_draft_tokens))

    def _start(self, seq: Sequence, slot: CacheSlot, now: float) -> Sequence:
        self._waiting = [e for e in self._waiting if e[3] is not seq]
        heapq.heapify(self._waiting)
        seq.kv = slot
        seq.status = SequenceStatus.RUNNING
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = now
        self.running.append(seq)
        return seq

    def _preempt_for(self, seq: Sequence, scheduled: list[ScheduledSequence]) -> CacheSlot | None:
        """Free room for `seq` by preempting running sequences of a strictly lower priority, lowest and newest
        first, when that is enough. A victim's rows already in this step's batch leave it (nothing has run yet: the
        decodes are scheduled before admissions, so an interactive victim always has one); the tokens they took
        from this step's budget are not handed on."""
        victims = victims_for(seq, self.running)
        need = seq.kv_tokens_needed(self.max_draft_tokens)
        if not victims or not self.blocks.can_free(need, [v.kv.region for v in victims if v.kv is not None]):
            return None
        for victim in victims:
            scheduled[:] = [s for s in scheduled if s.seq is not victim]
            self.preempt(victim)
            slot = self._region_for(seq)
            if slot is not None:
                return slot
        return None

    def preempt(self, seq: Sequence) -> None:
        """`seq` gives its region back and waits in its old place. When it runs again it recomputes its prompt (a
        copy for the blocks still cached) and gets its output's KV back as it was (engine.preemption)."""
        self.running.remove(seq)
        save_output(seq, self.kv_cache)
        self.blocks.release(seq)
        seq.status = SequenceStatus.WAITING
        seq.num_preemptions += 1
        self.num_preemptions += 1
        heapq.heappush(self._waiting, (seq.request.priority, seq.request.arrival_time, next(self._tiebreak), seq))

    def update_from_step(self, batch: SchedulerOutput, accepted: Mapping[str, int]) -> None:
        """After the forward (which wrote the KV of every fed row) and verification.

        accepted: drafts accepted per request id (absent: none). Each sequence's
        counter moves past its fed rows minus its rejected drafts, whose KV is
        simply overwritten later: rolling back is O(1).
        """
        for sched in batch.scheduled:
            kv = sched.seq.kv
            if kv is None:
                raise RuntimeError(f"{sched.seq.request_id} lost its KV region mid-step")
            rejected = len(sched.draft_tokens) - accepted.get(sched.seq.request_id, 0)
            kv.num_cached += sched.num_new_tokens - rejected
            self.blocks.committed(sched.seq)
            restore_output(sched.seq, self.kv_cache)

    @staticmethod
    def _prefill_chunk(seq: Sequence, budget: int) -> ScheduledSequence:
        remaining = seq.prefill_target - seq.num_computed
        n = min(remaining, budget)
        # A resumed sequence (preempted) recomputes KV only: its next token comes from its next decode.
        return ScheduledSequence(seq, n, is_prefill=True, needs_logits=n == remaining and not seq.output_ids)
