"""Which weight format keeps a model's file exactly: what `engine.weights: auto` picks, where the CPU runs it.

    a GGUF of Q4_0 / Q4_1 linears with a Q8_0 embedding and head -> int4 (the codes repacked bit for bit,
                                                                   engine/quant/gguf_repack.py)
    a GGUF of other types our kernel holds (K-quants, Q5_0, Q6_K,  -> gguf (each tensor as its type holds it)
    Q8_0 linears: what most GGUF downloads are)
    a checkpoint stored in bfloat16                               -> bf16
    anything else (fp32 or fp16 files, Q2_K, Q3_K, IQ types)       -> fp32 (every other format would round
                                                                   the weights again)

A GGUF whose linears are not read block by block (Phi-3's fused tensors, a MoE's stacked experts) is
quantized from its floats, so it is fp32's too.
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from engine.quant.formats import WeightFormat

_INT4_LINEARS = {"Q4_0", "Q4_1"}  # repacked as they are
_INT8_HEADS = {"Q8_0"}  # kept in its blocks
# What the gguf format serves as it is (engine/quant/gguf_repack.py's repacks; a test holds the two equal).
NATIVE_TYPES = frozenset({"Q4_0", "Q4_1", "Q4_K", "Q5_0", "Q5_1", "Q5_K", "Q6_K", "Q8_0"})


@dataclass(frozen=True)
class WeightSource:
    lossless: WeightFormat  # the fastest format holding the file's weights exactly
    held: str  # what the file holds, to say at start
    native: bool = False  # a GGUF whose every tensor the gguf format serves as it is


def _gguf_source(path: Path, blockwise: bool) -> WeightSource:
    from engine.quant.gguf_tensors import read_tensors

    types: dict[str, set[str]] = {"linears": set(), "head": set()}
    for t in read_tensors(path):
        if len(t.shape) < 2:  # norms and biases stay fp32 in every format
            continue
        types["linears" if t.name.startswith("blk.") else "head"].add(t.tensor_type.name)
    linears, head = sorted(types["linears"]), sorted(types["head"])
    held = f"{path.name}'s {'/'.join(linears)} linears and {'/'.join(head)} embedding"
    native = blockwise and set(linears) | set(head) <= NATIVE_TYPES
    if native and set(linears) <= _INT4_LINEARS and set(head) <= _INT8_HEADS:
        return WeightSource("int4", held, native)
    return WeightSource("gguf" if native else "fp32", held, native)


def _safetensors_dtypes(folder: Path) -> set[str]:
    dtypes: set[str] = set()
    for file in sorted(folder.glob("*.safetensors")):
        with file.open("rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        dtypes |= {v["dtype"] for k, v in header.items() if k != "__metadata__" and v["dtype"].startswith(("F", "BF"))}
    return dtypes


def weight_source(model_dir: Path, gguf: Path | None, blockwise: bool = True) -> WeightSource | None:
    """What the model's file holds (None: no file says, as for a model built in memory). blockwise: its GGUF
    linears are read block by block (engine.quant.apply)."""
    if gguf is not None:
        return _gguf_source(gguf, blockwise)
    dtypes = _safetensors_dtypes(model_dir)
    if not dtypes:
        return None
    held = f"{model_dir.name}'s {'/'.join(sorted(dtypes))} weights"
    return WeightSource("bf16" if dtypes == {"BF16"} else "fp32", held)
