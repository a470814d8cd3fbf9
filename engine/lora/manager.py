"""Which adapters are served, which sit in memory, and swapping them in between steps.

Names: `register(name, path)` makes an adapter servable (config at start, or
a live load from the bus); `unregister` stops serving it. Memory: at most
`max_loaded` adapters hold a slot of the stacked weights (engine.lora.layers);
the least recently used one without requests in flight is evicted when a slot
is needed, and read again from its path on the next request for it.

Loading never blocks the engine thread: files are read and tensors built on a
loader thread (`request_load`), and `poll()`, called by the engine between
steps, copies finished adapters into their slot (a few small tensor copies),
so a load pauses the other requests by at most that copy.

Unloading an adapter with requests in flight lets them finish: its slot is
freed when the last one ends (`release`); new requests for it are refused
at once.
"""
from __future__ import annotations

import collections
import concurrent.futures
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from engine.config import LoRAConfig
from engine.lora.adapter import AdapterError, LoRAAdapter, read_adapter
from engine.lora.layers import LoRALinear, StepRows, install_lora_linears
from engine.model import Decoder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadResult:
    name: str
    error: str | None  # None: the adapter is in its slot


class LoRAManager:
    def __init__(self, model: Decoder, config: LoRAConfig) -> None:
        if config.max_loaded < 1 or config.max_rank < 1:
            raise ValueError(f"LoRA needs max_loaded >= 1 and max_rank >= 1, got {config.max_loaded}, {config.max_rank}")
        self.config = config
        self.model_cfg = model.cfg
        self.device, self.dtype = model.device, model.dtype
        self.rows = StepRows()
        self._linears: list[tuple[int, LoRALinear]] = install_lora_linears(model, self.rows)
        self._allocated = False
        self.paths: dict[str, str] = {}  # served name -> folder
        self.slots: collections.OrderedDict[str, int] = collections.OrderedDict()  # resident, least recent first
        self.ranks: dict[int, int] = {}  # slot -> rank of the adapter in it
        self.adapter_bytes: dict[str, int] = {}
        self._free = list(range(config.max_loaded, 0, -1))  # slot 0 is the base model
        self._pins: collections.Counter[str] = collections.Counter()
        self._loading: dict[str, Future[LoRAAdapter]] = {}
        self._ready: dict[str, LoRAAdapter] = {}  # read, waiting for a free slot
        self._stale: set[str] = set()  # resident from a path since replaced; evicted when its requests end
        self._pool: ThreadPoolExecutor | None = None
        # Placements so far: a new one per weight write, so KV computed under older weights of a name is never
        # taken for the new ones' (the prefix cache's key, cache_key).
        self._placements = 0
        self._placement: dict[str, int] = {}

    # --- names -------------------------------------------------------------------------------------------------------

    def register(self, name: str, path: str) -> None:
        """Serve `name` from `path`; a resident adapter of that name from another path is read again (once its
        requests in flight have finished: they keep the weights they started with)."""
        if self.paths.get(name) not in (None, path) and name in self.slots:
            if self._pins[name]:
                self._stale.add(name)
            else:
                self._evict(name)
        self._ready.pop(name, None)
        self.paths[name] = path

    def unregister(self, name: str) -> bool:
        """Stop serving `name`; False when it was not served. Requests in flight finish first."""
        if self.paths.pop(name, None) is None:
            return False
        self._ready.pop(name, None)
        if name in self.slots and not self._pins[name]:
            self._evict(name)
        return True

    def served(self) -> list[str]:
        return sorted(self.paths)

    def is_resident(self, name: str) -> bool:
        return name in self.slots and name not in self._stale

    # --- loading -----------------------------------------------------------------------------------------------------

    def read(self, name: str, path: str) -> LoRAAdapter:
        """Read and check an adapter (any thread)."""
        return read_adapter(name, path, self.model_cfg, self.config.max_rank, self.dtype)

    def request_load(self, name: str) -> None:
        """Start reading a served, non-resident adapter on the loader thread (no-op when under way)."""
        if self.is_resident(name) or name in self._loading or name in self._ready:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="lora-load")
        self._loading[name] = self._pool.submit(self.read, name, self.paths[name])

    def loading(self) -> bool:
        return bool(self._loading or self._ready)

    def wait(self, timeout_s: float) -> None:
        """Block until a load under way finishes or timeout_s passes (an engine with nothing else to do)."""
        if self._loading:
            concurrent.futures.wait(list(self._loading.values()), timeout_s, concurrent.futures.FIRST_COMPLETED)

    def poll(self) -> list[LoadResult]:
        """Engine thread, between steps: take finished reads and put what fits into slots."""
        results: list[LoadResult] = []
        for name, future in list(self._loading.items()):
            if not future.done():
                continue
            del self._loading[name]
            error = future.exception()
            if error is not None:
                log.warning("loading LoRA adapter %r failed: %s", name, error)
                results.append(LoadResult(name, str(error) if isinstance(error, AdapterError) else repr(error)))
            elif future.result().path == str(Path(self.paths.get(name, "")).expanduser()):  # not unloaded or moved
                self._ready[name] = future.result()
        for name, adapter in list(self._ready.items()):
            if self._place(adapter):
                del self._ready[name]
                results.append(LoadResult(name, None))
        return results

    def install(self, adapter: LoRAAdapter) -> bool:
        """Engine thread: put an already read adapter into a slot now; False when no slot is free (every one holds
        an adapter with requests in flight): then `poll()` places it once one is."""
        if self._place(adapter):
            self._ready.pop(adapter.name, None)
            return True
        self._ready[adapter.name] = adapter
        return False

    def _place(self, adapter: LoRAAdapter) -> bool:
        if adapter.name in self._stale:  # its old weights serve requests in flight until they end
            return False
        slot = self.slots.get(adapter.name)
        if slot is None:
            slot = self._free_slot()
            if slot is None:
                return False
        if not self._allocated:
            for _, linear in self._linears:
                linear.allocate(self.config.max_loaded + 1, self.config.max_rank, self.device, self.dtype)
            self._allocated = True
        for layer, linear in self._linears:
            linear.write(slot, layer, adapter)
        self.rows.version += 1
        self._placements += 1
        self._placement[adapter.name] = self._placements
        self.slots[adapter.name] = slot
        self.slots.move_to_end(adapter.name)
        self.ranks[slot] = adapter.rank
        self.adapter_bytes[adapter.name] = adapter.nbytes()
        return True

    def _free_slot(self) -> int | None:
        if not self._free:
            idle = next((n for n in self.slots if not self._pins[n]), None)  # least recently used first
            if idle is None:
                return None
            log.info("evicting LoRA adapter %r (least recently used)", idle)
            self._evict(idle)
        return self._free.pop()

    def _evict(self, name: str) -> None:
        self._stale.discard(name)
        slot = self.slots.pop(name)
        for layer, linear in self._linears:
            linear.write(slot, layer, None)
        self.rows.version += 1
        self.ranks.pop(slot, None)
        self._free.append(slot)

    # --- requests ----------------------------------------------------------------------------------------------------

    def acquire(self, name: str) -> None:
        """A request of `name` enters the batch: its adapter stays resident until `release`."""
        self._pins[name] += 1
        self.slots.move_to_end(name)

    def release(self, name: str) -> None:
        self._pins[name] -= 1
        if self._pins[name] <= 0:
            del self._pins[name]
            if name in self.slots and (name not in self.paths or name in self._stale):  # unloaded or replaced
                self._evict(name)

    def begin_step(self, row_slots: list[int]) -> None:
        self.rows.set(row_slots, self.ranks, self.device, self.dtype)

    def end_step(self) -> None:
        self.rows.clear()

    def cache_key(self, name: str) -> str:
        """What names the resident weights of `name` for the prefix cache: its name and which placement."""
        return f"lora\0{name}\0{self._placement[name]}"

    def slot_of(self, name: str | None) -> int:
        return 0 if name is None else self.slots[name]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
