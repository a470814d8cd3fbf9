"""Putting a weight format into a loaded Decoder: quantized tensors in, fp32 linears out.

Where the quantized tensors come from:
* a GGUF model: the file's own blocks (engine.quant.gguf_repack), Q4_0/Q4_1
  codes carried over bit for bit in int4, and in `gguf` every tensor as its
  type holds it (K-quants, Q5_0, Q6_K, Q8_0: the same codes, exact scales);
* any other checkpoint: quantized once from the float weights.
Either way the result is cached next to the converted model
(`<cache>/quantized/<model>-<key>-<fmt>.safetensors`), so later starts skip
the repacking (seconds) the same way they skip GGUF conversion.

The token embedding (the tied LM head of small models) and an untied LM head
are kept int8 in int4 and int8 (in gguf, as the file holds them): the head is the largest single matrix
and logit precision decides greedy ties (llama.cpp keeps ≥ 6 bits there too). A
GGUF's Q8_0 head (the default model's) keeps its blocks and their scales; any
other is quantized once, per row.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator, MutableMapping
from functools import partial
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from engine.model import PRE_FUSED_ARCHITECTURES, Decoder, DecoderConfig
from engine.model_ref import gguf_fingerprint
from engine.packed_linear import PrepackedLinear, PrepackedWeight
from engine.quant.formats import QUANTIZED_FORMATS, WeightFormat
from engine.quant.gguf_repack import TargetFormat, read_gguf_weights
from engine.quant.linear import MAX_QUANT_ROWS, Bf16Linear, QuantizedEmbedding, QuantizedLinear, nbytes
from engine.quant.tensor import QuantFormat, QuantizedTensor, quantize
from engine.quant.vnni import VnniKernel, chosen
from engine.safetensors_file import SafetensorsFile

Progress = Callable[[str], None]
HEAD_FORMAT: QuantFormat = "int8"
# What the cached tensors hold; a new value makes earlier caches stale (2: Q8_0 kept in its blocks; 3: int4 mins
# in GGUF's convention, w = q * scale + min).
CACHE_LAYOUT = 3


def _noop(_: str) -> None:
    pass


def _linears(model: Decoder) -> dict[str, nn.Linear]:
    """The decoder layers' linears by module path ("layers.0.self_attn.qkv_proj", ...)."""
    return {name: mod for name, mod in model.layers.named_modules(prefix="layers") if isinstance(mod, nn.Linear)}


def quantize_decoder(model: Decoder, fmt: QuantFormat) -> dict[str, QuantizedTensor]:
    """Quantize a float Decoder's weights (no GGUF codes to carry over)."""
    out = {name: quantize(lin.weight, fmt) for name, lin in _linears(model).items()}
    out["embed_tokens"] = quantize(model.embed_tokens.weight, HEAD_FORMAT)
    if model.lm_head is not None:
        out["lm_head"] = quantize(model.lm_head.weight, HEAD_FORMAT)
    return out


def reads_gguf_blocks(cfg: DecoderConfig) -> bool:
    """Whether a GGUF's linears are read block by block (repacked); Phi-3's fused tensors (attn_qkv, a fused
    ffn_up) and a MoE's stacked experts (ffn_*_exps) are quantized from their floats instead."""
    return cfg.model_type not in PRE_FUSED_ARCHITECTURES and not cfg.num_experts


def _set_module(root: nn.Module, path: str, module: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, name, module)


def install_quantized(model: Decoder, tensors: MutableMapping[str, QuantizedTensor], wide: bool, kernel: str = "auto",
                      defer_wide: bool = False, saved: Path | None = None) -> None:
    """Replace the linears, the embedding and the LM head by their quantized forms (in place), taking each tensor
    out of `tensors` as it goes: the kernels' layouts are copies, so the originals go one by one instead of all
    at the end. The head first, when the least else is held: it is the largest (a 262k vocabulary's is 178 MB).
    kernel: engine.quant_kernel; defer_wide: the bf16 copies wait for the kernel dispatch (QuantizedLinear), which
    reads a tensor again from `saved` (the file save_tensors wrote) rather than keep every original till then."""

    def linear(name: str, qt: QuantizedTensor, bias: torch.Tensor | None) -> QuantizedLinear:
        reread = None if saved is None else partial(reread_tensor, saved, name)
        return QuantizedLinear(qt, bias, wide=wide, kernel=kernel, step=model.step_kind, defer_wide=defer_wide,
                               reread=reread)

    untied = "lm_head" in tensors
    head_name = "lm_head" if untied else "embed_tokens"
    head_qt = tensors.pop(head_name)
    head = linear(head_name, head_qt, None)
    embedding = tensors.pop("embed_tokens") if untied else head_qt
    # A tied head on our kernel holds the only copy of the codes (in its layout): the lookup reads rows from it.
    narrow = head.narrow
    tied = narrow if not untied and isinstance(narrow, VnniKernel) and narrow.bits == 8 else None
    model.embed_tokens = QuantizedEmbedding(embedding, model.dtype, tied)  # type: ignore[assignment]
    _set_head(model, head)
    del head_qt, embedding
    for name, lin in _linears(model).items():
        _set_module(model, name, linear(name, tensors.pop(name), lin.bias))


def narrow_linear(
    weight: torch.Tensor, bias: torch.Tensor | None, fmt: QuantFormat, kernel: str = "auto"
) -> QuantizedLinear:
    """A float weight quantized to fmt, on the quantized kernel alone (no wide bf16 copy): for a draft head's
    layers, whose steps are a few rows."""
    return QuantizedLinear(quantize(weight.detach(), fmt), bias, wide=False, kernel=kernel)


def quantize_linears(module: nn.Module, fmt: QuantFormat, kernel: str = "auto") -> None:
    """Every nn.Linear inside `module` (a draft head beside the target) as a narrow_linear."""
    for name, lin in [(n, m) for n, m in module.named_modules() if isinstance(m, nn.Linear)]:
        _set_module(module, name, narrow_linear(lin.weight, lin.bias, fmt, kernel))


def install_bf16(model: Decoder) -> None:
    """Every linear and the LM head as one prepacked bf16 copy; the embedding lookup stays in the model dtype."""
    for name, lin in _linears(model).items():
        _set_module(model, name, Bf16Linear(lin.weight, lin.bias))
    head_weight = model.embed_tokens.weight if model.lm_head is None else model.lm_head.weight
    _set_head(model, Bf16Linear(head_weight, None))


def _set_head(model: Decoder, head: nn.Module) -> None:
    model.lm_head = None
    model.head_matmul = head
    model.head_kernel = head  # a submodule, so weight_bytes and .modules() see it


def weight_bytes(model: Decoder) -> int:
    """Resident bytes of the model's weights in every copy kept (plain, prepacked, quantized, wide bf16)."""
    tensors: list[torch.Tensor] = list(model.parameters())
    for m in model.modules():
        if isinstance(m, (QuantizedLinear, Bf16Linear, QuantizedEmbedding)):
            tensors += m.tensors()
        elif isinstance(m, PrepackedLinear):
            tensors.append(m._packed.packed)
    packed_head = getattr(model.head_matmul, "__self__", None)  # prepack_for_cpu's bound PrepackedWeight.apply
    if isinstance(packed_head, PrepackedWeight):
        tensors.append(packed_head.packed)
    return nbytes(tensors)


# --- cache --------------------------------------------------------------------------------------


def cache_path(cache_root: Path, model_dir: Path, source: Path, fmt: str) -> Path:
    """Keyed by the model folder and the content of the file the codes come from (so a fresh install of the
    same GGUF, at another path and mtime, finds the quantized copy)."""
    key = hashlib.sha256(f"{model_dir.resolve()}:{gguf_fingerprint(source)}:{CACHE_LAYOUT}".encode()).hexdigest()
    return cache_root / "quantized" / f"{model_dir.name}-{key[:12]}-{fmt}.safetensors"


def save_tensors(path: Path, tensors: dict[str, QuantizedTensor]) -> None:
    """Write atomically (temporary file, then rename): a concurrent start never reads half a file."""
    from safetensors.torch import save_file

    flat: dict[str, torch.Tensor] = {}
    meta: dict[str, str] = {}
    for name, qt in tensors.items():
        flat[f"{name}.codes"] = qt.codes.contiguous()
        flat[f"{name}.scales"] = qt.scales.contiguous()
        if qt.mins is not None:
            flat[f"{name}.mins"] = qt.mins.contiguous()
        meta[name] = f"{qt.fmt}:{qt.group_size}"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    os.close(fd)
    try:
        save_file(flat, tmp, metadata=meta)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _read_tensor(f: SafetensorsFile, name: str) -> QuantizedTensor:
    fmt, group = f.metadata[name].split(":")
    mins = f.read(f"{name}.mins") if f"{name}.mins" in f else None
    return QuantizedTensor(fmt, f.read(f"{name}.codes"), f.read(f"{name}.scales"), mins, int(group))  # type: ignore[arg-type]


def reread_tensor(path: Path, name: str) -> QuantizedTensor:
    """One tensor of a file save_tensors wrote, read again (a deferred bf16 copy's source: QuantizedLinear)."""
    with SafetensorsFile(path) as f:
        return _read_tensor(f, name)


class SavedTensors(MutableMapping[str, QuantizedTensor]):
    """A file save_tensors wrote, each tensor read when it is taken: install_quantized then holds one original at
    a time beside the kernels' copies, not all of them."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with SafetensorsFile(path) as f:
            self._names = set(f.metadata)

    def __getitem__(self, name: str) -> QuantizedTensor:
        if name not in self._names:
            raise KeyError(name)
        return reread_tensor(self.path, name)

    def __setitem__(self, name: str, value: QuantizedTensor) -> None:
        raise TypeError("SavedTensors is read from its file")

    def __delitem__(self, name: str) -> None:
        self._names.remove(name)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._names))

    def __len__(self) -> int:
        return len(self._names)


TensorOrigin = Literal["cache", "gguf blocks", "floats"]


def _cache_file(model_dir: Path, gguf: Path | None, fmt: str, cache_root: Path) -> Path | None:
    """Where the quantized tensors are (or will be) cached, keyed by the file they come from; None for a model built
    in memory (tests), with no file on disk to key a cache by."""
    source = gguf if gguf is not None else model_dir / "config.json"
    return cache_path(cache_root, model_dir, source, fmt) if source.is_file() else None


def _origin(cached: Path | None, cfg: DecoderConfig, gguf: Path | None) -> TensorOrigin:
    if cached is not None and cached.is_file():
        return "cache"
    return "gguf blocks" if cached is not None and gguf is not None and reads_gguf_blocks(cfg) else "floats"


def tensor_origin(cfg: DecoderConfig, fmt: TargetFormat, model_dir: Path, gguf: Path | None,
                  cache_root: Path) -> TensorOrigin:
    """Where quantized_tensors takes a quantized format's tensors from: the cache of an earlier start, the GGUF's
    own blocks, or the float weights (quantized now). Only the last reads the float linears (engine.weight_plan
    leaves them unread otherwise)."""
    return _origin(_cache_file(model_dir, gguf, fmt, cache_root), cfg, gguf)


def quantized_tensors(
    model: Decoder, fmt: TargetFormat, model_dir: Path, gguf: Path | None, cache_root: Path,
    say: Progress = _noop,
) -> tuple[MutableMapping[str, QuantizedTensor], Path | None]:
    """The model's quantized tensors: from the cache, else from the GGUF or the float weights (then cached); and the
    cache file holding them (None for a model built in memory). gguf: every tensor as its file's type holds it
    (engine.quant.source checked that they all are)."""
    if fmt == "gguf" and (gguf is None or not reads_gguf_blocks(model.cfg)):
        raise ValueError("engine.weights gguf serves a GGUF's own blocks, and this model's weights are not read from "
                         "them; use int4, int8, bf16 or fp32")
    path = _cache_file(model_dir, gguf, fmt, cache_root)
    origin = _origin(path, model.cfg, gguf)
    if origin == "floats" and (model.embed_tokens.weight.is_meta or
                               any(lin.weight.is_meta for lin in _linears(model).values())):
        raise RuntimeError(f"the quantized {fmt} weights of {model_dir} went away from {cache_root} while the engine "
                           "started, and the float ones were not loaded: start it again")
    if path is None:
        return quantize_decoder(model, fmt), None  # type: ignore[arg-type]
    if origin == "cache":
        return SavedTensors(path), path
    if origin == "gguf blocks":
        assert gguf is not None
        say(f"{fmt} weights from {gguf.name}'s blocks (once) -> {path}")
        tensors = read_gguf_weights(gguf, model.cfg, fmt, "gguf" if fmt == "gguf" else HEAD_FORMAT)
    else:
        what = f"{gguf.name}'s dequantized {model.cfg.model_type} weights" if gguf is not None else "the weights"
        say(f"quantizing {what} to {fmt} (once) -> {path}")
        tensors = quantize_decoder(model, fmt)  # type: ignore[arg-type]
    save_tensors(path, tensors)
    return tensors, path


def apply_weight_format(
    model: Decoder,
    fmt: WeightFormat,
    model_dir: Path,
    gguf: Path | None,
    cache_root: Path,
    wide: bool,
    say: Progress = _noop,
    kernel: str = "auto",
    defer_wide: bool = False,
) -> None:
    """Install fmt ("bf16", "int8", "int4" or "gguf") into a CPU Decoder loaded in fp32; kernel: engine.quant_kernel.
    defer_wide: the kernel dispatch settles the bf16 copies, and says the resident line (resident_line) after."""
    if fmt == "bf16":
        install_bf16(model)
    elif fmt in QUANTIZED_FORMATS:
        tensors, saved = quantized_tensors(model, fmt, model_dir, gguf, cache_root, say)  # type: ignore[arg-type]
        say(chosen(kernel)[1])
        install_quantized(model, tensors, wide, kernel, defer_wide, saved)
    else:
        raise ValueError(f"apply_weight_format: {fmt!r} is not an installable format")
    for layer in model.layers:
        layer.self_attn.rows_as_decodes = MAX_QUANT_ROWS  # verification rows numerically like decodes
    if not defer_wide:
        say(resident_line(model, fmt))


def resident_line(model: Decoder, fmt: str) -> str:
    wide = any(isinstance(m, QuantizedLinear) and m.wide is not None for m in model.modules())
    copy = " (with the bf16 copy for wide steps)" if wide else ""
    return f"weights: {fmt}, {weight_bytes(model) / 2**20:.0f} MiB resident{copy}"
