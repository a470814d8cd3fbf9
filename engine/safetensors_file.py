"""A safetensors file read tensor by tensor with pread, never memory-mapped.

safetensors' own safe_open maps the whole file: every page a load touches stays in the process's resident set
until the file closes, and a tensor handed back without a copy keeps the mapping (and those pages) alive for the
worker's life. Reading each tensor's bytes into memory of its own makes the load hold what it keeps and nothing
else. The format: an 8-byte little-endian header length, a JSON header of {name: {dtype, shape, data_offsets}}
(offsets relative to the end of the header), then the data.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}  # fmt: skip


class SafetensorsFile:
    """An open safetensors file: its tensor names, shapes and dtypes from the header, each tensor read on demand."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)
        try:
            (length,) = struct.unpack("<Q", os.pread(self._fd, 8, 0))
            header = json.loads(os.pread(self._fd, length, 8))
        except Exception:
            os.close(self._fd)
            raise
        self.metadata: dict[str, str] = header.pop("__metadata__", None) or {}
        self._entries: dict[str, dict] = header
        self._data = 8 + length

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def shape(self, name: str) -> list[int]:
        return list(self._entries[name]["shape"])

    def dtype(self, name: str) -> torch.dtype:
        kind = self._entries[name]["dtype"]
        if kind not in _DTYPES:
            raise ValueError(f"{self.path}: tensor {name!r} has dtype {kind}, which the engine does not read")
        return _DTYPES[kind]

    def read(self, name: str) -> torch.Tensor:
        """The tensor, in memory of its own (one copy: the bytes land where the tensor keeps them)."""
        begin, end = self._entries[name]["data_offsets"]
        out = torch.empty(self.shape(name), dtype=self.dtype(name))
        view = memoryview(out.view(torch.uint8).reshape(-1).numpy()) if out.numel() else memoryview(b"")
        if len(view) != end - begin:
            raise ValueError(f"{self.path}: tensor {name!r} holds {end - begin} bytes, its shape and dtype {len(view)}")
        done = 0
        while done < len(view):  # pread may return less than asked (large reads, signals)
            got = os.preadv(self._fd, [view[done:]], self._data + begin + done)
            if got <= 0:
                raise ValueError(f"{self.path}: the file ends inside tensor {name!r}")
            done += got
        return out
