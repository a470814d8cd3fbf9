"""A GGUF file's tensors, read without building its metadata.

gguf's ``GGUFReader`` turns every key-value field into numpy views, the vocabulary's strings one by one: 3-5 s of
a 2-core machine for the default model's 49k tokens (262k for Gemma), in every worker start and every engine a test
builds, where the engine needs only the tensors (the tokenizer and config come from transformers). Here the
metadata is skipped over and each tensor is the same view of the mapped file that ``GGUFReader`` gives.
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGUF_MAGIC, GGMLQuantizationType, GGUFValueType
from gguf.quants import quant_shape_to_byte_shape

_SCALAR_BYTES = {
    GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.BOOL: 1,
    GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4,
    GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8,
}
_PLAIN_DTYPES = {
    GGMLQuantizationType.F32: np.float32, GGMLQuantizationType.F16: np.float16, GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8, GGMLQuantizationType.I16: np.int16, GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGUF's order, innermost first (as gguf's ReaderTensor.shape)
    data: np.ndarray  # [rows..., elements] for plain types, [rows..., bytes per row] for block types


class _Cursor:
    def __init__(self, buffer: mmap.mmap) -> None:
        self.buffer, self.at = buffer, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.buffer, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def string_bytes(self) -> memoryview:
        size = self.take("<Q")  # read before moving on: `self.at += self.take(...)` would read self.at first
        self.at += size
        return memoryview(self.buffer)[self.at - size:self.at]

    def string(self) -> str:
        return bytes(self.string_bytes()).decode("utf-8")

    def skip_value(self, kind: int) -> None:
        if kind == GGUFValueType.STRING:
            self.string_bytes()
        elif kind == GGUFValueType.ARRAY:
            item, count = self.take("<I"), self.take("<Q")
            if item in _SCALAR_BYTES:
                self.at += count * _SCALAR_BYTES[GGUFValueType(item)]
            else:
                for _ in range(count):
                    self.skip_value(item)
        else:
            self.at += _SCALAR_BYTES[GGUFValueType(kind)]


def read_tensors(path: Path) -> list[GGUFTensor]:
    """The tensors of a little-endian GGUF file (version 2 or 3), in file order."""
    with path.open("rb") as f:
        buffer = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    cursor = _Cursor(buffer)
    if cursor.take("<I") != GGUF_MAGIC:
        raise ValueError(f"{path.name} is not a little-endian GGUF file")
    if (version := cursor.take("<I")) not in (2, 3):
        raise ValueError(f"{path.name}: GGUF version {version} (2 and 3 are read)")
    n_tensors, n_fields = cursor.take("<Q"), cursor.take("<Q")
    alignment = GGUF_DEFAULT_ALIGNMENT
    for _ in range(n_fields):
        key, kind = cursor.string(), cursor.take("<I")
        if key == "general.alignment" and kind == GGUFValueType.UINT32:
            alignment = cursor.take("<I")
        else:
            cursor.skip_value(kind)
    infos = []
    for _ in range(n_tensors):
        name, n_dims = cursor.string(), cursor.take("<I")
        dims = tuple(cursor.take("<Q") for _ in range(n_dims))
        infos.append((name, dims, GGMLQuantizationType(cursor.take("<I")), cursor.take("<Q")))
    data_start = -(-cursor.at // alignment) * alignment
    whole = np.frombuffer(buffer, dtype=np.uint8)
    return [_tensor(whole, data_start, *info) for info in infos]


def _tensor(whole: np.ndarray, data_start: int, name: str, dims: tuple[int, ...], kind: GGMLQuantizationType,
            offset: int) -> GGUFTensor:
    elements = int(np.prod(dims))
    block, block_bytes = GGML_QUANT_SIZES[kind]
    start = data_start + offset
    raw = whole[start:start + elements * block_bytes // block]
    np_dims = tuple(reversed(dims))
    if kind in _PLAIN_DTYPES:
        data = raw.view(_PLAIN_DTYPES[kind]).reshape(np_dims)
    else:
        data = raw.reshape(quant_shape_to_byte_shape(np_dims, kind))
    return GGUFTensor(name, kind, dims, data)
