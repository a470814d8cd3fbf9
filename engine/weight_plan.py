"""The weight format a model is served in (engine.weights), decided before its weights are read.

Deciding first lets the loader skip what the format replaces: where the quantized tensors come from the cache
of an earlier start or from the GGUF's own blocks, the float linears, embedding and LM head would be read (a
262k-vocabulary embedding alone is 671 MB in fp32) only to be dropped, and the load would peak at several times
the weights it keeps. Those tensors are left on the meta device instead, and the format installs every one of
them (apply_weights checks that nothing is left unread).
"""
from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.model import DecoderConfig
from engine.model_ref import cache_root, gguf_for
from engine.model_text import Progress, noop
from engine.quant.apply import TensorOrigin, apply_weight_format, reads_gguf_blocks, tensor_origin
from engine.quant.formats import QUANTIZED_FORMATS, ResolvedFormat, resolve_weight_format
from engine.quant.source import weight_source

if TYPE_CHECKING:
    from engine.loader import LoadedModel

# The checkpoint tensors a quantized format replaces: the decoder layers' linears (separate or pre-fused)...
_LINEAR = re.compile(r"model\.layers\.\d+\.(self_attn\.(q|k|v|o|qkv)_proj|mlp\.(gate|up|down|gate_up)_proj)\.weight")
# ... and the embedding and LM head, which a draft head may need as floats (float_embedding).
_HEAD = ("model.embed_tokens.weight", "lm_head.weight")


@dataclass(frozen=True)
class WeightRequest:
    fmt: str  # engine.weights
    kernel: str = "auto"  # engine.quant_kernel
    float_embedding: bool = False  # an EAGLE head binds the target's float embedding and LM-head rows


@dataclass(frozen=True)
class WeightPlan:
    request: WeightRequest
    resolved: ResolvedFormat
    gguf: Path | None
    origin: TensorOrigin | None  # where a quantized format's tensors come from; None for bf16 and fp32

    def placeholder(self, name: str) -> bool:
        """Whether the loader leaves checkpoint tensor `name` unread (on the meta device) for the format to install."""
        if self.origin not in ("cache", "gguf blocks"):
            return False
        return bool(_LINEAR.fullmatch(name)) or (name in _HEAD and not self.request.float_embedding)


def plan_weights(name: str, path: Path, cfg: DecoderConfig, device: torch.device, request: WeightRequest) -> WeightPlan:
    """The format for a model (name: its reference; path: its HF folder), and where its tensors would come from."""
    found = gguf_for(name)
    gguf = found[0] if found else None
    source = None
    if request.fmt in ("auto", "gguf") and device.type == "cpu":
        source = weight_source(path, gguf, reads_gguf_blocks(cfg))
    resolved = resolve_weight_format(request.fmt, device, kernel=request.kernel, source=source)  # type: ignore[arg-type]
    origin = None
    if resolved.fmt in QUANTIZED_FORMATS:
        origin = tensor_origin(cfg, resolved.fmt, path, gguf, cache_root().parent)  # type: ignore[arg-type]
    return WeightPlan(request, resolved, gguf, origin)


def apply_weights(
    loaded: LoadedModel, requested: str, wide: bool, progress: Progress | None = None, kernel: str = "auto",
    defer_wide: bool = False,
) -> str:
    """Install the `engine.weights` format into a loaded model; returns the format in use.

    A format this device cannot run is replaced (by fp32, or engine.dtype on CUDA)
    with the reason said, and logged, once at start. wide: keep a bf16 copy for
    steps of many rows (engine.quant.linear). kernel: engine.quant_kernel. defer_wide:
    engine.kernel_dispatch.dispatch_kernels makes the bf16 copies, where a step runs on them.
    """
    say = progress or noop
    plan = loaded.weights
    if plan is None or (plan.request.fmt, plan.request.kernel) != (requested, kernel):
        plan = plan_weights(loaded.name, loaded.path, loaded.model.cfg, loaded.device, WeightRequest(requested, kernel))
    resolved = plan.resolved
    if resolved.note:
        logging.getLogger(__name__).warning(resolved.note)
        say(resolved.note)
    if resolved.choice:
        say(resolved.choice)
    if resolved.fmt != "fp32":
        if wide and not resolved.wide_copy and resolved.fmt != "bf16":
            say(f"no bf16 copy for wide steps (oneDNN's bf16 GEMM does not run on this CPU): every step runs "
                f"{resolved.fmt}")
            wide = False
        apply_weight_format(loaded.model, resolved.fmt, loaded.path, plan.gguf, cache_root().parent, wide, say,
                            kernel, defer_wide)
    tensors = chain(loaded.model.named_parameters(), loaded.model.named_buffers())
    unread = next((name for name, t in tensors if t.is_meta), None)
    if unread is not None:
        loaded_for = loaded.weights.request.fmt if loaded.weights is not None else "another format"
        raise RuntimeError(f"engine.weights {requested} ({resolved.fmt}) does not replace {unread}, which was loaded "
                           f"for {loaded_for}: load the model for the format it is served in")
    return resolved.fmt
