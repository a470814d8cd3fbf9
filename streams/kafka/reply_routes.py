"""Which reply routes a consumer may publish to.

A request names its own reply topic (``reply_to``), and anyone who can write to
the request topic can put any name there. Two things must hold before a
consumer spends work on a request or writes a single reply event:

* the topic is one of this deployment's reply topics (``delivery.reply_topic_patterns``,
  ``<prefix>.replies.*`` by default): never the workers, dead-letter or request
  topic, nor another deployment's topics on a shared cluster;
* the topic exists: a producer asked to write to a missing topic waits for its
  metadata for its whole request timeout (40 s), and while it waits the
  partition behind the request waits too.

Existence is looked up with a short bound and cached (a topic seen recently is
trusted for ``topic_cache_ttl_s``; a missing one is looked up again at most once
a second), so the check costs a dictionary lookup per request.
"""
from __future__ import annotations

import asyncio
import fnmatch
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Literal

log = logging.getLogger(__name__)

RouteProblem = Literal["reply_topic_forbidden", "reply_topic_missing"]
# A missing topic is looked up again after this long (an edge may create its topic just before sending).
_MISSING_RECHECK_S = 1.0
# Remembered topics, allowed and not; beyond this the cache starts over (a flood of made-up names).
_MAX_CACHED = 10_000


@dataclass(frozen=True)
class RouteCheck:
    """Why a reply route is refused; ``None`` from :meth:`ReplyRoutes.check` means it is fine."""

    code: RouteProblem
    message: str


def compile_patterns(patterns: Iterable[str], prefix: str) -> tuple[str, ...]:
    return tuple(pattern.replace("{prefix}", prefix) for pattern in patterns)


class ReplyRoutes:
    """Allowlist and existence check of reply topics, shared by every publish of one consumer."""

    def __init__(
        self,
        patterns: Iterable[str],
        list_topics: Callable[[], Awaitable[Iterable[str]]],
        *,
        ttl_s: float,
        lookup_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.patterns = tuple(patterns)
        self._list_topics = list_topics
        self._ttl_s = ttl_s
        self._lookup_timeout_s = lookup_timeout_s
        self._clock = clock
        self._seen: dict[str, float] = {}  # topic -> when it was last seen to exist
        self._missing: dict[str, float] = {}  # topic -> when it was last found missing
        self._refresh: asyncio.Task[set[str] | None] | None = None

    def allowed(self, topic: str) -> bool:
        return any(fnmatch.fnmatchcase(topic, pattern) for pattern in self.patterns)

    async def check(self, topic: str) -> RouteCheck | None:
        if not self.allowed(topic):
            return RouteCheck(
                "reply_topic_forbidden",
                f"reply topic '{topic}' is not a reply topic of this deployment (allowed: {', '.join(self.patterns)})",
            )
        if await self.exists(topic):
            return None
        return RouteCheck("reply_topic_missing", f"reply topic '{topic}' does not exist; create it before sending")

    async def exists(self, topic: str) -> bool:
        now = self._clock()
        seen = self._seen.get(topic)
        if seen is not None and now - seen < self._ttl_s:
            return True
        missing = self._missing.get(topic)
        if missing is not None and now - missing < _MISSING_RECHECK_S:
            return False
        topics = await self._lookup()
        if topics is None:
            # The look-up failed (a broker failing over, say): don't refuse work for it. The publish is bounded
            # anyway, so an unknown topic that is really missing costs its own lane a few seconds, nothing more.
            return True
        now = self._clock()
        if len(self._seen) + len(self._missing) > _MAX_CACHED:
            self._seen.clear()
            self._missing.clear()
        if topic in topics:
            self._seen[topic] = now
            self._missing.pop(topic, None)
            return True
        self._seen.pop(topic, None)
        self._missing[topic] = now
        return False

    def forget(self, topic: str) -> None:
        """A publish to the topic failed: it may be gone since it was checked, so look it up again next time."""
        self._seen.pop(topic, None)

    async def _lookup(self) -> set[str] | None:
        # One look-up at a time: requests arriving together share it.
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.create_task(self._fetch())
        return await asyncio.shield(self._refresh)

    async def _fetch(self) -> set[str] | None:
        try:
            return set(await asyncio.wait_for(self._list_topics(), timeout=self._lookup_timeout_s))
        except Exception as error:  # noqa: BLE001 - a failed look-up leaves the cache as it was
            log.warning("could not look up topic metadata within %.1f s: %r", self._lookup_timeout_s, error)
            return None
