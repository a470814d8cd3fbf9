"""A tenant's batch budget, apart from its interactive limits: checked when a batch is created.

Two limits (``edge.limits`` defaults, a tenant's own in the keys file, :class:`~streams.edge.keys.TenantLimits`):

* ``batch_tokens_per_day``: the tokens (prompt + max_tokens of every line, as counted when the batch is created)
  of the batches the tenant created in the last 24 h, the new one included;
* ``batch_queued_lines``: the lines of its unfinished batches not answered yet, the new one's included.

Why at creation, from the batches topic: every edge follows that topic (:class:`~streams.batch.book.BatchBook`),
so each one sees every batch of the tenant and its progress, without a counter store of its own; and once a
batch's lines are on the bus, refusing one later would fail it, not delay it. A batch never touches the
tenant's rpm/tpm/concurrency (those meter interactive requests), and an interactive request never touches these.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from schemas.batch import BatchState
from streams.batch.book import TERMINAL
from streams.edge.keys import TenantLimits
from streams.edge.limits import retry_after
from streams.wire import errors

DAY_S = 24 * 3600.0
# The queue drains as lines are answered, at a pace nobody can promise: a client is told to look again in a minute.
_QUEUE_RETRY_S = 60


@dataclass(frozen=True)
class BatchCost:
    lines: int
    tokens: int


def check_batch_quota(batches: Iterable[BatchState], tenant: str, limits: TenantLimits, cost: BatchCost,
                      now: float) -> None:
    """Nothing when the batch fits; 400 when it alone exceeds a limit, 429 (Retry-After) when it fits later."""
    mine = [s for s in batches if s.tenant == tenant and s.status != "failed"]  # failed: its lines never ran
    if limits.batch_queued_lines is not None:
        queued = sum(max(0, s.request_counts.total - s.answered) for s in mine if s.status not in TERMINAL)
        _check("batch_queued_lines", limits.batch_queued_lines, "lines not answered yet", queued, cost.lines,
               _QUEUE_RETRY_S)
    if limits.batch_tokens_per_day is not None:
        recent = sorted((s.created_at, s.estimated_tokens) for s in mine if s.created_at > now - DAY_S)
        spent = sum(tokens for _, tokens in recent)
        _check("batch_tokens_per_day", limits.batch_tokens_per_day, "tokens (prompt + max_tokens) in 24 h", spent,
               cost.tokens, _day_wait(recent, spent + cost.tokens - limits.batch_tokens_per_day, now))


def _check(name: str, limit: int, what: str, used: int, cost: int, wait_s: float) -> None:
    if cost > limit:
        raise errors.EdgeError(400, f"This batch needs {cost} {what}, more than your tenant's {name} limit of "
                               f"{limit}; split it into smaller batches.", param="input_file_id",
                               code=f"{name}_exceeded")
    if used + cost > limit:
        raise errors.rate_limited(f"Batch limit reached for your tenant: {name} is {limit} {what}, {used} are "
                                  f"used and this batch needs {cost}. Retry after {retry_after(wait_s)} s.",
                                  retry_after(wait_s), limit=name)


def _day_wait(recent: list[tuple[int, int]], excess: int, now: float) -> float:
    """Seconds until batches created earliest leave the 24 h window, freeing ``excess`` tokens."""
    freed = 0
    for created_at, tokens in recent:
        freed += tokens
        if freed >= excess:
            return created_at + DAY_S - now
    return DAY_S
