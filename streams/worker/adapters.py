"""The worker's side of the LoRA adapter registry: applying the adapters topic to its engine, and what it announces.

Every worker reads the compacted adapters topic from the beginning (a listener),
so one started later ends up with the same adapters. A load reads and checks
the adapter on a thread (files, tensors), then swaps it in on the engine thread
between two steps: the other requests pause for that copy only. A failed load
(missing path, broken or unsupported adapter) is logged and announced under the
command's id (the edge's load response reports it); the worker keeps serving.
An unload stops new requests for the adapter at once; those in flight finish.
"""
from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from schemas.adapters import AdapterCommand

log = logging.getLogger("specstream.worker.adapters")

# Failed loads remembered for the announcement (the edge waits seconds for its answer; older ones are history).
_REMEMBERED_FAILURES = 16


class WorkerAdapters:
    def __init__(self, base_model: str, configured: dict[str, str], announce: Callable[[], Awaitable[None]]) -> None:
        self.base_model = base_model
        self.held: dict[str, str] = dict(configured)  # served adapter name -> path
        self.failures: collections.OrderedDict[str, str] = collections.OrderedDict()  # command id -> why
        self._announce = announce
        self._engine: Any = None
        self._call: Callable[[Callable[[Any], Any]], Awaitable[Any]] | None = None
        self._ready = asyncio.Event()
        self._lock = asyncio.Lock()  # commands apply one at a time, in topic order

    def attach(self, engine: Any, call: Callable[[Callable[[Any], Any]], Awaitable[Any]]) -> None:
        """The engine is loaded: commands read before now apply in order."""
        self._engine, self._call = engine, call
        self._ready.set()

    def announcement(self) -> dict[str, Any]:
        return {"adapters": {name: self.base_model for name in sorted(self.held)},
                "adapter_errors": dict(self.failures)}

    async def on_command(self, command: AdapterCommand) -> None:
        if command.base_model != self.base_model:
            return
        await self._ready.wait()
        async with self._lock:
            if command.action == "unload":
                await self._unload(command)
            else:
                await self._load(command)
        await self._announce()

    async def _load(self, command: AdapterCommand) -> None:
        name, path = command.lora_name, command.lora_path
        assert path is not None and self._call is not None
        if self.held.get(name) == path:
            return  # a replay of what we hold (the topic is read from its beginning at every start)
        lora = getattr(self._engine, "lora", None)
        if lora is None:
            self._fail(command, "LoRA is off on this worker (engine.lora.max_loaded is 0)")
            return
        try:
            adapter = await asyncio.to_thread(lora.manager.read, name, path)
        except Exception as error:  # noqa: BLE001 - AdapterError says why; anything else is a bug worth the repr
            self._fail(command, str(error) if isinstance(error, ValueError) else repr(error))
            return

        def swap_in(engine: Any) -> bool:
            manager = engine.lora.manager
            manager.register(name, path)
            return bool(manager.install(adapter))

        try:
            installed = await self._call(swap_in)
        except Exception as error:  # noqa: BLE001 - the engine refused it (vLLM reads the folder only here)
            self._fail(command, str(error) if isinstance(error, ValueError) else repr(error))
            return
        if not installed:  # every slot busy with requests in flight: swapped in when one frees
            log.info("adapter %s registered; it takes a slot when one frees", name)
        self.held[name] = path
        log.info("LoRA adapter %s loaded from %s (%d KiB)", name, path, adapter.nbytes() // 1024)

    async def _unload(self, command: AdapterCommand) -> None:
        name = command.lora_name
        if self.held.pop(name, None) is None or self._call is None:
            return
        await self._call(lambda engine: engine.lora.manager.unregister(name) if engine.lora else False)
        log.info("LoRA adapter %s unloaded (requests in flight finish)", name)

    def _fail(self, command: AdapterCommand, reason: str) -> None:
        log.warning("loading LoRA adapter %s from %s failed: %s", command.lora_name, command.lora_path, reason)
        self.failures[command.command_id] = reason
        while len(self.failures) > _REMEMBERED_FAILURES:
            self.failures.popitem(last=False)
