"""The engine's settings, each declared once: a field here, with its type, bounds, default and description.

These pydantic models are the engine's configuration and, as they are, the `engine:` section of specstream's YAML
(streams.config reads them, with the environment overrides; config.example.yaml and the configuration reference
are generated from these descriptions). Why pydantic here rather than dataclasses the settings copy into: a copy is
a second declaration, and engine/ cannot import streams/. So adding a setting is one field below. Torch-free:
reading or checking a configuration must stay cheap. Knobs only code sets (the speculation controller's priors,
the draft arena) are not settings: engine.speculative.config.SpeculationTuning.
"""
from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

__all__ = [
    "ADAPTER_NAME",
    "DEFAULT_MODEL",
    "ByteSize",
    "DispatchMode",
    "DraftSampling",
    "EngineConfig",
    "LoRAConfig",
    "Section",
    "SpecMethod",
    "SpeculationConfig",
    "batch_line_slots",
    "embedded_engine_config",
    "parse_byte_size",
]

DEFAULT_MODEL = "smollm2-135m-instruct"

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1024, "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
          "g": 1000**3, "gb": 1000**3, "gib": 1024**3}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_byte_size(value: Any) -> Any:
    """Accept byte sizes as numbers or as strings like ``512MiB`` / ``2GB`` (binary and decimal units)."""
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match is None or match.group(2).lower() not in _UNITS:
            raise ValueError(f"expected a byte size such as 1048576, 512KiB or 2GB, got {value!r}")
        return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    return value


ByteSize = Annotated[int, BeforeValidator(parse_byte_size)]


class Section(BaseModel):
    """A part of the configuration: unknown keys are errors, and the values never change once validated."""

    # Frozen: settings are read by several threads (engine driver, event loop).
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


SpecMethod = Literal["ngram", "draft", "eagle", "suffix"]
# How a draft model drafts for sampled (temperature > 0) requests; greedy
# requests always draft the argmax.
#   "greedy":  draft argmax q. Deterministic proposal, so the verifier's coupled
#              rule makes the text identical to non-speculative seeded sampling:
#              a redelivered request regenerates the same text whatever draft
#              lengths the controller picks. Acceptance is p(argmax q), which is
#              poor at high temperature.
#   "coupled": draft argmax(q_t / E_t) with the SAME position-keyed noise E_t the
#              target's sample at position t uses. Still deterministic given the
#              prefix and seed, so the same reproducibility as "greedy", and
#              usually much higher acceptance at temperature > 0 (when q == p
#              the draft always matches; in general P(match) >= (1-TV)/(1+TV)).
#   "sampled": draft d ~ q with the draft's own noise, verified with the
#              Leviathan/Chen rejection rule: optimal acceptance 1 - TV(p, q),
#              lossless in distribution, but the text then depends on which
#              positions were drafted, i.e. on the controller's timing-driven
#              draft lengths, so redelivery may produce different text.
DraftSampling = Literal["greedy", "coupled", "sampled"]


class SpeculationConfig(Section):
    enabled: bool = Field(default=True, description="Speculative decoding on by default; requests may turn it off.")
    method: SpecMethod = Field(
        default="ngram",
        description="ngram: draft from the request's own text (no extra model); draft: a small draft model; "
        "eagle: a draft head trained for the target (specstream draft train); suffix: suffix decoding, from the "
        "request's own text and from the outputs of earlier requests (no extra model).",
    )
    draft_model: str | None = Field(default=None, description="Name or path of the draft model (method: draft).")
    # engine.speculative.eagle_artifact resolves it: a version folder, a head folder (its newest version) or a name.
    draft_head: str | None = Field(
        default=None, min_length=1,
        description="Trained draft head (method: eagle): a folder from `specstream draft train`, or its name under "
        "~/.cache/specstream/draft-heads; checked against the target when the worker starts.",
    )
    eagle_prompt_lookup: bool = Field(
        default=True,
        description="Method eagle: draft by prompt lookup (as method ngram, ngram_min..ngram_max) wherever it "
        "finds a match, by the head elsewhere.",
    )
    eagle_suffix: bool = Field(
        default=False,
        description="Method eagle: draft by suffix decoding (as method suffix) wherever it finds a match, before "
        "prompt lookup and the head.",
    )
    suffix_max_depth: int = Field(
        default=24, ge=4, le=256, description="Suffix decoding: the longest tail of a request matched."
    )
    suffix_max_spec_factor: float = Field(
        default=1.0, gt=0.0,
        description="Suffix decoding: a draft is at most this many tokens per token of its match (and at most "
        "max_draft_tokens).",
    )
    suffix_min_token_prob: float = Field(
        default=0.1, ge=0.0, le=1.0,
        description="Suffix decoding: a draft stops where the frequency of its path (the product of each token's "
        "share of what followed before) falls below this.",
    )
    suffix_max_outputs: int = Field(
        default=10_000, ge=0, description="Suffix decoding: outputs kept for drafting (the oldest go first)."
    )
    suffix_max_output_tokens: int = Field(
        default=1_000_000, ge=0,
        description="Suffix decoding: tokens of outputs kept for drafting (the oldest outputs go first); 0.1-0.3 KB "
        "each (repetitive to unrepetitive text).",
    )
    suffix_shared: bool = Field(
        default=False,
        description="Suffix decoding in a worker: past outputs draft for every tenant; false: a tenant's outputs "
        "draft only for that tenant. Outputs of tenants with log_prompts false are never kept.",
    )
    suffix_follow_completions: bool = Field(
        default=True,
        description="Suffix decoding in a worker: learn also from what every other worker generates, reading the "
        "completions topic (eval.log_completions) from its start at start, then as it grows.",
    )
    draft_sampling: DraftSampling = Field(
        default="greedy",
        description="How a draft model drafts for sampled requests; greedy and coupled keep seeded text reproducible.",
    )
    # k_max: also sizes every KV region's draft slack.
    max_draft_tokens: int = Field(default=8, gt=0, le=64, description="Most draft tokens verified per target forward.")
    adaptive: bool = Field(
        default=True,
        description="Adapt draft lengths to measured acceptance and step costs; false always drafts max_draft_tokens.",
    )
    min_acceptance: float = Field(
        default=0.3, ge=0.0, lt=1.0,
        description="Below this acceptance rate a sequence stops speculating (and probes again later); down to "
        "half of it where the measured step costs say its drafts still pay.",
    )
    probe_interval_steps: int = Field(
        default=16, gt=0, description="Steps between probes of a sequence that stopped speculating."
    )
    ngram_min: int = Field(default=1, ge=1, description="Shortest n-gram matched when drafting (method: ngram).")
    ngram_max: int = Field(default=4, ge=1, description="Longest n-gram matched when drafting (method: ngram).")

    @model_validator(mode="after")
    def _consistent(self) -> SpeculationConfig:
        if self.method == "draft" and not self.draft_model:
            raise ValueError("method 'draft' needs draft_model")
        if self.method == "eagle" and not self.draft_head:
            raise ValueError("method 'eagle' needs draft_head (train one with `specstream draft train`)")
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) exceeds ngram_max ({self.ngram_max})")
        return self


ADAPTER_NAME = r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"


class LoRAConfig(Section):
    adapters: dict[str, str] = Field(
        default_factory=dict,
        description="LoRA adapters served from the start, name: local PEFT folder (adapter_config.json + "
        "adapter_model.safetensors); each is a model of its own name (its parent is engine.model).",
    )
    # One slot each, sized for max_rank; the least recently used one without requests is evicted.
    max_loaded: int = Field(
        default=4, ge=0, le=64,
        description="LoRA adapters in memory at once (least recently used evicted, read again on demand); "
        "0 turns LoRA off (no adapter can be loaded).",
    )
    max_rank: int = Field(default=16, ge=1, le=256, description="Largest LoRA rank accepted; larger is refused at load.")
    # Read by the edge and the worker (who may load adapters), not by the engine.
    runtime_updates: bool = Field(
        default=False,
        description="Allow POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's "
        "VLLM_ALLOW_RUNTIME_LORA_UPDATING): any API key may then make every worker read a folder it can reach. "
        "Off: those routes answer 403; `specstream adapters` (Kafka access) still works.",
    )

    @property
    def enabled(self) -> bool:
        """LoRA slots exist (max_loaded > 0): without them the engine serves the base model only."""
        return self.max_loaded > 0

    @model_validator(mode="after")
    def _names(self) -> LoRAConfig:
        for name, path in self.adapters.items():
            if not re.match(ADAPTER_NAME, name):
                raise ValueError(f"adapters: name {name!r} must match {ADAPTER_NAME}")
            if not path.strip():
                raise ValueError(f"adapters.{name}: the path is empty")
        if self.adapters and self.max_loaded == 0:
            raise ValueError("adapters are listed but max_loaded is 0 (LoRA off)")
        return self


# engine.kernel_dispatch: which step sizes run on which matmul kernel, measured or fixed.
DispatchMode = Literal["auto", "fixed"]


def batch_line_slots(max_running_requests: int, batch_max_share: float) -> int:
    """How many batch-job lines may run beside the interactive requests (at least one: a small engine still runs a
    batch)."""
    return max(1, int(batch_max_share * max_running_requests))


class EngineConfig(Section):
    backend: Literal["specstream", "vllm"] = Field(
        default="specstream",
        description="Which engine the worker runs: specstream (ours) or vllm (vLLM's engine behind the same topics; "
        "installed apart by ./dev setup vllm into .venv-vllm, where specstream worker moves itself).",
    )
    vllm_core_process: bool = Field(
        default=False,
        description="backend vllm: run vLLM's engine core in a child process (as vllm serve does) instead of the "
        "worker's own; the child dies with the worker.",
    )
    # A known model name (engine.model_ref.KNOWN_MODELS), a local HF model folder or a .gguf file.
    model: str = Field(
        default=DEFAULT_MODEL, min_length=1,
        description="A known model name, a local Hugging Face model folder or a .gguf file.",
    )
    device: str = Field(
        default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$", description="cpu, cuda, cuda:N, or auto (CUDA if present)."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="Weights and KV cache dtype; auto picks one for the device."
    )
    # Set by LLMEngine.from_config (engine.threads). None, which code embedding the engine passes (tests, tools,
    # benchmarks: embedded_engine_config), leaves torch's setting as the process has it.
    threads: int | None = Field(
        default=0, ge=0, le=1024,
        description="Torch intra-op threads of the engine worker's process; 0: torch's default (one per physical "
        "core) but one fewer than the CPUs the process may use, at least 1, so the worker's event loop and the "
        "host's other services keep a core and no OpenMP thread of a step waits on a descheduled peer.",
    )
    max_model_len: int | None = Field(
        default=None, ge=16, description="Longest prompt + completion in tokens; null: min(model context, 2048)."
    )
    # An absolute budget wins over the fraction of free memory (engine.kv_cache.kv_budget_bytes).
    kv_cache_bytes: ByteSize | None = Field(
        default=None, gt=0, description="KV cache budget in bytes (e.g. 512MiB); wins over kv_cache_fraction."
    )
    kv_cache_fraction: float = Field(
        default=0.3, gt=0.0, le=0.95, description="KV cache budget as a fraction of free memory."
    )
    # engine.engine_setup.kv_cache_dtype resolves auto.
    kv_cache_dtype: Literal["auto", "float32", "bfloat16"] = Field(
        default="auto",
        description="The KV cache's element type (vLLM's kv_cache_dtype). bfloat16 halves what attention reads per "
        "step and doubles the tokens a budget holds; attention still sums in fp32. auto: bfloat16 with weights "
        "bf16/int8/int4 (as llama.cpp keeps f16 K and V beside its quantized files), else the model's dtype.",
    )
    max_running_requests: int = Field(
        default=64, ge=1,
        description="Most requests decoded together in one batch; batch-job lines never take these slots from "
        "interactive requests (see batch_max_share).",
    )
    # Any positive budget works (the scheduler chunks prefill to it); tests use small ones to force chunking.
    max_batched_tokens: int = Field(default=512, ge=1, description="Most tokens (prefill + decode) in one engine step.")
    # The three batch_* settings are read by engine.scheduler.
    batch_max_share: float = Field(
        default=0.5, gt=0.0, le=1.0,
        description="Share of max_running_requests that batch-job lines (the lowest priority) may hold, in slots "
        "interactive work leaves free; interactive requests still get every slot, admitted at the next step beside "
        "running lines, preempting one only when KV memory is short.",
    )
    batch_headroom: int = Field(
        default=2, ge=0,
        description="Running slots a new batch-job line must leave free: batch lines are not replaced while "
        "interactive work fills the rest, so a burst of interactive arrivals finds slots at once.",
    )
    batch_step_tokens: int = Field(
        default=32, ge=1,
        description="Most tokens of batch-job work in one engine step beyond one decode row per running line (their "
        "prompt tokens, then their speculative drafts); steps that carry interactive prefill carry no batch work at "
        "all. Bounds how much longer batch work makes the step an interactive request waits behind.",
    )
    # engine.prefix_cache: reuse the KV of any earlier or running sequence whose prompt prefix (and adapter) matches.
    prefix_caching: bool = Field(
        default=True,
        description="Automatic prefix caching (vLLM's enable_prefix_caching): a request whose prompt starts with "
        "the tokens of an earlier or running request (same LoRA adapter) copies their KV instead of computing it "
        "again, in blocks of 16 tokens; the last prompt token is always computed. Cached blocks nobody runs on are "
        "evicted least recently used first. Outputs are the same with it on and off.",
    )
    # engine.packed_linear; with a quantized format engine.quant.linear.
    prepack_weights: bool = Field(
        default=True,
        description="CPU: keep a oneDNN-prepacked copy of the weights for the step sizes where it beats the plain "
        "GEMM (see kernel_dispatch); costs one more copy of the weights in memory. With weights int4/int8: a bf16 "
        "copy for the steps too wide for the quantized kernel instead.",
    )
    kernel_dispatch: DispatchMode = Field(
        default="auto",
        description="CPU: which step sizes run on which matmul kernel. auto: measured on this CPU at load (1-3 s "
        "once, then cached in ~/.cache/specstream/calibration) and logged; fixed: the Intel dev machine's "
        "thresholds (fp32 prepacked for 4-48 rows, int4/int8 kernel up to 9), for reproducible runs.",
    )
    # engine.fused.decoder_step.
    fused_step: bool = Field(
        default=True,
        description="CPU with weights int4/int8/gguf/bf16: run each step's decoder layers as one C++ call (compiled "
        "with g++ on first use, ~1 min, cached in ~/.cache/specstream/ops), bit for bit the layer-by-layer path's "
        "results without its per-op Python, and attend a decode's row and a verification's rows with one C++ kernel "
        "call per sequence. It takes the Llama family's layers with biases (Qwen2) and q/k norms (Qwen3), sliding "
        "windows (Mistral, Phi-3), Gemma 3's (sandwich norms, GeGLU, local layers with their own RoPE base) and "
        "Gemma 2's soft-capped attention scores; Mixtral's experts run layer by layer. A model or machine it cannot "
        "serve says why at start and runs layer by layer.",
    )
    # engine.quant.formats resolves it against the CPU, engine.quant.source says what keeps the file exactly.
    weights: Literal["auto", "fp32", "bf16", "int8", "int4", "gguf"] = Field(
        default="auto",
        description="CPU weight format. auto: the fastest format that keeps the model's file exactly, said at start: "
        "int4 for a GGUF of Q4_0/Q4_1 blocks (the default model: its codes as they are, the Q8_0 embedding too), "
        "gguf for a GGUF of other types our kernel serves as they are (Q4_K, Q5_0, Q5_1, Q5_K, Q6_K, Q8_0: "
        "Q4_K_M and similar downloads), bf16 for a bf16 checkpoint, else fp32. int4/int8 (weight-only; a GGUF's "
        "other types quantized once) and gguf run on our kernel with AVX2 or AVX512-VNNI, bf16 needs AVX-512; a CPU "
        "lacking what a format needs gets fp32, saying why.",
    )
    # engine.quant.vnni.
    quant_kernel: Literal["auto", "torch"] = Field(
        default="auto",
        description="CPU with weights int4/int8: auto runs our kernel, which quantizes activations to int8 in "
        "blocks of 32 as llama.cpp does and sums in integers with AVX512-VNNI or AVX2 (the same bits either way; "
        "built with the fused step's g++, cached), else torch's weight-only kernels (bf16 activations); torch: "
        "always torch's. Said at start.",
    )
    speculation: SpeculationConfig = Field(default_factory=SpeculationConfig)
    lora: LoRAConfig = Field(default_factory=LoRAConfig)

    @model_validator(mode="after")
    def _adapters_are_not_the_base(self) -> EngineConfig:
        if self.model in self.lora.adapters:
            raise ValueError(f"lora.adapters: {self.model!r} is the base model's name")
        return self

    @property
    def max_sequences(self) -> int:
        """Sequences that may run at once: the interactive requests plus the batch lines beside them."""
        return self.max_running_requests + batch_line_slots(self.max_running_requests, self.batch_max_share)


def embedded_engine_config(**settings: Any) -> EngineConfig:
    """The configuration of an engine that code runs in a process of its own (tests, benchmarks, tools) rather than
    a worker: torch's threads stay as that process set them and no LoRA slots are made unless `lora` is given; every
    other setting as given or at its default. Validated like the YAML."""
    return EngineConfig(**({"threads": None, "lora": LoRAConfig(max_loaded=0)} | settings))
