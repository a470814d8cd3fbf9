"""Engine configuration: plain dataclasses.

The YAML / pydantic settings (streams/config.py) validate user input and build
these; the engine reads them as they are. The speculation part is
engine.spec.config.SpeculationConfig (re-exported here).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.lora.config import LoRAConfig
from engine.spec.config import SpeculationConfig

__all__ = ["DEFAULT_MODEL", "EngineConfig", "LoRAConfig", "SpeculationConfig"]

DEFAULT_MODEL = "smollm2-135m-instruct"


def batch_line_slots(max_running_requests: int, batch_max_share: float) -> int:
    """How many batch-job lines may run beside the interactive requests (at least one: a small engine still runs a
    batch)."""
    return max(1, int(batch_max_share * max_running_requests))


@dataclass
class EngineConfig:
    # A known model name (see engine.model_ref.KNOWN_MODELS), a local HF model folder or a .gguf file.
    model: str = DEFAULT_MODEL
    device: str = "auto"  # "auto" | "cpu" | "cuda" | "cuda:N"
    # Torch intra-op threads of the process, set by LLMEngine.from_config (engine.threads): 0 auto (one CPU left
    # to the rest of the process and host), None leaves torch's setting as it is (tests, in-process tools).
    threads: int | None = None
    dtype: str = "auto"  # "auto" | "float32" | "bfloat16" | "float16"
    # None: min(model context, 2048).
    max_model_len: int | None = None
    # KV arena size: an absolute budget in bytes wins over the fraction of free memory.
    kv_cache_bytes: int | None = None
    kv_cache_fraction: float = 0.3
    # The KV arena's element: "auto" | "float32" | "bfloat16" (vLLM's kv_cache_dtype). auto: bfloat16 with the
    # reduced-precision weight formats (bf16, int8, int4; as llama.cpp keeps f16 K and V beside its quantized
    # weights), else the model's dtype (engine.engine_setup.kv_cache_dtype).
    kv_cache_dtype: str = "auto"
    max_running_requests: int = 64
    max_batched_tokens: int = 512
    # Batch work (requests at the lowest priority, 10: offline batch jobs) runs at most this share of
    # max_running_requests lines, beside the interactive requests, never in their slots (engine.scheduler).
    batch_max_share: float = 0.5
    # Running slots a new batch line must leave free: room for a burst of interactive arrivals (engine.scheduler).
    batch_headroom: int = 2
    # Most tokens of batch work beyond one decode row per running line in one step (prompt tokens, then drafts);
    # steps with interactive prefill carry no batch work at all: bounds what the step an interactive arrival waits
    # behind can hold of batch work (engine.scheduler).
    batch_step_tokens: int = 32
    # Reuse the KV of any earlier or running sequence whose prompt prefix (and adapter) matches (engine.prefix_cache).
    prefix_caching: bool = True
    # CPU only: keep a oneDNN-prepacked copy of the weights for the step sizes where it beats
    # the plain GEMM (speculative verification, small batches); one more copy of the weights
    # in memory (engine.packed_linear). With a quantized format: a bf16 copy for the steps
    # where it beats the quantized kernel (engine.quant.linear).
    prepack_weights: bool = True
    # Which step sizes (rows) take which kernel: "auto" measures it on this CPU at load (cached,
    # engine.kernel_dispatch); "fixed" keeps one Intel machine's thresholds (fp32 packed for
    # 4..48 rows, int4/int8 kernel up to 9), for reproducible runs.
    kernel_dispatch: str = "auto"
    # CPU, int4/int8/bf16 weights: run each step's decoder layers as one C++ call
    # (engine.fused.decoder_step; built with g++ once and cached), the same bits as the eager layers.
    fused_step: bool = True
    # Weight format: "auto" | "fp32" | "bf16" | "int8" | "int4" (engine.quant.formats). fp32 is
    # the default until the quiet-machine benchmark confirms auto (int4 on AVX-512 + BF16 CPUs).
    weights: str = "fp32"
    # int4/int8: "auto" runs our int8-activation VNNI kernel where the CPU has it (engine.quant.vnni), else
    # torch's weight-only kernels; "torch" always torch's.
    quant_kernel: str = "auto"
    speculation: SpeculationConfig = field(default_factory=SpeculationConfig)
    # LoRA adapters (engine.lora); None: the base model only, no adapter can be loaded.
    lora: LoRAConfig | None = None

    @property
    def max_sequences(self) -> int:
        """Sequences that may run at once: the interactive requests plus the batch lines beside them."""
        return self.max_running_requests + batch_line_slots(self.max_running_requests, self.batch_max_share)
