"""LoRA adapters on the vLLM backend: the registry the worker's adapters topic drives (``WorkerAdapters`` calls
``engine.lora.manager``'s read / register / install / unregister, as on our engine), over vLLM's ``LoRARequest``.

vLLM reads an adapter's PEFT folder itself and keeps ``max_loras`` of them resident (least recently used evicted,
read again on demand). A name maps to one ``LoRARequest`` with an id of its own: loading a name again from another
path takes a fresh id, so vLLM never serves the old weights under it. Unloading only forgets the name (new requests
are refused at once); vLLM keeps the weights until its cache evicts them, so requests in flight finish on them.
"""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# vLLM's accepted max_lora_rank values (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_max_lora_rank(max_rank: int) -> int:
    """The smallest rank vLLM accepts that holds our engine.lora.max_rank (ours is checked at read)."""
    return next(r for r in VLLM_LORA_RANKS if r >= max_rank)


@dataclass(frozen=True)
class CheckedAdapter:
    """A PEFT folder whose config vLLM can serve; read again by vLLM itself when installed."""

    name: str
    path: str
    rank: int
    size: int

    def nbytes(self) -> int:
        return self.size


def check_adapter(name: str, path: str, max_rank: int) -> CheckedAdapter:
    """What our engine's read checks that vLLM would only find out on the engine thread, or not at all: ValueError
    naming what is wrong."""
    folder = Path(path)
    config_file, weights = folder / "adapter_config.json", folder / "adapter_model.safetensors"
    if not config_file.is_file() or not weights.is_file():
        raise ValueError(f"{path}: a PEFT LoRA folder needs adapter_config.json and adapter_model.safetensors")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{config_file}: not JSON ({error})") from None
    if config.get("peft_type", "LORA") != "LORA":
        raise ValueError(f"{name}: peft_type {config['peft_type']!r} is not LoRA")
    rank = int(config.get("r", 0))
    if not 0 < rank <= max_rank:
        raise ValueError(f"{name}: rank {rank} is outside 1..engine.lora.max_rank ({max_rank})")
    if config.get("use_dora"):
        raise ValueError(f"{name}: DoRA adapters (use_dora) are not served by the vLLM backend")
    return CheckedAdapter(name, path, rank, weights.stat().st_size)


@dataclass
class VllmAdapters:
    """Served adapter names and their ``LoRARequest``s; register/install/unregister run on the engine thread."""

    engine: Any  # vllm.v1.engine.llm_engine.LLMEngine
    max_rank: int
    requests: dict[str, Any] = field(default_factory=dict)  # name -> LoRARequest
    _ids: itertools.count = field(default_factory=lambda: itertools.count(1))

    @property
    def manager(self) -> VllmAdapters:  # WorkerAdapters reaches the registry as engine.lora.manager
        return self

    def read(self, name: str, path: str) -> CheckedAdapter:
        return check_adapter(name, path, self.max_rank)

    def register(self, name: str, path: str) -> None:
        from vllm.lora.request import LoRARequest

        self.requests[name] = LoRARequest(name, next(self._ids), path)

    def install(self, adapter: CheckedAdapter) -> bool:
        """vLLM reads the folder now (its errors reach the load's answer); True: resident."""
        return bool(self.engine.add_lora(self.requests[adapter.name]))

    def unregister(self, name: str) -> bool:
        return self.requests.pop(name, None) is not None

    def request_for(self, name: str) -> Any:
        """The LoRARequest a request for adapter ``name`` runs with; KeyError when it is not served."""
        return self.requests[name]
