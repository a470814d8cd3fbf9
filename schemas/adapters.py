"""LoRA adapter registry events: what the compacted adapters topic carries, and the HTTP bodies that write it.

The topic holds, per adapter name, the newest command (load with its path, or
unload). Every engine worker reads it from the beginning, so a worker started
later serves the same adapters; each announces what it holds in its
`ServiceAnnouncement` (`adapters`, and `adapter_errors` for loads that failed),
which is how the edge's model list and the load response follow.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from schemas.events import Event

ADAPTER_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"


class AdapterCommand(Event):
    """Load or unload one LoRA adapter on every engine worker serving `base_model`, keyed by `lora_name`."""

    type: Literal["lora_adapter"] = "lora_adapter"
    command_id: str = Field(min_length=1, max_length=64,
                            description="Unique id of this command; a worker's failed load is announced under it.")
    action: Literal["load", "unload"] = Field(description="load: serve the adapter (again); unload: stop serving it.")
    lora_name: str = Field(pattern=ADAPTER_NAME_PATTERN, description="The adapter's served model name.")
    lora_path: str | None = Field(
        default=None, min_length=1,
        description="Local PEFT folder (adapter_config.json + adapter_model.safetensors) on the workers; load only.",
    )
    base_model: str = Field(min_length=1, description="The base model the adapter applies to; other workers ignore it.")
    at: float = Field(description="Unix time of the command.")

    @model_validator(mode="after")
    def _path_for_load(self) -> AdapterCommand:
        if self.action == "load" and self.lora_path is None:
            raise ValueError("a load command needs lora_path")
        return self


class LoadLoRAAdapterBody(BaseModel):
    """`POST /v1/load_lora_adapter`, as vLLM takes it."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(description="The name the adapter is served under (the `model` of requests).")
    lora_path: str = Field(description="Local PEFT adapter folder, as the workers see it.")
    load_inplace: bool = Field(default=False, description="Replace an adapter of the same name instead of refusing.")


class UnloadLoRAAdapterBody(BaseModel):
    """`POST /v1/unload_lora_adapter`, as vLLM takes it."""

    model_config = ConfigDict(extra="forbid")

    lora_name: str = Field(description="The adapter to stop serving; requests in flight finish.")
    lora_int_id: int | None = Field(default=None, description="Accepted for vLLM compatibility; ignored.")
