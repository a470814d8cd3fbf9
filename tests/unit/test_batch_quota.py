"""A tenant's batch budget: lines waiting and tokens a day, counted from the batches it already has."""
from __future__ import annotations

import pytest

from schemas.batch import BatchRequestCounts, BatchState
from streams.edge.batches.quota import DAY_S, BatchCost, check_batch_quota
from streams.edge.keys import TenantLimits
from streams.wire.errors import EdgeError

NOW = 1_000_000.0


def batch(tenant: str = "alice", *, total: int = 100, answered: int = 0, tokens: int = 1000,
          status: str = "in_progress", created_at: float = NOW - 60) -> BatchState:
    return BatchState(id=f"batch_{tenant}_{created_at}", tenant=tenant, endpoint="/v1/completions",
                      input_file_id="file-1", status=status, created_at=int(created_at),  # type: ignore[arg-type]
                      expires_at=int(created_at + DAY_S), request_counts=BatchRequestCounts(total=total),
                      answered=answered, estimated_tokens=tokens, at=created_at)


def refusal(batches: list[BatchState], limits: TenantLimits, cost: BatchCost) -> EdgeError:
    with pytest.raises(EdgeError) as caught:
        check_batch_quota(batches, "alice", limits, cost, NOW)
    return caught.value


def test_a_batch_past_the_lines_still_queued_is_refused_with_429_naming_the_limit() -> None:
    limits = TenantLimits(batch_queued_lines=150)
    check_batch_quota([batch(answered=60)], "alice", limits, BatchCost(lines=110, tokens=1), NOW)  # 40 + 110 fit
    error = refusal([batch(answered=40)], limits, BatchCost(lines=110, tokens=1))
    assert error.status == 429 and "batch_queued_lines" in error.message and error.headers["Retry-After"] == "60"


def test_finished_failed_and_other_tenants_batches_do_not_count_as_queued() -> None:
    others = [batch(status="completed"), batch(status="failed"), batch("bob")]
    check_batch_quota(others, "alice", TenantLimits(batch_queued_lines=100), BatchCost(100, 1), NOW)


def test_tokens_of_the_last_24_hours_count_and_the_wait_is_until_the_oldest_leaves() -> None:
    limits = TenantLimits(batch_tokens_per_day=2500)
    old = batch(tokens=5000, created_at=NOW - DAY_S - 1, status="completed")  # out of the window
    first, second = batch(tokens=1000, created_at=NOW - 3600), batch(tokens=1000, created_at=NOW - 60)
    check_batch_quota([old, first], "alice", limits, BatchCost(1, 1500), NOW)
    error = refusal([old, first, second], limits, BatchCost(1, 1500))
    assert error.status == 429 and "batch_tokens_per_day" in error.message
    assert error.headers["Retry-After"] == str(int(DAY_S - 3600))  # when `first` leaves the window


def test_a_batch_larger_than_a_limit_by_itself_is_a_400_naming_it() -> None:
    error = refusal([], TenantLimits(batch_tokens_per_day=100), BatchCost(1, 101))
    assert error.status == 400 and error.code == "batch_tokens_per_day_exceeded"
    assert "batch_tokens_per_day limit of 100" in error.message
