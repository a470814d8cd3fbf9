"""``specstream plan``: weights, KV cache, concurrency and throughput of a model on a device, and the settings to use.

    specstream plan --model smollm2-135m-instruct --device cpu
    specstream plan --model llama-3-8b --device H100-80GB --max-model-len 8192 --request-rate 20
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from streams.commands.common import say
from streams.config import Settings, parse_byte_size
from streams.ops.capacity import DEVICES, GIB, PRESETS, ModelShape, Plan, PlanError, Workload, cpu_device, plan

EXIT_BAD_INPUT = 2


def add_commands(commands: Any) -> None:
    p = commands.add_parser("plan", help="capacity plan: memory, KV cache, concurrency, throughput, settings")
    p.add_argument("--model", help="a served model name, a Hugging Face model folder, or a preset: "
                   + ", ".join(PRESETS) + " (default: engine.model)")
    p.add_argument("--device", default="cpu", help="cpu (this machine) or one of " + ", ".join(DEVICES))
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16", "int8", "int4"],
                   help="weights dtype (default: on cpu, what engine.weights serves the model's file in, e.g. int4 for "
                   "the default model; bfloat16 on a GPU)")
    p.add_argument("--backend", choices=["specstream", "vllm"], default=None,
                   help="the engine that will serve it (default: engine.backend); only its formats are offered")
    p.add_argument("--max-model-len", type=int, help="longest prompt + completion (default: min(context, 2048))")
    p.add_argument("--kv-cache-fraction", type=float, default=None,
                   help="share of the memory left after the weights for the KV cache (default: engine's)")
    p.add_argument("--kv-cache-bytes", help="KV budget in bytes, e.g. 512MiB (wins over the fraction)")
    p.add_argument("--memory", help="override the device's memory, e.g. 64GiB")
    p.add_argument("--prompt-tokens", type=int, default=512, help="mean prompt length of the workload")
    p.add_argument("--output-tokens", type=int, default=256, help="mean completion length of the workload")
    p.add_argument("--request-rate", type=float, help="target requests per second: replicas and partitions")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(handler=cmd_plan)


def cmd_plan(args: argparse.Namespace, settings: Settings) -> int:
    try:
        result = _plan(args, settings)
    except PlanError as error:
        say(f"plan: {error}")
        return EXIT_BAD_INPUT
    print(json.dumps(as_dict(result), indent=2) if args.json else render(result))
    return 0


def _plan(args: argparse.Namespace, settings: Settings) -> Plan:
    engine = settings.engine
    model = load_shape(args.model or engine.model)
    device = _device(args.device, args.memory)
    dtype = args.dtype or _served_dtype(args.model or engine.model, device.name, engine.weights, args.backend or
                                        engine.backend)
    kv_bytes = _size(args.kv_cache_bytes, "--kv-cache-bytes") if args.kv_cache_bytes else None
    for name, value in (("--prompt-tokens", args.prompt_tokens), ("--output-tokens", args.output_tokens)):
        if value <= 0:
            raise PlanError(f"{name} must be positive, got {value}")
    if args.request_rate is not None and args.request_rate <= 0:
        raise PlanError(f"--request-rate must be positive, got {args.request_rate}")
    # Imported here: torch comes with the engine package.
    from engine.config import batch_line_slots

    spec = engine.speculation
    return plan(
        model, device, dtype=dtype, max_model_len=args.max_model_len or engine.max_model_len,
        kv_cache_bytes=kv_bytes, kv_cache_fraction=args.kv_cache_fraction or engine.kv_cache_fraction,
        max_running_requests=engine.max_running_requests,
        draft_tokens=spec.max_draft_tokens if spec.enabled else 0,
        workload=Workload(args.prompt_tokens, args.output_tokens, args.request_rate),
        batch_lines=batch_line_slots(engine.max_running_requests, engine.batch_max_share),
        backend=args.backend or engine.backend,
    )


# engine.weights -> the plan's dtype names
# gguf: the file's own types, 4 bits (Q4_K) to 8 (Q5_0, Q6_K, Q8_0) a weight in our kernel: planned at the most.
_FORMAT_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "int8": "int8", "int4": "int4", "gguf": "int8"}


def _served_dtype(name_or_path: str, device: str, weights: str, backend: str) -> str:
    """The weights' dtype the worker will serve: bfloat16 on a GPU; on a CPU engine.weights, where auto is the format
    that keeps the model's file exactly (engine/quant/source.py; a preset has no file: float32)."""
    if device != "cpu":
        return "bfloat16"
    if backend != "specstream":
        return "float32"
    if weights != "auto":
        return _FORMAT_DTYPES[weights]
    if name_or_path in PRESETS:
        return "float32"
    from engine.loader import resolve_model_dir
    from engine.model_ref import gguf_for
    from engine.quant.source import weight_source

    gguf = gguf_for(name_or_path)
    folder = Path(name_or_path) if gguf is None else resolve_model_dir(name_or_path)
    source = weight_source(folder, gguf[0] if gguf else None)
    return _FORMAT_DTYPES[source.lossless] if source is not None else "float32"


def load_shape(name_or_path: str) -> ModelShape:
    """A preset's numbers, a folder's config.json, or a served model (converted once, like the engine does)."""
    if name_or_path in PRESETS:
        return ModelShape.from_hf_config(name_or_path, PRESETS[name_or_path])
    folder = Path(name_or_path)
    if not (folder / "config.json").is_file():
        from engine.loader import resolve_model_dir

        try:
            folder = resolve_model_dir(name_or_path)
        except (FileNotFoundError, ValueError, KeyError) as error:
            raise PlanError(f"unknown model {name_or_path!r}: {error}; presets: {', '.join(PRESETS)}") from None
    config = json.loads((folder / "config.json").read_text())
    try:
        return ModelShape.from_hf_config(name_or_path, config)
    except KeyError as error:
        raise PlanError(f"{folder / 'config.json'} lacks {error} (not a decoder-only transformer?)") from None


def _device(name: str, memory: str | None) -> Any:
    if name == "cpu":
        device = cpu_device(_memory_total())
    elif name in DEVICES:
        device = DEVICES[name]
    else:
        raise PlanError(f"unknown device {name!r}; known: cpu, {', '.join(DEVICES)}")
    if memory is not None:
        device = type(device)(**{**device.__dict__, "memory_bytes": _size(memory, "--memory")})
    return device


def _size(text: str, flag: str) -> int:
    try:
        value = int(parse_byte_size(text))
    except ValueError as error:
        raise PlanError(f"{flag}: {error}") from None
    if value <= 0:
        raise PlanError(f"{flag} must be positive, got {text!r}")
    return value


def _memory_total() -> int:
    with open("/proc/meminfo") as meminfo:
        for line in meminfo:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    raise PlanError("cannot read this machine's memory from /proc/meminfo; pass --memory")


def as_dict(p: Plan) -> dict[str, Any]:
    return {
        "model": p.model.name, "device": p.device.name, "dtype": p.dtype, "params": p.model.num_params,
        "weights_bytes": p.weights_bytes, "kv_bytes_per_token": p.kv_bytes_per_token,
        "kv_budget_bytes": p.kv_budget_bytes, "kv_tokens": p.kv_tokens, "max_sequences": p.max_sequences,
        "estimates": [e.__dict__ for e in p.estimates], "replicas": p.replicas, "settings": p.settings(),
    }


def render(p: Plan) -> str:
    lines = [
        f"{p.model.name}: {p.model.num_params / 1e9:.3g} B parameters, {p.model.num_layers} layers, "
        f"{p.model.num_kv_heads} KV heads x {p.model.head_dim}",
        f"device {p.device.name}: {p.device.memory_bytes / GIB:.1f} GiB, "
        f"{p.device.bandwidth_bytes_s / 1e9:.0f} GB/s",
        f"weights ({p.dtype}): {p.weights_bytes / GIB:.2f} GiB",
        f"KV cache: {p.kv_bytes_per_token / 1024:.1f} KiB per token; budget {p.kv_budget_bytes / GIB:.2f} GiB "
        f"= {p.kv_tokens} tokens = {p.max_sequences} sequences of this workload at once",
        "decode estimate (roofline at the workload's mean context):",
    ]
    lines += [f"  batch {e.batch:>4}: {e.step_s * 1000:8.1f} ms/step, {e.tokens_per_s:9.0f} tok/s ({e.bound}-bound)"
              for e in p.estimates]
    if p.replicas is not None:
        lines.append(f"replicas for the target rate: {p.replicas}")
    lines.append("settings:")
    lines += [f"  {key}: {value}" for key, value in p.settings().items()]
    return "\n".join(lines)
