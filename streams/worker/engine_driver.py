"""Runs the engine in one dedicated thread and talks to the asyncio loop.

The engine's ``step()`` is blocking compute (one forward pass of the whole
batch, tens of milliseconds to seconds on CPU). Running it on the event loop
would freeze Kafka heartbeats, consumption and publishing for that long, so
the engine lives in its own thread and is touched by nothing else:

* the loop sends commands (add, abort) through an inbox guarded by a
  condition variable; the thread applies them between steps, so the engine
  never needs a lock of its own;
* the thread steps while the engine has unfinished work and sleeps on the
  condition when idle (no busy polling);
* outputs go back to the loop with ``loop.call_soon_threadsafe``, one call per
  step, preserving step order.

Tokenization also happens on this thread (inside the add command): the
tokenizer is then only ever used by one thread, which sidesteps Hugging Face
fast tokenizers' "Already borrowed" errors under concurrent use.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engine.outputs import RequestOutput
from engine.request import EngineRequest

log = logging.getLogger(__name__)


class Engine(Protocol):
    """What the worker needs from ``engine.llm_engine.LLMEngine``."""

    tokenizer: Any
    model_name: str
    max_model_len: int

    def add_request(self, request: EngineRequest) -> None: ...

    def abort(self, request_id: str) -> RequestOutput | None: ...

    def step(self) -> list[RequestOutput]: ...

    def has_unfinished(self) -> bool: ...


@dataclass
class _Add:
    # Builds the request on the engine thread (tokenization included); may raise.
    prepare: Callable[[Engine], EngineRequest]
    done: asyncio.Future[EngineRequest]


@dataclass
class _Abort:
    request_id: str
    done: asyncio.Future[RequestOutput | None]


@dataclass
class _Call:
    # Anything else done to the engine between steps (e.g. swapping in a LoRA adapter read off-thread).
    fn: Callable[[Engine], Any]
    done: asyncio.Future[Any]


class EngineDriver:
    """Owns the engine thread.

    ``on_outputs`` is called on the event loop with each step's outputs;
    ``on_failure`` is called on the loop when ``step()`` raised (the requests in
    that step are lost; the caller fails them and the driver keeps going).
    """

    def __init__(
        self,
        engine: Engine,
        loop: asyncio.AbstractEventLoop,
        on_outputs: Callable[[list[RequestOutput]], None],
        on_failure: Callable[[BaseException], None],
        *,
        name: str = "engine",
    ) -> None:
        self.engine = engine
        self._loop = loop
        self._on_outputs = on_outputs
        self._on_failure = on_failure
        self._cond = threading.Condition()
        self._inbox: list[_Add | _Abort | _Call] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # --- called on the event loop ----------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    async def add(self, prepare: Callable[[Engine], EngineRequest]) -> EngineRequest:
        """Prepare and add a request on the engine thread; raises what ``prepare`` or ``add_request`` raised
        (notably ``engine.request.RequestRejected``)."""
        done: asyncio.Future[EngineRequest] = self._loop.create_future()
        self._send(_Add(prepare, done))
        return await done

    def abort(self, request_id: str) -> asyncio.Future[RequestOutput | None]:
        """Abort a request; the future holds the engine's final output for it (None when it did not hold it)."""
        done: asyncio.Future[RequestOutput | None] = self._loop.create_future()
        self._send(_Abort(request_id, done))
        return done

    async def call(self, fn: Callable[[Engine], Any]) -> Any:
        """Run ``fn(engine)`` on the engine thread between two steps; returns or raises what it did."""
        done: asyncio.Future[Any] = self._loop.create_future()
        self._send(_Call(fn, done))
        return await done

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop after the current step; blocks up to ``timeout_s`` for the thread to end."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout_s)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _send(self, command: _Add | _Abort | _Call) -> None:
        with self._cond:
            if self._stopping:
                raise RuntimeError("engine driver is stopped")
            self._inbox.append(command)
            self._cond.notify()

    # --- the engine thread ----------------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._inbox and not self._stopping and not self.engine.has_unfinished():
                    self._cond.wait()
                if self._stopping:
                    commands, self._inbox = self._inbox, []
                    self._cancel_commands(commands)
                    return
                commands, self._inbox = self._inbox, []
            for command in commands:
                self._apply(command)
            if not self.engine.has_unfinished():
                continue
            try:
                outputs = self.engine.step()
            except BaseException as error:  # noqa: BLE001 - reported to the loop, which fails the affected requests
                log.exception("engine step failed")
                self._post(self._on_failure, error)
                continue
            if outputs:
                self._post(self._on_outputs, outputs)

    def _apply(self, command: _Add | _Abort | _Call) -> None:
        if isinstance(command, _Call):
            try:
                result = command.fn(self.engine)
            except BaseException as error:  # noqa: BLE001 - handed to the awaiting coroutine
                self._resolve(command.done, error=error)
            else:
                self._resolve(command.done, result=result)
        elif isinstance(command, _Add):
            try:
                request = command.prepare(self.engine)
                self.engine.add_request(request)
            except BaseException as error:  # noqa: BLE001 - handed to the awaiting coroutine
                self._resolve(command.done, error=error)
            else:
                self._resolve(command.done, result=request)
        else:
            try:
                output = self.engine.abort(command.request_id)
            except BaseException as error:  # noqa: BLE001
                log.exception("engine abort of %s failed", command.request_id)
                self._resolve(command.done, error=error)
            else:
                self._resolve(command.done, result=output)

    def _resolve(self, future: asyncio.Future[Any], *, result: Any = None, error: BaseException | None = None) -> None:
        def settle() -> None:
            if future.done():  # the awaiting coroutine was cancelled
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

        self._post(settle)

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: the process is exiting and nobody awaits this any more
            log.debug("event loop closed; dropped %s", getattr(callback, "__name__", callback))

    def _cancel_commands(self, commands: list[_Add | _Abort | _Call]) -> None:
        for command in commands:
            self._resolve(command.done, error=RuntimeError("engine driver stopped"))
