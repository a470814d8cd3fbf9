"""One PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors), checked against the base model.

What is refused, at load and with a message naming it: DoRA, LoRA on the
embedding or the LM head, modules_to_save (full copies of base modules),
trained biases, alpha_pattern, fan_in_fan_out, a rank above max_rank, a
tensor whose shape does not fit the base model, any tensor we do not know.

The weights are kept per PEFT projection (q_proj, k_proj, ... down_proj) as
A^T [in, r] and scaling * B^T [r, out], the layout the delta's matmuls take;
`engine.lora.layers` maps them into the decoder's fused qkv / gate_up linears.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.model import DecoderConfig

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (PEFT drops the adapter name when saving)
_KEY = re.compile(
    r"^base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(" + "|".join(PROJECTIONS) + r")\.lora_([AB])\.weight$"
)
_REFUSED_TARGETS = ("embed_tokens", "lm_head")


class AdapterError(ValueError):
    """The adapter cannot be served; the message says why (shown in the load response and the worker log)."""


@dataclass
class LoRAAdapter:
    name: str
    path: str
    rank: int  # the largest rank of its modules
    # (layer, projection) -> (A^T [in, r], scaling * B^T [r, out]), in the model dtype.
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    def nbytes(self) -> int:
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.weights.values())


def projection_shapes(cfg: DecoderConfig) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each unfused base projection."""
    q, kv, h, i = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def _read_config(folder: Path) -> dict[str, object]:
    path = folder / "adapter_config.json"
    if not folder.is_dir():
        raise AdapterError(f"adapter path {str(folder)!r} is not a directory")
    if not path.is_file():
        raise AdapterError(f"{str(folder)!r} has no adapter_config.json")
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise AdapterError(f"{path}: unreadable adapter_config.json ({exc})") from exc
    if not isinstance(config, dict):
        raise AdapterError(f"{path}: adapter_config.json is not a JSON object")
    return config


def _check_config(config: dict[str, object], where: str) -> float:
    """Refuse what we do not serve; returns lora_alpha."""
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{where}: peft_type {config.get('peft_type')!r} is not supported (only LORA)")
    if config.get("use_dora"):
        raise AdapterError(f"{where}: DoRA adapters (use_dora: true) are not supported")
    if config.get("modules_to_save"):
        raise AdapterError(f"{where}: modules_to_save {config['modules_to_save']!r} is not supported "
                           "(full copies of base modules)")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"{where}: trained biases (bias: {config['bias']!r}) are not supported")
    if config.get("alpha_pattern"):
        raise AdapterError(f"{where}: alpha_pattern is not supported")
    if config.get("fan_in_fan_out"):
        raise AdapterError(f"{where}: fan_in_fan_out is not supported")
    targets = config.get("target_modules") or []
    targets = [targets] if isinstance(targets, str) else list(targets)  # type: ignore[arg-type]
    for refused in _REFUSED_TARGETS:
        if any(refused in str(t) for t in targets):
            raise AdapterError(f"{where}: LoRA on {refused} is not supported (only attention and MLP projections)")
    alpha = config.get("lora_alpha", 8)
    if not isinstance(alpha, (int, float)):
        raise AdapterError(f"{where}: lora_alpha {alpha!r} is not a number")
    return float(alpha)


def _load_tensors(folder: Path) -> dict[str, torch.Tensor]:
    path = folder / "adapter_model.safetensors"
    if not path.is_file():
        raise AdapterError(f"{str(folder)!r} has no adapter_model.safetensors")
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises several kinds for a broken file
        raise AdapterError(f"{path}: unreadable safetensors file ({exc})") from exc


def _pair(
    key_a: str, a: torch.Tensor, b: torch.Tensor | None, shape: tuple[int, int], max_rank: int, where: str
) -> int:
    """Checks one module's A [r, in] and B [out, r]; returns r."""
    if b is None:
        raise AdapterError(f"{where}: {key_a} has no matching lora_B")
    in_f, out_f = shape
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != in_f or b.shape[0] != out_f or a.shape[0] != b.shape[1]:
        raise AdapterError(f"{where}: {key_a} does not fit the base model: A {tuple(a.shape)}, B {tuple(b.shape)}, "
                           f"base projection is [{out_f}, {in_f}]")
    rank = a.shape[0]
    if rank > max_rank:
        raise AdapterError(f"{where}: rank {rank} exceeds max_rank {max_rank}")
    return rank


def read_adapter(
    name: str, path: str | Path, cfg: DecoderConfig, max_rank: int, dtype: torch.dtype = torch.float32
) -> LoRAAdapter:
    """Read and check an adapter folder (files and CPU tensors only: safe off the engine thread)."""
    folder = Path(path).expanduser()
    where = f"adapter {name!r} ({folder})"
    config = _read_config(folder)
    alpha = _check_config(config, where)
    rslora = bool(config.get("use_rslora", False))
    tensors = _load_tensors(folder)
    shapes = projection_shapes(cfg)
    found: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise AdapterError(f"{where}: unsupported tensor {key!r} (only LoRA A/B of {', '.join(PROJECTIONS)})")
        layer = int(m.group(1))
        if layer >= cfg.num_layers:
            raise AdapterError(f"{where}: {key} targets layer {layer}; the base model has {cfg.num_layers} layers")
        found.setdefault((layer, m.group(2)), {})[m.group(3)] = tensor
    if not found:
        raise AdapterError(f"{where}: adapter_model.safetensors holds no LoRA weights")
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = {}
    top_rank = 0
    for (layer, proj), pair in sorted(found.items()):
        key_a = f"layers.{layer}.{proj}.lora_A"
        if "A" not in pair:
            raise AdapterError(f"{where}: layers.{layer}.{proj}.lora_B has no matching lora_A")
        rank = _pair(key_a, pair["A"], pair.get("B"), shapes[proj], max_rank, where)
        scaling = alpha / math.sqrt(rank) if rslora else alpha / rank
        a_t = pair["A"].to(torch.float32).t().contiguous().to(dtype)  # [in, r]
        b_t = (pair["B"].to(torch.float32).t() * scaling).contiguous().to(dtype)  # [r, out]
        weights[(layer, proj)] = (a_t, b_t)
        top_rank = max(top_rank, rank)
    return LoRAAdapter(name=name, path=str(folder), rank=top_rank, weights=weights)
