"""The edge's Kafka side as one object: connect, submit a request, disconnect.

:class:`Edge` owns the publisher, the reply router and the readiness tracker.
``start()`` connects in the background and keeps retrying while Kafka is
unreachable, so the HTTP server is up (``/healthz`` 200, ``/readyz`` 503 with
the reason) before the bus is; ``submit()`` registers a request with the
router *before* publishing it, so no reply can arrive unrouted.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from schemas.events import EDGE_KIND, EdgeAnnouncement, GenerateRequest
from streams.batch.files import StoreFiles
from streams.batch.validation import upload_validator
from streams.edge.batches.desk import BatchDesk
from streams.edge.publisher import RequestPublisher
from streams.edge.readiness import ReadinessWatch, ReadyState
from streams.edge.replies import ReplyRouter, ReplyStream
from streams.edge.responses.store import ResponseStore
from streams.edge.settings import EdgeOptions
from streams.files.blobs import BlobStore
from streams.files.purposes import register_validator
from streams.files.store import FileStore
from streams.kafka.acls import edge_grants
from streams.kafka.clients import encode
from streams.kafka.permissions import prepare_service
from streams.kafka.topic_watch import gone_topics, watch_topics
from streams.service.announcer import Announcer
from streams.telemetry.logs import bind_request, trace_id_of
from streams.telemetry.tracing import trace_id_hex
from streams.wire import errors

log = logging.getLogger(__name__)

# How often an edge announces itself on the edges topic, so `specstream topics gc` can tell the reply topics of
# running edges from those of edges that are gone.
ANNOUNCE_S = 60.0


async def prepare_edge(s: EdgeOptions) -> list[str]:
    """The edge's permissions, then its topics (its reply topic included); one-line KafkaAccessError if refused.

    Returns the names of those topics."""
    return await prepare_service(
        s.kafka, edge_grants(s.catalog, s.edge_id), [s.catalog.replies(s.edge_id)],
        replication_factor=s.kafka.replication_factor, min_insync_replicas=s.kafka.min_insync_replicas,
        client_id=f"{s.client_id}-{s.edge_id}-admin",
    )


class Edge:
    def __init__(self, settings: EdgeOptions, tracer: trace.Tracer | None = None) -> None:
        self.settings = settings
        self.tracer = tracer
        self.publisher = RequestPublisher(settings, tracer)
        self.router = ReplyRouter(settings)
        # A stream the edge itself ends (diverged regeneration) still runs on a worker: cancel it there.
        self.router.on_abandon = self.publisher.cancel_soon
        self.readiness = ReadinessWatch(settings)
        files = settings.settings.files
        self.files = FileStore(settings.kafka, settings.catalog, BlobStore(files.dir), max_bytes=files.max_bytes,
                               client_id=f"{settings.client_id}-{settings.edge_id}-files")
        # Stored responses of the Responses API (streams/edge/responses): the topic, read whole by every edge.
        self.responses = ResponseStore(settings.kafka, settings.catalog.responses,
                                       client_id=f"{settings.client_id}-{settings.edge_id}-responses")
        # Batch jobs (streams/batch): their lines are read from the files store, their state is on the bus.
        self.batches = BatchDesk(settings, StoreFiles(self.files), lambda: self.publisher.producer)
        register_validator("batch", upload_validator(settings.settings.batch))
        self.connected = asyncio.Event()
        self.last_error: str = "not connected yet"
        self._connect_task: asyncio.Task | None = None
        self._announce_task: asyncio.Task | None = None
        self._topic_watch: asyncio.Task | None = None
        self._reconnect_task: asyncio.Task | None = None
        # The topics the last connection created or found (streams.kafka.topic_watch reconnects when they vanish).
        self._topics: list[str] = []
        self.started_at = time.time()
        # On the services topic with every other service (`specstream status`); the edges topic above is topics gc's.
        self.announcer = Announcer(self._send_announcement, settings.catalog.services.name, kind=EDGE_KIND,
                                   service_id=self.edge_id, heartbeat_s=settings.heartbeat_s)

    @property
    def edge_id(self) -> str:
        return self.settings.edge_id

    @property
    def reply_topic(self) -> str:
        return self.router.reply_topic

    async def start(self, *, wait_s: float | None = None) -> None:
        """Start connecting; wait up to ``wait_s`` (default: settings.startup_timeout_s) for it to finish."""
        self._connect_task = asyncio.create_task(self._connect_forever(), name=f"edge-connect-{self.edge_id}")
        wait_s = self.settings.edge.startup_timeout_s if wait_s is None else wait_s
        try:
            await asyncio.wait_for(asyncio.shield(self.connected.wait()), timeout=wait_s)
        except TimeoutError:
            log.warning("edge %s: not connected to Kafka after %.0f s (%s); serving 503 until it is",
                        self.edge_id, wait_s, self.last_error)

    async def _connect_forever(self) -> None:
        delay = 0.5
        while True:
            try:
                await self._connect_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                detail = str(exc) or type(exc).__name__
                servers = self.settings.kafka.bootstrap_servers
                self.last_error = detail if servers in detail else f"cannot connect to Kafka at {servers}: {detail}"
                log.warning("edge %s: %s; retrying in %.1f s", self.edge_id, self.last_error, delay)
                await self._stop_parts()
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self.last_error = ""
            self.connected.set()
            self._announce_task = asyncio.create_task(self._announce_forever(), name=f"edge-announce-{self.edge_id}")
            self._topic_watch = asyncio.create_task(watch_topics(
                self.settings.kafka, self._topics, on_gone=self._topics_gone,
                gone_after_s=self.settings.settings.delivery.missing_topic_restart_s,
                client_id=f"{self.settings.client_id}-{self.edge_id}-topic-watch"), name=f"edge-topics-{self.edge_id}")
            await self.announcer.announce("ready")
            self.announcer.start_heartbeat()
            log.info("edge %s connected: requests -> %s, replies <- %s",
                     self.edge_id, self.publisher.request_topic, self.reply_topic)
            return

    async def _connect_once(self) -> None:
        self._topics = await prepare_edge(self.settings)
        await self.publisher.start()
        await self.router.start()
        await self.readiness.start()
        await self.files.start()
        await self.responses.start()
        await self.batches.start()

    def _topics_gone(self, names: list[str]) -> None:
        """Topics of this edge vanished: serve 503 naming them, and connect again (which recreates them).

        Requests in flight keep their reply streams: a worker still generating one publishes to the recreated reply
        topic, which the new connection reads from its end, as at any start.
        """
        self.last_error = f"{gone_topics(names)}; connecting again, which recreates them"
        log.error("edge %s: %s", self.edge_id, self.last_error)
        self.connected.clear()
        self._reconnect_task = asyncio.create_task(self._reconnect(), name=f"edge-reconnect-{self.edge_id}")

    async def _reconnect(self) -> None:
        # Topics first: what the clients still send there (a heartbeat) is then acknowledged, where their stop would
        # otherwise wait out the request timeout (~40 s). The connection below creates whatever this could not.
        try:
            await prepare_edge(self.settings)
        except Exception as error:  # noqa: BLE001 - the connection's own start retries and reports it
            log.debug("edge %s: recreating topics before reconnecting failed: %r", self.edge_id, error)
        await self._disconnect(announce=False)
        self._connect_task = asyncio.create_task(self._connect_forever(), name=f"edge-connect-{self.edge_id}")

    async def _announce_forever(self) -> None:
        announcement = EdgeAnnouncement(edge_id=self.edge_id, reply_topic=self.reply_topic, at=0.0)
        while True:
            try:
                await self.publisher.producer.send_and_wait(
                    self.settings.catalog.edges.name, encode(announcement.model_copy(update={"at": time.time()})),
                    key=self.edge_id.encode())
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - best effort; the next one retries
                log.debug("edge %s: announcement failed: %r", self.edge_id, exc)
            await asyncio.sleep(ANNOUNCE_S)

    async def _send_announcement(self, topic: str, key: bytes, value: bytes) -> None:
        await self.publisher.producer.send_and_wait(topic, value, key=key)

    async def _stop_parts(self) -> None:
        for part in (self.batches, self.responses, self.files, self.readiness, self.router, self.publisher):
            try:
                await part.stop()
            except Exception:
                log.exception("edge %s: stopping %s failed", self.edge_id, type(part).__name__)

    async def stop(self) -> None:
        if self._reconnect_task is not None:
            self._reconnect_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reconnect_task
        await self._disconnect(announce=True)

    async def _disconnect(self, *, announce: bool) -> None:
        for task in (self._announce_task, self._topic_watch):
            if task is not None:
                task.cancel()
        self.announcer.stop_heartbeat()
        if announce and self.connected.is_set():
            await self.announcer.announce("stopped")
        if self._connect_task is not None:
            self._connect_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._connect_task
        self.connected.clear()
        await self._stop_parts()

    async def ready_state(self) -> ReadyState:
        if not self.connected.is_set():
            return ReadyState(False, self.last_error or "connecting to Kafka")
        return await self.readiness.state(router_running=self.router.started.is_set())

    async def submit(self, request: GenerateRequest) -> ReplyStream:
        """Register the request with the router, then publish it. Returns its reply stream."""
        if not self.connected.is_set():
            raise errors.not_ready(self.last_error or "not connected to Kafka")
        # The rest of this request's handling logs with its ids (the access log line included).
        bind_request(request.request_id,
                     trace_id_hex() or trace_id_of(request.trace.traceparent if request.trace is not None else None))
        stream = self.router.open(request.request_id, deadline=request.deadline)
        timeout_s = self.settings.edge.publish_timeout_s
        try:
            await asyncio.wait_for(self.publisher.publish_request(request), timeout=timeout_s)
        except asyncio.CancelledError:
            # The client went away while we published; the request may be on the bus already.
            stream.close()
            self.publisher.cancel_soon(request.request_id)
            raise
        except Exception as exc:
            stream.close()
            # A timed-out send may still reach the broker later: make sure no worker spends time on it.
            self.publisher.cancel_soon(request.request_id, "publishing failed at the edge")
            reason = (f"no acknowledgement within edge.publish_timeout_s ({timeout_s:g} s)"
                      if isinstance(exc, TimeoutError) else repr(exc))
            log.warning("edge %s: publishing %s failed: %s", self.edge_id, request.request_id, reason)
            raise errors.not_ready(f"could not publish the request to Kafka: {reason}") from None
        if self.tracer is not None:
            self._trace_relay(stream)
        return stream

    def _trace_relay(self, stream: ReplyStream) -> None:
        """A span from the publish's acknowledgement to the final reply (or the stream's close without one)."""
        assert self.tracer is not None
        span = self.tracer.start_span(f"receive {self.reply_topic}", kind=SpanKind.CONSUMER, attributes={
            "messaging.system": "kafka", "messaging.operation.type": "receive",
            "messaging.destination.name": self.reply_topic, "messaging.message.id": stream.request_id})

        def end() -> None:
            final = stream.final
            span.set_attribute("specstream.final_event", type(final).__name__ if final is not None else "none")
            if final is None or getattr(final, "code", None) is not None:
                span.set_status(Status(StatusCode.ERROR, getattr(final, "code", None) or "closed before the final event"))
            span.end()

        stream.on_end = end

    def abandon(self, stream: ReplyStream, reason: str = "client disconnected") -> None:
        """The client of an unfinished request is gone: stop routing it and tell the workers. Idempotent."""
        if stream.closed:
            return
        stream.close()
        if not stream.finished:
            self.publisher.cancel_soon(stream.request_id, reason)
