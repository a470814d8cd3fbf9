"""Engine configuration: plain dataclasses.

The YAML / pydantic settings (streams/config.py) validate user input and build
these; the engine reads them as they are.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

DEFAULT_MODEL = "smollm2-135m-instruct"


@dataclass
class SpeculationConfig:
    enabled: bool = True
    method: Literal["ngram", "draft"] = "ngram"
    # Path or name of the draft model when method == "draft".
    draft_model: str | None = None
    # How the draft model drafts for sampled requests (see engine.spec.config):
    # "greedy" and "coupled" keep seeded text reproducible across redeliveries,
    # "sampled" (Leviathan rejection with q) does not.
    draft_sampling: Literal["greedy", "coupled", "sampled"] = "greedy"
    # Upper bound of k, the number of draft tokens verified per target forward.
    max_draft_tokens: int = 8
    # False pins k at max_draft_tokens: for benchmarks that show a method's ceiling.
    adaptive: bool = True
    # Below this acceptance rate the controller stops speculating for a sequence...
    min_acceptance: float = 0.3
    # ...and probes again every this many steps.
    probe_interval_steps: int = 16
    ngram_min: int = 1
    ngram_max: int = 4


@dataclass
class EngineConfig:
    # A known model name (see engine.loader.KNOWN_MODELS), a local HF model folder or a .gguf file.
    model: str = DEFAULT_MODEL
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    dtype: str = "auto"  # "auto" | "float32" | "bfloat16" | "float16"
    # None: min(model context, 2048).
    max_model_len: int | None = None
    # KV arena size: an absolute budget in bytes wins over the fraction of free memory.
    kv_cache_bytes: int | None = None
    kv_cache_fraction: float = 0.3
    max_running_requests: int = 64
    max_batched_tokens: int = 512
    # CPU only: keep a oneDNN-prepacked copy of the weights for steps of 4..48 rows
    # (speculative verification, small batches), which MKL handles poorly; one more
    # copy of the weights in memory (engine.packed_linear).
    prepack_weights: bool = True
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)
