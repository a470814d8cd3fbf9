"""Per-tenant limits: requests per minute, tokens per minute, requests in flight.

Admission happens once per request, after validation (so the token count is
known) and before the request is published:

* **rpm**: each request costs 1;
* **tpm**: each request costs its prompt tokens (counted with the model's
  tokenizer) plus its ``max_tokens``, reserved up front; when the request ends
  the tokens it did not generate are given back to the window that was charged;
* **concurrency**: a lease per request in flight, returned when its reply ends
  (completed, failed, cancelled or the client went away).

A request over any limit is refused with 429 and ``Retry-After`` (whole
seconds until the request would fit); nothing is charged for a refused
request, and a tenant's limits never touch another tenant's counters.

Windows: a sliding window over 60 s approximated from two fixed windows (the
current minute's count plus the previous minute's, weighted by how much of it
still overlaps the last 60 s). It needs two counters per limit, never lets a
burst at a minute boundary double the rate, and is what most API gateways do.

Where the counters live
-----------------------
* **In memory** (default, ``edge.redis_url: null``): no dependency, no network
  hop, exact for one edge. With N edges behind a load balancer each edge
  counts only what it sees, so a tenant may get up to N times its limits.
* **Redis** (``edge.redis_url: redis://host:6379/0``): every edge shares the
  same counters, so the limits hold across edges. Each admission is one Lua
  script run atomically on the Redis server (check all three limits, then
  charge all three, using Redis' clock so the edges' clocks do not matter):
  one round trip (~0.1-0.5 ms on a LAN) per request, and one more at its end.
  Concurrency leases are members of a sorted set scored by their expiry (the
  request's deadline plus grace), so the leases of an edge that crashed
  expire instead of leaking. If Redis is unreachable the edge refuses new
  requests with 503 (it fails closed: limits that silently stop holding are
  worse than a visible outage) and serves them again once Redis is back.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from streams.edge.keys import TenantLimits
from streams.wire import errors

log = logging.getLogger(__name__)

WINDOW_S = 60.0


@dataclass(frozen=True)
class Refusal:
    limit: str  # "rpm" | "tpm" | "concurrency"
    retry_after_s: int
    limit_value: int
    cost: int


def window_wait(prev: float, cur: float, elapsed: float, cost: float, limit: float, window: float = WINDOW_S) -> float:
    """Seconds until ``cost`` more fits under ``limit`` in the two-window estimate; 0 when it fits now.

    The estimate at ``elapsed`` seconds into the current window is
    ``prev * (1 - elapsed / window) + cur``. Mirrored in the Lua script below.
    """
    if prev * (1.0 - elapsed / window) + cur + cost <= limit:
        return 0.0
    if cost > limit:
        return window  # never fits; say "a minute"
    if cur + cost <= limit:
        # Wait for enough of the previous window to slide out.
        return max(0.0, window * (1.0 - (limit - cur - cost) / prev) - elapsed) if prev > 0 else 0.0
    # Only in the next window, where the current one becomes the previous one.
    into_next = window * (1.0 - (limit - cost) / cur) if cur > 0 else 0.0
    return (window - elapsed) + max(0.0, into_next)


def retry_after(seconds: float) -> int:
    return max(1, math.ceil(seconds - 1e-9))


class Lease:
    """One admitted request's hold on its tenant's limits. ``release`` is idempotent and never raises."""

    def __init__(self, limiter: "Limiter", tenant: str, lease_id: str, tokens: int, window_index: int | None) -> None:
        self.limiter = limiter
        self.tenant = tenant
        self.lease_id = lease_id
        self.tokens = tokens
        self.window_index = window_index
        self.released = False

    def release(self, used_tokens: int | None = None) -> None:
        """Return the concurrency slot and the reserved tokens not used (``used_tokens`` None: keep the reservation)."""
        if self.released:
            return
        self.released = True
        refund = 0 if used_tokens is None else max(0, self.tokens - used_tokens)
        self.limiter.release_soon(self, refund)


class Limiter:
    """Interface; :class:`MemoryLimiter` and :class:`RedisLimiter` implement it."""

    backend = "none"

    def __init__(self) -> None:
        self._pending: set[asyncio.Task] = set()

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        if self._pending:
            await asyncio.wait(set(self._pending), timeout=2.0)

    async def acquire(self, tenant: str, limits: TenantLimits, tokens: int, lease_ttl_s: float) -> Lease:
        """Charge one request of ``tokens`` tokens; raises a 429 EdgeError (with Retry-After) when over a limit."""
        raise NotImplementedError

    async def _release(self, lease: Lease, refund: int) -> None:
        raise NotImplementedError

    def release_soon(self, lease: Lease, refund: int) -> None:
        """Run the release as its own task: safe from code that is being cancelled (a client that went away)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        task = loop.create_task(self._release_logged(lease, refund))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _release_logged(self, lease: Lease, refund: int) -> None:
        try:
            await self._release(lease, refund)
        except Exception as error:  # noqa: BLE001 - the lease expires on its own
            log.warning("limits: releasing a lease of tenant %s failed (%r); it expires by itself", lease.tenant, error)


def _refuse(refusal: Refusal) -> errors.EdgeError:
    what = {
        "rpm": f"{refusal.limit_value} requests per minute",
        "tpm": f"{refusal.limit_value} tokens per minute",
        "concurrency": f"{refusal.limit_value} requests in flight",
    }[refusal.limit]
    if refusal.limit == "tpm" and refusal.cost > refusal.limit_value:
        message = (f"This request needs {refusal.cost} tokens (prompt + max_tokens), more than your tenant's limit "
                   f"of {what}; lower max_tokens or shorten the prompt.")
    else:
        message = f"Rate limit reached for your tenant: {what}. Retry after {refusal.retry_after_s} s."
    return errors.rate_limited(message, refusal.retry_after_s, limit=refusal.limit)


class MemoryLimiter(Limiter):
    """Counters in this process: exact for one edge; with several edges, each enforces the limits on its own."""

    backend = "memory"

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.clock = clock
        self._windows: dict[tuple[str, str], dict[int, float]] = {}
        self._leases: dict[str, dict[str, float]] = {}

    def _counts(self, tenant: str, kind: str, index: int) -> tuple[float, float]:
        windows = self._windows.setdefault((tenant, kind), {})
        for old in [i for i in windows if i < index - 1]:
            del windows[old]
        return windows.get(index - 1, 0.0), windows.get(index, 0.0)

    def check(self, tenant: str, limits: TenantLimits, tokens: int, now: float) -> Refusal | None:
        index = int(now // WINDOW_S)
        elapsed = now - index * WINDOW_S
        if limits.concurrency is not None:
            leases = self._leases.setdefault(tenant, {})
            for lease_id in [i for i, expiry in leases.items() if expiry <= now]:
                del leases[lease_id]
            if len(leases) >= limits.concurrency:
                return Refusal("concurrency", 1, limits.concurrency, 1)
        for kind, limit, cost in (("rpm", limits.rpm, 1), ("tpm", limits.tpm, tokens)):
            if limit is None:
                continue
            prev, cur = self._counts(tenant, kind, index)
            wait = window_wait(prev, cur, elapsed, cost, limit)
            if wait > 0:
                return Refusal(kind, retry_after(wait), limit, cost)
        return None

    async def acquire(self, tenant: str, limits: TenantLimits, tokens: int, lease_ttl_s: float) -> Lease:
        now = self.clock()
        refusal = self.check(tenant, limits, tokens, now)
        if refusal is not None:
            raise _refuse(refusal)
        index = int(now // WINDOW_S)
        for kind, cost in (("rpm", 1), ("tpm", tokens)):
            windows = self._windows.setdefault((tenant, kind), {})
            windows[index] = windows.get(index, 0.0) + cost
        lease_id = uuid.uuid4().hex
        self._leases.setdefault(tenant, {})[lease_id] = now + lease_ttl_s
        return Lease(self, tenant, lease_id, tokens, index)

    async def _release(self, lease: Lease, refund: int) -> None:
        self._leases.get(lease.tenant, {}).pop(lease.lease_id, None)
        if refund and lease.window_index is not None:
            windows = self._windows.get((lease.tenant, "tpm"), {})
            if lease.window_index in windows:
                windows[lease.window_index] = max(0.0, windows[lease.window_index] - refund)

    def in_flight(self, tenant: str) -> int:
        return len(self._leases.get(tenant, {}))


# KEYS[1]: the tenant's key prefix. ARGV: window, rpm, tpm, concurrency (0: none), tokens, lease id, lease ttl.
# Returns {1, window index} when admitted, {0, limit name, retry-after ms, limit, cost} when refused.
_ACQUIRE = """
local base = KEYS[1]
local W = tonumber(ARGV[1])
local limits = {rpm = tonumber(ARGV[2]), tpm = tonumber(ARGV[3])}
local conc = tonumber(ARGV[4])
local tokens = tonumber(ARGV[5])
local lease = ARGV[6]
local ttl = tonumber(ARGV[7])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local idx = math.floor(now / W)
local elapsed = now - idx * W
local leases = base .. ':leases'
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', leases, '-inf', now)
  if redis.call('ZCARD', leases) >= conc then
    return {0, 'concurrency', 1000, conc, 1}
  end
end
local function wait(prev, cur, cost, limit)
  if prev * (1 - elapsed / W) + cur + cost <= limit then return 0 end
  if cost > limit then return W end
  if cur + cost <= limit then
    if prev <= 0 then return 0 end
    return math.max(0, W * (1 - (limit - cur - cost) / prev) - elapsed)
  end
  local into_next = 0
  if cur > 0 then into_next = W * (1 - (limit - cost) / cur) end
  return (W - elapsed) + math.max(0, into_next)
end
local costs = {rpm = 1, tpm = tokens}
for _, kind in ipairs({'rpm', 'tpm'}) do
  local limit = limits[kind]
  if limit > 0 then
    local cur = tonumber(redis.call('GET', base .. ':' .. kind .. ':' .. idx) or '0')
    local prev = tonumber(redis.call('GET', base .. ':' .. kind .. ':' .. (idx - 1)) or '0')
    local w = wait(prev, cur, costs[kind], limit)
    if w > 0 then
      return {0, kind, math.ceil(w * 1000), limit, costs[kind]}
    end
  end
end
for _, kind in ipairs({'rpm', 'tpm'}) do
  local key = base .. ':' .. kind .. ':' .. idx
  redis.call('INCRBY', key, costs[kind])
  redis.call('EXPIRE', key, math.ceil(2 * W) + 5)
end
if conc > 0 then
  redis.call('ZADD', leases, now + ttl, lease)
  redis.call('EXPIRE', leases, math.ceil(ttl) + 5)
end
return {1, idx}
"""

# KEYS[1]: the tenant's key prefix. ARGV: lease id, window index, tokens to give back.
_RELEASE = """
local base = KEYS[1]
redis.call('ZREM', base .. ':leases', ARGV[1])
local refund = tonumber(ARGV[3])
if refund > 0 then
  local key = base .. ':tpm:' .. ARGV[2]
  local cur = tonumber(redis.call('GET', key) or '-1')
  if cur >= 0 then
    local ttl = redis.call('PTTL', key)
    local left = math.max(0, cur - refund)
    if ttl > 0 then redis.call('SET', key, left, 'PX', ttl) else redis.call('SET', key, left) end
  end
end
return 1
"""


class RedisLimiter(Limiter):
    """Counters in Redis, shared by every edge that points at the same server (see the module docstring)."""

    backend = "redis"

    def __init__(self, url: str, *, key_prefix: str = "specstream:limits") -> None:
        super().__init__()
        self.url = url
        self.key_prefix = key_prefix
        self._redis: Any = None
        self._acquire_script: Any = None
        self._release_script: Any = None

    async def start(self) -> None:
        import redis.asyncio as redis

        self._redis = redis.Redis.from_url(self.url, socket_timeout=2.0, socket_connect_timeout=2.0)
        self._acquire_script = self._redis.register_script(_ACQUIRE)
        self._release_script = self._redis.register_script(_RELEASE)
        try:
            await self._redis.ping()
            log.info("limits: counters in Redis at %s", _redact(self.url))
        except Exception as error:  # noqa: BLE001 - reported per request until it is back
            log.warning("limits: Redis at %s is not reachable yet (%r); new requests get 503 until it is",
                        _redact(self.url), error)

    async def stop(self) -> None:
        await super().stop()
        if self._redis is not None:
            await self._redis.aclose()
            self._redis = None

    def _base(self, tenant: str) -> str:
        # The hash tag keeps a tenant's keys in one slot of a Redis Cluster.
        return f"{self.key_prefix}:{{{tenant}}}"

    async def acquire(self, tenant: str, limits: TenantLimits, tokens: int, lease_ttl_s: float) -> Lease:
        if self._redis is None:
            raise errors.not_ready("the rate limiter is not started")
        lease_id = uuid.uuid4().hex
        args = [WINDOW_S, limits.rpm or 0, limits.tpm or 0, limits.concurrency or 0, tokens, lease_id, lease_ttl_s]
        try:
            result = await self._acquire_script(keys=[self._base(tenant)], args=args)
        except Exception as error:  # noqa: BLE001 - connection refused, timeout, script error
            log.warning("limits: Redis at %s failed: %r", _redact(self.url), error)
            raise errors.not_ready(f"the rate limiter (Redis) is unavailable: {type(error).__name__}") from None
        if int(result[0]) == 1:
            return Lease(self, tenant, lease_id, tokens, int(result[1]))
        kind = result[1].decode() if isinstance(result[1], bytes) else str(result[1])
        raise _refuse(Refusal(kind, retry_after(int(result[2]) / 1000.0), int(result[3]), int(result[4])))

    async def _release(self, lease: Lease, refund: int) -> None:
        if self._redis is None:
            return
        await self._release_script(keys=[self._base(lease.tenant)],
                                   args=[lease.lease_id, lease.window_index or 0, refund])


def _redact(url: str) -> str:
    """redis://user:secret@host -> redis://user:***@host (the URL may carry a password)."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}"


def make_limiter(redis_url: str | None) -> Limiter:
    return RedisLimiter(redis_url) if redis_url else MemoryLimiter()
