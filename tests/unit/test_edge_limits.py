"""Per-tenant limits: the window arithmetic, the in-memory limiter, and the Redis limiter on a real redis-server."""
from __future__ import annotations

import asyncio

import pytest

from streams.edge.keys import TenantLimits
from streams.edge.limits import WINDOW_S, MemoryLimiter, RedisLimiter, make_limiter, window_wait
from streams.wire import errors
from tests.edge_support import refused_429

TTL = 300.0


class Clock:
    def __init__(self, t: float = 1_000_020.0) -> None:  # 20 s into a window
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_full_sliding_window_waits_until_the_weighted_count_fits() -> None:
    assert window_wait(prev=0, cur=2, elapsed=10, cost=1, limit=3) == 0
    # The current window is full: wait for the next one (then the previous window's weight decays).
    assert window_wait(prev=0, cur=3, elapsed=10, cost=1, limit=3) == pytest.approx(50 + 60 * (1 - 2 / 3))
    # Room in the current window but the previous one still weighs: 10*(1-e/60) + 0 + 1 <= 5 -> e >= 36.
    assert window_wait(prev=10, cur=0, elapsed=6, cost=1, limit=5) == pytest.approx(30)
    assert window_wait(prev=0, cur=0, elapsed=0, cost=11, limit=10) == WINDOW_S  # never fits


async def test_memory_rpm_refuses_with_retry_after_and_other_tenants_are_unaffected() -> None:
    clock = Clock()
    limiter = MemoryLimiter(clock)
    limits = TenantLimits(rpm=3)
    for _ in range(3):
        (await limiter.acquire("alice", limits, 10, TTL)).release(10)
    refused = await refused_429(limiter.acquire("alice", limits, 10, TTL))
    assert refused.headers["X-RateLimit-Limited"] == "rpm" and "3 requests per minute" in refused.message
    assert await limiter.acquire("bob", limits, 10, TTL)
    # After Retry-After seconds it fits again.
    clock.t += int(refused.headers["Retry-After"])
    assert await limiter.acquire("alice", limits, 10, TTL)


async def test_memory_tpm_counts_prompt_plus_max_tokens_and_refunds_unused() -> None:
    clock = Clock()
    limiter = MemoryLimiter(clock)
    limits = TenantLimits(tpm=100)
    lease = await limiter.acquire("alice", limits, 80, TTL)
    refused = await refused_429(limiter.acquire("alice", limits, 30, TTL))
    assert refused.headers["X-RateLimit-Limited"] == "tpm"
    lease.release(used_tokens=20)  # 60 of the 80 reserved were not generated
    await asyncio.sleep(0)
    assert await limiter.acquire("alice", limits, 30, TTL)
    too_big = await refused_429(limiter.acquire("alice", limits, 101, TTL))
    assert "more than your tenant's limit" in too_big.message


async def test_concurrency_leases_are_released_once_and_expire_after_a_crash() -> None:
    clock = Clock()
    limiter = MemoryLimiter(clock)
    limits = TenantLimits(concurrency=2)
    first = await limiter.acquire("alice", limits, 1, TTL)
    await limiter.acquire("alice", limits, 1, TTL)
    refused = await refused_429(limiter.acquire("alice", limits, 1, TTL))
    assert refused.headers["X-RateLimit-Limited"] == "concurrency"
    first.release(1)
    first.release(1)  # idempotent
    await asyncio.sleep(0)
    assert limiter.in_flight("alice") == 1
    await limiter.acquire("alice", limits, 1, TTL)
    clock.t += TTL + 1  # leases of requests that never ended (a crash) expire
    await limiter.acquire("alice", limits, 1, TTL)
    assert limiter.in_flight("alice") == 1


def test_a_redis_url_selects_the_shared_limiter_and_none_the_in_memory_one() -> None:
    assert isinstance(make_limiter(None), MemoryLimiter)
    assert isinstance(make_limiter("redis://127.0.0.1:1/0"), RedisLimiter)


async def test_redis_unreachable_is_503() -> None:
    limiter = RedisLimiter("redis://127.0.0.1:1/0")
    await limiter.start()
    try:
        with pytest.raises(errors.EdgeError) as caught:
            await limiter.acquire("alice", TenantLimits(rpm=1), 1, TTL)
        assert caught.value.status == 503 and "Redis" in caught.value.message
    finally:
        await limiter.stop()
