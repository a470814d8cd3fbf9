"""A consumer service as a process: FastStream's app runs it until SIGINT/SIGTERM, drains, and exits 0.

FastStream installs the signal handlers and calls the service's hooks in
order: prepare (topics, the consumer's own start), start the broker, announce
ready; on a signal: drain, stop the Kafka clients, close. With the broker gone,
aiokafka's clients can take minutes to stop (each waits out its own retries);
the drain already settled what could be, so a watchdog armed after it exits
the process once the clients had ``CLIENT_STOP_GRACE_S`` to stop.

Topics the service's start created that vanish from the cluster (streams.kafka.topic_watch) end it the same way, with
status 1: its restart recreates them.
"""
from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Sequence

from faststream import FastStream

from streams.service.gc_pauses import freeze_startup_heap
from streams.service.logs import faststream_log
from streams.service.runner import ConsumerService
from streams.kafka.topic_watch import TopicsGone, gone_topics, watch_topics

log = logging.getLogger("specstream.service")

# After the drain, how long the Kafka clients may take to stop before the process exits anyway.
CLIENT_STOP_GRACE_S = 10.0
# The same once its topics are gone: what its clients still try to send there can never be acknowledged.
GONE_CLIENT_STOP_GRACE_S = 2.0


def create_app(service: ConsumerService, *, companions: Sequence[ConsumerService] = ()) -> FastStream:
    """``companions``: more consumers of the same process that need the main one running (the engine worker's
    batch lane needs its engine): started after it, drained with it (at once, so the drain takes one
    drain_timeout_s, not two), their clients stopped before it closes."""

    async def drain() -> None:
        await asyncio.gather(service.drain(), *(c.drain() for c in companions))

    async def stop_companions() -> None:
        # After the drain hooks, so the watchdog is armed: with the broker gone a companion's Kafka clients
        # may never stop (a worker whose batch lane was up then ignored SIGTERM for good).
        await asyncio.gather(*(c.stop() for c in companions))

    async def freeze() -> None:  # last: everything start-up built (an engine's model included) is long-lived
        freeze_startup_heap(f"{service.kind} {service.service_id}")

    return FastStream(
        service.broker,
        logger=faststream_log,
        on_startup=[service.prepare],
        after_startup=[service.started, *(c.start for c in companions), freeze],
        on_shutdown=[drain],
        after_shutdown=[stop_companions, service.close],
    )


async def serve(service: ConsumerService, *, companions: Sequence[ConsumerService] = ()) -> None:
    """Serve until SIGINT/SIGTERM, then drain and stop (exit 0, also when the broker is gone).

    Raises :class:`TopicsGone`, after the same drain, when topics its start created vanished from the cluster.
    """
    app = create_app(service, companions=companions)
    topics = StartTopics([service, *companions], stop=app.exit)
    watchdog: threading.Timer | None = None

    @app.after_startup
    async def _watch_topics() -> None:
        topics.watch()

    @app.on_shutdown
    async def _arm_watchdog() -> None:
        # Runs after the drain (hooks run in the order they were added).
        nonlocal watchdog
        topics.stop_watching()
        watchdog = exit_if_clients_hang(topics_gone=bool(topics.gone))

    try:
        await app.run()
    finally:
        if watchdog is not None:
            watchdog.cancel()
    topics.raise_if_gone()


class StartTopics:
    """The topics a process's services created at their start, watched (streams.kafka.topic_watch): once some are gone,
    it says so once and calls ``stop`` (the process drains); ``raise_if_gone`` then ends it with TopicsGone."""

    def __init__(self, services: Sequence[ConsumerService], *, stop: Callable[[], object]) -> None:
        self.services = services
        self.stop = stop
        self.gone: list[str] = []
        self._task: asyncio.Task[None] | None = None

    def watch(self) -> None:
        first = self.services[0]
        names = [name for s in self.services for name in s.created_topics]
        self._task = asyncio.create_task(watch_topics(
            first.options.kafka, names, gone_after_s=first.options.missing_topic_restart_s, on_gone=self._gone,
            client_id=f"specstream-{first.kind}-{first.service_id}-topic-watch"))

    def stop_watching(self) -> None:
        if self._task is not None:
            self._task.cancel()

    def raise_if_gone(self) -> None:
        if self.gone:
            raise TopicsGone(self.gone)

    def _gone(self, names: list[str]) -> None:
        first = self.services[0]
        log.error("%s %s: %s: draining, then exiting with status 1 for a restart", first.kind, first.service_id,
                  gone_topics(names))
        self.gone.extend(names)
        for service in self.services:
            if service.announcer.topic in names:  # its drain's announcements could never be acknowledged
                service.announcer.mute(f"its topic {service.announcer.topic} is gone")
        self.stop()


def exit_if_clients_hang(*, topics_gone: bool) -> threading.Timer:
    """Armed after a drain: exits the process (0, or 1 when its topics are gone) unless cancelled within the grace."""
    grace_s = GONE_CLIENT_STOP_GRACE_S if topics_gone else CLIENT_STOP_GRACE_S
    timer = threading.Timer(grace_s, _exit_stuck_clients, args=(grace_s, 1 if topics_gone else 0))
    timer.daemon = True
    timer.start()
    return timer


def _exit_stuck_clients(grace_s: float, status: int) -> None:
    log.warning("Kafka clients did not stop within %.0f s (broker unreachable, or topics gone?); exiting", grace_s)
    logging.shutdown()
    os._exit(status)
