"""Per-tenant limits shared through a real redis-server: two limiters see one count, unused tokens are refunded and
a lease a crashed edge never released expires."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from streams.edge.keys import TenantLimits
from streams.edge.limits import RedisLimiter
from tests.edge_support import redis_server, refused_429

TTL = 300.0


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


async def test_redis_limits_are_shared_by_two_limiters(redis_url: str) -> None:
    a, b = RedisLimiter(redis_url, key_prefix="t1"), RedisLimiter(redis_url, key_prefix="t1")
    await a.start()
    await b.start()
    try:
        limits = TenantLimits(rpm=4, tpm=1000, concurrency=3)
        leases = [await a.acquire("alice", limits, 10, TTL), await b.acquire("alice", limits, 10, TTL),
                  await a.acquire("alice", limits, 10, TTL)]
        refused = await refused_429(b.acquire("alice", limits, 10, TTL))
        assert refused.headers["X-RateLimit-Limited"] == "concurrency"
        leases[0].release(10)
        await asyncio.sleep(0.1)
        await b.acquire("alice", limits, 10, TTL)  # the 4th request of the minute
        refused = await refused_429(a.acquire("alice", TenantLimits(rpm=4), 10, TTL))
        assert refused.headers["X-RateLimit-Limited"] == "rpm" and 1 <= int(refused.headers["Retry-After"]) <= 120
        assert await a.acquire("bob", limits, 10, TTL)  # another tenant has its own counters
    finally:
        await a.stop()
        await b.stop()


async def test_redis_tpm_refund_and_lease_expiry(redis_url: str) -> None:
    limiter = RedisLimiter(redis_url, key_prefix="t2")
    await limiter.start()
    try:
        limits = TenantLimits(tpm=100, concurrency=1)
        lease = await limiter.acquire("alice", limits, 90, 1.0)  # a lease that expires after 1 s
        await refused_429(limiter.acquire("alice", TenantLimits(tpm=100), 20, TTL))
        lease.release(used_tokens=30)
        await asyncio.sleep(0.1)
        again = await limiter.acquire("alice", limits, 20, 1.0)
        assert again is not None
        await asyncio.sleep(1.2)  # `again` is never released: its lease expires
        assert await limiter.acquire("alice", limits, 10, TTL)
    finally:
        await limiter.stop()
