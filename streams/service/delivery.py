"""One consumed message on its way to an answer: what a handler holds and finishes.

A handler answers through its :class:`Delivery`: ``reply`` sends an event to
the message's reply route, ``publish`` to any topic, ``fail`` answers with an
``ErrorEvent``. The delivery is finished when the handler returns, or, after
``defer()``, when the handler calls ``finish()`` itself (the engine worker
answers long after its handler returned). Its offsets are committed only once
everything it published is acknowledged by Kafka.

A delivery the foundation takes back (its partition moved in a rebalance, or the
drain at shutdown ran out of time) is *handed back*: it is not answered and not
committed, so Kafka redelivers it; the handler hears of it through
``on_handback`` (the engine worker aborts the generation).
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import BaseModel

from schemas.events import ErrorCode, ErrorEvent, ReplyRoute
from streams.kafka import clients
from streams.service.offsets import Source


class Outlet(Protocol):
    """What a delivery needs from the service that runs it."""

    def publish(self, topic: str, partition: int | None, key: bytes, event: BaseModel, *,
                origin: Delivery | None = None) -> asyncio.Future[Any]: ...

    def settle(self, delivery: Delivery) -> None: ...

    def forget(self, delivery: Delivery) -> None: ...


@dataclass(eq=False)
class Delivery:
    sources: list[Source]
    value: bytes | None
    key: bytes | None
    received_at: float  # this process's clock, when consumed
    published_at: float  # the record's timestamp (Kafka's clock)
    outlet: Outlet
    headers: Sequence[tuple[str, bytes]] = ()  # the record's Kafka headers (traceparent)
    payload: BaseModel | None = None  # the validated input
    request_id: str = ""
    route: ReplyRoute | None = None
    final_event: BaseModel | None = None  # the last reply (Completion, ErrorEvent), dead-lettered if undeliverable
    published: list[asyncio.Future[Any]] = field(default_factory=list)
    trace: Any = None  # telemetry's state of this delivery (its spans); None when not traced
    done: bool = False
    deferred: bool = False
    _handback: list[Callable[[], object]] = field(default_factory=list)

    @property
    def source(self) -> Source:
        return self.sources[0]

    def reply(self, event: BaseModel) -> None:
        """Send one event to the message's reply route, keyed by its request id (so its events stay in order)."""
        if self.route is None:
            raise RuntimeError(f"{self.request_id or self.source}: the message names no reply route")
        self.final_event = event
        self.publish(self.route.topic, clients.request_key(self.request_id), event, partition=self.route.partition)

    def publish(self, topic: str, key: bytes, event: BaseModel, *, partition: int | None = None) -> None:
        self.published.append(self.outlet.publish(topic, partition, key, event, origin=self))

    def defer(self) -> None:
        """The handler finishes this delivery later, with ``finish()`` or ``fail()``."""
        self.deferred = True

    def finish(self) -> None:
        """Answered: once Kafka acknowledged what it published, its offsets are committed. Idempotent."""
        if self.done:
            return
        self.done = True
        self.outlet.settle(self)

    def fail(self, code: ErrorCode, message: str) -> None:
        """Answer with an ``ErrorEvent`` (when there is a route) and finish."""
        if self.done:
            return
        if self.route is not None:
            self.reply(ErrorEvent(request_id=self.request_id or None, code=code, message=message))
        self.finish()

    def on_handback(self, callback: Callable[[], object]) -> None:
        self._handback.append(callback)

    def hand_back(self) -> None:
        """Give up without answering: Kafka redelivers the message (to whoever owns its partition)."""
        if self.done:
            return
        self.done = True
        for callback in self._handback:
            # The engine driver refuses commands once stopped; the request is not answered either way.
            with contextlib.suppress(RuntimeError):
                callback()
        self.outlet.forget(self)
