"""Noticing that topics a process created at its start are gone from the cluster, so that it recreates them.

A topic deleted under a running process, or a broker whose storage was reset, leaves the process's clients
asking for metadata of a topic nobody will create: aiokafka's fetcher of an assigned partition loops without
backoff (an edge once logged 3,200 lines a second for 18 minutes and never recovered), a group consumer sits with
no partitions, every publish to it times out. Only a process's start creates its topics (``prepare_service``), so
the cure is that start again: an edge reconnects in place, a consumer service exits for its supervisor (``up``,
Kubernetes) to restart it.

A topic counts as gone once every look-up for ``gone_after_s`` found it missing: a broker that has just restarted
can answer without a topic it has not replayed from the metadata log yet, and an unreachable broker says nothing
about topics at all (its look-ups are skipped, not counted).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection, Sequence

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from streams.kafka import clients
from streams.kafka.connection import Connectable

log = logging.getLogger(__name__)

# Look-ups per gone_after_s: one absence alone never decides.
_CHECKS_PER_WINDOW = 3
_LOOKUP_TIMEOUT_S = 10.0


class TopicsGone(KafkaError):
    """Topics the process created at its start no longer exist; its restart recreates them."""

    def __init__(self, names: Sequence[str]) -> None:
        self.names = tuple(names)
        super().__init__(f"{gone_topics(names)}; a restart recreates them")

    def __str__(self) -> str:
        return str(self.args[0])


def gone_topics(names: Sequence[str]) -> str:
    """What is gone and why it may be, in one line."""
    return f"topics gone from the cluster: {', '.join(names)} (deleted, or the broker's storage was reset)"


class MissingTopics:
    """How long each watched topic has been missing, from successive look-ups of the cluster's topics."""

    def __init__(self, names: Collection[str], gone_after_s: float) -> None:
        self.names = tuple(dict.fromkeys(names))
        self.gone_after_s = gone_after_s
        self._missing_since: dict[str, float] = {}

    def observe(self, existing: Collection[str], now: float) -> list[str]:
        """Record one look-up; the watched topics missing from every look-up for ``gone_after_s`` or longer."""
        present = set(existing)
        for name in self.names:
            if name in present:
                self._missing_since.pop(name, None)
            else:
                self._missing_since.setdefault(name, now)
        return [name for name, since in self._missing_since.items() if now - since >= self.gone_after_s]


async def watch_topics(kafka: Connectable, names: Collection[str], *, gone_after_s: float,
                       on_gone: Callable[[list[str]], None], client_id: str) -> None:
    """Look the topics up every ``gone_after_s / 3`` seconds; call ``on_gone`` once with the gone ones, and return.

    Runs until then or until cancelled; ``gone_after_s <= 0`` watches nothing.
    """
    if gone_after_s <= 0 or not names:
        return
    missing = MissingTopics(names, gone_after_s)
    admin: AIOKafkaAdminClient | None = None
    try:
        while True:
            await asyncio.sleep(gone_after_s / _CHECKS_PER_WINDOW)
            try:
                if admin is None:
                    admin = await _started_admin(kafka, client_id)
                existing = await asyncio.wait_for(admin.list_topics(), _LOOKUP_TIMEOUT_S)
            except (KafkaError, OSError, TimeoutError) as error:
                log.debug("topic watch: look-up failed (%r); not counted", error)
                continue
            except Exception as error:  # noqa: BLE001 - a watch that ended here would leave the process unwatched
                log.warning("topic watch: look-up failed unexpectedly (%r); not counted", error)
                continue
            gone = missing.observe(existing, time.monotonic())
            if gone:
                on_gone(gone)
                return
    finally:
        if admin is not None:
            await admin.close()


async def _started_admin(kafka: Connectable, client_id: str) -> AIOKafkaAdminClient:
    admin = clients.make_admin(kafka, client_id=client_id)
    try:
        await asyncio.wait_for(admin.start(), _LOOKUP_TIMEOUT_S)
    except BaseException:
        await admin.close()
        raise
    return admin
