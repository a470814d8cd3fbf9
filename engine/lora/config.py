"""Configuration of LoRA serving (no torch here: reading a config must stay cheap)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class LoRAConfig:
    # Adapters served from the start: served name -> local PEFT folder.
    adapters: dict[str, str] = field(default_factory=dict)
    # Adapters in memory at once (one slot each); the least recently used one without requests is evicted.
    max_loaded: int = 4
    # Largest rank accepted; the slots are sized for it.
    max_rank: int = 16
