"""Capacity planning: what fits on a device and how fast it can go, from the model's shape alone.

Memory is exact arithmetic (the same formulas the engine allocates with):

* weights: parameters x bytes per parameter;
* KV cache per token: 2 (K and V) x layers x KV heads x head dim x bytes per element;
* the KV budget: ``kv_cache_bytes``, else ``kv_cache_fraction`` of the memory left after the weights, capped
  (as the engine caps it) at what ``max_running_requests`` sequences of ``max_model_len``, plus the batch-job lines
  that may run beside them, could ever use.

Speed is an estimate from a roofline: a decode step reads every weight once and each sequence's KV once, so at
small batches it is bound by memory bandwidth; at large batches by the matrix units. Published device bandwidths
and dense bf16 rates go in, with an efficiency factor that says how much of the peak a real engine reaches.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

GIB = 1024**3
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "int4": 0.5}
# The weight formats each engine runs, by device kind (engine.backend). Our int8/int4 kernels are CPU kernels;
# vLLM's quantized formats need checkpoints quantized for them, so a plan from a float model offers only floats.
RUNNABLE_DTYPES: dict[tuple[str, str], tuple[str, ...]] = {
    ("specstream", "cpu"): ("float32", "bfloat16", "float16", "int8", "int4"),
    ("specstream", "gpu"): ("float32", "bfloat16", "float16"),
    ("vllm", "cpu"): ("float32", "bfloat16"),
    ("vllm", "gpu"): ("float32", "bfloat16", "float16"),
}


class PlanError(ValueError):
    """Inputs that cannot give a plan (a model that does not fit, no memory); the message says which."""


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that memory and speed depend on."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    max_context: int

    @classmethod
    def from_hf_config(cls, name: str, config: dict[str, Any]) -> ModelShape:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return cls(
            name=name,
            num_layers=int(config["num_hidden_layers"]),
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
            max_context=int(config.get("max_position_embeddings") or 2048),
        )

    @property
    def num_params(self) -> int:
        attention = self.hidden_size * self.head_dim * (2 * self.num_heads + 2 * self.num_kv_heads)  # q, o, k, v
        mlp = 3 * self.hidden_size * self.intermediate_size  # gate, up, down
        per_layer = attention + mlp + 2 * self.hidden_size  # two RMSNorms
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)
        return self.num_layers * per_layer + embeddings + self.hidden_size

    def kv_bytes_per_token(self, dtype_bytes: float) -> int:
        return int(2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes)


# Architecture numbers of well-known models (their public config.json), for planning without their weights.
PRESETS: dict[str, dict[str, Any]] = {
    "llama-2-7b": {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 32,
                   "intermediate_size": 11008, "vocab_size": 32000, "max_position_embeddings": 4096},
    "llama-3-8b": {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 8192},
    "mistral-7b": {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "intermediate_size": 14336, "vocab_size": 32000, "max_position_embeddings": 32768},
    "qwen2.5-7b": {"num_hidden_layers": 28, "hidden_size": 3584, "num_attention_heads": 28, "num_key_value_heads": 4,
                   "intermediate_size": 18944, "vocab_size": 152064, "max_position_embeddings": 32768},
}


@dataclass(frozen=True)
class Device:
    name: str
    memory_bytes: int
    bandwidth_bytes_s: float  # peak memory bandwidth
    flops_bf16: float  # dense half-precision matrix rate (fp32 rate for a CPU)
    efficiency: float = 0.6  # share of the peaks a real engine reaches
    overhead_bytes: int = 0  # memory that is never ours (CUDA context, activations, the runtime)


# Published peak figures (vendor data sheets: dense, no sparsity).
DEVICES: dict[str, Device] = {
    "H200-141GB": Device("H200-141GB", 141 * 10**9, 4.8e12, 989e12, overhead_bytes=3 * GIB),
    "H100-80GB": Device("H100-80GB", 80 * 10**9, 3.35e12, 989e12, overhead_bytes=3 * GIB),
    "A100-80GB": Device("A100-80GB", 80 * 10**9, 2.04e12, 312e12, overhead_bytes=3 * GIB),
    "A100-40GB": Device("A100-40GB", 40 * 10**9, 1.56e12, 312e12, overhead_bytes=3 * GIB),
    "L40S-48GB": Device("L40S-48GB", 48 * 10**9, 0.864e12, 362e12, overhead_bytes=2 * GIB),
    "A10G-24GB": Device("A10G-24GB", 24 * 10**9, 0.6e12, 70e12, overhead_bytes=2 * GIB),
    "L4-24GB": Device("L4-24GB", 24 * 10**9, 0.3e12, 121e12, overhead_bytes=2 * GIB),
    "T4-16GB": Device("T4-16GB", 16 * 10**9, 0.32e12, 65e12, overhead_bytes=2 * GIB),
}


def cpu_device(memory_bytes: int, *, bandwidth_bytes_s: float = 22e9, flops: float = 230e9) -> Device:
    """This machine's CPU: memory as given; bandwidth and fp32 GEMM rate as measured here
    (54e26a1:docs/benchmarks.md)."""
    return Device("cpu", memory_bytes, bandwidth_bytes_s, flops, efficiency=0.8, overhead_bytes=GIB)


@dataclass(frozen=True)
class Workload:
    prompt_tokens: int = 512
    output_tokens: int = 256
    requests_per_s: float | None = None  # target arrival rate, for replicas and partitions

    @property
    def sequence_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True)
class Estimate:
    batch: int
    step_s: float
    tokens_per_s: float
    bound: str  # "memory" or "compute"


@dataclass(frozen=True)
class Plan:
    model: ModelShape
    device: Device
    dtype: str
    max_model_len: int
    weights_bytes: int
    kv_bytes_per_token: int
    kv_budget_bytes: int
    kv_tokens: int
    max_sequences: int  # of the workload's length, at once
    estimates: list[Estimate] = field(default_factory=list)
    max_running_requests: int = 0
    replicas: int | None = None
    partitions: int = 6
    backend: str = "specstream"

    def settings(self) -> dict[str, Any]:
        """The configuration keys to use, as `specstream` reads them."""
        # Quantized formats are engine.weights (int8, int4); float formats engine.dtype.
        weights = {"engine.weights": self.dtype} if self.dtype in ("int8", "int4") else {"engine.dtype": self.dtype}
        return {
            "engine.backend": self.backend,
            **weights,
            "engine.max_model_len": self.max_model_len,
            "engine.kv_cache_bytes": self.kv_budget_bytes,
            "engine.max_running_requests": self.max_running_requests,
            "kafka.request_partitions": self.partitions,
        }


def plan(model: ModelShape, device: Device, *, dtype: str = "bfloat16", max_model_len: int | None = None,
         kv_cache_bytes: int | None = None, kv_cache_fraction: float = 0.9, max_running_requests: int = 256,
         draft_tokens: int = 8, workload: Workload | None = None, batch_lines: int = 0,
         backend: str = "specstream") -> Plan:
    """batch_lines: batch-job lines that may run beside max_running_requests (engine.config.batch_line_slots)."""
    if dtype not in DTYPE_BYTES:
        raise PlanError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    runnable = RUNNABLE_DTYPES[(backend, "cpu" if device.name == "cpu" else "gpu")]
    if dtype not in runnable:
        raise PlanError(f"engine.backend {backend} does not run {dtype} weights on {device.name}; it runs "
                        f"{', '.join(runnable)}")
    if device.memory_bytes <= 0:
        raise PlanError(f"device {device.name} has no memory ({device.memory_bytes} bytes)")
    if not 0 < kv_cache_fraction <= 1:
        raise PlanError(f"kv_cache_fraction must be in (0, 1], got {kv_cache_fraction}")
    workload = workload or Workload()
    length = max_model_len or min(model.max_context, 2048)
    if workload.sequence_tokens > length:
        raise PlanError(f"the workload's requests ({workload.sequence_tokens} tokens) are longer than "
                        f"max_model_len ({length})")
    weights = int(model.num_params * DTYPE_BYTES[dtype])
    free = device.memory_bytes - device.overhead_bytes - weights
    if free <= 0:
        raise PlanError(
            f"{model.name} does not fit on {device.name}: its {dtype} weights take {weights / GIB:.1f} GiB of "
            f"{(device.memory_bytes - device.overhead_bytes) / GIB:.1f} GiB usable; use a smaller dtype, more "
            "devices or a bigger one")
    per_token = model.kv_bytes_per_token(kv_dtype_bytes(dtype))
    budget = kv_cache_bytes if kv_cache_bytes is not None else int(free * kv_cache_fraction)
    if kv_cache_bytes is not None and kv_cache_bytes > free:
        raise PlanError(f"kv_cache_bytes ({kv_cache_bytes / GIB:.1f} GiB) exceeds the {free / GIB:.1f} GiB left "
                        "after the weights")
    # As the engine does: no more slots than every running sequence at full length (+ draft slack) could use.
    slack = draft_tokens + 1
    tokens = min(budget // per_token, (max_running_requests + batch_lines) * (length + slack))
    if tokens < length + slack:
        raise PlanError(f"a KV budget of {budget / GIB:.2f} GiB holds {tokens} tokens: not one sequence of "
                        f"max_model_len {length}")
    sequences = tokens // (workload.sequence_tokens + slack)
    running = max(1, min(max_running_requests, sequences))
    estimates = [estimate(model, device, dtype, b, workload) for b in _batches(running)]
    result = Plan(model, device, dtype, length, weights, per_token, budget, tokens, sequences, estimates, running,
                  backend=backend)
    return _size_fleet(result, workload)


def kv_dtype_bytes(weights_dtype: str) -> float:
    """The KV cache keeps the activations' dtype: quantized weights still compute (and cache) in bf16."""
    return DTYPE_BYTES[weights_dtype] if weights_dtype in ("float32", "bfloat16", "float16") else 2


def estimate(model: ModelShape, device: Device, dtype: str, batch: int, workload: Workload) -> Estimate:
    """One decode step of `batch` sequences at the workload's mean context length."""
    context = workload.prompt_tokens + workload.output_tokens // 2
    read = model.num_params * DTYPE_BYTES[dtype] + batch * context * model.kv_bytes_per_token(kv_dtype_bytes(dtype))
    memory_s = read / (device.bandwidth_bytes_s * device.efficiency)
    compute_s = 2 * model.num_params * batch / (device.flops_bf16 * device.efficiency)
    step = max(memory_s, compute_s)
    return Estimate(batch, step, batch / step, "memory" if memory_s >= compute_s else "compute")


def _batches(most: int) -> list[int]:
    sizes = [b for b in (1, 4, 16, 64, 256) if b < most]
    return [*sizes, most]


def _size_fleet(result: Plan, workload: Workload) -> Plan:
    if workload.requests_per_s is None:
        return result
    best = result.estimates[-1]
    per_replica = best.tokens_per_s / workload.output_tokens  # requests/s one replica finishes at full batch
    replicas = max(1, math.ceil(workload.requests_per_s / per_replica))
    # KEDA never runs more consumers than partitions; leave room to grow twice.
    partitions = max(6, 2 * replicas)
    return Plan(**{**result.__dict__, "replicas": replicas, "partitions": partitions})
